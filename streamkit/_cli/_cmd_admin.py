"""``streamkit reset``, ``resume`` and ``delete-stream``: changing where processors stand."""

from __future__ import annotations

import asyncclick as click

from .._errors import ConfigError, StreamkitError
from .._literal import printable
from .._replay import (
    ResetRefused,
    StateChoice,
    apply_reset,
    check_reset,
    parse_position,
    plan_reset,
)
from ._admin import delete_stream_keys, live_members, resume_partitions
from ._confirm import confirm
from ._exits import fail
from ._loading import load_app, load_processor, load_stream
from ._options import redis_url_option, yes_option

__all__ = ["delete_stream", "reset", "resume"]


@click.command()
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@click.option(
    "--to",
    "where",
    required=True,
    metavar="WHERE",
    help="start: process every retained event again; end: skip every event sent so far; "
    "a time: process the events sent since (ISO 8601, UTC unless it says otherwise, or "
    "relative: -2h, -30m, -1d); an entry id (1700000000000-0): process from that entry on.",
)
@click.option(
    "--state",
    type=click.Choice(["clear", "keep"]),
    help="For a processor with tables, windows or outputs: clear (only with --to start) "
    "rebuilds its state from the retained events; keep processes them again against the "
    "state as it stands. Required with --to start, a time or an id for such a processor.",
)
@click.option(
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="Reset only this partition (repeatable; default: every partition).",
)
@yes_option
@click.option(
    "--force",
    is_flag=True,
    help="Reset even while workers run the processor: the reset takes their leases, and "
    "they start the partitions again from the new position, with the state as Redis "
    "holds it.",
)
@redis_url_option
async def reset(
    app_path: str,
    processor_name: str,
    where: str,
    state: StateChoice | None,
    partitions: tuple[int, ...],
    yes: bool,
    force: bool,
    redis_url: str | None,
) -> None:
    """Move where a processor reads its stream from: the start, the end, a time, an id.

    Pending (delivered, unacknowledged) entries are forgotten. Stop the processor's
    workers first: a reset under running workers is refused unless --force (it then
    takes their leases: they start the partitions again within the lease TTL, from the
    new position). For a processor with state, say what becomes of it (--state): see
    docs/state.md, "Replays".
    """
    try:
        to = parse_position(where)
    except ConfigError as exc:
        fail(str(exc), 2)
    app = load_app(app_path, redis_url)
    processor = load_processor(app, processor_name)
    try:
        check_reset(processor, to=to, state=state)
    except ResetRefused as exc:
        fail(str(exc), 2)
    try:
        async with app:
            alive = await live_members(app, processor)
            if alive and not force:
                fail(
                    f"{len(alive)} worker(s) run {processor.name} right now "
                    f"({', '.join(alive)}); stop them first, or pass --force"
                )
            plan = await plan_reset(
                app, processor, to=to, state=state, partitions=list(partitions) or None
            )
            if plan.nothing_to_do:
                newest = max((p.last for p in plan.partitions if p.last), default=None)
                click.echo(
                    f"nothing to replay: {processor.stream.name} has no event "
                    f"{plan.where()}"
                    + (f" (its newest is {newest})" if newest else "")
                    + "; nothing was reset"
                )
                return
            if not yes:
                lines = plan.describe()
                if alive:
                    lines.append(
                        f"{len(alive)} worker(s) run {processor.name}: the reset takes their "
                        f"leases, so nothing they have in flight commits, and they start the "
                        f"partitions again from the new position, with the state as Redis "
                        f"holds it."
                    )
                confirm("\n".join(lines) + "\nGo ahead?", refused="nothing was reset")
            taken = await apply_reset(app, processor, plan)
    except ConfigError as exc:
        fail(str(exc), 2)
    except StreamkitError as exc:
        fail(str(exc))
    scope = (
        f" (partition{'s' if len(plan.partitions) > 1 else ''} "
        f"{', '.join(str(p.partition) for p in plan.partitions)})"
        if partitions
        else ""
    )
    cleared = ", its state cleared" if plan.state == "clear" else ""
    click.echo(f"{processor.name} now reads {processor.stream.name} {plan.where()}{scope}{cleared}")
    loss = plan.loss()
    if loss:
        click.echo(f"{loss}.")
    if taken:
        click.echo(
            f"took the lease{'s' if taken > 1 else ''} of {taken} partition(s) from the "
            f"running worker(s): nothing they had in flight commits, and they start "
            f"{'them' if taken > 1 else 'it'} again once their lease would have run out "
            f"(lease_ttl at most), from the new position, with the state as Redis holds it"
        )


@click.command()
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("processor_name", metavar="PROCESSOR")
@click.option(
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="A halted partition to resume (repeatable; default: every halted one).",
)
@click.option(
    "--skip",
    is_flag=True,
    help="Acknowledge the halted events without processing them, then go on.",
)
@redis_url_option
async def resume(
    app_path: str,
    processor_name: str,
    partitions: tuple[int, ...],
    skip: bool,
    redis_url: str | None,
) -> None:
    """Resume a processor on partitions where its exception policy halted.

    The worker owning each partition processes the halted event again (or, with
    --skip, the events after it) within a second. `streamkit status` lists the
    halted partitions and their errors.
    """
    app = load_app(app_path, redis_url)
    processor = load_processor(app, processor_name)
    try:
        async with app:
            cleared = await resume_partitions(
                app, processor, partitions=list(partitions) or None, skip=skip
            )
    except ConfigError as exc:
        fail(str(exc), 2)
    except StreamkitError as exc:
        fail(str(exc))
    missing = sorted(set(partitions) - set(cleared))
    for partition, record in sorted(cleared.items()):
        skipped = ""
        if skip and record.entry_ids:
            skipped = f", skipping {printable(', '.join(record.entry_ids))}"
        click.echo(f"resumed {processor.name} on partition {partition}{skipped}")
    if missing:
        fail(
            f"{processor.name} is not halted on partition "
            f"{', '.join(map(str, missing))} (see `streamkit status {app_path}`)"
        )
    if not cleared:
        fail(f"{processor.name} is not halted on any partition; nothing to resume")


@click.command("delete-stream")
@click.argument("stream_path", metavar="MODULE:STREAM")
@yes_option
@click.option("--force", is_flag=True, help="Delete even while workers run its processors.")
@redis_url_option
async def delete_stream(stream_path: str, yes: bool, force: bool, redis_url: str | None) -> None:
    """Delete a stream's events, metadata and processors' membership, to recreate it.

    For a stream created with other settings (partition count, record type, partition
    key) than the code now uses. Only this stream's keys are deleted; its processors'
    dead letters are kept. Stop its workers first.
    """
    app, stream = load_stream(stream_path, redis_url)
    processors = [p for p in app.processors.values() if p.stream is stream]
    try:
        async with app:
            for processor in processors:
                alive = await live_members(app, processor)
                if alive and not force:
                    fail(
                        f"{len(alive)} worker(s) run {processor.name} on {stream.name} right "
                        f"now; stop them first, or pass --force; nothing was deleted"
                    )
            if not yes:
                confirm(
                    f"Delete all events of {app.name}.{stream.name} "
                    f"({stream.partition_count} partitions) and its recorded settings?",
                    refused="nothing was deleted",
                )
            deleted = await delete_stream_keys(app, stream, processors)
    except StreamkitError as exc:
        fail(str(exc))
    click.echo(f"deleted {app.name}.{stream.name} ({deleted:,} event(s))")
