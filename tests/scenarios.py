"""Helpers for scenario tests: sending numbered events and checking what was seen."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import TYPE_CHECKING

import attrs

from tests.apps.scenario import SEEN, Numbered

if TYPE_CHECKING:
    from streamkit import Redis, Stream


def numbered_events(keys: int, per_key: int, *, start: int = 0) -> list[Numbered]:
    """``per_key`` events for each of ``keys`` keys, interleaved, seq from ``start``."""
    return [
        Numbered(key=f"k{k}", seq=seq) for seq in range(start, start + per_key) for k in range(keys)
    ]


@attrs.frozen
class Tally:
    """What the processors saw, against what was sent."""

    sent: int
    processed: int
    lost: int
    duplicated: int
    order_violations: int
    workers: frozenset[str]

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.order_violations == 0


def tally(sent: list[Numbered], seen: list[bytes]) -> Tally:
    """Count losses, duplicates and order violations.

    An order violation is an event processed for the first time before an earlier
    event of its key was: redeliveries after a crash may repeat events, but a key's
    events must first be processed in sequence.
    """
    expected = {(e.key, e.seq) for e in sent}
    first_seen: dict[str, list[int]] = defaultdict(list)
    counts: dict[tuple[str, int], int] = defaultdict(int)
    workers = set()
    for item in seen:
        key, seq_text, worker = item.decode().split(":", 2)
        seq = int(seq_text)
        counts[key, seq] += 1
        workers.add(worker)
        if counts[key, seq] == 1:
            first_seen[key].append(seq)
    violations = sum(
        1
        for seqs in first_seen.values()
        for before, after in itertools.pairwise(seqs)
        if after < before
    )
    return Tally(
        sent=len(sent),
        processed=len(seen),
        lost=len(expected - set(counts)),
        duplicated=sum(n - 1 for n in counts.values()),
        order_violations=violations,
        workers=frozenset(workers),
    )


async def seen(redis: Redis) -> list[bytes]:
    items = await redis.lrange(SEEN, 0, -1)
    return [i if isinstance(i, bytes) else i.encode() for i in items]


async def send_numbered(stream: Stream[Numbered], events: list[Numbered]) -> None:
    await stream.send_many(events)
