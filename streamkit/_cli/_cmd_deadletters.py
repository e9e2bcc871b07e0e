"""``streamkit deadletters``: list, replay and purge a processor's dead letters."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import asyncclick as click
from rich.console import Console
from rich.table import Table

from .._errors import StreamkitError
from ._confirm import confirm
from ._deadletters import (
    count_dead_letters,
    list_dead_letters,
    parse_dead_letter_id,
    purge_dead_letters,
    replay_dead_letters,
)
from ._exits import fail
from ._loading import load_app, load_processor
from ._options import WholeHelpGroup, redis_url_option

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._app import App, Processor

__all__ = ["deadletters"]


@click.group(cls=WholeHelpGroup)
def deadletters() -> None:
    """List, replay and purge a processor's dead letters."""


@deadletters.command("list")
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Show at most this many dead letters (the oldest); says how many more exist.",
)
@redis_url_option
async def deadletters_list(
    app_path: str, processor_name: str, limit: int, redis_url: str | None
) -> None:
    """Show a processor's dead letters, oldest first."""
    app = load_app(app_path, redis_url)
    processor = load_processor(app, processor_name)
    try:
        async with app:
            letters = await list_dead_letters(app.redis, processor.keys, count=limit)
            total = await count_dead_letters(app.redis, processor.keys)
    except StreamkitError as exc:
        fail(str(exc))
    if not letters:
        click.echo(f"{processor.name} has no dead letters")
        return
    table = Table(title=f"dead letters of {app.name}: {processor.name}", title_justify="left")
    for column in ("id", "failed at", "reason", "error", "partition", "entry id", "deliveries"):
        table.add_column(column)
    for letter in letters:
        error = f"{letter.error_type}: {letter.error}" if letter.error_type else letter.error
        table.add_row(
            letter.id,
            letter.failed_at.isoformat(timespec="seconds"),
            letter.reason,
            error,
            str(letter.partition),
            letter.entry_id,
            str(letter.delivery_count),
        )
    Console(width=200).print(table)
    if total > len(letters):
        click.echo(
            f"showing the oldest {len(letters):,} of {total:,} dead letters; "
            f"pass --limit {total} to see them all"
        )


DeadLetterAction = Callable[["App", "Processor", "Sequence[str] | None"], Awaitable[int]]


async def replay_letters(app: App, processor: Processor, ids: Sequence[str] | None) -> int:
    settings = processor.stream.settings
    return await replay_dead_letters(
        app.redis,
        processor.stream.spec,
        processor.keys,
        partition_size=settings.partition_size,
        max_len=settings.max_len,
        ids=ids,
    )


async def purge_letters(app: App, processor: Processor, ids: Sequence[str] | None) -> int:
    return await purge_dead_letters(app.redis, processor.keys, ids=ids)


async def act_on_dead_letters(
    action: DeadLetterAction,
    *,
    ask: str,
    done: str,
    app_path: str,
    processor_name: str,
    ids: tuple[str, ...],
    yes: bool,
    redis_url: str | None,
) -> None:
    """Confirm, then apply ``action`` (replay or purge) to the chosen dead letters.

    Given ids are checked first, in form and then in Redis: if any is not a dead
    letter of the processor, nothing is done (exit code 2).
    """
    app = load_app(app_path, redis_url)
    processor = load_processor(app, processor_name)
    wanted: list[str] = []
    for given in ids:
        parsed = parse_dead_letter_id(given)
        if parsed is None:
            fail(
                f"--id {given!r} is not a dead letter id (ids look like 1767225600000-0; "
                f"`streamkit deadletters list {app_path} {processor.name}` shows them); "
                f"nothing was {done}",
                2,
            )
        if parsed not in wanted:
            wanted.append(parsed)
    which = f"{len(wanted)} dead letter(s)" if wanted else "all dead letters"
    try:
        async with app:
            if wanted:
                existing = {
                    letter.id for letter in await list_dead_letters(app.redis, processor.keys)
                }
                missing = [i for i in wanted if i not in existing]
                if missing:
                    fail(
                        f"{processor.name} has no dead letter {', '.join(missing)} "
                        f"(`streamkit deadletters list {app_path} {processor.name}` shows "
                        f"those it has); nothing was {done}",
                        2,
                    )
            if not yes:
                confirm(f"{ask} {which} of {processor.name}?", refused=f"nothing was {done}")
            count = await action(app, processor, wanted or None)
    except StreamkitError as exc:
        fail(str(exc))
    click.echo(f"{done} {count} dead letter(s) of {processor.name}")


@deadletters.command("replay")
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@click.option("--id", "ids", multiple=True, metavar="ID", help="Replay only these (repeatable).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@redis_url_option
async def deadletters_replay(
    app_path: str, processor_name: str, ids: tuple[str, ...], yes: bool, redis_url: str | None
) -> None:
    """Send dead letters back to their partitions for processing again."""
    await act_on_dead_letters(
        replay_letters,
        ask="Replay",
        done="replayed",
        app_path=app_path,
        processor_name=processor_name,
        ids=ids,
        yes=yes,
        redis_url=redis_url,
    )


@deadletters.command("purge")
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@click.option("--id", "ids", multiple=True, metavar="ID", help="Purge only these (repeatable).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@redis_url_option
async def deadletters_purge(
    app_path: str, processor_name: str, ids: tuple[str, ...], yes: bool, redis_url: str | None
) -> None:
    """Delete dead letters for good."""
    await act_on_dead_letters(
        purge_letters,
        ask="Delete",
        done="purged",
        app_path=app_path,
        processor_name=processor_name,
        ids=ids,
        yes=yes,
        redis_url=redis_url,
    )
