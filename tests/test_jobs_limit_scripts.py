"""The bookkeeping of rate and concurrency limits in the claim and finish scripts, call
by call, against a real Redis: a claim keeps what it knows of a limit's keys (the size of
a concurrency set, of a rate window) and adds the places it takes in a rate window at its
end, so what one call does must still hold every limit exactly, the window filling or
slots coming free in the middle of the call included; a scope whose held jobs were all
let out is disarmed at once, and a job arriving while others wait still waits behind them.
(The limits under workers, in flight: test_jobs_control.py, test_jobs_state.py.)"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pytest

from streamkit._lua import script
from streamkit._redis import LuaScript
from streamkit.jobs import JobStatus, RateLimit, open_job_queue
from streamkit.jobs._claim import ensure_groups
from streamkit.jobs._scripts import GROUP
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import Redis
    from streamkit.jobs import JobHandle, JobQueue

_CLAIM = LuaScript(script("jobs/claim"))
_FINISH = LuaScript(script("jobs/finish"))
#: Jobs run under this name; its limits' keys are named after it.
NAME = "limited"


_NOW_MS = LuaScript("local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000)")


async def redis_ms(redis: Redis) -> int:
    """Redis's clock, in milliseconds, as the scripts read it (their leases and windows
    run on it; ``redis.time()`` keeps whole seconds only)."""
    return int(await _NOW_MS(redis, keys=[], args=[]))


async def wait_redis_past(redis: Redis, seconds: float) -> None:
    """Wait until ``seconds`` have passed on Redis's clock from now."""
    until = await redis_ms(redis) + math.ceil(seconds * 1000) + 1

    async def past() -> bool:
        return await redis_ms(redis) >= until

    await wait_until(past, what=f"{seconds}s passed on Redis's clock", within=10)


@pytest.fixture
async def queue(redis: Redis) -> AsyncIterator[JobQueue]:
    async with open_job_queue(redis, "lim", lease_ttl=0.2) as queue:
        await ensure_groups(queue, 0)
        yield queue


def key(queue: JobQueue, suffix: str) -> str:
    return f"{queue.shard_keys[0].base}:{suffix}"


async def claim(
    queue: JobQueue,
    want: int,
    consumer: str = "w1",
    *,
    reclaim: bool = False,
    delivered: tuple[Any, ...] = (),
) -> list[Any]:
    """One call of the claim script: the jobs it started."""
    keys = queue.shard_keys[0]
    args = (
        keys.base,
        consumer,
        want,
        math.ceil(queue.lease_ttl * 1000),
        "1" if reclaim else "0",
        queue.max_deliveries,
        b"{}",
        *delivered,
    )
    reply: list[Any] = await _CLAIM(queue.redis, keys.keys, args)
    return list(reply[0])


async def finish(queue: JobQueue, jobs: list[Any]) -> None:
    """One call of the finish script: each job succeeded."""
    keys = queue.shard_keys[0]
    outcomes: list[Any] = [keys.base, math.ceil(queue.lease_ttl * 1000)]
    for job in jobs:
        outcomes += [job[0], job[4], "ok", b"null", 0]
    await _FINISH(queue.redis, keys.keys, outcomes)


def ids(jobs: list[Any]) -> list[str]:
    return [job[0].decode() if isinstance(job[0], bytes) else job[0] for job in jobs]


async def statuses(handles: list[JobHandle[Any]]) -> list[JobStatus]:
    return [(await h.info()).status for h in handles]


# ---------------------------------------------------------------------- rate windows


async def starts_in(redis: Redis, window: str) -> int:
    """The starts rate window ``window`` counts (its count, kept beside it)."""
    raw = await redis.get(window.replace(":rl:", ":rn:", 1))
    return int(raw or 0)


def starts_of(member: Any) -> int:
    """The starts of a member of a rate window (a group of a call's places)."""
    text = member.decode() if isinstance(member, bytes) else member
    return int(text.rpartition("#")[2]) if "#" in text else 1


