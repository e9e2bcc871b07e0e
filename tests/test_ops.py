"""One operation, three drivers: the retry and OutcomeUnknown logic is the operation's own.

The idempotent append (:func:`streamkit._ops.append`) runs against a real Redis
through the Trio driver (:func:`streamkit._redis.run_op`), the blocking client's and
the asyncio client's. Faults are made by an operation around it (:func:`faulty`),
which passes every request on to the real driver and then loses a reply (Redis ran
the call, its answer never came: :class:`~streamkit.OutcomeUnknown`) or, before a
call reaches the driver, says Redis was unreachable (it surely never ran). Each
driver must give the same requests in the same order, the same result or error,
and the same stream in Redis.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import pytest
import trio

from streamkit import NotReplicated, OutcomeUnknown, RedisUnavailable, StreamkitError
from streamkit._backoff import Backoff
from streamkit._ops import APPEND, Call, CallBatch, Now, Sleep, append, retried
from streamkit._produce import AppendCall, FinishedMarkers
from streamkit._redis import run_op
from streamkit._wire import text
from streamkit.clients import AsyncioClient, BlockingClient
from streamkit.jobs import Job, JobOptions
from streamkit.jobs._ops import send_plan
from streamkit.jobs._plan import JobIds, Placement, plan_enqueue

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from streamkit import Redis
    from streamkit._ops import Op

T = TypeVar("T")

Driver = Literal["trio", "blocking", "asyncio"]
DRIVERS: list[Driver] = ["trio", "blocking", "asyncio"]
Fault = Literal["lost", "unreachable"] | None

URL = "redis://test"
FAST = Backoff(initial=0.01, maximum=0.02)


def always(fault: Fault) -> Iterator[Fault]:
    return itertools.repeat(fault)


def faulty(op: Op[T], faults: Iterator[Fault], transcript: list[str]) -> Op[T]:
    """``op``, with each script call's fault taken from ``faults``: ``"lost"`` sends
    the call and loses its reply, ``"unreachable"`` does not send it and says Redis
    could not be reached. ``transcript`` gets each request's kind, in order."""
    reply: Any = None
    error: StreamkitError | None = None
    while True:
        try:
            request = op.throw(error) if error is not None else op.send(reply)
        except StopIteration as stop:
            result: T = stop.value
            return result
        reply, error = None, None
        if isinstance(request, Call):
            transcript.append("call")
            fault = next(faults, None)
            if fault == "unreachable":
                error = RedisUnavailable(URL, "connection refused (made by the test)")
                continue
            try:
                reply = yield request
            except StreamkitError as exc:
                error = exc
                continue
            if fault == "lost":
                reply, error = None, OutcomeUnknown(URL, "reply lost (made by the test)")
            continue
        if isinstance(request, CallBatch):
            transcript.append(f"batch of {len(request.calls)}")
            replies: list[Any] = yield request
            reply = [
                OutcomeUnknown(URL, "reply lost (made by the test)")
                if next(faults, None) == "lost"
                else got
                for got in replies
            ]
            continue
        transcript.append("now" if isinstance(request, Now) else "sleep")
        assert isinstance(request, Sleep | Now)
        reply = yield request


async def drive(driver: Driver, url: str, redis: Redis, make: Callable[[], Op[T]]) -> T:
    """Run the operation ``make()`` through ``driver``."""
    if driver == "trio":
        return await run_op(redis, make())
    if driver == "blocking":

        def blocking() -> T:
            with BlockingClient(url, queue="ops") as client:
                return client.run(make())

        return await trio.to_thread.run_sync(blocking)

    async def in_asyncio() -> T:
        client = AsyncioClient(url, queue="ops")
        try:
            return await client.run(make())
        finally:
            await client.aclose()

    return await trio.to_thread.run_sync(asyncio.run, in_asyncio())


def appends(key: str, n: int, markers: FinishedMarkers) -> AppendCall:
    entries: list[bytes | int] = []
    for i in range(n):
        entries += [1, b"n", str(i).encode()]
    return AppendCall.make(markers, key, keep=1000, cap=0, entries=entries)


