"""What happens to a client's connections: counted, reported in the log, summed up.

:class:`Health` hears every connection a pool opens and every one that ends, warns
once about a loss (and once about the recovery) without flooding the log on a
flapping network, and counts; :class:`RedisStatistics` is the snapshot users see.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

import attrs
import trio

from ._translate import reason

if TYPE_CHECKING:
    from coredis.connection import BaseConnection

__all__ = ["LOSS_REPORT_INTERVAL", "Health", "RedisStatistics"]

#: Seconds after a lost connection was reported during which further losses are only
#: counted (and logged at debug level).
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
    """What happened to a client's connections; reports losses and recoveries.

    A lost connection is logged as a warning, and so is the next connection opened
    after it. Losses within :data:`LOSS_REPORT_INTERVAL` of a reported one are logged
    at debug level only, and counted in the next warning: a flapping network does not
    flood the log.
    """

    url: str
    lost: int = 0
    discarded: int = 0
    reconnects: int = 0
    _down_since: float | None = None
    _reported_at: float = -math.inf
    _reported_down: bool = False
    _unreported: int = 0
    # A cluster's masters, as its client last learned them.
    _masters: list[str] | None = None

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
        """A connection was opened."""
        if self._down_since is None:
            return
        self.reconnects += 1
        if self._reported_down:
            log.warning(
                "reconnected to Redis at %s (%.2fs after a connection was lost)",
                self.url,
                time.monotonic() - self._down_since,
            )
        else:
            log.debug("reconnected to Redis at %s", self.url)
        self._down_since = None
        self._reported_down = False

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
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        if now - self._reported_at < LOSS_REPORT_INTERVAL or self._reported_down:
            self._unreported += 1
            log.debug("lost a connection to Redis at %s: %s", self.url, reason(error))
            return
        more = f" ({self._unreported} more lost since the last report)" if self._unreported else ""
        log.warning(
            "lost a connection to Redis at %s (%s)%s; commands in flight on it have an "
            "unknown outcome and are not sent again; reconnecting",
            self.url,
            reason(error),
            more,
        )
        self._reported_at = now
        self._reported_down = True
        self._unreported = 0


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
