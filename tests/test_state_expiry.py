"""Tables whose keys expire: exact by the events' own times, swept by the commits,
never returned once expired, on a server and on a cluster."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, Events, Record
from streamkit._worker import run_worker
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit import Redis

FAST: dict[str, Any] = {
    "lease_ttl": 1.0,
    "heartbeat_interval": 0.1,
    "session_timeout": 1.0,
    "grace_period": 1.0,
}
TTL = 1.5  # seconds


class Visit(Record):
    user: str
    n: int


def visits_app(redis_url: str, seen: list[tuple[str, int, int]]) -> tuple[App, Any, Any]:
    """Counts visits per user in a table whose keys expire TTL after their last write;
    ``seen`` gets (user, n, count after the visit) per processed visit."""
    app = App("exp", redis_url=redis_url, **FAST)
    visits = app.stream("visits", record=Visit, partition_by="user", partition_count=2)
    counts = app.table("counts", value=int, default=0, ttl=timedelta(seconds=TTL))

    @app.processor(visits, tables=[counts])
    async def count(events: Events[Visit]) -> None:
        async for visit in events.records():
            n = await counts.get(visit.user) + 1
            counts.set(visit.user, n)
            seen.append((visit.user, visit.n, n))

    return app, visits, counts


def ms(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def model(sent: list[tuple[str, int, str]]) -> dict[int, int]:
    """The count each visit must see, by the visits' own append times: a key expires
    TTL after its last write."""
    last: dict[str, tuple[int, int]] = {}
    out = {}
    for user, n, entry_id in sent:
        at = ms(entry_id)
        count, written = last.get(user, (0, -math.inf))
        count = count + 1 if at < written + TTL * 1000 else 1
        last[user] = (count, at)
        out[n] = count
    return out


@pytest.mark.cluster
async def test_a_key_expires_ttl_after_its_last_write_by_the_events_times(
    redis_url: str, redis: Redis
) -> None:
    seen: list[tuple[str, int, int]] = []
    app, visits, _ = visits_app(redis_url, seen)
    sent: list[tuple[str, int, str]] = []

    async def visit(user: str, n: int) -> None:
        (entry_id,) = await visits.send(Visit(user=user, n=n))
        sent.append((user, n, entry_id))

    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await visit("ada", 1)
        await visit("bob", 2)
        await trio.sleep(TTL / 3)  # the scenario: ada comes back within the ttl
        await visit("ada", 3)
        await trio.sleep(TTL * 1.5)  # bob's key expires; ada's first write too
        await visit("bob", 4)
        await visit("ada", 5)

        async def all_seen() -> bool:
            return len(seen) == 5

        await wait_until(all_seen, what="every visit processed", within=20)
        await worker.stop()
    expected = model(sent)
    assert {n: count for _, n, count in seen} == expected
    # ada's count restarted only if her second write had expired too (by the times).
    assert expected[4] == 1


async def test_expired_keys_are_never_read_and_are_swept_on_a_quiet_partition(
    redis_url: str, redis: Redis
) -> None:
    seen: list[tuple[str, int, int]] = []
    app, visits, counts = visits_app(redis_url, seen)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        (entry_id,) = await visits.send(Visit(user="ada", n=1))
        deadline = ms(entry_id) + TTL * 1000
        partition = counts.partition_of("ada")
        key = counts.key(partition)

        async def committed() -> bool:
            return await redis.hexists(key, "ada")

        await wait_until(committed, what="ada's count committed", within=10)
        # Read until it reads as gone: never before its deadline (Redis's clock).
        async with app:
            while True:
                value = await counts.read("ada")
                now = await server_ms(redis)
                if value == 0:
                    assert now >= deadline, (now, deadline)
                    break
                assert value == 1
                await trio.sleep(0.05)

        # The quiet partition's commits give the space back, with nothing else sent.
        async def swept() -> bool:
            return not await redis.hexists(key, "ada") and not await redis.zcard(
                counts.expiry_key(partition)
            )

        await wait_until(swept, what="ada's key swept", within=TTL + 5)
        await worker.stop()


async def server_ms(redis: Redis) -> int:
    """Redis's clock, in ms (as the scripts read it)."""
    now: Any = await redis.eval(
        "local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000)", [], []
    )
    return int(now)