async def run_everywhere(
    redis_url: str,
    redis: Redis,
    make: Callable[[str], Callable[[list[str]], Op[Any]]],
) -> dict[Driver, tuple[list[str], Any, int]]:
    """Run the operation ``make(key)(transcript)`` through each driver, each on a key of
    its own: per driver its transcript, its result (or error) and the key's length."""
    seen: dict[Driver, tuple[list[str], Any, int]] = {}
    for driver in DRIVERS:
        key = f"__strm:{{ops.{driver}.0}}"
        transcript: list[str] = []
        try:
            outcome: Any = await drive(
                driver, redis_url, redis, functools.partial(make(key), transcript)
            )
        except StreamkitError as exc:
            outcome = exc
        seen[driver] = (transcript, outcome, await redis.xlen(key))
    return seen


def appending(
    n: int, faults: Callable[[], Iterator[Fault]], **options: Any
) -> Callable[[str], Callable[[list[str]], Op[Any]]]:
    """For :func:`run_everywhere`: one append of ``n`` entries with the faults of
    ``faults()``, ``options`` given to :func:`streamkit._ops.append`."""

    def make(key: str) -> Callable[[list[str]], Op[Any]]:
        markers = FinishedMarkers()
        return lambda transcript: faulty(
            append(markers, [appends(key, n, markers)], **options), faults(), transcript
        )

    return make


async def test_an_append_runs_alike_through_every_driver(redis_url: str, redis: Redis) -> None:
    seen = await run_everywhere(redis_url, redis, appending(3, lambda: iter(())))
    for driver, (transcript, outcome, length) in seen.items():
        assert transcript == ["now", "call"], driver
        ((ids, dropped),) = outcome
        assert len(ids) == 3
        assert dropped == 0
        assert length == 3


async def test_a_lost_reply_is_retried_with_its_marker_and_appends_once(
    redis_url: str, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "streamkit.redis")
    make = appending(2, lambda: iter(["lost", None]), backoff=FAST)
    seen = await run_everywhere(redis_url, redis, make)
    for driver, (transcript, outcome, length) in seen.items():
        # The first call ran and its reply was lost: the retry, with the same marker,
        # finds the marker and returns the ids the first call appended.
        assert transcript == ["now", "call", "now", "sleep", "call"], driver
        ((ids, _),) = outcome
        assert length == 2, driver
        key = f"__strm:{{ops.{driver}.0}}"
        assert [text(entry.identifier) for entry in await redis.xrange(key)] == ids
    applied_before = [r for r in caplog.records if "applied before" in r.getMessage()]
    assert len(applied_before) == len(DRIVERS)


async def test_replies_lost_until_the_retry_time_is_over_are_outcome_unknown(
    redis_url: str, redis: Redis
) -> None:
    # Half a second of retries: far more than a call takes, even on a loaded machine.
    make = appending(2, lambda: always("lost"), give_up_after=0.5, backoff=FAST)
    seen = await run_everywhere(redis_url, redis, make)
    for driver, (transcript, outcome, length) in seen.items():
        assert isinstance(outcome, OutcomeUnknown), (driver, outcome)
        assert "retried for 0.5s without learning whether it was applied" in str(outcome)
        # Sent again and again, appended once: every retry found the marker.
        assert length == 2, driver
        assert transcript[:2] == ["now", "call"]
        assert transcript[-2:] == ["call", "now"]
        assert transcript.count("call") >= 2, transcript


async def test_an_unreachable_redis_is_retried_then_raised_and_nothing_is_sent(
    redis_url: str, redis: Redis
) -> None:
    make = appending(2, lambda: always("unreachable"), give_up_after=0.1, backoff=FAST)
    seen = await run_everywhere(redis_url, redis, make)
    for driver, (transcript, outcome, length) in seen.items():
        # Nothing reached Redis: the last error, not OutcomeUnknown.
        assert type(outcome) is RedisUnavailable, (driver, outcome)
        assert length == 0
        assert transcript[:4] == ["now", "call", "now", "sleep"]


async def test_a_call_that_is_not_idempotent_is_not_sent_again_after_a_lost_reply(
    redis_url: str, redis: Redis
) -> None:
    def make(key: str) -> Callable[[list[str]], Op[Any]]:
        markers = FinishedMarkers()

        def op() -> Op[Any]:
            call = appends(key, 1, markers)
            return (
                yield from retried(
                    Call.run(APPEND, call.keys, call.args), what="appending", idempotent=False
                )
            )

        return lambda transcript: faulty(op(), iter(["lost"]), transcript)

    seen = await run_everywhere(redis_url, redis, make)
    for driver, (transcript, outcome, length) in seen.items():
        assert isinstance(outcome, OutcomeUnknown), (driver, outcome)
        assert transcript == ["now", "call", "now"], driver
        assert length == 1


