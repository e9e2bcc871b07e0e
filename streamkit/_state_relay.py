"""The outbox relay: records a processor emitted on Redis Cluster, moved on exactly once.

On Redis Cluster a partition's commit can only write keys of the partition's own hash
slot, and an output stream's partition usually lives in another. So the commit
appends emitted records to the partition's *outbox* (``__obox:{app.stream.N}.proc``,
in the slot), and this relay, running in the partition's task under its lease, moves
them to their target partitions:

* for each target, one script in the target's slot appends the entries in outbox
  order, skipping those at or below the relay marker (``__rely:{target}:source``, the
  last outbox id relayed from this source to that target), and advances the marker:
  a relay repeated after a crash or a lost reply appends nothing twice;
* then a fenced script in the source slot deletes the relayed entries from the
  outbox (refused once the lease is lost: the next owner relays what is left).

Redis replicates asynchronously, and a failover can undo a commit that was relayed
already (its events are then processed again and emit again) or a relay whose outbox
entries were deleted already. With ``replicas=N`` (the ``state_replicas`` setting) each
step waits for ``N`` replicas of the master it wrote to (``WAIT``) before the next:
the outbox is read by a fenced script that writes, so the wait covers the commits that
wrote the entries; the relay waits on the target's master before the entries are
deleted. Then a failover neither repeats nor loses an emitted record.

A new owner relays the previous owner's leftovers first.

Jobs a processor enqueued in its commits (on a server and on a cluster alike) wait in
the same outbox, and are relayed the same way: the enqueue script runs on the job's
shard, skipping the jobs at or below the source's marker in that shard's slot (see
:mod:`streamkit.jobs._committed`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import trio

from . import _keys
from ._backoff import Backoff
from ._errors import NotReplicated, RedisUnavailable
from ._lua import script
from ._redis import LuaScript, health_of, redis_errors, replicated
from .jobs._committed import JOB_FIELD, relay_calls

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._locks import HeldLease
    from ._redis import Redis

__all__ = ["OutboxRelay"]

log = logging.getLogger("streamkit.state")

#: Outbox entries relayed per round.
RELAY_BATCH = 500
#: The outbox field naming an entry's target stream key.
TARGET_FIELD = b"__to"

_RELAY_SCRIPT = LuaScript(script("streams/relay"))
_READ_SCRIPT = LuaScript(script("streams/outbox_read"))
_DELETE_SCRIPT = LuaScript(script("streams/outbox_delete"))
_ENQUEUE_SCRIPT = LuaScript(script("jobs/enqueue"))
#: Seconds each step of a relay waits for its replicas (with ``replicas``).
REPLICA_TIMEOUT = 2.0


class OutboxRelay:
    """Relays one partition's outbox while the partition is processed here.

    Attributes:
        outbox: the outbox's key.
        relayed: entries relayed so far.
    """

    def __init__(
        self,
        redis: Redis,
        outbox: str,
        source: str,
        held: HeldLease,
        keep_of: Callable[[str], int],
        *,
        replicas: int = 0,
    ) -> None:
        self.outbox = outbox
        self.relayed = 0
        self.replicas = replicas
        self._redis = redis
        self._source = source
        self._held = held
        self._keep_of = keep_of
        self._wake = trio.Event()

    def wake(self) -> None:
        """A commit carrying outputs landed: relay them."""
        self._wake.set()

    async def run(self) -> None:
        """Relay the outbox now, then whenever woken, until cancelled.

        Redis being unavailable is waited out with backoff (the records wait in the
        outbox, committed); a lost lease ends the relaying (the next owner goes on).
        """
        delays = None
        while True:
            try:
                if not await self.relay_all():
                    return
                delays = None
            except (RedisUnavailable, NotReplicated) as exc:
                if delays is None:
                    delays = Backoff().delays()
                delay = next(delays)
                if isinstance(exc, RedisUnavailable):
                    # An outage: the client's outage log says it once for the process.
                    health_of(self._redis).unavailable(exc, what=f"relaying {self.outbox}")
                    log.debug("relaying %s failed: %s (retrying in %.2fs)", self.outbox, exc, delay)
                else:
                    log.warning(
                        "relaying %s failed: %s (retrying in %.2fs)", self.outbox, exc, delay
                    )
                await trio.sleep(delay)
                continue
            await self._wake.wait()
            self._wake = trio.Event()

    def _waiting(self) -> contextlib.AbstractContextManager[None]:
        if not self.replicas:
            return contextlib.nullcontext()
        return replicated(self._redis, self.replicas, REPLICA_TIMEOUT)

    async def relay_all(self) -> bool:
        """Relay until the outbox is empty; ``False`` if the lease was lost.

        Error handling:
            :class:`~streamkit.RedisUnavailable`, and with ``replicas``
            :class:`~streamkit.NotReplicated`: nothing is lost, the entries wait in
            the outbox for the next attempt.
        """
        with self._waiting():
            return await self._relay_all()

    async def _relay_all(self) -> bool:
        while True:
            lease = self._held.lease
            with redis_errors():
                entries: Any = await _READ_SCRIPT(
                    self._redis,
                    keys=[self.outbox, lease.key, self.outbox + ":relayed"],
                    args=[lease.value, RELAY_BATCH],
                )
            if entries == -1:
                return False
            if not entries:
                return True
            by_target: dict[bytes, list[bytes | int]] = {}
            jobs: list[tuple[bytes, bytes]] = []
            ids: list[bytes] = []
            for entry_id, flat in entries:
                ids.append(entry_id)
                if flat[0] == JOB_FIELD:
                    jobs.append((entry_id, flat[1]))
                    continue
                it = iter(flat)
                fields = dict(zip(it, it, strict=True))
                target = fields.pop(TARGET_FIELD)
                args = by_target.setdefault(target, [])
                args.append(entry_id)
                args.append(len(fields))
                for name, value in fields.items():
                    args.append(name)
                    args.append(value)
            for target, args in by_target.items():
                key = target.decode()
                with redis_errors():
                    await _RELAY_SCRIPT(
                        self._redis,
                        keys=[key, _keys.relay_key(key, self._source)],
                        args=[self._keep_of(key), *args],
                    )
            for keys, args in relay_calls(jobs, self._source):
                with redis_errors():
                    await _ENQUEUE_SCRIPT(self._redis, keys=keys, args=args)
            with redis_errors():
                deleted = await _DELETE_SCRIPT(
                    self._redis, keys=[self.outbox, lease.key], args=[lease.value, *ids]
                )
            if deleted == -1:
                return False
            self.relayed += len(ids)

    def __repr__(self) -> str:
        return f"<OutboxRelay {self.outbox} relayed {self.relayed}>"
