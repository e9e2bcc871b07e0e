"""What happens to a client's connections: counted, reported in the log, summed up.

:class:`Health` hears every connection a pool opens, every one that could not be
opened and every one that ends; with what the client's users report
(:func:`~streamkit._redis.health_of`), it keeps the client's :class:`OutageLog`: an
outage is said once, summed up every 30 seconds, and its end said in one line,
however many partitions, pools and retry loops meet it. :class:`RedisStatistics` is
the snapshot users see.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs
import trio

from .._errors import RedisUnavailable, ServerRefused
from .._outage import OutageLog
from .._vanished import Vanished
from ._translate import reason

if TYPE_CHECKING:
    from coredis.connection import BaseConnection

__all__ = ["LOSS_REPORT_INTERVAL", "Health", "RedisStatistics"]

#: Seconds after an outage was reported during which a new one is only counted (and
#: reported by its first summary if it lasts).
LOSS_REPORT_INTERVAL = 10.0

log = logging.getLogger("streamkit.redis")


@attrs.frozen
class RedisStatistics:
    """A snapshot of a client's connections (see :func:`redis_statistics`).

    Attributes:
        shared_connections: open connections of the shared (multiplexed) pool,
            and of the hot scripts' pool (multiplexed too, see ``docs/redis.md``).
        dedicated_connections: open dedicated connections, idle or running a command.
        dedicated_in_use: dedicated connections running a command now.
        discarded: dedicated connections thrown away because the command on them was
            cancelled or timed out (their state was unknown).
        lost: connections lost unexpectedly (server closed or killed them, network).
        reconnects: times a connection was opened again after one was lost.
    """

    shared_connections: int
    dedicated_connections: int
    dedicated_in_use: int
    discarded: int
    lost: int
    reconnects: int


@attrs.define(eq=False)
class Health:
    """What happened to a client's connections; reports its outages.

    A lost connection, a connection that could not be opened and a failure its users
    report (:meth:`unavailable`) all go to :attr:`outage`, which warns once, sums
    up at a steady interval and says when Redis is back (the next connection opened,
    or a command answered). While :func:`~streamkit.open_redis` is still connecting,
    the pools' failures are left to its own retry loop, which reports to the same log.
    """

    url: str
    lost: int = 0
    discarded: int = 0
    reconnects: int = 0
    #: The client's outages, said once each.
    outage: OutageLog = attrs.field(init=False)
    #: Keys that vanished under the client's users (see :mod:`streamkit._vanished`).
    vanished: Vanished = attrs.field(init=False, factory=Vanished)
    #: Still connecting (open_redis's first ping): its retry loop reports failures.
    connecting: bool = True
    _lost_since_reconnect: bool = False
    # A cluster's masters, as its client last learned them.
    _masters: list[str] | None = None

    def __attrs_post_init__(self) -> None:
        self.outage = OutageLog(f"Redis at {self.url}", announce_gap=LOSS_REPORT_INTERVAL)

    def unavailable(self, exc: RedisUnavailable, *, what: str) -> None:
        """A user of the client met ``exc`` while doing ``what``, and will try again."""
        self.outage.failed(exc.reason, what=what, refused=isinstance(exc, ServerRefused))

    def learned_layout(self, masters: list[str]) -> None:
        """A cluster client learned the cluster's layout: warn if its masters changed."""
        if self._masters is not None and masters != self._masters:
            log.warning(
                "the Redis Cluster at %s has other masters now (a failover, or nodes "
                "added or removed): %s, before %s; commands go to the new ones",
                self.url,
                ", ".join(masters),
                ", ".join(self._masters),
            )
        self._masters = masters

    def established(self) -> None:
        """A connection was opened: Redis answers."""
        if self._lost_since_reconnect:
            self.reconnects += 1
            self._lost_since_reconnect = False
        self.outage.answered()

    def could_not_connect(self, exc: BaseException) -> None:
        """A connection could not be opened."""
        if not self.connecting:
            self.outage.failed(reason(exc), what="opening a connection")

    def ended(self, connection: BaseConnection, *, dedicated: bool) -> None:
        """A connection that was opened ended: closed on purpose, discarded or lost."""
        error = connection._last_error
        if error is None:
            # Closed on purpose: discarded after a cancelled command, or shut down.
            if connection._terminated and dedicated:
                self.discarded += 1
                log.debug("discarded a dedicated connection to Redis at %s", self.url)
            return
        self.lost += 1
        self._lost_since_reconnect = True
        log.debug(
            "lost a connection to Redis at %s (%s); commands in flight on it have an "
            "unknown outcome and are not sent again",
            self.url,
            reason(error),
        )
        self.outage.failed(f"lost a connection ({reason(error)})", what="a connection")


def _cancelled_in(exc: BaseException | None, depth: int = 0) -> bool:
    if exc is None or depth > 10:
        return False
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup) and any(
        _cancelled_in(e, depth + 1) for e in exc.exceptions
    ):
        return True
    return _cancelled_in(exc.__cause__ or exc.__context__, depth + 1)


class _NoCancelledConnectNoise(logging.Filter):
    """Drops coredis's ERROR record for a connection attempt that was cancelled.

    coredis logs "Connection attempt failed unexpectedly!" with a traceback when the
    command that opens a connection is cancelled during the handshake: nothing failed.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            return not _cancelled_in(record.exc_info[1])
        return True


if not any(isinstance(f, _NoCancelledConnectNoise) for f in logging.getLogger("coredis").filters):
    logging.getLogger("coredis").addFilter(_NoCancelledConnectNoise())
