"""Lease renewals asked for at the same moment, sent to Redis as one call.

A worker holds a lease per owned partition, and :meth:`LockManager.hold` keeps each
alive with an extension every ``ttl / 3``. Sent one by one, a worker owning 512
partitions costs Redis over 150 script calls a second while nothing happens. The
holds of one manager renew on one grid (``keep_lease_alive(..., aligned=True)``), so
their renewals fall due together; :class:`Renewals` gathers the extensions asked for
in one scheduling round and sends them as one ``locks/extend_many`` call (per slot on
a Redis Cluster, per TTL, and per :data:`CHUNK` leases), each lease extended exactly
as ``locks/extend`` would, and each caller answered for its own lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import attrs
import trio

from ._errors import RedisUnavailable
from ._lua import script
from ._redis import LuaScript, is_cluster, key_slot

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ._redis import Redis

__all__ = ["CHUNK", "Renewals"]

#: The most leases one call extends (a bound on the script's time: about 1 ms).
CHUNK = 1000

_EXTEND_MANY = LuaScript(script("locks/extend_many"), hot=True)


class _Renewable(Protocol):
    """What a renewal needs of a lease (a :class:`~streamkit._locks.Lease`; named here
    by what it has, as importing the lock module would be a cycle)."""

    @property
    def key(self) -> str: ...
    @property
    def value(self) -> bytes: ...
    @property
    def ttl(self) -> float: ...


Lease = TypeVar("Lease", bound=_Renewable)


@attrs.define(eq=False)
class _Batch(Generic[Lease]):
    """The extensions asked for in one scheduling round, and, once sent, the replies."""

    leases: list[Lease] = attrs.field(factory=list)
    sent_at: float = 0.0
    replies: dict[int, Any] = attrs.field(factory=dict)
    error: BaseException | None = None
    done: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class Renewals(Generic[Lease]):
    """Sends the extensions of one lock manager's leases together.

    ``run(script, keys, args)`` runs a script as the manager does (its errors
    translated); ``answer(lease, reply, sent_at)`` turns one lease's reply, as
    ``locks/extend`` gives it, into the extended lease, or raises
    :class:`NotLockOwner`.
    """

    redis: Redis
    run: Callable[[LuaScript, list[str], list[str | int | bytes]], Awaitable[Any]]
    answer: Callable[[Lease, Any, float], Lease]
    _open: _Batch[Lease] | None = attrs.field(default=None, init=False)

    async def extend(self, lease: Lease) -> Lease:
        """Extend ``lease`` by its TTL, in one call with the others asked for now.

        Cancellation:
            As :meth:`LockManager.extend`: if cancelled after the call was sent, the
            extension may or may not have happened.

        Error handling:
            :class:`NotLockOwner` for a lease no longer ours; :class:`RedisUnavailable`
            (or the error of the call) for every lease of a call that failed.
        """
        batch = self._open
        if batch is not None:
            index = len(batch.leases)
            batch.leases.append(lease)
            await batch.done.wait()
            return self._outcome(batch, index)
        batch = self._open = _Batch[Lease]([lease])
        try:
            # The other holds whose renewal falls due now run before this returns.
            await trio.lowlevel.checkpoint()
            self._open = None
            batch.sent_at = trio.current_time()
            await self._send(batch)
        except BaseException as exc:
            batch.error = exc
            raise
        finally:
            if self._open is batch:
                self._open = None
            batch.done.set()
        return self._outcome(batch, 0)

    def _outcome(self, batch: _Batch[Lease], index: int) -> Lease:
        if index in batch.replies:
            return self.answer(batch.leases[index], batch.replies[index], batch.sent_at)
        error = batch.error
        if isinstance(error, Exception):
            raise error
        raise RedisUnavailable(None, "the call extending this lease with others was cancelled")

    async def _send(self, batch: _Batch[Lease]) -> None:
        groups: dict[tuple[int, int], list[int]] = {}
        cluster = is_cluster(self.redis)
        for index, lease in enumerate(batch.leases):
            ttl_ms = max(1, round(lease.ttl * 1000))
            groups.setdefault((ttl_ms, key_slot(lease.key) if cluster else 0), []).append(index)
        calls = [
            (ttl_ms, indexes[start : start + CHUNK])
            for (ttl_ms, _), indexes in groups.items()
            for start in range(0, len(indexes), CHUNK)
        ]

        async def one(ttl_ms: int, indexes: list[int]) -> None:
            leases = [batch.leases[i] for i in indexes]
            replies = await self.run(
                _EXTEND_MANY, [lease.key for lease in leases], [ttl_ms, *(x.value for x in leases)]
            )
            batch.replies.update(zip(indexes, replies, strict=True))

        if len(calls) == 1:
            await one(*calls[0])
            return
        async with trio.open_nursery() as nursery:
            for ttl_ms, indexes in calls:
                nursery.start_soon(one, ttl_ms, indexes)
