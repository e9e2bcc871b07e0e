"""Operations: what streamkit does with Redis, written once as generators of Redis work.

An *operation* is a generator that yields the Redis work it needs and is sent back the
replies: a :class:`Call` (a script run or a command), a :class:`CallBatch` (calls sent
together), a :class:`Sleep` before trying again, or :data:`NOW` (the driver's clock).
It returns its result. It does no I/O and holds no clock, so one operation runs under
every I/O world through a thin *driver* of that world:

* Trio: :func:`streamkit._redis.run_op` (coredis, the hot path);
* blocking and asyncio: the clients' ``run`` (redis-py; :mod:`streamkit.clients`).

A driver does what a request asks and nothing else: it sends the call (loading a
script the server lacks, in its one place), translates a client library's error into
streamkit's and throws it into the operation (a batch's errors come back as replies,
one per call), sleeps, reads its clock. Everything that decides (whether a call goes
again, the idempotency marker's bookkeeping, what an unknown outcome becomes, what is
logged) lives in the operation, once, for all the drivers.

The operations the Trio side and the clients share sit here (the idempotent append)
and in :mod:`streamkit.jobs._ops` (enqueueing); the clients' own ones (job handles,
table reads) in :mod:`streamkit.clients._ops`.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs

from . import _lua
from ._errors import RedisUnavailable, StreamkitError
from ._produce import append_reply, say_dropped
from ._retrying import DEFAULT_RETRY_FOR, RETRY_BACKOFF, RetryRule

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence

    from ._backoff import Backoff
    from ._produce import AppendCall, FinishedMarkers

__all__ = [
    "APPEND",
    "NOW",
    "Call",
    "CallBatch",
    "Now",
    "Op",
    "Request",
    "Sleep",
    "Work",
    "append",
    "drive",
    "drive_blocking",
    "retried",
]

T = TypeVar("T")

log = logging.getLogger("streamkit.redis")


# ------------------------------------------------------------------------ requests


# Not frozen: a frozen attrs class costs twice the time to make, and one is made for
# every call of an operation. Nothing changes a call once made.
@attrs.define
class Call:
    """One command for the driver to run.

    Attributes:
        args: the command and its arguments.
        key: a key of the command: routes it on a cluster (its node), and names it.
        script: the script an ``EVALSHA`` runs, loaded on a ``NOSCRIPT`` reply (a
            refused ``EVALSHA`` ran nothing).
    """

    args: tuple[Any, ...]
    key: str
    script: _lua.Script | None = None

    @classmethod
    def run(cls, script: _lua.Script, keys: Sequence[str], args: Iterable[Any]) -> Call:
        """Run ``script`` with ``keys`` and ``args``."""
        return cls(("EVALSHA", script.sha, len(keys), *keys, *args), keys[0], script)

    @classmethod
    def command(cls, *args: Any) -> Call:
        """A plain command whose first argument after its name is its key."""
        return cls(args, args[1])


@attrs.frozen
class CallBatch:
    """Calls sent together (pipelined per node, or at once on the Trio side).

    The reply is a list: per call its reply, or the :class:`~streamkit.StreamkitError`
    it failed with (the others ran regardless). With ``replicas``, each call is
    followed on its connection by ``WAIT replicas timeout``, and a call that too few
    replicas acknowledged gets :class:`~streamkit.NotReplicated`.
    """

    calls: tuple[Call, ...]
    replicas: int = 0
    replica_timeout: float = 0.0


@attrs.frozen
class Sleep:
    """Wait this many seconds (before trying a call again)."""

    seconds: float


@attrs.frozen
class Now:
    """The driver's clock: its reply is the time now, in seconds (Trio's clock on the
    Trio side, so that a test's :class:`trio.testing.MockClock` drives the retries)."""


#: The request for the driver's time.
NOW: Final = Now()

#: What a driver's ``do`` is given: every request but :data:`NOW` (the loop's own).
Work = Call | CallBatch | Sleep
Request = Work | Now
#: An operation: yields requests, is sent their replies, returns its result.
Op = Generator[Request, Any, T]

#: The idempotent append (``streams/append``).
APPEND = _lua.script("streams/append")


# ------------------------------------------------------------------------- driving


async def drive(op: Op[T], do: Callable[[Work], Awaitable[Any]], now: Callable[[], float]) -> T:
    """Run ``op`` with ``do``, an async function that does what a call, a batch or a
    sleep asks (a driver's own, under any event loop), and ``now``, the driver's clock:
    send each reply back, throw each streamkit error in, until the operation returns.

    Error handling:
        What the operation raises; an error of ``do`` that is not a
        :class:`~streamkit.StreamkitError` (a bug) ends it where it is raised.
    Cancellation:
        The operation is closed (``GeneratorExit`` at its yield), so that its own
        clean-up runs.
    """
    try:
        request = next(op)
        while True:
            if isinstance(request, Now):
                request = op.send(now())
                continue
            try:
                reply = await do(request)
            except StreamkitError as exc:
                request = op.throw(exc)
            else:
                request = op.send(reply)
    except StopIteration as stop:
        result: T = stop.value
        return result
    finally:
        op.close()


def drive_blocking(op: Op[T], do: Callable[[Work], Any], now: Callable[[], float]) -> T:
    """:func:`drive` for a blocking ``do``."""
    try:
        request = next(op)
        while True:
            if isinstance(request, Now):
                request = op.send(now())
                continue
            try:
                reply = do(request)
            except StreamkitError as exc:
                request = op.throw(exc)
            else:
                request = op.send(reply)
    except StopIteration as stop:
        result: T = stop.value
        return result
    finally:
        op.close()


