"""Splitting the items of a batch into script calls by count, cost and bytes (pure).

One script call runs to its end while Redis serves no one else, and its request must
fit Redis' limits: a batch of jobs to enqueue or outcomes to record goes in calls of at
most ``max_cost`` (jobs, plus the dependencies they name) and about ``max_bytes``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = ["MAX_CALL_BYTES", "chunks"]

#: Bytes of arguments per script call, about: an item larger than this goes alone.
MAX_CALL_BYTES = 512 * 1024


def chunks(
    sizes: Sequence[int],
    *,
    max_cost: int,
    max_bytes: int = MAX_CALL_BYTES,
    costs: Sequence[int] | None = None,
) -> Iterator[range]:
    """The ranges of item indexes, in order, that make one call each.

    Args:
        sizes: each item's bytes.
        max_cost: the most cost per call (each item costs 1 unless ``costs`` says).
        max_bytes: the most bytes per call, unless a single item is larger (it goes
            alone).
        costs: each item's cost, if not 1.

    Every range holds at least one item.
    """
    start, cost, size = 0, 0, 0
    for i, item_size in enumerate(sizes):
        item_cost = 1 if costs is None else costs[i]
        if i > start and (cost + item_cost > max_cost or size + item_size > max_bytes):
            yield range(start, i)
            start, cost, size = i, 0, 0
        cost += item_cost
        size += item_size
    if start < len(sizes):
        yield range(start, len(sizes))
