"""The terminal views of a fleet snapshot: ``streamkit status`` and its ``--watch``.

Pure: a snapshot (with its rates) and a terminal size in, rich renderables out. The
views fit the terminal's width: a title says less rather than wrap (:func:`fitted`),
every row is one line, and a table's flexible column (a worker, a job name) gets the
room the others leave. When the rows do not fit the height, the watch view keeps each
table's most telling rows (halted, then the most lag) and says how many it left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .._literal import printable
from .._state_late import total_late
from ._fleet import (
    NO_RATES,
    FleetRates,
    FleetSample,
    FleetSnapshot,
    ProcessorSnapshot,
    QueueSnapshot,
    counts_by_name,
    partition_worker,
    worker_names,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from rich.console import RenderableType

    from ._admin import PartitionStatus

__all__ = [
    "ago",
    "compact",
    "fit_rows",
    "fitted",
    "fleet_view",
    "halted_lines",
    "head_line",
    "jobs_table",
    "jobs_title",
    "members_table",
    "partitions_table",
    "pick_rows",
    "processor_title",
    "status_view",
]

#: The job counts the view shows per job name, in order.
JOB_COLUMNS = ("queued", "scheduled", "waiting", "running", "retrying", "dead", "succeeded")
#: Lines a table takes besides its rows: its title, its header, the header's rule.
TABLE_LINES = 3
#: Spaces between two columns of a table (right padding and divider).
COLUMN_GAP = 2


def compact(number: float | None) -> str:
    """``987``, ``9,876``, ``98.8k``, ``9.88M``: short enough for a narrow column."""
    if number is None:
        return "?"
    if abs(number) < 100_000:
        return f"{number:,.0f}" if number == int(number) or abs(number) >= 100 else f"{number:.1f}"
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(number) >= size:
            scaled = number / size
            return f"{scaled:.3g}{unit}" if scaled < 1000 else f"{scaled:,.0f}{unit}"
    return f"{number:,.0f}"  # pragma: no cover (unreachable: >= 100k is >= 1e3)


def ago(moment: datetime | None, now: datetime) -> str:
    """``5s ago``, ``3m ago``, ``2h ago``, ``4d ago``: short enough for a narrow table."""
    if moment is None:
        return "-"
    seconds = max(0, int((now - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def fit_rows(wanted: Sequence[int], budget: int) -> list[int]:
    """How many lines each table gets for its rows, out of ``budget`` (pure).

    Every table gets one line first (if the budget allows), then the lines left go
    round the tables that want more, one at a time, so a long table cannot starve
    the others. No table gets more than it wants.
    """
    given = [0] * len(wanted)
    left = max(0, budget)
    while left > 0:
        progressed = False
        for i, want in enumerate(wanted):
            if left > 0 and given[i] < want:
                given[i] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    return given


def pick_rows(rows: Sequence[PartitionStatus], lines: int) -> tuple[list[PartitionStatus], int]:
    """The partitions to show in ``lines`` lines, and how many are left out (pure).

    All of them when they fit. Otherwise ``lines - 1`` rows (one line says how many
    more there are): the halted partitions first, then those with the most lag,
    then the most pending; shown in partition order.
    """
    if len(rows) <= lines:
        return list(rows), 0
    keep = max(0, lines - 1)
    ranked = sorted(
        rows,
        key=lambda r: (r.halted is None, -(r.lag or 0), -r.pending, r.partition),
    )
    kept = sorted(ranked[:keep], key=lambda r: r.partition)
    return kept, len(rows) - len(kept)


def _worker_width(width: int, other: Sequence[Sequence[str]]) -> int:
    """The width left for a table's flexible column, given the other columns' cells."""
    fixed = sum(max(len(cell) for cell in column) for column in other)
    return max(8, width - fixed - COLUMN_GAP * len(other))


def _table() -> Table:
    # No padding on the left of a cell: columns are COLUMN_GAP apart (the right
    # padding and the divider), which leaves names their room on 80 columns.
    return Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        title_justify="left",
        padding=(0, 1, 0, 0),
    )


def _line(text: str | Text, *, style: str = "") -> Text:
    line = text if isinstance(text, Text) else Text(text, style=style)
    line.no_wrap = True
    line.overflow = "ellipsis"
    return line


Piece = tuple[str, str]


def fitted(candidates: Sequence[Sequence[Piece]], width: int) -> Text:
    """The first of ``candidates`` (each a line as pieces of text and style, the
    richest first) that fits ``width`` columns: a title says less rather than
    wrap or cut; only the last, the barest, is cut (with an ellipsis) if even it
    does not fit."""
    chosen = candidates[-1]
    for pieces in candidates:
        if sum(len(text) for text, _ in pieces) <= width:
            chosen = pieces
            break
    return _line(Text.assemble(*chosen))


def _workers(count: int) -> str:
    return f"{count} worker{'s' if count != 1 else ''}"


def processor_title(processor: ProcessorSnapshot, rates: FleetRates, width: int = 80) -> Text:
    """The processor, its totals and its workers, in one line that fits ``width``:
    the stream's name and the workers' names go first when it would not."""
    alive = [m.name for m in processor.members if m.alive]
    halted = sum(1 for p in processor.partitions if p.halted is not None)
    rate = rates.processors.get(processor.name)
    stats = [
        f"{compact(rate)} events/s" if rate is not None else None,
        f"lag {compact(processor.lag)}",
        f"pending {compact(processor.pending)}",
        f"late {compact(processor.late)}" if processor.windows else None,
        _workers(len(alive)),
    ]
    totals: list[Piece] = [(" · ".join(p for p in stats if p), "")]
    if halted:
        totals.append((" · ", ""))
        totals.append((f"{halted} HALTED", "bold red"))
    name: Piece = (f"processor {printable(processor.name)}", "bold")
    stream: Piece = (f" (stream {printable(processor.stream)})", "")
    names: Piece = (f" ({printable(', '.join(alive))})", "") if alive else ("", "")
    return fitted(
        [
            [name, stream, (": ", ""), *totals, names],
            [name, stream, (": ", ""), *totals],
            [name, (": ", ""), *totals],
        ],
        width,
    )


def _worker_cell(row: PartitionStatus, names: dict[str, str], *, why: bool) -> str:
    """Who processes the partition; ``HALTED`` first when it is halted (with the
    error's type when ``why``: the watch view has no summary under the table)."""
    worker = printable(partition_worker(row, names))
    if row.halted is None:
        return worker
    halted = f"HALTED ({printable(row.halted.error_type or 'halted')})" if why else "HALTED"
    return halted if worker == "-" else f"{halted} · {worker}"


def partitions_table(
    processor: ProcessorSnapshot,
    rows: Sequence[PartitionStatus],
    rates: FleetRates | None,
    now: datetime,
    width: int,
) -> Table:
    """A processor's partitions, one line each: who processes it (``HALTED`` when
    halted), lag and pending; with ``rates`` (the watch view) the events/s, without
    (``streamkit status``) the entries and the keys of each table it writes; for a
    processor writing windowed tables, its late events (``late``); for a join's, its
    buffered events (``buffered``)."""
    names = worker_names(processor.members)
    tables = processor.tables if rates is None else ()
    # Late window events (dropped or dead-lettered), over the windowed tables.
    late = ("late",) if processor.windows else ()
    # A stream-stream join's events waiting for a match or for their window to close.
    buffered = ("buffered",) if any(row.buffered for row in rows) else ()
    headers = (
        "part",
        "worker",
        *(("entries",) if rates is None else ()),
        "lag",
        "pending",
        *(("events/s",) if rates is not None else ()),
        *(printable(t) for t in tables),
        *late,
        *buffered,
        "last event",
    )
    cells: list[tuple[str, ...]] = []
    halted: list[bool] = []
    for row in rows:
        if rates is not None:
            rate = rates.partitions.get((processor.name, row.partition))
            middle: tuple[str, ...] = (
                compact(row.lag),
                compact(row.pending),
                "-" if rate is None else compact(rate),
            )
        else:
            middle = (compact(row.length), compact(row.lag), compact(row.pending))
        halted.append(row.halted is not None)
        cells.append(
            (
                str(row.partition),
                _worker_cell(row, names, why=rates is not None),
                *middle,
                # (a global table's keys: on the first partition's line only)
                *(compact(row.tables[t]) if t in row.tables else "" for t in tables),
                *((compact(total_late(row.late)),) if late else ()),
                *((compact(sum(row.buffered.values())),) if buffered else ()),
                ago(row.last_event_at, now),
            )
        )
    others = [[headers[i], *(c[i] for c in cells)] for i in range(len(headers)) if i != 1]
    table = _table()
    table.add_column("part", justify="right", no_wrap=True)
    table.add_column(
        "worker", no_wrap=True, overflow="ellipsis", max_width=_worker_width(width, others)
    )
    for header in headers[2:-1]:
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("last event", no_wrap=True)
    for values, red in zip(cells, halted, strict=True):
        # The worker cell holds text from Redis: a Text, never read as markup.
        table.add_row(values[0], Text(values[1]), *values[2:], style="red" if red else None)
    return table


def jobs_title(queue: QueueSnapshot, rates: FleetRates, width: int = 80) -> Text:
    """The queue's name, its ready jobs by priority, and its rate, fitting ``width``."""
    by_priority = " · ".join(f"{prio} {compact(n)}" for prio, n in queue.counts.queued.items())
    name: Piece = (f"jobs (queue {printable(queue.name)}): ", "bold")
    rate: Piece = (
        (f" · {compact(rates.jobs)} succeeded/s", "") if rates.jobs is not None else ("", "")
    )
    return fitted(
        [
            [name, (f"queued by priority: {by_priority}", ""), rate],
            [name, (f"queued {by_priority}", ""), rate],
            [name, (f"queued {by_priority}", "")],
        ],
        width,
    )


#: The columns' headers, and shorter ones for when the long ones leave a job name no room.
JOB_HEADERS = dict(zip(JOB_COLUMNS, JOB_COLUMNS, strict=True))
SHORT_JOB_HEADERS = {
    "queued": "queued",
    "scheduled": "delayed",
    "waiting": "waits",
    "running": "runs",
    "retrying": "retry",
    "dead": "dead",
    "succeeded": "done",
}


def jobs_table(queue: QueueSnapshot, names: Sequence[str], width: int) -> Table:
    """The jobs in each state: all of them, then per job name (``names``, in order).

    The counts' headers are shortened (``delayed`` for scheduled, ``done`` for
    succeeded, ...) when the full ones would leave a job name too little room.
    """
    by_name = counts_by_name(queue.counts, queue.declared)
    counts = queue.counts
    total = {
        "queued": sum(counts.queued.values()),
        "scheduled": counts.scheduled,
        "waiting": counts.waiting,
        "running": counts.running,
        "retrying": counts.retrying,
        "dead": counts.dead,
        "succeeded": counts.succeeded,
    }
    cells = [("all jobs", *(compact(total[c]) for c in JOB_COLUMNS))]
    cells += [
        (printable(name), *(compact(by_name[name][c]) for c in JOB_COLUMNS)) for name in names
    ]
    longest = max(len(row[0]) for row in cells)
    for headers in (JOB_HEADERS, SHORT_JOB_HEADERS):
        others = [
            [headers[column], *(c[i + 1] for c in cells)] for i, column in enumerate(JOB_COLUMNS)
        ]
        if _worker_width(width, others) >= longest:
            break
    table = _table()
    table.add_column(
        "job", no_wrap=True, overflow="ellipsis", max_width=_worker_width(width, others)
    )
    for column in JOB_COLUMNS:
        table.add_column(headers[column], justify="right", no_wrap=True)
    for i, row in enumerate(cells):
        # Job names come from Redis: a Text, never read as markup.
        table.add_row(Text(row[0]), *row[1:], style="bold" if i == 0 else None)
    return table


def _job_names(queue: QueueSnapshot, lines: int) -> tuple[list[str], int]:
    """The job names to show in ``lines`` lines (the busiest), and how many are left out."""
    by_name = counts_by_name(queue.counts, queue.declared)
    names = list(by_name)
    if len(names) <= lines:
        return names, 0
    keep = max(0, lines - 1)
    busy = sorted(
        names, key=lambda n: -sum(by_name[n][c] for c in JOB_COLUMNS if c != "succeeded")
    )[:keep]
    return [n for n in names if n in busy], len(names) - keep


@attrs.frozen(kw_only=True)
class _Section:
    title: Text
    wanted: int


def fleet_view(
    sample: FleetSample,
    *,
    width: int,
    height: int | None,
    now: datetime,
    footer: str = "",
) -> RenderableType:
    """The status view of ``sample``, fitting ``width`` columns and ``height`` lines
    (``None``: any height; every row is shown)."""
    snapshot = sample.snapshot
    rates = sample.rates if sample.error is None else NO_RATES
    lines: list[RenderableType] = []
    if snapshot is None:
        lines.append(_line(f"no reading yet: {printable(sample.error)}", style="red"))
        return Group(*lines)
    lines.append(head_line(snapshot, width, footer))
    if sample.error is not None:
        lines.append(
            _line(
                f"reading failed: {printable(sample.error)}; showing the last reading",
                style="bold red",
            )
        )
    sections: list[_Section] = [
        _Section(title=processor_title(p, rates, width), wanted=len(p.partitions))
        for p in snapshot.processors
    ]
    queue = snapshot.jobs
    if queue is not None:
        names = len(counts_by_name(queue.counts, queue.declared))
        sections.append(_Section(title=jobs_title(queue, rates, width), wanted=names))
    if not sections:
        lines.append(_line(f"app {printable(snapshot.app)} has no processors and no jobs"))
        return Group(*lines)
    # A blank line, a title and a table's header and rule per section, and the jobs'
    # "all jobs" row: then the rows, as many as fit.
    fixed = len(lines) + 4 * len(sections) + (1 if queue is not None else 0)
    wanted = [s.wanted for s in sections]
    given = wanted if height is None else fit_rows(wanted, height - fixed)
    for processor, section, rows in zip(snapshot.processors, sections, given, strict=False):
        lines += [Text(""), section.title]
        shown, more = pick_rows(processor.partitions, rows)
        lines.append(partitions_table(processor, shown, rates, now, width))
        if more:
            lines.append(_line(f"… {more} more partitions (the busiest are shown)", style="dim"))
    if queue is not None:
        lines += [Text(""), sections[-1].title]
        shown_names, more = _job_names(queue, given[-1])
        lines.append(jobs_table(queue, shown_names, width))
        if more:
            lines.append(_line(f"… {more} more jobs (the busiest are shown)", style="dim"))
    return Group(*lines)


def head_line(snapshot: FleetSnapshot, width: int, footer: str = "") -> Text:
    """The app, its Redis and the reading's time (and ``footer``), fitting ``width``."""
    app: Piece = (printable(f"app {snapshot.app}, Redis at {snapshot.redis_url}"), "")
    at: Piece = (f" · {snapshot.taken_at:%H:%M:%S}", "")
    more: Piece = (f" · {footer}", "") if footer else ("", "")
    return fitted([[app, at, more], [app, at], [app]], width)


def status_view(snapshot: FleetSnapshot, *, app_path: str, width: int, now: datetime) -> Group:
    """What ``streamkit status`` prints (pure): per processor its workers and every
    partition, the halted ones summed up with the command that resumes them; then the
    job queue. Every line fits ``width`` columns."""
    lines: list[RenderableType] = [head_line(snapshot, width)]
    if not snapshot.processors:
        lines.append(_line(f"app {printable(snapshot.app)} has no processors"))
    for processor in snapshot.processors:
        lines += [Text(""), processor_title(processor, NO_RATES, width)]
        lines += data_loss_lines(processor, now)
        lines += reset_lines(processor, now)
        lines.append(members_table(processor, now, width))
        lines.append(partitions_table(processor, processor.partitions, None, now, width))
        lines += halted_lines(processor, app_path, width, now)
    queue = snapshot.jobs
    if queue is not None:
        lines += [Text(""), jobs_title(queue, NO_RATES, width)]
        lines.append(jobs_table(queue, list(counts_by_name(queue.counts, queue.declared)), width))
    return Group(*lines)


def members_table(processor: ProcessorSnapshot, now: datetime, width: int = 80) -> RenderableType:
    """The workers of a processor, alive or not (``streamkit status``)."""
    if not processor.members:
        # A clean stop leaves the group without members: say which case it is.
        if processor.ever_run:
            return _line("no worker runs it now (the last one left or was reaped)", style="dim")
        return _line("no worker has run it yet", style="dim")
    cells = []
    for m in processor.members:
        if m.alive:
            state = "alive"
        elif m.static:
            state = "dead (static: its partitions wait for it)"
        else:
            state = "dead (not reaped yet)"
        cells.append((printable(m.name), state, ago(m.joined_at, now)))
    others = [["state", *(c[1] for c in cells)], ["joined", *(c[2] for c in cells)]]
    table = _table()
    table.add_column(
        "worker", no_wrap=True, overflow="ellipsis", max_width=_worker_width(width, others)
    )
    table.add_column("state", no_wrap=True)
    table.add_column("joined", no_wrap=True)
    for name, state, joined in cells:
        # Names come from Redis: a Text, never read as markup.
        table.add_row(Text(name), state, joined, style=None if state == "alive" else "dim")
    return table


def reset_lines(processor: ProcessorSnapshot, now: datetime) -> list[Text]:
    """The last reset of the processor (``streamkit reset``), for a week: where its
    partitions read from since, and the events it could not replay (trimmed)."""
    reset = processor.last_reset
    if reset is None:
        return []
    where = printable(reset.where)
    scope = "" if reset.partitions is None else f" (partitions {reset.partitions})"
    state = {"clear": " · state rebuilt", "keep": " · state kept"}.get(reset.state or "", "")
    lines = [_line(f"reset {ago(reset.at, now)}: reads {where}{scope}{state}", style="dim")]
    if reset.gone:
        lines.append(
            _line(f"  {reset.gone:,} event(s) were gone (trimmed): not replayed", style="yellow")
        )
    return lines


def data_loss_lines(processor: ProcessorSnapshot, now: datetime) -> list[Text]:
    """The last data loss a worker found for the processor, in red (wrapped: it is the
    one thing the operator must read)."""
    loss = processor.data_loss
    if loss is None:
        return []
    tables = ", ".join(processor.tables)
    consequence = f" Tables ({tables}) may have lost updates." if tables else ""
    line = Text(
        f"DATA LOSS {ago(loss.at, now)} ({loss.at:%Y-%m-%d %H:%M:%S} UTC, found by "
        f"{printable(loss.by)}): Redis lost {printable(loss.what)}.{consequence}",
        style="bold red",
    )
    return [line]


def halted_lines(
    processor: ProcessorSnapshot, app_path: str, width: int, now: datetime
) -> list[Text]:
    """The processor's halted partitions summed up in a line (the first one's error;
    ``--json`` has each one's), then the exact command that resumes them: on the
    same line when it fits, else on a line of its own, never cut (it is to be
    copied)."""
    halted = [row for row in processor.partitions if row.halted is not None]
    if not halted:
        return []
    first = halted[0].halted
    assert first is not None
    error = f"{first.error_type}: {first.error}" if first.error_type else first.error
    # Where it halted last: the part cut first when the line is too long.
    where = f" (on {first.worker})"
    if len(halted) == 1:
        what = f"partition {halted[0].partition} HALTED {ago(first.since, now)}: "
        command = f"streamkit resume {app_path} {processor.name} --partition {halted[0].partition}"
        event = "event"
    else:
        numbers = ", ".join(str(row.partition) for row in halted)
        what = f"partitions {numbers} HALTED, the first {ago(first.since, now)}: "
        # Without --partition, resume resumes every halted partition of the processor.
        command = f"streamkit resume {app_path} {processor.name}"
        event = "events"
    summary = _line(
        Text.assemble((printable(what), "bold red"), printable(error), printable(where))
    )
    command = printable(command)
    prefix = "fix the cause, then: "
    skip = f" (--skip skips the {event})"
    if len(prefix) + len(command) <= width:
        lines = [prefix + command + (skip if len(prefix + command + skip) <= width else "")]
    else:
        lines = [f"fix the cause, then run{skip if len(prefix + skip) <= width else ''}:", command]
    return [summary, *(Text(line, no_wrap=True, overflow="ignore") for line in lines)]