# ---------------------------------------------------------------------- operations


def retried(call: Call, *, what: str, idempotent: bool = True) -> Op[Any]:
    """Run ``call``, trying again by the rule of :mod:`streamkit._retrying`: while Redis
    is unavailable, and, if ``idempotent``, also when the outcome was unknown."""
    rule = RetryRule(what, idempotent=idempotent, started=(yield NOW))
    while True:
        try:
            return (yield call)
        except RedisUnavailable as exc:
            delay = rule.next_delay(exc, (yield NOW))
            log.debug(
                "%s: %s (attempt %d, retrying in %.2fs)", what, exc.reason, rule.attempts, delay
            )
        yield Sleep(delay)


def append(
    markers: FinishedMarkers,
    appends: Sequence[AppendCall],
    *,
    replicas: int = 0,
    replica_timeout: float = 0.0,
    give_up_after: float = DEFAULT_RETRY_FOR,
    backoff: Backoff = RETRY_BACKOFF,
) -> Op[list[tuple[list[str], int]]]:
    """Run idempotent appends (together, when more than one); return each one's new
    entry ids and the number of unprocessed entries its hard cap dropped.

    Each append is retried with its marker while Redis is unavailable or its outcome
    unknown (see :mod:`streamkit._idempotent`); a cap that dropped unprocessed entries
    is said at WARNING. One append without ``replicas`` is a single :class:`Call`, for
    its latency.

    Error handling:
        :class:`~streamkit.RedisUnavailable` once Redis stayed unreachable for
        ``give_up_after`` seconds and the append surely did not happen;
        :class:`~streamkit.OutcomeUnknown` if it may have (a connection was lost with
        it in flight, and no later attempt got through to tell).
        :class:`~streamkit.ServerRefused` with ``out_of_memory`` at once: nothing was
        appended. Any other error of a call at once. Whatever ends the operation
        (an error, a cancellation), the markers of the appends without a reply are
        given back.
    """
    started = yield NOW
    first: list[Any] | None = None
    if len(appends) == 1 and not replicas:
        # The common case, one call that lands, without the retry loop's bookkeeping.
        call = appends[0]
        try:
            reply = yield Call.run(APPEND, call.keys, call.args)
        except RedisUnavailable as exc:
            first = [exc]  # the loop below decides
        except BaseException:
            call.failed(markers)
            raise
        else:
            call.succeeded(markers)
            return [_landed(call, reply)]
    return (
        yield from _retrying_appends(
            markers, appends, first, started, replicas, replica_timeout, give_up_after, backoff
        )
    )


def _retrying_appends(
    markers: FinishedMarkers,
    appends: Sequence[AppendCall],
    first: list[Any] | None,
    started: float,
    replicas: int,
    replica_timeout: float,
    give_up_after: float,
    backoff: Backoff,
) -> Op[list[tuple[list[str], int]]]:
    """:func:`append`'s loop: the appends sent (a single call or a batch), each that
    Redis did not take retried by its rule, until all landed; ``first``, the replies of
    a first round sent already."""
    single = len(appends) == 1 and not replicas
    # Made on an append's first failure only.
    rules: dict[int, RetryRule] = {}
    results: list[tuple[list[str], int] | None] = [None] * len(appends)
    todo = list(range(len(appends)))
    try:
        while todo:
            replies: list[Any]
            if first is not None:
                replies, first = first, None
            elif single:
                try:
                    replies = [(yield Call.run(APPEND, appends[0].keys, appends[0].args))]
                except StreamkitError as exc:
                    replies = [exc]
            else:
                replies = yield CallBatch(
                    tuple(Call.run(APPEND, appends[i].keys, appends[i].args) for i in todo),
                    replicas=replicas,
                    replica_timeout=replica_timeout,
                )
            again: list[int] = []
            delay = 0.0
            now: float | None = None
            for i, reply in zip(todo, replies, strict=True):
                call = appends[i]
                if isinstance(reply, RedisUnavailable):
                    if now is None:
                        now = yield NOW
                    rule = rules.get(i)
                    if rule is None:
                        rule = rules[i] = RetryRule(
                            f"appending to {call.key}",
                            idempotent=True,
                            started=started,
                            give_up_after=give_up_after,
                            backoff=backoff,
                            fail_fast_oom=True,
                            unknown_is_final=True,
                        )
                    wait = rule.next_delay(reply, now)
                    log.debug(
                        "appending to %s: %s (attempt %d, retrying in %.2fs)",
                        call.key,
                        reply.reason,
                        rule.attempts,
                        wait,
                    )
                    call.retrying()
                    delay = max(delay, wait)
                    again.append(i)
                elif isinstance(reply, StreamkitError):
                    raise reply
                else:
                    call.succeeded(markers)
                    results[i] = _landed(call, reply)
            todo = again
            if todo:
                yield Sleep(delay)
    except BaseException:
        for i, result in enumerate(results):
            if result is None:
                appends[i].failed(markers)
        raise
    return [result for result in results if result is not None]


def _landed(call: AppendCall, reply: Any) -> tuple[list[str], int]:
    """An append's reply: its new ids and the unprocessed entries its cap dropped
    (said at WARNING)."""
    ids, dropped, before = append_reply(reply)
    if dropped:
        say_dropped(call.cap, dropped, call.stream, call.partition)
    if before:
        log.debug("append to %s was applied before its connection was lost; not repeated", call.key)
    return ids, dropped