async def test_a_batch_retries_only_its_calls_whose_replies_were_lost(
    redis_url: str, redis: Redis
) -> None:
    def make(key: str) -> Callable[[list[str]], Op[Any]]:
        markers = FinishedMarkers()
        # Three partitions of one hash tag's family; the second's reply is lost.
        keys = [key.replace(".0}", f".{p}}}") for p in range(3)]
        return lambda transcript: faulty(
            append(markers, [appends(k, 2, markers) for k in keys], backoff=FAST),
            iter([None, "lost", None, None]),
            transcript,
        )

    seen = await run_everywhere(redis_url, redis, make)
    for driver, (transcript, outcome, _) in seen.items():
        assert transcript == ["now", "batch of 3", "now", "sleep", "batch of 1"], driver
        assert [len(ids) for ids, _ in outcome] == [2, 2, 2]
        for p in range(3):
            assert await redis.xlen(f"__strm:{{ops.{driver}.{p}}}") == 2


async def test_a_debounced_enqueue_keeps_the_replies_of_its_retried_calls(
    redis_url: str, redis: Redis
) -> None:
    async def touch(user: str) -> None:
        pass

    job: Job[Any, Any] = Job(
        "touch", touch, JobOptions(debounce=60, key="user"), None, lambda: cast("Any", None)
    )

    def make(key: str) -> Callable[[list[str]], Op[Any]]:
        plan = plan_enqueue(job, [("a",), ("b",), ("a",)], Placement(1, JobIds()), queue="q")
        queue = f"ops-{key.split('.')[1]}"
        return lambda transcript: faulty(send_plan(plan, queue), iter(["unreachable"]), transcript)

    seen = await run_everywhere(redis_url, redis, make)
    for driver, (transcript, outcome, _) in seen.items():
        # Not sent the first time: sent again, and its reply says which job took each.
        assert transcript == ["now", "call", "now", "sleep", "call"], driver
        (a, _, a_added), (b, _, b_added), (again, _, again_added) = outcome
        assert again == a != b
        assert (a_added, b_added, again_added) == (True, True, False)


async def test_the_trio_driver_retries_on_trio_s_clock(autojump_clock: trio.abc.Clock) -> None:
    """The operation's time is the driver's: on a MockClock, five seconds of retries
    against an unreachable Redis pass at once (no Redis is touched)."""
    markers = FinishedMarkers()
    transcript: list[str] = []
    op = faulty(
        append(markers, [appends("__strm:{ops.clock.0}", 1, markers)]),
        always("unreachable"),
        transcript,
    )
    # No call reaches the driver: no client is needed, nor touched.
    nothing = cast("Redis", object())
    started = trio.current_time()
    with pytest.raises(RedisUnavailable):
        await run_op(nothing, op)
    # The default retry time (5 s), on the mock clock.
    assert 4.5 <= trio.current_time() - started <= 5.0
    assert transcript.count("sleep") >= 10


async def test_a_batch_asking_for_replicas_a_server_lacks_is_not_replicated(
    redis_url: str, redis: Redis
) -> None:
    """The session's server has no replica: each driver waits for one after each
    append of the batch, and the operation raises the count reached (0); the entries
    are on the master, and the batch was not sent again."""

    def make(key: str) -> Callable[[list[str]], Op[Any]]:
        markers = FinishedMarkers()
        keys = [key.replace(".0}", f".{p}}}") for p in range(2)]
        return lambda transcript: faulty(
            append(
                markers,
                [appends(k, 1, markers) for k in keys],
                replicas=1,
                replica_timeout=0.05,
            ),
            iter(()),
            transcript,
        )

    seen = await run_everywhere(redis_url, redis, make)
    for driver, (transcript, outcome, length) in seen.items():
        assert isinstance(outcome, NotReplicated), (driver, outcome)
        assert outcome.acknowledged == 0
        assert transcript == ["now", "batch of 2"], driver
        assert length == 1
