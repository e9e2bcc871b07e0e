"""The terminal views of a job queue: its counts, one job, its dead jobs (pure).

For ``streamkit jobs``: data from the queue in, rich tables and text lines out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from rich.table import Table
from rich.text import Text

from .._literal import literal_text, printable
from ..jobs import JobStatus
from ._fleet import job_history
from ._fleet_view import ago

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from ..jobs import JobInfo, QueueCounts

__all__ = [
    "by_name_table",
    "call_text",
    "counts_table",
    "dead_jobs_table",
    "error_text",
    "job_lines",
    "relative",
]

#: What each job status means, as ``streamkit jobs show`` says it.
STATUS_GLOSSES: dict[JobStatus, str] = {
    JobStatus.SCHEDULED: "delayed until it is due",
    JobStatus.WAITING: "for the jobs it depends on",
    JobStatus.HELD: "held back by a limit or a pause",
    JobStatus.SENT: "queued for a worker",
    JobStatus.EXECUTING: "running now",
    JobStatus.RETRY: "a try failed; waiting for the next",
    JobStatus.DEAD: "in the dead-letter queue",
    JobStatus.EXPIRED: "not started before it expired",
}


def relative(moment: datetime | None, now: datetime) -> str:
    """``2026-01-01T10:00:00+00:00 (5s ago)``, ``... (in 2m)``, or ``-``."""
    if moment is None:
        return "-"
    stamp = moment.isoformat(timespec="seconds")
    if moment <= now:
        return f"{stamp} ({ago(moment, now)})"
    return f"{stamp} (in {ago(now, moment).removesuffix(' ago')})"


def iso_ms(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="milliseconds") if moment is not None else None


def status_text(status: JobStatus) -> str:
    gloss = STATUS_GLOSSES.get(status)
    return f"{status.value} ({gloss})" if gloss else status.value


def call_text(info: JobInfo) -> str:
    """The job as a call: ``send_email('ada@example.com', retry=True)``."""
    parts = [repr(arg) for arg in info.args]
    parts += [f"{key}={value!r}" for key, value in info.kwargs.items()]
    return f"{info.name}({', '.join(parts)})"


def error_text(info: JobInfo) -> str:
    if info.error is None:
        return "-"
    return f"{info.error.type}: {info.error.message}" if info.error.message else info.error.type


def counts_table(counts: QueueCounts) -> Table:
    """How many jobs the queue holds in each state (``streamkit jobs info``)."""
    table = Table()
    table.add_column("status", no_wrap=True)
    table.add_column("jobs", justify="right")
    rows = [
        *((f"queued, {prio} priority", n) for prio, n in counts.queued.items()),
        ("scheduled (delayed)", counts.scheduled),
        ("waiting for other jobs", counts.waiting),
        ("running", counts.running),
        ("retrying (waiting for a try)", counts.retrying),
        ("held (a limit, a pause)", counts.held),
        ("dead", counts.dead),
        ("succeeded (total)", counts.succeeded),
        ("aborted (total)", counts.aborted),
        ("expired (total)", counts.expired),
    ]
    for label, number in rows:
        table.add_row(literal_text(label), f"{number:,}")
    return table


def by_name_table(by_name: dict[str, dict[str, int]]) -> Table:
    """The jobs of each name, by state (``streamkit jobs info``): a name is never
    cut; the counts fold onto more lines when they must."""
    table = Table()
    table.add_column("job", no_wrap=True)
    table.add_column("jobs by status", overflow="fold", ratio=1)
    for name, per_count in by_name.items():
        shown = ", ".join(f"{n:,} {count}" for count, n in per_count.items() if n)
        table.add_row(literal_text(name), Text(shown or "none"))
    return table


def job_lines(info: JobInfo, now: datetime) -> list[str]:
    """One job, as ``streamkit jobs show`` prints it: a line per fact, its history,
    and the traceback of its last failed try."""
    rows: list[tuple[str, str]] = [
        ("status", status_text(info.status)),
        ("call", call_text(info)),
        ("priority", info.priority),
        ("tries", f"{info.tries} of {info.max_tries}"),
        ("enqueued", relative(info.enqueued_at, now)),
    ]
    if info.held_by is not None:
        rows.append(("held by", info.held_by))
    if info.due_at is not None:
        rows.append(("due", relative(info.due_at, now)))
    if info.expires_at is not None:
        rows.append(("expires", relative(info.expires_at, now)))
    rows += [
        ("started", relative(info.started_at, now)),
        ("finished", relative(info.finished_at, now)),
        ("worker", info.worker or "-"),
    ]
    if info.progress is not None:
        done = f"{info.progress:.0%}"
        rows.append(
            ("progress", f"{done} {info.progress_message}" if info.progress_message else done)
        )
    if info.progress_value is not None:
        shown = orjson.dumps(info.progress_value).decode()
        rows.append(("progress", shown if len(shown) <= 200 else shown[:199] + "…"))
    if info.lost:
        rows.append(("lost", f"its worker died while running it {info.lost} time(s)"))
    rows.append(("error", error_text(info)))
    rows.append(("history", "oldest first"))
    lines = [f"job {info.id} of queue {info.queue}"]
    lines += [f"  {label:<9} {value}" for label, value in rows]
    lines += [f"    {iso_ms(at) or '-':<29} {what}" for at, what in job_history(info)]
    if info.error is not None and info.error.traceback:
        lines.append("  traceback of the last failed try:")
        lines += [f"    {line}" for line in info.error.traceback.rstrip().splitlines()]
    # Names, ids, arguments, messages and the traceback come from Redis: each line is
    # shown literally (the traceback keeps its own lines).
    return [printable(line) for line in lines]


def dead_jobs_table(queue: str, dead: Sequence[JobInfo], now: datetime) -> Table:
    """Dead jobs with their last errors (``streamkit jobs dlq list``)."""
    table = Table(title=f"dead jobs of queue {queue}", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("job", overflow="fold")
    table.add_column("failed", no_wrap=True)
    table.add_column("tries", justify="right", no_wrap=True)
    table.add_column("error", overflow="fold", ratio=1)
    for info in dead:
        first_line = error_text(info).splitlines()[0] if info.error else "-"
        table.add_row(
            literal_text(info.id),
            literal_text(info.name),
            ago(info.finished_at, now),
            f"{info.tries}/{info.max_tries}",
            literal_text(first_line),
        )
    return table
