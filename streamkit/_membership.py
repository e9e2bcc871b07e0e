"""The membership store: who is in a group, and which partitions each member owns.

Members join, heartbeat, leave and get reaped when their heartbeat stops; every change
recomputes a sticky, balanced assignment (:mod:`streamkit._assignment`) atomically in
Redis and is announced on a control stream, which every member watches to keep its
view of the assignment current.

Keys of a group ``g`` (one Redis Cluster slot, thanks to the ``{g}`` hash tag):

===========================  ============================================================
key                          what it holds
===========================  ============================================================
``__memb:{g}``               JSON: generation, partitions, members (with metadata) and
                             the assignment
``__beat:{g}:ID``            member ID's heartbeat: a string key with a TTL
``__ctrl:{g}``               control stream: ``event`` (join/leave/reap), ``member``,
                             ``generation``; capped at about 1000 entries
===========================  ============================================================
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
import orjson
import trio
import trio_util

from ._assignment import Assignment, Assignor, assign
from ._backoff import Backoff, retry_unavailable
from ._errors import ConfigError, MetadataMismatch, RedisUnavailable, StreamkitError
from ._groups import leaves
from ._redis import Redis, redis_errors

if TYPE_CHECKING:
    from collections.abc import (
        AsyncIterator,
        Callable,
        Collection,
        Iterator,
        Mapping,
        Sequence,
    )

__all__ = [
    "MemberInfo",
    "Membership",
    "MembershipKeys",
    "MembershipSettings",
    "MembershipSnapshot",
    "MembershipStatistics",
    "membership_keys",
    "next_deadline",
    "open_membership",
    "read_membership",
    "reset_membership",
    "run_periodically",
]

DEFAULT_HEARTBEAT_INTERVAL = 1.0
DEFAULT_SESSION_TIMEOUT = 10.0
DEFAULT_STATIC_GRACE = 60.0
DEFAULT_REFRESH_INTERVAL = 5.0
DEFAULT_LEAVE_TIMEOUT = 2.0
CONTROL_STREAM_MAXLEN = 1000
_STATE_VERSION = 1
_CONTROL_READ_COUNT = 100

log = logging.getLogger("streamkit.membership")


# --------------------------------------------------------------------------- keys


def _tag_safe(kind: str, value: str) -> str:
    # Braces would change the hash tag, so the group's keys could land on different
    # cluster slots and the transactions below would fail there.
    if not isinstance(value, str) or not value or "{" in value or "}" in value:
        raise ConfigError(kind, f"must be a non-empty string without braces, got {value!r}")
    return value


@attrs.frozen
class MembershipKeys:
    """The Redis keys of one membership group (all in one cluster slot).

    Attributes:
        group: the group's name.
        state: the JSON state (members, assignment, generation, partitions).
        control: the control stream announcing every change.
    """

    group: str
    state: str
    control: str

    def heartbeat(self, member_id: str) -> str:
        """The heartbeat key of ``member_id``."""
        return f"__beat:{{{self.group}}}:{member_id}"


def membership_keys(group: str) -> MembershipKeys:
    """Return the keys of ``group``.

    Error handling:
        :class:`ConfigError` if ``group`` is empty or contains braces.
    """
    _tag_safe("group", group)
    return MembershipKeys(group, f"__memb:{{{group}}}", f"__ctrl:{{{group}}}")


# --------------------------------------------------------------------------- state


@attrs.frozen(kw_only=True)
class MemberInfo:
    """What the group records about a member.

    Attributes:
        id: the member's id.
        static: whether a graceful exit keeps its place for ``static_grace`` seconds.
        host: the host name it runs on.
        pid: its process id.
        joined_at: when it joined, as a Unix timestamp.
        heartbeat_ttl: seconds until its heartbeat expires, as last read (``None``
            where unknown or already expired); only set by :func:`read_membership`.
    """

    id: str
    static: bool = False
    host: str = ""
    pid: int = 0
    joined_at: float = 0.0
    heartbeat_ttl: float | None = None

    def _to_json(self) -> dict[str, Any]:
        return {
            "static": self.static,
            "host": self.host,
            "pid": self.pid,
            "joined_at": self.joined_at,
        }

    @classmethod
    def _from_json(cls, member_id: str, data: Mapping[str, Any]) -> MemberInfo:
        return cls(
            id=member_id,
            static=bool(data.get("static", False)),
            host=str(data.get("host", "")),
            pid=int(data.get("pid", 0)),
            joined_at=float(data.get("joined_at", 0.0)),
        )


@attrs.frozen(kw_only=True)
class _State:
    """The decoded ``__memb`` key; every change produces a new one."""

    generation: int
    partitions: tuple[int, ...]
    members: Mapping[str, MemberInfo]
    assignment: Assignment

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "version": _STATE_VERSION,
                "generation": self.generation,
                "partitions": list(self.partitions),
                "members": {m: info._to_json() for m, info in sorted(self.members.items())},
                "assignment": {m: list(p) for m, p in self.assignment.members.items()},
            }
        )

    @classmethod
    def decode(cls, raw: bytes | None) -> _State | None:
        if raw is None:
            return None
        try:
            data = orjson.loads(raw)
            generation = int(data["generation"])
            partitions = tuple(int(p) for p in data["partitions"])
            members = {m: MemberInfo._from_json(m, info) for m, info in data["members"].items()}
            assignment = Assignment(
                generation=generation,
                partitions=partitions,
                members={m: [int(p) for p in ps] for m, ps in data["assignment"].items()},
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StreamkitError(f"membership state is corrupt: {exc!r}") from exc
        return cls(
            generation=generation, partitions=partitions, members=members, assignment=assignment
        )


def _checked(
    assignor: Assignor,
    partitions: tuple[int, ...],
    members: Collection[str],
    previous: Mapping[str, Collection[int]],
) -> dict[str, tuple[int, ...]]:
    if not members:
        # The last member left: nobody owns anything until someone joins.
        return {}
    result = assignor(partitions, members, previous)
    given = sorted(p for owned in result.values() for p in owned)
    if given != sorted(partitions) or not set(result) <= set(members):
        raise ConfigError(
            "assignor",
            f"must give each of {list(partitions)} to exactly one of {sorted(members)}, "
            f"returned {result!r}",
        )
    return {m: tuple(result.get(m, ())) for m in members}


def _with_members(
    state: _State | None,
    members: Mapping[str, MemberInfo],
    partitions: tuple[int, ...],
    assignor: Assignor,
) -> _State:
    generation = (state.generation if state else 0) + 1
    previous = state.assignment.members if state else {}
    owners = _checked(assignor, partitions, list(members), previous)
    return _State(
        generation=generation,
        partitions=partitions,
        members=dict(members),
        assignment=Assignment(generation=generation, partitions=partitions, members=owners),
    )


def plan_join(
    state: _State | None,
    member: MemberInfo,
    partitions: tuple[int, ...],
    assignor: Assignor,
    *,
    group: str = "",
) -> _State | None:
    """The state after ``member`` joins, or ``None`` if nothing changes.

    A member that is already in the group (a static member back within its grace
    period, or a rejoin that raced with nothing) changes nothing, so nobody's
    partitions move and the generation stays.

    Error handling:
        :class:`MetadataMismatch` if the group has members and other partitions.
    """
    if state is not None and state.members:
        if member.id in state.members:
            return None
        if state.partitions != partitions:
            raise MetadataMismatch(
                f"membership group {group}", "partitions", list(state.partitions), list(partitions)
            )
    members = dict(state.members) if state else {}
    members[member.id] = member
    return _with_members(state, members, partitions, assignor)


def plan_removal(state: _State | None, gone: Collection[str], assignor: Assignor) -> _State | None:
    """The state after the ``gone`` members leave or are reaped; ``None``: no change."""
    if state is None or not set(gone) & set(state.members):
        return None
    members = {m: info for m, info in state.members.items() if m not in gone}
    return _with_members(state, members, state.partitions, assignor)


def _announce(pipe: Any, keys: MembershipKeys, event: str, member: str, generation: int) -> None:
    pipe.xadd(
        keys.control,
        {"event": event, "member": member, "generation": str(generation)},
        trim_strategy=coredis.PureToken.MAXLEN,
        threshold=CONTROL_STREAM_MAXLEN,
        trim_operator=coredis.PureToken.APPROXIMATELY,
    )


# --------------------------------------------------------------------------- periodic


def next_deadline(start: float, interval: float, now: float) -> float:
    """Return the first ``start + k * interval`` (``k >= 1``) strictly after ``now``.

    Ticks that were missed (because the work took longer than ``interval``) are
    skipped rather than run back to back, and the schedule never drifts.
    """
    k = max(1, math.floor((now - start) / interval) + 1)
    deadline = start + k * interval
    # Floating point may put start + k*interval a hair below now.
    while deadline <= now:
        k += 1
        deadline = start + k * interval
    return deadline


async def run_periodically(interval: float, fn: Callable[[], Any], *, first: float = 0.0) -> None:
    """Await ``fn()`` at ``start + first + k * interval`` for ``k = 0, 1, ...``, forever.

    Cancellation:
        Returns only by cancellation.
    """
    start = trio.current_time() + first
    await trio.sleep_until(start)
    while True:
        await fn()
        await trio.sleep_until(next_deadline(start, interval, trio.current_time()))


# --------------------------------------------------------------------------- settings


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise ConfigError(attribute.name, f"must be a positive number, got {value!r}")


def _partitions(value: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise ConfigError("partitions", f"must be a count or a sequence of ints, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError("partitions", f"must be at least 1, got {value!r}")
        return tuple(range(value))
    parts = tuple(sorted(set(value)))
    if not parts or not all(isinstance(p, int) and not isinstance(p, bool) for p in parts):
        raise ConfigError("partitions", f"must be a non-empty sequence of ints, got {value!r}")
    return parts


@attrs.frozen(kw_only=True)
class MembershipSettings:
    """How a member behaves in its group. All times are in seconds.

    Attributes:
        partitions: the group's partitions (an int ``n`` means ``0 .. n-1``).
        heartbeat_interval: how often the member renews its heartbeat and looks for
            dead members.
        session_timeout: how long a heartbeat lasts; a member silent this long is
            reaped. Must exceed ``heartbeat_interval`` (keep it several times larger).
        static_grace: how long a static member's place is kept after it exits.
        refresh_interval: the longest the member goes without re-reading the state,
            as a safety net behind the control stream.
        leave_timeout: the longest leaving may take on exit.
    """

    partitions: tuple[int, ...] = attrs.field(converter=_partitions)
    heartbeat_interval: float = attrs.field(default=DEFAULT_HEARTBEAT_INTERVAL, validator=_positive)
    session_timeout: float = attrs.field(default=DEFAULT_SESSION_TIMEOUT, validator=_positive)
    static_grace: float = attrs.field(default=DEFAULT_STATIC_GRACE, validator=_positive)
    refresh_interval: float = attrs.field(default=DEFAULT_REFRESH_INTERVAL, validator=_positive)
    leave_timeout: float = attrs.field(default=DEFAULT_LEAVE_TIMEOUT, validator=_positive)

    @session_timeout.validator
    def _longer_than_heartbeat(self, attribute: attrs.Attribute[float], value: float) -> None:
        if value <= self.heartbeat_interval:
            raise ConfigError(
                "session_timeout",
                f"must be longer than heartbeat_interval ({self.heartbeat_interval}), got {value}",
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


# --------------------------------------------------------------------------- the member


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


class _Retry(Exception):
    """The watched keys turned out to be the wrong ones; start the transaction over."""

    def __init__(self, members: Collection[str]) -> None:
        super().__init__("member list changed")
        self.members = tuple(members)


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
    _connected: bool = attrs.field(default=True, init=False)
    _heartbeats: int = attrs.field(default=0, init=False)
    _heartbeat_failures: int = attrs.field(default=0, init=False)
    _joins: int = attrs.field(default=0, init=False)
    _reaped: int = attrs.field(default=0, init=False)
    _refreshes: int = attrs.field(default=0, init=False)
    _backoff: Backoff = attrs.field(factory=Backoff, init=False)
    # Test hook: False makes exiting behave like a crash (no leave, heartbeat lapses).
    _leave_on_exit: bool = attrs.field(default=True, init=False)

    def __attrs_post_init__(self) -> None:
        self.keys = membership_keys(self.group)
        _tag_safe("member_id", self.id)
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
            f"{'' if self._connected else ', Redis unreachable'}>"
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
            connected=self._connected,
        )

    # ----------------------------------------------------------------- publishing

    def _publish(self, state: _State) -> None:
        # Only the watch task (and join, before it starts) publishes, in the order
        # Redis answered, so values never go back in time.
        if state.assignment != self.assignment.value:
            self.assignment.value = state.assignment
        mine = frozenset(state.assignment.of(self.id))
        if mine != self.partitions.value:
            log.info(
                "member %s of %s now owns %s (generation %d)",
                self.id, self.group, sorted(mine), state.generation,
            )  # fmt: skip
            self.partitions.value = mine

    # ----------------------------------------------------------------- transactions

    async def _transact(
        self,
        decide: Callable[[_State | None], _State | None],
        *,
        event: str,
        member: str,
        beat_px: int | None = None,
        delete_beat: bool = False,
    ) -> tuple[_State | None, bool]:
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

        async def body(pipe: Any) -> tuple[_State | None, bool]:
            state = _State.decode(await redis.get(keys.state))
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

    async def _join(self) -> _State:
        parts = self.settings.partitions
        beat = _ms(self.settings.session_timeout)

        info = attrs.evolve(self._info, joined_at=time.time())

        def decide(state: _State | None) -> _State | None:
            return plan_join(state, info, parts, self.assignor, group=self.group)

        state, changed = await self._transact(decide, event="join", member=self.id, beat_px=beat)
        assert state is not None
        self._joins += 1
        if changed:
            log.info(
                "member %s joined %s: generation %d, %d members",
                self.id, self.group, state.generation, len(state.members),
            )  # fmt: skip
        else:
            log.info(
                "member %s rejoined %s in place: generation %d unchanged",
                self.id, self.group, state.generation,
            )  # fmt: skip
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
            log.info(
                "static member %s left %s; its place is kept for %ss",
                self.id, self.group, self.settings.static_grace,
            )  # fmt: skip
            return
        state, changed = await self._transact(
            lambda state: plan_removal(state, [self.id], self.assignor),
            event="leave",
            member=self.id,
            delete_beat=True,
        )
        if changed and state is not None:
            log.info(
                "member %s left %s: generation %d, %d members remain",
                self.id, self.group, state.generation, len(state.members),
            )  # fmt: skip

    async def _reap_once(self) -> None:
        current: Assignment = self.assignment.value
        candidates = [m for m in current.members if m != self.id]
        if not candidates:
            return
        # Fast path, every tick: one EXISTS for everybody. Only if a heartbeat is
        # missing do we pay for a transaction.
        with redis_errors():
            alive = await self.redis.exists([self.keys.heartbeat(m) for m in candidates])
        if alive == len(candidates):
            return
        state, reaped = await self._transact_reap(current.members)
        if reaped and state is not None:
            self._reaped += len(reaped)
            log.warning(
                "member %s reaped %s from %s (heartbeat expired): generation %d",
                self.id, reaped, self.group, state.generation,
            )  # fmt: skip

    async def _transact_reap(self, members: Collection[str]) -> tuple[_State | None, list[str]]:
        """Remove every member whose heartbeat key is gone, atomically.

        The liveness check runs under WATCH on every member's heartbeat key, so a
        member that heartbeats in between is never reaped: its SET aborts our EXEC
        and the retry sees it alive. If the state lists members we did not watch,
        we start over watching them too.
        """
        redis = self.redis
        keys = self.keys
        watched = tuple(sorted(set(members)))
        while True:

            async def body(
                pipe: Any, watched: tuple[str, ...] = watched
            ) -> tuple[_State | None, list[str]]:
                state = _State.decode(await redis.get(keys.state))
                if state is None:
                    return None, []
                if not set(state.members) <= set(watched):
                    raise _Retry(state.members)
                others = [m for m in sorted(state.members) if m != self.id]
                async with redis.pipeline(transaction=False) as probe:
                    requests = [probe.exists([keys.heartbeat(m)]) for m in others]
                gone = [m for m, r in zip(others, requests, strict=True) if not await r]
                new = plan_removal(state, gone, self.assignor)
                if new is None:
                    return state, []
                pipe.set(keys.state, new.encode())
                _announce(pipe, keys, "reap", ",".join(gone), new.generation)
                return new, gone

            try:
                with redis_errors():
                    return await redis.transaction(
                        body, keys.state, *(keys.heartbeat(m) for m in watched)
                    )
            except _Retry as retry:
                watched = tuple(sorted(set(retry.members)))

    async def _get_state_raw(self) -> bytes | None:
        with redis_errors():
            return await self.redis.get(self.keys.state)

    # ----------------------------------------------------------------- background

    async def _heartbeat(self) -> None:
        session = self.settings.session_timeout
        try:
            with _timeout(session, "heartbeat"), redis_errors():
                await self.redis.set(
                    self.keys.heartbeat(self.id), str(time.time()), px=_ms(session)
                )
        except RedisUnavailable as exc:
            self._heartbeat_failures += 1
            self._set_connected(False, exc)
        else:
            self._heartbeats += 1
            self._set_connected(True)

    async def _reap(self) -> None:
        try:
            with _timeout(self.settings.session_timeout, "looking for dead members"):
                await self._reap_once()
        except RedisUnavailable as exc:
            self._set_connected(False, exc)

    def _set_connected(self, connected: bool, exc: RedisUnavailable | None = None) -> None:
        if connected and not self._connected:
            log.warning("member %s of %s: Redis is reachable again", self.id, self.group)
        elif not connected and self._connected:
            log.warning(
                "member %s of %s: Redis unreachable (%s); keeping the last known "
                "assignment (generation %d, partitions %s) and retrying",
                self.id, self.group, exc.reason if exc else "?",
                self.assignment.value.generation, sorted(self.partitions.value),
            )  # fmt: skip
        self._connected = connected

    async def _refresh(self) -> None:
        """Re-read the state and publish it; rejoin if we are no longer a member."""
        state = _State.decode(await self._get_state_raw())
        self._refreshes += 1
        if state is None or self.id not in state.members:
            log.warning(
                "member %s is no longer in %s (reaped while paused or unreachable, "
                "or the state was lost); rejoining",
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
                    await self._refresh()
            except RedisUnavailable as exc:
                self._set_connected(False, exc)
                await trio.sleep(next(delays))
            else:
                self._set_connected(True)
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
) -> AsyncIterator[Membership]:
    """Join ``group`` for the duration of the block; leave on exit.

    Entering returns once this member is registered and knows its first
    assignment. In the background it heartbeats every ``heartbeat_interval``
    (drift-free), reaps members whose heartbeat expired, and follows the control
    stream to keep :attr:`Membership.assignment` and :attr:`Membership.partitions`
    current. If it finds itself removed (reaped while paused), it rejoins.

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
        heartbeat_interval: see :class:`MembershipSettings`.
        session_timeout: see :class:`MembershipSettings`.
        static_grace: see :class:`MembershipSettings`.
        refresh_interval: see :class:`MembershipSettings`.
        leave_timeout: see :class:`MembershipSettings`.
        assignor: computes assignments; :func:`streamkit.assign` by default. All
            members of a group must use the same one.

    Cancellation:
        Leaving on exit runs shielded for at most ``leave_timeout`` seconds, so
        cancelling the surrounding scope still leaves the group cleanly.

    Error handling:
        :class:`ConfigError` for invalid settings. :class:`MetadataMismatch` if the
        group's live members use other partitions. While entering, an unreachable
        Redis is retried with backoff for ``session_timeout`` seconds, then
        :class:`RedisUnavailable` is raised. Once joined, Redis outages are logged
        and retried forever, keeping the last known assignment. A failure to leave
        is logged, not raised: the others reap this member once its heartbeat
        expires. An error in the block propagates unwrapped.
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

    async def join() -> _State:
        # Read the control stream's position first: any change after it, our own
        # join included, wakes the watcher, so nothing between is missed.
        member._control_id = await member._last_control_id()
        return await member._join()

    state = await retry_unavailable(
        join,
        backoff=member._backoff,
        give_up_after=settings.session_timeout,
        what=f"joining membership group {group!r} as {member.id!r}",
    )
    member._publish(state)
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(member._run)
            try:
                yield member
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                nursery.cancel_scope.cancel("membership closing")
    except BaseExceptionGroup as group_exc:
        unwrapped = _unwrap(group_exc, body_error)
        if unwrapped is group_exc:
            raise
        # Keep the error's own cause (the Redis error behind a streamkit error, or
        # whatever the user chained), but not the group around it.
        raise unwrapped from unwrapped.__cause__
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


