"""Keys that vanished under their users: the evidence that Redis lost its data.

A lease whose lock is gone while it was still held, a consumer group gone while its
partition was read, a membership state gone while its members ran: each piece meets
one of these on its own, per partition, and would say so on its own (twenty lines for
one ``FLUSHALL``). Instead each reports it here, on the :class:`Vanished` of its Redis
client (``health_of(redis).vanished``). A worker watches it
(:mod:`streamkit._data_loss`) and says what happened once per processor, at ERROR when
the evidence shows that Redis lost data; the pieces then log their own lines at DEBUG.
Without a watcher (a piece composed on its own), each report is said at WARNING as it
comes.
"""

from __future__ import annotations

import logging
from typing import Literal

import attrs
import trio
import trio_util

from ._keys import parse_partition_lock_name

__all__ = ["VANISHED", "Episode", "Vanished", "VanishedKind", "lost_to_vanishing"]

log = logging.getLogger("streamkit.redis")

#: How the reason of a lease lost to its lock vanishing begins (see
#: :func:`lost_to_vanishing`).
VANISHED = "the lock vanished while the lease was still valid"

#: What vanished: a lease's lock, a consumer group, a membership state, a stream's
#: recorded metadata.
VanishedKind = Literal["lease", "group", "membership", "metadata"]

_WHAT: dict[str, str] = {
    "lease": "the lock of a held lease",
    "group": "a consumer group",
    "membership": "the membership state",
    "metadata": "the stream's metadata",
}


def lost_to_vanishing(reason: str) -> bool:
    """Whether a lease was lost because its lock vanished while the lease was valid
    (deleted, or Redis lost its data): reported to :class:`Vanished`, said once."""
    return reason.startswith(VANISHED)


@attrs.define(eq=False)
class Episode:
    """What vanished in one scope (a processor's group) since it was last taken.

    Attributes:
        scope: the group (``app.stream.processor``), or a lock's name.
        first_at: when (Trio time) the first report came.
        partitions: the partitions each kind vanished on (``-1``: not a partition's).
        details: one detail per kind, the first reported.
    """

    scope: str
    first_at: float
    partitions: dict[str, set[int]] = attrs.field(factory=dict)
    details: dict[str, str] = attrs.field(factory=dict)

    def add(self, kind: str, partition: int | None, detail: str) -> None:
        self.partitions.setdefault(kind, set()).add(-1 if partition is None else partition)
        self.details.setdefault(kind, detail)

    @property
    def kinds(self) -> set[str]:
        """The kinds of key that vanished."""
        return set(self.partitions)


@attrs.define(eq=False)
class Vanished:
    """The keys that vanished under the users of one Redis client (see the module docs).

    Attributes:
        watched: whether a watcher says what vanished (then pieces log at DEBUG).
        reports: the number of reports so far; a watcher waits for it to change.
    """

    watched: bool = False
    reports: trio_util.AsyncValue[int] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(0)
    )
    _episodes: dict[str, Episode] = attrs.field(init=False, factory=dict)

    def report(
        self, scope: str, kind: VanishedKind, *, partition: int | None = None, detail: str = ""
    ) -> int:
        """Record that a ``kind`` key of ``scope`` (of ``partition``) vanished.

        Returns:
            the level the reporting piece logs its own line at: DEBUG when a watcher
            says it for all, else WARNING (this reports it then, on its own).
        """
        if kind == "lease":
            # A partition's lease counts for its processor's group.
            owner = parse_partition_lock_name(scope)
            if owner is not None:
                scope, partition = owner
        episode = self._episodes.get(scope)
        if episode is None:
            episode = self._episodes[scope] = Episode(scope, trio.current_time())
        episode.add(kind, partition, detail)
        self.reports.value += 1
        if self.watched:
            return logging.DEBUG
        where = "" if partition is None else f" (partition {partition})"
        log.warning(
            "%s of %s vanished%s: deleted, or Redis lost its data%s",
            _WHAT[kind],
            scope,
            where,
            f" ({detail})" if detail else "",
        )
        return logging.DEBUG

    @property
    def pending(self) -> bool:
        """Whether reports came since the last :meth:`take`."""
        return bool(self._episodes)

    def take(self) -> list[Episode]:
        """The episodes reported since the last take, oldest first."""
        episodes = sorted(self._episodes.values(), key=lambda e: e.first_at)
        self._episodes = {}
        return episodes
