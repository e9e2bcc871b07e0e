"""The terminal view of a fleet snapshot, for ``streamkit status`` (and ``--watch``).

Pure: a snapshot (with its rates) and a terminal size in, rich renderables out. The
view fits the terminal: every row is one line (cells are cut with an ellipsis), and
when the rows do not fit the height, each table keeps its most telling rows (halted,
then the most lag) and says how many it left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .._literal import literal_text, printable
from ._fleet import (
    NO_RATES,
    FleetRates,
    FleetSample,
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
    "fleet_view",
    "jobs_table",
    "members_table",
    "pick_rows",
    "status_table",
]

#: The job counts the view shows per job name, in order.
JOB_COLUMNS = ("queued", "scheduled", "waiting", "running", "retrying", "dead", "succeeded")
#: Lines a table takes besides its rows: its title, its header, the header's rule.
TABLE_LINES = 3
#: Spaces between two columns of a table (padding and divider).
COLUMN_GAP = 3


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
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title_justify="left")


def _line(text: str | Text, *, style: str = "") -> Text:
    line = text if isinstance(text, Text) else Text(text, style=style)
    line.no_wrap = True
    line.overflow = "ellipsis"
    return line


def processor_title(processor: ProcessorSnapshot, rates: FleetRates) -> Text:
    alive = [m.name for m in processor.members if m.alive]
    rate = rates.processors.get(processor.name)
    parts = [
        f"{compact(rate)} events/s" if rate is not None else None,
        f"lag {compact(processor.lag)}",
        f"pending {compact(processor.pending)}",
        f"{len(alive)} worker{'s' if len(alive) != 1 else ''}"
        + (f": {printable(', '.join(alive))}" if alive else ""),
    ]
    title = Text(f"processor {processor.name} ", style="bold")
    title.append(f"(stream {processor.stream}): ", style="")
    title.append(" · ".join(p for p in parts if p))
    return _line(title)


def partitions_table(
    processor: ProcessorSnapshot,
    rows: Sequence[PartitionStatus],
    rates: FleetRates,
    now: datetime,
    width: int,
) -> Table:
    names = worker_names(processor.members)
    cells: list[tuple[str, ...]] = []
    halted: list[bool] = []
    for row in rows:
        rate = rates.partitions.get((processor.name, row.partition))
        worker = printable(partition_worker(row, names))
        if row.halted is not None:
            worker = f"HALTED ({printable(row.halted.error_type or 'halted')}) · {worker}"
        halted.append(row.halted is not None)
        cells.append(
            (
                str(row.partition),
                worker,
                compact(row.lag),
                compact(row.pending),
                "-" if rate is None else compact(rate),
                ago(row.last_event_at, now),
            )
        )
    headers = ("part", "worker", "lag", "pending", "events/s", "last event")
    others = [[headers[i], *(c[i] for c in cells)] for i in (0, 2, 3, 4, 5)]
    table = _table()
    table.add_column("part", justify="right", no_wrap=True)
    table.add_column(
        "worker", no_wrap=True, overflow="ellipsis", max_width=_worker_width(width, others)
    )
    for header in headers[2:5]:
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("last event", no_wrap=True)
    for values, red in zip(cells, halted, strict=True):
        # The worker cell holds text from Redis: a Text, never read as markup.
        table.add_row(values[0], Text(values[1]), *values[2:], style="red" if red else None)
    return table


def jobs_title(queue: QueueSnapshot, rates: FleetRates) -> Text:
    """The queue's name, its ready jobs by priority, and its rate."""
    by_priority = " · ".join(f"{prio} {compact(n)}" for prio, n in queue.counts.queued.items())
    title = Text(f"jobs (queue {queue.name}): ", style="bold")
    title.append(f"queued by priority: {by_priority}")
    if rates.jobs is not None:
        title.append(f" · {compact(rates.jobs)} succeeded/s")
    return _line(title)


def jobs_table(queue: QueueSnapshot, names: Sequence[str], width: int) -> Table:
    """The jobs in each state: all of them, then per job name (``names``, in order)."""
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
    others = [[JOB_COLUMNS[i], *(c[i + 1] for c in cells)] for i in range(len(JOB_COLUMNS))]
    table = _table()
    table.add_column(
        "job", no_wrap=True, overflow="ellipsis", max_width=_worker_width(width, others)
    )
    for column in JOB_COLUMNS:
        table.add_column(column, justify="right", no_wrap=True)
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
    head = printable(
        f"app {snapshot.app}, Redis at {snapshot.redis_url} · {snapshot.taken_at:%H:%M:%S}"
    )
    lines.append(_line(head + (f" · {footer}" if footer else "")))
    if sample.error is not None:
        lines.append(
            _line(
                f"reading failed: {printable(sample.error)}; showing the last reading",
                style="bold red",
            )
        )
    sections: list[_Section] = [
        _Section(title=processor_title(p, rates), wanted=len(p.partitions))
        for p in snapshot.processors
    ]
    queue = snapshot.jobs
    if queue is not None:
        names = len(counts_by_name(queue.counts, queue.declared))
        sections.append(_Section(title=jobs_title(queue, rates), wanted=names))
    if not sections:
        lines.append(_line(f"app {snapshot.app} has no processors and no jobs"))
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


def members_table(processor: ProcessorSnapshot, now: datetime) -> Table:
    """The workers of a processor, alive or not (``streamkit status``)."""
    table = Table(
        title=f"processor {processor.name} (stream {processor.stream}): workers",
        title_justify="left",
    )
    table.add_column("worker", overflow="fold", ratio=3)
    table.add_column("state", overflow="fold", ratio=2)
    table.add_column("joined", no_wrap=True)
    for m in processor.members:
        if m.alive:
            state = "alive"
        elif m.static:
            state = "dead (static: its partitions wait for it)"
        else:
            state = "dead (not reaped yet)"
        table.add_row(literal_text(m.name), state, ago(m.joined_at, now))
    if not processor.members:
        table.add_row("-", "no worker has run it", "-")
    return table


def status_table(processor: ProcessorSnapshot, now: datetime) -> Table:
    """Every partition of a processor, with its entries (``streamkit status``)."""
    names = worker_names(processor.members)
    table = Table(
        title=f"processor {processor.name} (stream {processor.stream}): partitions",
        title_justify="left",
    )
    table.add_column("partition", justify="right", no_wrap=True)
    table.add_column("worker", overflow="fold", ratio=1)
    for column in ("entries", "lag", "pending"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("last event", no_wrap=True)
    for row in processor.partitions:
        table.add_row(
            str(row.partition),
            literal_text(partition_worker(row, names)),
            f"{row.length:,}",
            "?" if row.lag is None else f"{row.lag:,}",
            f"{row.pending:,}",
            ago(row.last_event_at, now),
        )
    return table
