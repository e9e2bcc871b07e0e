"""``streamkit deadletters``: list, replay and purge a processor's dead letters."""

from __future__ import annotations

from typing import Literal

import asyncclick as click
from rich.console import Console
from rich.table import Table

from .._errors import StreamkitError
from .._literal import literal_text
from ._confirm import BulkAction, OnProgress, bulk_options, confirm_and_act
from ._deadletters import (
    count_dead_letters,
    list_dead_letters,
    parse_dead_letter_id,
    purge_dead_letters,
    replay_dead_letters,
)
from ._exits import StdoutConsole, fail
from ._loading import load_app, load_processor
from ._options import WholeHelpGroup, limit_option, redis_url_option

__all__ = ["deadletters"]


@click.group(cls=WholeHelpGroup)
def deadletters() -> None:
    """List, replay and purge a processor's dead letters."""


@deadletters.command("list")
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@limit_option(help="Show at most this many dead letters (the oldest); says how many more exist.")
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
        # Everything but the numbers comes from the dead letter: shown literally.
        table.add_row(
            literal_text(letter.id),
            letter.failed_at.isoformat(timespec="seconds"),
            literal_text(letter.reason),
            literal_text(error),
            str(letter.partition),
            literal_text(letter.entry_id),
            str(letter.delivery_count),
        )
    # At least 200 columns: a table of error messages is unreadable when folded narrow.
    StdoutConsole(width=max(200, Console().width)).print(table)
    if total > len(letters):
        click.echo(
            f"showing the oldest {len(letters):,} of {total:,} dead letters; "
            f"pass --limit {total} to see them all"
        )


async def act_on_dead_letters(
    verb: Literal["replay", "purge"],
    *,
    app_path: str,
    processor_name: str,
    ids: tuple[str, ...],
    yes: bool,
    redis_url: str | None,
) -> None:
    """Confirm, then replay or purge the chosen dead letters (all by default), one
    step at a time (see :func:`confirm_and_act`).

    Given ids are checked first, in form and then in Redis: if any is not a dead
    letter of the processor, nothing is done (exit code 2).
    """
    app = load_app(app_path, redis_url)
    processor = load_processor(app, processor_name)
    action = BulkAction(verb=verb, things="dead letter(s)", owner=f"of {processor.name}")
    listing = f"`streamkit deadletters list {app_path} {processor.name}`"
    wanted: list[str] = []
    for given in ids:
        parsed = parse_dead_letter_id(given)
        if parsed is None:
            fail(
                f"--id {given!r} is not a dead letter id (ids look like 1767225600000-0; "
                f"{listing} shows them); {action.nothing}",
                2,
            )
        if parsed not in wanted:
            wanted.append(parsed)
    keys = processor.keys
    settings = processor.stream.settings

    async def act(on_progress: OnProgress) -> None:
        if verb == "replay":
            await replay_dead_letters(
                app.redis,
                processor.stream.spec,
                keys,
                partition_size=settings.partition_size,
                max_len=settings.max_len,
                ids=wanted or None,
                on_progress=on_progress,
            )
        else:
            await purge_dead_letters(app.redis, keys, ids=wanted or None, on_progress=on_progress)

    try:
        async with app:
            if wanted:
                existing = {letter.id for letter in await list_dead_letters(app.redis, keys)}
                missing = [i for i in wanted if i not in existing]
                if missing:
                    fail(
                        f"{processor.name} has no dead letter {', '.join(missing)} "
                        f"({listing} shows those it has); {action.nothing}",
                        2,
                    )
                total = len(wanted)
            else:
                total = await count_dead_letters(app.redis, keys)
                if not total:
                    click.echo(f"{processor.name} has no dead letters; {action.nothing}")
                    return
            which = f"{total:,} dead letter(s)" if wanted else f"all {total:,} dead letter(s)"
            ask = "Replay" if verb == "replay" else "Delete"
            question = f"{ask} {which} of {processor.name}?"
            count = await confirm_and_act(action, act, total=total, question=question, yes=yes)
    except StreamkitError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail(f"interrupted; {action.nothing}", 130)
    click.echo(f"{action.done} {count:,} dead letter(s) of {processor.name}")


def _dead_letters_command(verb: Literal["replay", "purge"], summary: str) -> click.Command:
    """``streamkit deadletters replay`` or ``purge``: one command, told apart by its verb."""

    @deadletters.command(verb, help=summary)
    @click.argument("app_path", metavar="MODULE:APP")
    @click.argument("processor_name", metavar="PROCESSOR")
    @bulk_options(verb)
    @redis_url_option
    async def command(
        app_path: str, processor_name: str, ids: tuple[str, ...], yes: bool, redis_url: str | None
    ) -> None:
        await act_on_dead_letters(
            verb,
            app_path=app_path,
            processor_name=processor_name,
            ids=ids,
            yes=yes,
            redis_url=redis_url,
        )

    return command


deadletters_replay = _dead_letters_command(
    "replay", "Send dead letters back to their partitions for processing again."
)
deadletters_purge = _dead_letters_command("purge", "Delete dead letters for good.")
