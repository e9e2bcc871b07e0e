"""Exception policies under run_processor: halt, retry, dead letters, ignore, poison."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import pytest
import trio

from streamkit import (
    Backoff,
    ConfigError,
    ExceptionPolicy,
    LockLost,
    ProcessorHalted,
    run_processor,
)
from tests.consume import DEAD, GROUP, feed_of, lock_name, pending_ids, send

if TYPE_CHECKING:
    from streamkit import Events, Redis, Stream
    from tests.consume import Tick

FAST = Backoff(initial=0.001, maximum=0.001, jitter=0)


class Boom(Exception):
    pass


async def dead_letters(redis: Redis) -> list[dict[bytes, bytes]]:
    return [cast("dict[bytes, bytes]", e.field_values) for e in await redis.xrange(DEAD)]


def processor_until(last: int, seen: list[int], fail: dict[int, int]) -> Any:
    """Records what it sees; raises Boom on record n while fail[n] > 0."""

    async def process(events: Events[Tick]) -> None:
        async for tick in events.records():
            seen.append(tick.n)
            if fail.get(tick.n, 0) > 0:
                fail[tick.n] -= 1
                raise Boom(f"bad {tick.n}")
            if tick.n == last:
                return

    return process


async def test_halt_raises_and_leaves_the_event_pending(
    redis: Redis, ticks: Stream[Tick], caplog: pytest.LogCaptureFixture
) -> None:
    ids = await send(ticks, range(5))
    seen: list[int] = []
    with trio.fail_after(10), pytest.raises(ProcessorHalted) as info:
        async with feed_of(redis, ticks) as feed:
            await run_processor(
                processor_until(4, seen, {2: 99}), feed, ExceptionPolicy(action="halt"), redis=redis
            )
    assert seen == [0, 1, 2]
    assert info.value.entry_ids == (ids[2],)
    assert (info.value.stream, info.value.partition) == ("ticks", 0)
    assert isinstance(info.value.__cause__, Boom)
    assert await pending_ids(redis, ticks) == ids[2:]
    assert any(
        "halting" in r.getMessage() for r in caplog.records if r.name == "streamkit.policies"
    )


async def test_retry_then_succeed_keeps_order(redis: Redis, ticks: Stream[Tick]) -> None:
    await send(ticks, range(5))
    seen: list[int] = []
    with trio.fail_after(10):
        async with feed_of(redis, ticks) as feed:
            policy = ExceptionPolicy(action="retry", retries=3, backoff=FAST)
            await run_processor(processor_until(4, seen, {2: 2}), feed, policy, redis=redis)
    assert seen == [0, 1, 2, 2, 2, 3, 4]
    assert await pending_ids(redis, ticks) == []
    assert await dead_letters(redis) == []


async def test_retry_a_take_batch_in_place(redis: Redis, ticks: Stream[Tick]) -> None:
    await send(ticks, range(6))
    batches: list[list[int]] = []
    failures = [1]

    async def process(events: Events[Tick]) -> None:
        async for batch in events.take(3):
            batches.append([t.n for t in batch])
            if batch[0].n == 3 and failures[0]:
                failures[0] -= 1
                raise Boom("batch")
            if batch[-1].n == 5:
                return

    with trio.fail_after(10):
        async with feed_of(redis, ticks) as feed:
            await run_processor(
                process, feed, ExceptionPolicy(action="retry", backoff=FAST), redis=redis
            )
    assert batches == [[0, 1, 2], [3, 4, 5], [3, 4, 5]]


async def test_retries_exhausted_go_to_the_dead_letter_stream(
    redis: Redis, ticks: Stream[Tick]
) -> None:
    ids = await send(ticks, range(4))
    seen: list[int] = []
    with trio.fail_after(10):
        async with feed_of(redis, ticks) as feed:
            policy = ExceptionPolicy(
                action="retry", retries=2, backoff=FAST, on_exhausted="dead_letter"
            )
            await run_processor(processor_until(3, seen, {1: 99}), feed, policy, redis=redis)
    assert seen == [0, 1, 1, 1, 2, 3]
    assert await pending_ids(redis, ticks) == []
    [letter] = await dead_letters(redis)
    original = cast("dict[bytes, bytes]", (await redis.xrange(ticks.key(0)))[1].field_values)
    assert letter[b"data"] == original[b"data"]
    assert letter[b"dl.reason"] == b"retries exhausted"
    assert letter[b"dl.error_type"] == f"{Boom.__module__}.Boom".encode()
    assert letter[b"dl.error"] == b"bad 1"
    assert letter[b"dl.stream"] == b"ticks"
    assert letter[b"dl.partition"] == b"0"
    assert letter[b"dl.entry_id"] == ids[1].encode()
    # One delivery by Redis, then two attempts in place: the attempts made.
    assert letter[b"dl.delivery_count"] == b"3"
    assert letter[b"dl.group"] == GROUP.encode()
    assert float(letter[b"dl.time"]) > 0


async def test_dead_letter_action(redis: Redis, ticks: Stream[Tick]) -> None:
    await send(ticks, range(3))
    seen: list[int] = []
    with trio.fail_after(10):
        async with feed_of(redis, ticks) as feed:
            await run_processor(
                processor_until(2, seen, {0: 99}),
                feed,
                ExceptionPolicy(action="dead_letter"),
                redis=redis,
            )
    assert seen == [0, 1, 2]
    assert [d[b"dl.reason"] for d in await dead_letters(redis)] == [b"error"]


async def test_ignore_acknowledges_and_continues(
    redis: Redis, ticks: Stream[Tick], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "streamkit.policies")
    await send(ticks, range(3))
    seen: list[int] = []
    with trio.fail_after(10):
        async with feed_of(redis, ticks) as feed:
            await run_processor(
                processor_until(2, seen, {1: 99}),
                feed,
                ExceptionPolicy(action="ignore"),
                redis=redis,
            )
    assert seen == [0, 1, 2]
    assert await pending_ids(redis, ticks) == []
    assert await dead_letters(redis) == []
    assert any("ignoring" in r.getMessage() for r in caplog.records)


async def test_poison_events_skip_the_processor(redis: Redis, ticks: Stream[Tick]) -> None:
    ids = await send(ticks, range(3))
    # Crash loops: record 0 was delivered to the partition's consumer three times.
    await redis.xgroup_create(ticks.key(0), GROUP, "0")
    await redis.xreadgroup(GROUP, "p0", streams={ticks.key(0): ">"}, count=1)
    for _ in range(2):
        await redis.xreadgroup(GROUP, "p0", streams={ticks.key(0): "0"}, count=1)
    seen: list[int] = []
    with trio.fail_after(10):
        async with feed_of(redis, ticks) as feed:
            policy = ExceptionPolicy(action="retry", on_exhausted="dead_letter", max_deliveries=3)
            await run_processor(processor_until(2, seen, {}), feed, policy, redis=redis)
    assert seen == [1, 2]
    [letter] = await dead_letters(redis)
    assert letter[b"dl.reason"] == b"poison"
    assert letter[b"dl.entry_id"] == ids[0].encode()
    assert letter[b"dl.delivery_count"] == b"4"
    assert b"max_deliveries=3" in letter[b"dl.error"]
    assert await pending_ids(redis, ticks) == []


async def test_undecodable_events_are_not_retried(redis: Redis, ticks: Stream[Tick]) -> None:
    await send(ticks, [0])
    bad = cast("bytes", await redis.xadd(ticks.key(0), {b"data": b"not json"})).decode()
    await send(ticks, [2])
    seen: list[int] = []
    with trio.fail_after(10):
        async with feed_of(redis, ticks) as feed:
            policy = ExceptionPolicy(action="retry", backoff=FAST, on_exhausted="dead_letter")
            await run_processor(processor_until(2, seen, {}), feed, policy, redis=redis)
    assert seen == [0, 2]
    [letter] = await dead_letters(redis)
    assert letter[b"dl.reason"] == b"undecodable"
    assert letter[b"dl.entry_id"] == bad.encode()
    assert letter[b"dl.error_type"] == b"streamkit.DecodeError"
    assert letter[b"data"] == b"not json"


async def test_undecodable_event_is_dead_lettered_by_default(
    redis: Redis, ticks: Stream[Tick]
) -> None:
    # The default action halts on processor errors, but an undecodable event can
    # never succeed: halting on it would stop its partition for good.
    bad = cast("bytes", await redis.xadd(ticks.key(0), {b"data": b"[]"})).decode()
    await send(ticks, [0])
    seen: list[int] = []
    with trio.fail_after(10):
        async with feed_of(redis, ticks) as feed:
            await run_processor(processor_until(0, seen, {}), feed, ExceptionPolicy(), redis=redis)
    assert seen == [0]
    [letter] = await dead_letters(redis)
    assert (letter[b"dl.reason"], letter[b"dl.entry_id"]) == (b"undecodable", bad.encode())
    assert await pending_ids(redis, ticks) == []


async def test_undecodable_event_halts_when_told(redis: Redis, ticks: Stream[Tick]) -> None:
    bad = cast("bytes", await redis.xadd(ticks.key(0), {b"data": b"[]"})).decode()
    policy = ExceptionPolicy(on_undecodable="halt")
    with trio.fail_after(10), pytest.raises(ProcessorHalted) as info:
        async with feed_of(redis, ticks) as feed:
            await run_processor(processor_until(0, [], {}), feed, policy, redis=redis)
    assert info.value.entry_ids == (bad,)
    assert await pending_ids(redis, ticks) == [bad]


async def test_a_halt_logs_the_processors_traceback_once(
    redis: Redis, ticks: Stream[Tick], caplog: pytest.LogCaptureFixture
) -> None:
    await send(ticks, range(3))
    with trio.fail_after(10), pytest.raises(ProcessorHalted):
        async with feed_of(redis, ticks) as feed:
            await run_processor(processor_until(2, [], {1: 1}), feed, redis=redis)
    [record] = [r for r in caplog.records if r.exc_info is not None]
    assert record.levelno == logging.ERROR
    text = caplog.text
    assert text.count("Traceback (most recent call last)") == 1
    # The file and line of the processor's raise, not only "Boom: bad 1".
    assert 'test_policies.py", line' in text
    assert 'raise Boom(f"bad {tick.n}")' in text


async def test_exhausted_retries_log_the_traceback_as_a_warning(
    redis: Redis, ticks: Stream[Tick], caplog: pytest.LogCaptureFixture
) -> None:
    await send(ticks, range(3))
    policy = ExceptionPolicy(action="retry", retries=2, backoff=FAST, on_exhausted="ignore")
    with trio.fail_after(10):
        async with feed_of(redis, ticks) as feed:
            await run_processor(processor_until(2, [], {1: 99}), feed, policy, redis=redis)
    traced = [r for r in caplog.records if r.exc_info is not None]
    assert [r.levelno for r in traced] == [logging.WARNING]
    assert "retries exhausted" in traced[0].getMessage()


async def test_lost_lease_is_not_handled_by_the_policy(redis: Redis, ticks: Stream[Tick]) -> None:
    await send(ticks, range(3))

    async def process(events: Events[Tick]) -> None:
        async for tick in events.records():
            if tick.n == 1:
                key = "__lock:" + lock_name(0)
                await redis.set(key, b"someone-else:1")

    with trio.fail_after(10), pytest.raises(LockLost):
        async with feed_of(redis, ticks) as feed:
            await run_processor(process, feed, ExceptionPolicy(action="ignore"), redis=redis)
    assert await dead_letters(redis) == []


async def test_error_outside_any_event_halts_after_retries(
    redis: Redis, ticks: Stream[Tick]
) -> None:
    calls = [0]

    async def process(events: Events[Tick]) -> None:
        calls[0] += 1
        raise Boom("before iterating")

    async def run() -> None:
        async with feed_of(redis, ticks) as feed:
            policy = ExceptionPolicy(action="retry", retries=2, backoff=FAST)
            await run_processor(process, feed, policy, redis=redis)

    with trio.fail_after(10), pytest.raises(ProcessorHalted):
        await run()
    assert calls == [3]


def test_policy_validation() -> None:
    with pytest.raises(ConfigError):
        ExceptionPolicy(action="explode")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ExceptionPolicy(on_exhausted="retry")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ExceptionPolicy(retries=-1)
    with pytest.raises(ConfigError):
        ExceptionPolicy(max_deliveries=0)
    assert ExceptionPolicy(action="retry", on_exhausted="ignore").final_action == "ignore"
    assert ExceptionPolicy(action="dead_letter").final_action == "dead_letter"
    with pytest.raises(ConfigError):
        ExceptionPolicy(on_undecodable="retry")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ExceptionPolicy(on_poison="explode")  # type: ignore[arg-type]
    default = ExceptionPolicy()
    assert (default.on_undecodable, default.on_poison) == ("dead_letter", "dead_letter")