def _unwrap(
    group: BaseExceptionGroup[BaseException], preferred: BaseException | None
) -> BaseException:
    # Prefer the user's own exception, then the one meaningful background error.
    found = leaves(group)
    if (
        preferred is not None
        and not isinstance(preferred, trio.Cancelled)
        and any(leaf is preferred for leaf in found)
    ):
        return preferred
    meaningful = [leaf for leaf in found if not isinstance(leaf, trio.Cancelled)]
    if len(meaningful) == 1:
        return meaningful[0]
    return group


# --------------------------------------------------------------------------- CLI helpers


@attrs.frozen(kw_only=True)
class MembershipSnapshot:
    """What :func:`read_membership` found in Redis.

    Attributes:
        group: the group's name.
        generation: the current generation.
        partitions: the group's partitions.
        members: every member, with its heartbeat's remaining time.
        assignment: who owns what.
    """

    group: str
    generation: int
    partitions: tuple[int, ...]
    members: tuple[MemberInfo, ...]
    assignment: Assignment


async def read_membership(redis: Redis, group: str) -> MembershipSnapshot | None:
    """Return a snapshot of ``group``'s state, or ``None`` if it has never had members.

    Error handling:
        :class:`RedisUnavailable` / :class:`BackendError` from Redis;
        :class:`StreamkitError` if the state is corrupt.
    """
    keys = membership_keys(group)
    with redis_errors():
        raw = await redis.get(keys.state)
    state = _State.decode(raw)
    if state is None:
        return None
    ids = sorted(state.members)
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            requests = [pipe.pttl(keys.heartbeat(m)) for m in ids]
        ttls = [await request for request in requests]
    members = tuple(
        attrs.evolve(state.members[m], heartbeat_ttl=ttl / 1000 if ttl >= 0 else None)
        for m, ttl in zip(ids, ttls, strict=True)
    )
    return MembershipSnapshot(
        group=group,
        generation=state.generation,
        partitions=state.partitions,
        members=members,
        assignment=state.assignment,
    )


async def reset_membership(redis: Redis, group: str) -> None:
    """Delete ``group``'s state, heartbeats and control stream (for ``streamkit reset``).

    Only safe while no member runs: live members would rejoin at once.
    """
    keys = membership_keys(group)
    with redis_errors():
        raw = await redis.get(keys.state)
        state = _State.decode(raw)
        members = list(state.members) if state else []
        await redis.delete([keys.state, keys.control, *(keys.heartbeat(m) for m in members)])
