"""The runtime membership store: one member of a group, alive in the background.

A member joins its group, heartbeats, reaps members whose heartbeat stopped, and
leaves on exit; every change recomputes a sticky, balanced assignment
(:mod:`streamkit._assignment`) atomically in Redis and is announced on a control
stream, which every member watches to keep its view of the assignment current. The
keys, the JSON state and the pure planning of each change are in
:mod:`streamkit._membership_state`; this module does the I/O.

Why one room (about 630 lines): joining, heartbeats, reaping, watching and leaving
share one member's state and its transactions; the pure planning is apart.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any

import attrs
import coredis
import trio
import trio_util

from ._assignment import Assignment, Assignor, assign
from ._backoff import Backoff, retry_unavailable
from ._errors import RedisUnavailable, ServerRefused, StreamkitError
from ._lua import script
from ._membership_settings import (
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_LEAVE_TIMEOUT,
    DEFAULT_REFRESH_INTERVAL,
    DEFAULT_SESSION_TIMEOUT,
    DEFAULT_STATIC_GRACE,
    MembershipSettings,
)
from ._membership_state import (
    CONTROL_STREAM_MAXLEN,
    GroupState,
    MemberInfo,
    MembershipKeys,
    membership_keys,
    plan_join,
    plan_removal,
    tag_safe,
)
from ._nurseries import open_service_nursery
from ._periodic import run_periodically
from ._redis import (
    REPORT_EVERY,
    LuaScript,
    Redis,
    health_of,
    redis_errors,
    ride_out_refusals,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence

__all__ = ["Membership", "MembershipStatistics", "open_membership"]

_CONTROL_READ_COUNT = 100

_HEARTBEAT = LuaScript(script("membership/heartbeat"))

log = logging.getLogger("streamkit.membership")


def _announce(pipe: Any, keys: MembershipKeys, event: str, member: str, generation: int) -> None:
    pipe.xadd(
        keys.control,
        {"event": event, "member": member, "generation": str(generation)},
        trim_strategy=coredis.PureToken.MAXLEN,
        threshold=CONTROL_STREAM_MAXLEN,
        trim_operator=coredis.PureToken.APPROXIMATELY,
    )


@contextlib.contextmanager
def _timeout(seconds: float, what: str) -> Iterator[None]:
    # A server that accepts connections but does not answer counts as unreachable.
    try:
        with trio.fail_after(seconds):
            yield
    except trio.TooSlowError as exc:
        raise RedisUnavailable("redis", f"{what} timed out after {seconds}s") from exc


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


@attrs.frozen(kw_only=True)
class MembershipStatistics:
    """A snapshot of a member's state and counters.

    Attributes:
        member_id: the member's id.
        group: the group's name.
        generation: the generation of the assignment it knows.
        partitions: the partitions it owns.
        members: how many members the group has, as far as it knows.
        heartbeats: heartbeats sent successfully.
        heartbeat_failures: heartbeats that could not be sent.
        joins: times it joined (1, plus one per rejoin after being reaped).
        reaped: dead members this member removed from the group.
        refreshes: times it re-read the state.
        connected: whether its last Redis command succeeded.
    """

    member_id: str
    group: str
    generation: int
    partitions: frozenset[int]
    members: int
    heartbeats: int
    heartbeat_failures: int
    joins: int
    reaped: int
    refreshes: int
    connected: bool


@attrs.define(eq=False)
class Membership:
    """A member of a group, as returned by :func:`open_membership`.

    Attributes:
        id: this member's id.
        group: the group's name.
        static: whether this is a static member.
        assignment: ``trio_util.AsyncValue[Assignment]``: the whole group's latest
            known assignment.
        partitions: ``trio_util.AsyncValue[frozenset[int]]``: the partitions this
            member owns. Iterate ``member.partitions.eventual_values()`` to follow it.
        connected: ``trio_util.AsyncBool``: whether its last Redis command succeeded.
        last_heartbeat: ``trio_util.AsyncValue[float | None]``: the Trio-clock time
            at which the last successful heartbeat was sent (``None`` before the
            first); each heartbeat changes it.
    """

    redis: Redis = attrs.field(repr=False)
    group: str
    id: str
    static: bool
    settings: MembershipSettings = attrs.field(repr=False)
    assignor: Assignor = attrs.field(repr=False)
    keys: MembershipKeys = attrs.field(init=False, repr=False)
    assignment: trio_util.AsyncValue[Assignment] = attrs.field(init=False, repr=False)
    partitions: trio_util.AsyncValue[frozenset[int]] = attrs.field(init=False, repr=False)
    _info: MemberInfo = attrs.field(init=False, repr=False)
    _control_id: str | bytes = attrs.field(default=b"0-0", init=False)
    _highest: int = attrs.field(default=0, init=False)
    connected: trio_util.AsyncBool = attrs.field(
        init=False, repr=False, factory=lambda: trio_util.AsyncBool(True)
    )
    last_heartbeat: trio_util.AsyncValue[float | None] = attrs.field(
        init=False, repr=False, factory=lambda: trio_util.AsyncValue(None)
    )
    _heartbeats: int = attrs.field(default=0, init=False)
    _heartbeat_failures: int = attrs.field(default=0, init=False)
    _refused_reported_at: float = attrs.field(default=-math.inf, init=False)
    # When the last command Redis answered was sent (Trio clock), and whether the
    # member stopped heartbeating for having heard nothing for a session timeout.
    _heard_at: float = attrs.field(default=-math.inf, init=False)
    _silent: bool = attrs.field(default=False, init=False)
    _joins: int = attrs.field(default=0, init=False)
    _reaped: int = attrs.field(default=0, init=False)
    # The last heartbeat found a heartbeat of a member this one watches missing.
    _watched_missing: bool = attrs.field(default=False, init=False)
    # The last heartbeat found the group's state gone: refresh (and so rejoin) now.
    _state_gone: bool = attrs.field(default=False, init=False)
    # A refresh from the watch and one from a heartbeat's finding take turns.
    _refresh_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _refreshes: int = attrs.field(default=0, init=False)
    _backoff: Backoff = attrs.field(factory=Backoff, init=False)
    # Test hook: False makes exiting behave like a crash (no leave, heartbeat lapses).
    _leave_on_exit: bool = attrs.field(default=True, init=False)

    def __attrs_post_init__(self) -> None:
        self.keys = membership_keys(self.group)
        tag_safe("member_id", self.id)
        self._info = MemberInfo(
            id=self.id,
            static=self.static,
            host=socket.gethostname(),
            pid=os.getpid(),
            joined_at=time.time(),
        )
        self.assignment = trio_util.AsyncValue(Assignment())
        self.partitions = trio_util.AsyncValue(frozenset())

    def __repr__(self) -> str:
        current: Assignment = self.assignment.value
        return (
            f"<Membership {self.id!r} of {self.group!r}{' static' if self.static else ''}: "
            f"generation {current.generation}, {len(current.members)} members, "
            f"owns {sorted(self.partitions.value)}"
            f"{'' if self.connected.value else ', Redis unreachable'}>"
        )

    def statistics(self) -> MembershipStatistics:
        """Return a snapshot of this member's state and counters."""
        current: Assignment = self.assignment.value
        return MembershipStatistics(
            member_id=self.id,
            group=self.group,
            generation=current.generation,
            partitions=self.partitions.value,
            members=len(current.members),
            heartbeats=self._heartbeats,
            heartbeat_failures=self._heartbeat_failures,
            joins=self._joins,
            reaped=self._reaped,
            refreshes=self._refreshes,
            connected=self.connected.value,
        )

    # ----------------------------------------------------------------- publishing

    def _publish(self, state: GroupState) -> None:
        # Only the watch task (and join, before it starts) publishes, in the order
        # Redis answered, so values never go back in time.
        # The highest generation seen: one lower later means the state was made anew.
        self._highest = max(self._highest, state.generation)
        if state.assignment != self.assignment.value:
            self.assignment.value = state.assignment
        mine = frozenset(state.assignment.of(self.id))
        if mine != self.partitions.value:
            log.debug(
                "member %s of %s is assigned %s (generation %d)",
                self.id, self.group, sorted(mine), state.generation,
            )  # fmt: skip
            self.partitions.value = mine

    # ----------------------------------------------------------------- transactions

    async def _transact(
        self,
        decide: Callable[[GroupState | None], GroupState | None],
        *,
        event: str,
        member: str,
        beat_px: int | None = None,
        delete_beat: bool = False,
    ) -> tuple[GroupState | None, bool]:
        """Read the state, decide, write: atomically, retried on conflicts.

        ``decide`` is pure: it maps the state read to a new state, or ``None`` for no
        change. The new state, this member's heartbeat (``beat_px``) and a control
        message are written in one MULTI/EXEC, which Redis drops if the state key
        changed after it was read (WATCH); coredis then runs the whole function again.

        Returns:
            The state now in Redis (as far as this transaction knows), and whether it
            was changed.
        """
        redis = self.redis
        keys = self.keys

        async def body(pipe: Any) -> tuple[GroupState | None, bool]:
            state = GroupState.decode(await redis.get(keys.state))
            new = decide(state)
            if beat_px is not None:
                pipe.set(keys.heartbeat(member), str(time.time()), px=beat_px)
            if delete_beat:
                pipe.delete([keys.heartbeat(member)])
            if new is None:
                return state, False
            pipe.set(keys.state, new.encode())
            _announce(pipe, keys, event, member, new.generation)
            return new, True

        with redis_errors():
            return await redis.transaction(body, keys.state)

    async def _join(self) -> GroupState:
        parts = self.settings.partitions
        beat = _ms(self.settings.session_timeout)

        info = attrs.evolve(self._info, joined_at=time.time())

        def decide(state: GroupState | None) -> GroupState | None:
            return plan_join(state, info, parts, self.assignor, group=self.group)

        sent_at = trio.current_time()
        state, changed = await self._transact(decide, event="join", member=self.id, beat_px=beat)
        self._heard(sent_at)
        assert state is not None
        self._joins += 1
        # The member id is the record's ``member`` field in the worker's log context.
        log.debug(
            "member %s joins %s: generation %d, %s",
            self.id, self.group, state.generation, _members(len(state.members)),
        )  # fmt: skip
        if changed:
            log.info("joined %s", self.group)
        else:
            log.info("rejoined %s in place (a static member back in time)", self.group)
        return state

    async def _leave(self) -> None:
        if self.static:
            # Keep our place and partitions: if we are back within static_grace,
            # nothing moves; if not, the others reap us as they would a dead member.
            with redis_errors():
                await self.redis.set(
                    self.keys.heartbeat(self.id),
                    str(time.time()),
                    px=_ms(self.settings.static_grace),
                )
            log.info("left %s; its place is kept for %gs", self.group, self.settings.static_grace)
            return
        state, changed = await self._transact(
            lambda state: plan_removal(state, [self.id], self.assignor),
            event="leave",
            member=self.id,
            delete_beat=True,
        )
        if changed and state is not None:
            log.debug(
                "member %s left %s: generation %d, %s remain",
                self.id, self.group, state.generation, _members(len(state.members)),
            )  # fmt: skip
            log.info("left %s", self.group)

    async def _reap_once(self) -> None:
        # The fast path, every tick, is in the heartbeat's own call: it counts the
        # heartbeats of the members this one watches. Only if one was missing do we pay
        # for a transaction (which looks at everybody).
        if not self._watched_missing:
            return
        self._watched_missing = False
        current: Assignment = self.assignment.value
        state, reaped = await self._transact_reap(current.members)
        if reaped and state is not None:
            self._reaped += len(reaped)
            log.warning(
                "member %s reaped %s from %s (heartbeat expired): generation %d",
                self.id, reaped, self.group, state.generation,
            )  # fmt: skip

    async def _transact_reap(self, members: Collection[str]) -> tuple[GroupState | None, list[str]]:
        """Remove every member of ``members`` whose heartbeat key is gone, atomically.

        The heartbeats of the members found silent are watched with the state, so a
        member that heartbeats in between is never reaped: its SET aborts our EXEC
        and the retry sees it alive. The live members' heartbeats are not watched:
        they change every heartbeat interval and would abort the transaction again
        and again (for seconds, on a loaded machine), and they are not removed
        anyway. A member that falls silent meanwhile is reaped at the next tick.
        """
        redis = self.redis
        keys = self.keys
        others = sorted(set(members) - {self.id})
        # Translated like every call: a raw client error here (a refused connection to
        # a master that just died, say) would end the reaper, and the worker with it.
        with redis_errors():
            async with redis.pipeline(transaction=False) as probe:
                requests = [probe.exists([keys.heartbeat(m)]) for m in others]
            silent = [m for m, r in zip(others, requests, strict=True) if not await r]
        if not silent:
            return None, []

        async def body(pipe: Any) -> tuple[GroupState | None, list[str]]:
            state = GroupState.decode(await redis.get(keys.state))
            if state is None:
                return None, []
            listed = [m for m in silent if m in state.members]
            async with redis.pipeline(transaction=False) as probe:
                requests = [probe.exists([keys.heartbeat(m)]) for m in listed]
            gone = [m for m, r in zip(listed, requests, strict=True) if not await r]
            new = plan_removal(state, gone, self.assignor)
            if new is None:
                return state, []
            pipe.set(keys.state, new.encode())
            _announce(pipe, keys, "reap", ",".join(gone), new.generation)
            return new, gone

        with redis_errors():
            return await redis.transaction(body, keys.state, *(keys.heartbeat(m) for m in silent))

    async def _get_state_raw(self) -> bytes | None:
        with redis_errors():
            return await self.redis.get(self.keys.state)

    # ----------------------------------------------------------------- background

    def _heard(self, sent_at: float) -> None:
        """Redis answered a command sent at ``sent_at``."""
        self._heard_at = max(self._heard_at, sent_at)

    async def _heartbeat(self) -> None:
        session = self.settings.session_timeout
        sent_at = trio.current_time()
        # Heard nothing for a session timeout: the others may have reaped this member
        # already. Requests may still reach Redis while replies do not (a link cut one
        # way), and heartbeats landing unheard would keep it listed, its partitions
        # kept from the others, for as long as the cut lasts. Ask without announcing
        # (a PING) until Redis answers; then heartbeat (and rejoin if reaped) again.
        silent = sent_at - self._heard_at >= session
        if silent and not self._silent:
            # In an outage the client's outage log says it, once for the process; a
            # link that takes requests and gives no replies is said here.
            level = logging.DEBUG if health_of(self.redis).outage.down else logging.WARNING
            log.log(
                level,
                "member %s of %s heard nothing from Redis for %ss (its session timeout): "
                "no heartbeats until Redis answers; the others take its partitions over",
                self.id, self.group, session,
            )  # fmt: skip
        self._silent = silent
        try:
            with _timeout(session, "heartbeat"), redis_errors():
                if silent:
                    await self.redis.ping()
                else:
                    watched = _watched_by(self.id, self.assignment.value.members)
                    beats = [self.keys.heartbeat(m) for m in watched]
                    alive = int(
                        await _HEARTBEAT(
                            self.redis,
                            keys=[self.keys.heartbeat(self.id), self.keys.state, *beats],
                            args=[str(time.time()), _ms(session)],
                        )
                    )
                    if alive < 0:
                        self._state_gone = True
                    elif alive < len(watched):
                        self._watched_missing = True
        except RedisUnavailable as exc:
            self._heartbeat_failures += 1
            self._set_connected(False, exc)
        else:
            self._set_connected(True, sent_at=sent_at)
            if not silent:
                self._heartbeats += 1
                self.last_heartbeat.value = sent_at

    async def _reap(self) -> None:
        try:
            if self._state_gone:
                self._state_gone = False
                with _timeout(self.settings.session_timeout, "rejoining"):
                    async with self._refresh_lock:
                        await self._refresh()
            with _timeout(self.settings.session_timeout, "looking for dead members"):
                await self._reap_once()
        except ServerRefused as exc:
            # Reachable, but refusing to change the state (out of memory, say): the
            # dead stay members until it accepts again; heartbeats go on meanwhile.
            self._refused("removing dead members", exc)
        except RedisUnavailable as exc:
            self._set_connected(False, exc)

    def _refused(self, what: str, exc: ServerRefused) -> None:
        now = trio.current_time()
        if now - self._refused_reported_at >= REPORT_EVERY:
            self._refused_reported_at = now
            log.warning(
                "member %s of %s: %s: %s; keeping the last known assignment and retrying",
                self.id, self.group, what, exc,
            )  # fmt: skip

    def _set_connected(
        self, connected: bool, exc: RedisUnavailable | None = None, *, sent_at: float | None = None
    ) -> None:
        # The client's outage log says an outage once for the whole process; what
        # this member does about it is detail.
        outage = health_of(self.redis).outage
        if connected:
            outage.answered(sent_at)
            if sent_at is not None:
                self._heard(sent_at)
            if not self.connected.value:
                log.debug("member %s of %s: Redis is reachable again", self.id, self.group)
        else:
            assert exc is not None
            health_of(self.redis).unavailable(exc, what=f"member {self.id} of {self.group}")
            if self.connected.value:
                log.debug(
                    "member %s of %s: Redis %s (%s); keeping the last known "
                    "assignment (generation %d, partitions %s) and retrying",
                    self.id, self.group,
                    "refused a command" if isinstance(exc, ServerRefused) else "unreachable",
                    exc.reason,
                    self.assignment.value.generation, sorted(self.partitions.value),
                )  # fmt: skip
        self.connected.value = connected

    async def _refresh(self) -> None:
        """Re-read the state and publish it; rejoin if we are no longer a member."""
        state = GroupState.decode(await self._get_state_raw())
        self._refreshes += 1
        if state is None or (self.id not in state.members and state.generation < self._highest):
            # The group's state is gone while we were in it (deleted, or Redis lost
            # it), or was made again from nothing by a member back sooner than us.
            level = health_of(self.redis).vanished.report(self.group, "membership")
            log.log(level, "the state of %s vanished; member %s rejoins", self.group, self.id)
            state = await self._join()
        elif self.id not in state.members:
            log.warning(
                "member %s is no longer in %s (reaped while paused or unreachable); "
                "rejoining",
                self.id, self.group,
            )  # fmt: skip
            state = await self._join()
        self._publish(state)

    async def _watch(self) -> None:
        delays = self._backoff.delays()
        block = _ms(self.settings.refresh_interval)
        # A hung server (SIGSTOP, partition) would otherwise block us forever.
        limit = self.settings.refresh_interval + self.settings.session_timeout
        while True:
            sent_at = trio.current_time()
            try:
                with _timeout(limit, "watching the control stream"):
                    with redis_errors():
                        reply = await self.redis.xread(
                            {self.keys.control: self._control_id},
                            count=_CONTROL_READ_COUNT,
                            block=block,
                        )
                    entries = reply.get(self.keys.control.encode(), ()) if reply else ()
                    if entries:
                        self._control_id = entries[-1].identifier
                        log.debug(
                            "member %s saw %s", self.id, [dict(e.field_values) for e in entries]
                        )
                    # Any message, or a quiet refresh_interval, means: look again.
                    async with self._refresh_lock:
                        await self._refresh()
            except ServerRefused as exc:
                # Reachable, but refusing to record a change (a rejoin, say).
                self._refused("updating the group", exc)
                await trio.sleep(next(delays))
            except RedisUnavailable as exc:
                self._set_connected(False, exc)
                await trio.sleep(next(delays))
            else:
                self._set_connected(True, sent_at=sent_at)
                delays = self._backoff.delays()

    async def _run(self) -> None:
        async with trio.open_nursery() as nursery:
            interval = self.settings.heartbeat_interval
            nursery.start_soon(self._watch)
            nursery.start_soon(lambda: run_periodically(interval, self._heartbeat, first=interval))
            nursery.start_soon(lambda: run_periodically(interval, self._reap, first=interval))

    async def _last_control_id(self) -> str | bytes:
        with redis_errors():
            last = await self.redis.xrevrange(self.keys.control, count=1)
        return last[0].identifier if last else b"0-0"