async def test_one_claim_takes_no_more_places_in_a_window_than_the_rate_allows(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job(name=NAME, rate_limit="5/60s")
    async def job(n: int) -> None: ...

    handles = await job.enqueue_many([(n,) for n in range(20)])
    started = await claim(queue, 20)
    assert ids(started) == [h.id for h in handles[:5]]
    window = key(queue, f"rl:n:{NAME}")
    assert await starts_in(redis, window) == 5
    assert await redis.zcard(window) == 1  # one group: the call's 5 places
    assert 59_000 < await redis.pttl(window) <= 60_000
    assert 59_000 < await redis.pttl(window.replace(":rl:", ":rn:")) <= 60_000
    assert await statuses(handles[5:]) == [JobStatus.HELD] * 15
    assert await claim(queue, 20) == []
    await finish(queue, started)
    assert await claim(queue, 20) == []  # the window is full still
    assert await starts_in(redis, window) == 5


async def test_the_places_of_a_claim_that_leaves_room_are_in_the_window_after_it(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job(name=NAME, limit_key="k", key_rate_limit="4/60s")
    async def job(k: str, n: int) -> None: ...

    await job.enqueue_many([("a", n) for n in range(6)])
    assert len(await claim(queue, 3, "w1")) == 3
    assert await starts_in(redis, key(queue, f"rl:k:{NAME}:a")) == 3
    assert len(await claim(queue, 3, "w2")) == 1
    assert await starts_in(redis, key(queue, f"rl:k:{NAME}:a")) == 4


async def test_a_claim_that_fills_a_window_of_old_starts_drops_them_and_counts_its_own(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job(name=NAME, rate_limit=RateLimit(3, per=0.3))
    async def job(n: int) -> None: ...

    handles = await job.enqueue_many([(n,) for n in range(10)])
    first = await claim(queue, 3)
    assert len(first) == 3
    await finish(queue, first)
    await wait_redis_past(redis, 0.3)  # the window's 3 places are out of it now
    before_ms = await redis_ms(redis)
    # In one call: the 3 old places are dropped when the window looks full, 3 places
    # taken, and the 4th job finds the window full of this call's own places.
    second = await claim(queue, 10)
    assert ids(second) == [h.id for h in handles[3:6]]
    window = key(queue, f"rl:n:{NAME}")
    groups = await redis.zrange(window, 0, -1, withscores=True)
    assert [starts_of(member) for member, _ in groups] == [3]  # the old group dropped
    assert min(score for _, score in groups) >= before_ms
    assert await starts_in(redis, window) == 3
    assert await statuses(handles[6:]) == [JobStatus.HELD] * 4


async def test_a_window_of_a_member_per_start_is_counted_and_trimmed(
    redis: Redis, queue: JobQueue
) -> None:
    """A window written before groups and counts (a member per start, no count) still
    limits: its members are counted once, and dropped as they leave the window."""

    @queue.job(name=NAME, rate_limit=RateLimit(4, per=0.5))
    async def job(n: int) -> None: ...

    window = key(queue, f"rl:n:{NAME}")
    now = await redis_ms(redis)
    await redis.zadd(window, {f"old{n}:1:{now}": now for n in range(3)})
    await redis.pexpire(window, 500)
    handles = await job.enqueue_many([(n,) for n in range(6)])
    first = await claim(queue, 6)
    assert ids(first) == [handles[0].id]  # 3 old starts and this one fill the window
    assert await starts_in(redis, window) == 4
    await wait_redis_past(redis, 0.5)
    second = await claim(queue, 6)
    assert ids(second) == [h.id for h in handles[1:5]]
    assert await starts_in(redis, window) == 4
    assert [starts_of(m) for m, _ in await redis.zrange(window, 0, -1, withscores=True)] == [4]


async def test_a_claim_of_more_places_than_one_call_of_zadd_takes(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job(name=NAME, rate_limit="1000/60s", limit_key="k", key_rate_limit="1000/60s")
    async def job(k: str, n: int) -> None: ...

    await job.enqueue_many([("a", n) for n in range(1200)])
    started = await claim(queue, 1200)
    assert len(started) == 1000
    for window in (key(queue, f"rl:n:{NAME}"), key(queue, f"rl:k:{NAME}:a")):
        assert await starts_in(redis, window) == 1000
        assert await redis.pttl(window) > 59_000


# ---------------------------------------------------------------------- concurrency slots


async def test_one_claim_grants_no_more_slots_than_the_limit(redis: Redis, queue: JobQueue) -> None:
    @queue.job(name=NAME, concurrency=3)
    async def job(n: int) -> None: ...

    handles = await job.enqueue_many([(n,) for n in range(10)])
    started = await claim(queue, 10)
    assert len(started) == 3
    slots = key(queue, f"cc:n:{NAME}")
    assert await redis.scard(slots) == 3
    assert await statuses(handles[3:]) == [JobStatus.HELD] * 7
    await finish(queue, started[:1])  # one slot free: one held job let out
    assert len(await claim(queue, 10)) == 1
    assert await redis.scard(slots) == 3


async def test_jobs_taken_over_keep_their_slots_in_the_claim_that_takes_them(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job(name=NAME, concurrency=2)
    async def job(n: int) -> None: ...

    handles = await job.enqueue_many([(n,) for n in range(2)])
    assert len(await claim(queue, 2, "w1")) == 2
    later = await job.enqueue_many([(n,) for n in range(2, 4)])
    await wait_redis_past(redis, queue.lease_ttl)  # w1's leases ran out
    # w2 takes both over (they keep their slots, counted once), then reads the new
    # jobs: no slot for them
    started = await claim(queue, 4, "w2", reclaim=True)
    assert sorted(ids(started)) == sorted(h.id for h in handles)
    assert await redis.scard(key(queue, f"cc:n:{NAME}")) == 2
    assert await statuses(later) == [JobStatus.HELD] * 2


async def test_a_slot_given_back_in_the_middle_of_a_claim_lets_the_job_waiting_for_it_start(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job(name=NAME, concurrency=1, retries=0)
    async def job(n: int) -> None: ...

    (first,) = await job.enqueue_many([(1,)])
    assert ids(await claim(queue, 1, "w1")) == [first.id]
    (second,) = await job.enqueue_many([(2,)])
    # w2's blocking read delivers the second job; then w1's lease runs out
    ready = queue.shard_keys[0].ready(1)
    read = await redis.xreadgroup(GROUP, "w2", streams={ready: ">"}, count=1)
    assert read
    (entry,) = next(iter(read.values()))
    await wait_redis_past(redis, queue.lease_ttl)  # w1's lease ran out
    # In one call: the second job is held (the first holds the slot), the first is
    # taken over and ends dead (its worker died on its last try), giving its slot back,
    # which lets the second out; read again, it starts.
    started = await claim(queue, 2, "w2", reclaim=True, delivered=(1, entry.identifier, second.id))
    assert ids(started) == [second.id]
    assert (await first.info()).status is JobStatus.DEAD
    slots = key(queue, f"cc:n:{NAME}")
    assert [m.decode() for m in await redis.smembers(slots)] == [second.id]


# ---------------------------------------------------------------------- held jobs


async def test_a_scope_whose_held_jobs_all_went_out_at_a_release_is_disarmed(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job(name=NAME, limit_key="k", key_concurrency=1)
    async def job(k: str, n: int) -> None: ...

    one, two = await job.enqueue_many([("a", 1), ("a", 2)])
    started = await claim(queue, 2)
    assert ids(started) == [one.id]
    scope = f"cc:k:{NAME}:a"
    wake, lims = key(queue, "wake"), key(queue, "lims")
    assert await redis.zscore(wake, scope) is not None
    assert await redis.hget(lims, scope) == b"1,0"
    await finish(queue, started)  # gives the slot back: lets the second out
    assert not await redis.exists([wake, key(queue, f"park:{scope}")])
    assert await redis.hget(lims, scope) is None
    again = await claim(queue, 2)
    assert ids(again) == [two.id]
    await finish(queue, again)
    assert not await redis.exists([key(queue, f"cc:k:{NAME}:a"), wake, lims])


async def test_a_job_arriving_while_others_wait_for_a_slot_waits_behind_them(
    redis: Redis, queue: JobQueue
) -> None:
    @queue.job(name=NAME, concurrency=2)
    async def job(n: int) -> None: ...

    handles = await job.enqueue_many([(n,) for n in range(5)])
    running = await claim(queue, 5)
    assert len(running) == 2
    assert await statuses(handles[2:]) == [JobStatus.HELD] * 3
    (late,) = await job.enqueue_many([(5,)])
    await finish(queue, running[:1])  # one slot free: the first held job let out
    # the late job comes first in the ready stream and a slot is free, but two jobs
    # wait for one still: it waits behind them, and the one let out starts
    started = await claim(queue, 1)
    assert (await late.info()).status is JobStatus.HELD
    assert ids(started) == [handles[2].id]
    park = [
        item.decode().split("|")[0]
        for item in await redis.lrange(key(queue, f"park:cc:n:{NAME}"), 0, -1)
    ]
    assert park == [handles[3].id, handles[4].id, late.id]
