"""``streamkit reset``, ``resume`` and ``delete-stream``: changing where processors stand."""

from __future__ import annotations

import asyncclick as click

from .._errors import ConfigError, StreamkitError
from .._literal import printable
from ._admin import delete_stream_keys, live_members, reset_positions, resume_partitions
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
    type=click.Choice(["start", "end"]),
    required=True,
    help="start: process every retained event again; end: skip all events sent so far.",
)
@yes_option
@click.option("--force", is_flag=True, help="Reset even while workers run the processor.")
@redis_url_option
async def reset(
    app_path: str, processor_name: str, to: str, yes: bool, force: bool, redis_url: str | None
) -> None:
    """Move a processor to the start or the end of its stream.

    Pending (delivered, unacknowledged) entries are forgotten. Stop the processor's
    workers first: a reset under running workers is refused unless --force.
    """
    app = load_app(app_path, redis_url)
    processor = load_processor(app, processor_name)
    try:
        async with app:
            alive = await live_members(app, processor)
            if alive and not force:
                fail(
                    f"{len(alive)} worker(s) run {processor.name} right now "
                    f"({', '.join(alive)}); stop them first, or pass --force"
                )
            question = (
                f"Reset {processor.name} of {app.name} to the {to} of "
                f"{processor.stream.name} ({processor.stream.partition_count} partitions)?"
            )
            if not yes:
                confirm(question, refused="nothing was reset")
            await reset_positions(app, processor, to="start" if to == "start" else "end")
    except StreamkitError as exc:
        fail(str(exc))
    click.echo(f"{processor.name} now reads {processor.stream.name} from the {to}")


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