#: How many members each member watches for a missing heartbeat, every tick (in its
#: heartbeat's call): the ones after it in the order of their ids, around the ring.
#: Each member is watched by as many others (all of them in a smaller group), so a
#: fleet of W members costs Redis W lookups of this many keys a tick, not W EXISTS of
#: W - 1 keys (at 128 members, 16,256 lookups a second). A member whose watchers all
#: died with it is watched by new ones once they are reaped (by theirs) and the ring
#: closes over them.
REAP_WATCHES = 3


def _watched_by(member: str, members: Collection[str]) -> list[str]:
    """The members whose heartbeats ``member`` looks at each tick: the
    :data:`REAP_WATCHES` after it in the ring of ``members`` sorted by id (all the others
    in a group that small; the ones after where it would be, if it is not listed)."""
    ring = sorted(set(members) - {member})
    if len(ring) <= REAP_WATCHES:
        return ring
    start = sum(1 for m in ring if m < member)
    return [ring[(start + i) % len(ring)] for i in range(REAP_WATCHES)]


def _members(count: int) -> str:
    return f"{count} member{'' if count == 1 else 's'}"


@contextlib.asynccontextmanager
async def open_membership(
    redis: Redis,
    group: str,
    *,
    partitions: int | Sequence[int],
    member_id: str | None = None,
    static: bool = False,
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
    session_timeout: float = DEFAULT_SESSION_TIMEOUT,
    static_grace: float = DEFAULT_STATIC_GRACE,
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
    leave_timeout: float = DEFAULT_LEAVE_TIMEOUT,
    assignor: Assignor = assign,
    ride_out_outages: bool = False,
) -> AsyncIterator[Membership]:
    """Join ``group`` for the duration of the block; leave on exit.

    Entering returns once this member is registered and knows its first
    assignment. In the background it heartbeats every ``heartbeat_interval``
    (drift-free), reaps members whose heartbeat expired, and follows the control
    stream to keep :attr:`Membership.assignment` and :attr:`Membership.partitions`
    current. If it finds itself removed (reaped while paused), it rejoins. A member
    that heard nothing from Redis for ``session_timeout`` stops heartbeating (it
    only pings) until Redis answers, so the others reap it even if its requests
    still reach Redis while the replies are lost; it then rejoins.

    Args:
        redis: a client from :func:`streamkit.open_redis`.
        group: the group's name (no braces).
        partitions: the partitions to spread: a count ``n`` (``0 .. n-1``) or the
            partition numbers. Every member must give the same.
        member_id: a stable id (required to make ``static`` useful); a random one
            by default.
        static: on a graceful exit, keep this member's place and partitions for
            ``static_grace`` seconds instead of leaving, so a quick restart with the
            same ``member_id`` moves nothing.
        heartbeat_interval: see :class:`~streamkit.lowlevel.MembershipSettings`.
        session_timeout: see :class:`~streamkit.lowlevel.MembershipSettings`.
        static_grace: see :class:`~streamkit.lowlevel.MembershipSettings`.
        refresh_interval: see :class:`~streamkit.lowlevel.MembershipSettings`.
        leave_timeout: see :class:`~streamkit.lowlevel.MembershipSettings`.
        assignor: computes assignments; :func:`streamkit.lowlevel.assign` by default. All
            members of a group must use the same one.
        ride_out_outages: while entering, retry an unreachable Redis for as long as it
            takes (saying so), as a member does once joined, rather than give up after
            ``session_timeout``: for a service that reached Redis already (a worker
            starting its processors while Redis restarts).

    Cancellation:
        Leaving on exit runs shielded for at most ``leave_timeout`` seconds, so
        cancelling the surrounding scope still leaves the group cleanly.

    Error handling:
        :class:`ConfigError` for invalid settings. :class:`MetadataMismatch` if the
        group's live members use other partitions. While entering, an unreachable
        Redis is retried with backoff for ``session_timeout`` seconds (forever with
        ``ride_out_outages``), then :class:`RedisUnavailable` is raised. Once joined,
        Redis outages are logged and retried forever, keeping the last known
        assignment. A failure to leave is logged, not raised: the others reap this
        member once its heartbeat expires. An error in the block propagates unwrapped.
    """
    settings = MembershipSettings(
        partitions=partitions,
        heartbeat_interval=heartbeat_interval,
        session_timeout=session_timeout,
        static_grace=static_grace,
        refresh_interval=refresh_interval,
        leave_timeout=leave_timeout,
    )
    member = Membership(
        redis=redis,
        group=group,
        id=uuid.uuid4().hex if member_id is None else member_id,
        static=static,
        settings=settings,
        assignor=assignor,
    )

    async def join() -> GroupState:
        # Read the control stream's position first: any change after it, our own
        # join included, wakes the watcher, so nothing between is missed.
        member._control_id = await member._last_control_id()
        return await member._join()

    async def join_when_accepted() -> GroupState:
        # Refused (Redis out of memory, say): wait for as long as it takes, saying
        # so, rather than exit; only an unreachable Redis gives up.
        return await ride_out_refusals(join, what=f"joining membership group {group!r}")

    state = await retry_unavailable(
        join_when_accepted,
        backoff=member._backoff,
        give_up_after=None if ride_out_outages else settings.session_timeout,
        what=f"joining membership group {group!r} as {member.id!r}",
        outage=health_of(redis).outage,
    )
    member._publish(state)
    try:
        async with open_service_nursery(reason="membership closing") as nursery:
            nursery.start_soon(member._run)
            yield member
    finally:
        if member._leave_on_exit:
            with trio.move_on_after(settings.leave_timeout, shield=True) as scope:
                try:
                    await member._leave()
                except StreamkitError as exc:
                    log.warning(
                        "member %s could not leave %s (%s); the others will reap it",
                        member.id, group, exc,
                    )  # fmt: skip
            if scope.cancelled_caught:
                log.warning(
                    "member %s: leaving %s took over %ss; the others will reap it",
                    member.id, group, settings.leave_timeout,
                )  # fmt: skip
        member.partitions.value = frozenset()