async def test_no_reader_returns_an_expired_key_swept_or_not(redis_url: str, redis: Redis) -> None:
    """Keys past their deadline and not swept yet (no worker runs): every reader, in any
    process, leaves them out."""
    app, _, counts = visits_app(redis_url, [])
    users = [f"u{i}" for i in range(20)]
    now = await server_ms(redis)
    for i, user in enumerate(users):
        partition = counts.partition_of(user)
        await redis.hset(counts.key(partition), {user: str(i)})
        # The even ones expired a second ago; the odd ones expire in an hour.
        deadline = now - 1000 if i % 2 == 0 else now + 3_600_000
        await redis.zadd(counts.expiry_key(partition), {user: deadline})
    alive = {user: i for i, user in enumerate(users) if i % 2}
    expected_many = [alive.get(user, 0) for user in users]
    async with app:
        assert [await counts.read(user) for user in users] == expected_many
        assert await counts.read_many(users) == expected_many
        assert dict([item async for item in counts.items()]) == alive
    client = app.blocking()
    try:
        got = await trio.to_thread.run_sync(
            lambda: (
                [client.read(counts, user) for user in users],
                client.read_many(counts, users),
                dict(client.items(counts)),
            )
        )
    finally:
        client.close()
    assert got == (expected_many, expected_many, alive)


@pytest.mark.cluster
async def test_a_key_expired_during_a_handover_is_not_read_by_anyone(
    redis_url: str, redis: Redis
) -> None:
    """The worker goes (no one owns the partition, no commit sweeps): readers already
    leave the expired key out; the next owner's processor sees it missing too."""
    seen: list[tuple[str, int, int]] = []
    app, visits, counts = visits_app(redis_url, seen)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        (entry_id,) = await visits.send(Visit(user="ada", n=1))
        await visits.send(Visit(user="ada", n=2))

        async def counted() -> bool:
            return len(seen) == 2

        await wait_until(counted, what="ada's visits counted", within=10)
        await worker.stop()
    partition = counts.partition_of("ada")

    async def due() -> bool:
        return await server_ms(redis) >= ms(entry_id) + TTL * 1000 + 200

    await wait_until(due, what="ada's key due", within=TTL + 5)
    assert await redis.hexists(counts.key(partition), "ada"), "swept already: no handover"
    async with app:
        assert await counts.read("ada") == 0
        assert dict([item async for item in counts.items()]) == {}
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await visits.send(Visit(user="ada", n=3))

        async def third() -> bool:
            return len(seen) == 3

        await wait_until(third, what="ada's third visit", within=10)
        await worker.stop()
    assert seen[-1] == ("ada", 3, 1)  # counted from nothing: the old count had expired


async def test_a_key_whose_commit_lands_while_the_index_is_read_still_expires(
    redis_url: str, redis: Redis
) -> None:
    """A key whose commit is in flight is due from memory, not from the index; if that
    commit lands while a sweep reads the index, the key is in neither what the read
    returned nor in flight after it, and was left unexpired (for ever on a quiet
    partition: nothing due was left to sweep again)."""
    from streamkit._commit import Changes
    from streamkit._state_expiry import ExpiringTableView
    from streamkit._state_views import MISSING
    from tests.test_joins import LandsDuringRead

    _, _, counts = visits_app(redis_url, [])
    view = ExpiringTableView(counts, 0, 2, redis, 100)
    await view.open()
    clock = 1_000_000
    view.now = lambda: clock
    view.set("ada", 1)
    view.promote()
    pinned: list[bytes] = []
    view.contribute(Changes(), pinned)  # handed to a commit, not landed yet
    view._redis = LandsDuringRead(redis, "evalsha", lambda: view.unpin(pinned))  # type: ignore[assignment]
    await view.sweep(clock + int(TTL * 1000))
    assert view.done_writes() == {b"ada": (MISSING, None)}, "swept"
