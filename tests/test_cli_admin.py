"""``streamkit status``, ``reset`` and ``deadletters`` against a real worker's results."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

import attrs
import orjson
import pytest
import trio

from streamkit._worker import run_worker
from streamkit.testing import wait_until
from tests.apps import failing
from tests.test_cli import signalled_while_paused, streamkit

if TYPE_CHECKING:
    from streamkit import Redis

APP = "tests.apps.failing:app"
DEAD = "__dead:{failing.jobs.handle}"


@pytest.fixture
async def processed(redis_url: str, redis: Redis) -> None:
    """30 jobs processed by a worker: 27 done, 3 dead-lettered."""
    app = failing.app
    app.settings = attrs.evolve(app.settings, redis_url=redis_url, grace_period=0.5)
    async with app, trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await failing.jobs.send_many(failing.Job(key=f"k{n % 4}", n=n) for n in range(30))

        async def processed() -> bool:
            return await redis.llen("failing:done") >= 27 and await redis.xlen(DEAD) >= 3

        await wait_until(processed, what="27 jobs done and 3 dead letters", within=30)
        await worker.stop()


@pytest.mark.cluster
async def test_status_shows_every_partition(redis_url: str, processed: None) -> None:
    result = await streamkit("status", APP, redis_url=redis_url)
    assert result.code == 0, result.err
    assert "processor handle (stream jobs): lag 0 · pending 0 · " in result.out
    assert f"Redis at {redis_url}" in result.out
    lines = result.out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["part", "worker"])
    assert lines[header].split() == ["part", "worker", "entries", "lag", "pending", "last", "event"]
    partitions = [line.split() for line in lines[header + 2 : header + 4]]
    assert [row[0] for row in partitions] == ["0", "1"]  # one row per partition
    assert all(row[3:5] == ["0", "0"] for row in partitions), result.out  # no lag, no pending
    assert max(len(line) for line in result.out.splitlines()) <= 80


@pytest.mark.cluster
async def test_dead_letters_list_replay_purge(
    redis_url: str, redis: Redis, processed: None
) -> None:
    assert await redis.xlen(DEAD) == 3
    listed = await streamkit("deadletters", "list", APP, "handle", redis_url=redis_url)
    assert listed.code == 0, listed.err
    assert listed.out.count("ValueError: bad job") == 3
    for n in (3, 13, 23):
        assert f"bad job {n}" in listed.out

    before = sum([await redis.xlen(f"__strm:{{failing.jobs.{p}}}") for p in range(2)])
    replayed = await streamkit("deadletters", "replay", APP, "handle", "--yes", redis_url=redis_url)
    assert replayed.code == 0, replayed.err
    assert "replayed 3 dead letter(s)" in replayed.out
    after = sum([await redis.xlen(f"__strm:{{failing.jobs.{p}}}") for p in range(2)])
    assert after == before + 3
    assert await redis.xlen(DEAD) == 0

    await redis.xadd(DEAD, {"dl.reason": "error", "data": "{}"})
    purged = await streamkit("deadletters", "purge", APP, "handle", "--yes", redis_url=redis_url)
    assert "purged 1 dead letter(s)" in purged.out
    assert await redis.xlen(DEAD) == 0


@pytest.mark.cluster
async def test_reset_needs_confirmation(redis_url: str, redis: Redis, processed: None) -> None:
    refused = await streamkit("reset", APP, "handle", "--to", "start", redis_url=redis_url)
    assert refused.code == 1
    assert "nothing was reset" in refused.err

    done = await streamkit("reset", APP, "handle", "--to", "start", "--yes", redis_url=redis_url)
    assert done.code == 0, done.err
    status = await streamkit("status", APP, redis_url=redis_url)
    # Every entry is lag again.
    total = sum([await redis.xlen(f"__strm:{{failing.jobs.{p}}}") for p in range(2)])
    assert str(total) not in ("0",)
    assert status.code == 0


async def test_unknown_processor_in_admin_commands(redis_url: str) -> None:
    result = await streamkit("deadletters", "list", APP, "nope", redis_url=redis_url)
    assert result.code == 2
    assert "unknown processor 'nope' (known: handle)" in result.err


@pytest.mark.cluster
async def test_reset_a_new_app_creates_what_is_missing(redis_url: str, redis: Redis) -> None:
    # Partition 0 exists (an event was sent), partition 1 does not yet.
    await redis.xadd("__strm:{failing.jobs.0}", {"data": '{"key": "a", "n": 1}'})
    done = await streamkit("reset", APP, "handle", "--to", "end", "--yes", redis_url=redis_url)
    assert done.code == 0, done.err
    assert "handle now reads jobs from the end" in done.out
    for p in range(2):
        [group] = await redis.xinfo_groups(f"__strm:{{failing.jobs.{p}}}")
        fields = {k.decode() if isinstance(k, bytes) else k: v for k, v in group.items()}
        assert fields["lag"] == 0


@pytest.mark.cluster
async def test_reset_checks_every_partition_before_changing_any(
    redis_url: str, redis: Redis
) -> None:
    await redis.xadd("__strm:{failing.jobs.0}", {"data": '{"key": "a", "n": 1}'})
    await redis.set("__strm:{failing.jobs.1}", "not a stream")
    refused = await streamkit("reset", APP, "handle", "--to", "end", "--yes", redis_url=redis_url)
    assert refused.code == 1
    assert "__strm:{failing.jobs.1} holds a string, not a stream" in refused.err
    assert "nothing was reset" in refused.err
    assert "Traceback" not in refused.err
    assert await redis.xinfo_groups("__strm:{failing.jobs.0}") == ()


@pytest.mark.cluster
async def test_status_names_workers_once_and_shows_dead_static_members(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = failing.app
    monkeypatch.setattr(app, "settings", attrs.evolve(app.settings, redis_url=redis_url))
    handle = app.processors["handle"]
    static = attrs.evolve(handle.settings, member_id="web-1", static_grace=0.5)
    monkeypatch.setitem(app.processors, "handle", attrs.evolve(handle, settings=static))
    async with app, trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await failing.jobs.send_many(failing.Job(key=f"k{n}", n=n * 10) for n in range(4))

        async def done() -> bool:
            return await redis.llen("failing:done") >= 4

        await wait_until(done, what="4 jobs done", within=30)
        alive = await streamkit("status", APP, "--json", redis_url=redis_url)
        assert alive.code == 0, alive.err
        report = orjson.loads(alive.out)
        [processor] = report["processors"]
        [member] = processor["workers"]
        name = f"{socket.gethostname()}:{os.getpid()} (web-1)"
        assert member["name"] == name
        assert member["alive"] is True
        assert {p["worker"] for p in processor["partitions"]} == {name}
        assert report["redis_url"] == redis_url
        await worker.stop()

    async def beat_expired() -> bool:
        return not await redis.exists(["__beat:{failing.jobs.handle}:web-1"])

    await wait_until(beat_expired, what="the static member's heartbeat expired", within=10)
    dead = await streamkit("status", APP, redis_url=redis_url)
    assert dead.code == 0, dead.err
    assert "dead (static" in dead.out
    assert "waits for" in dead.out


async def dead_letters(redis: Redis, count: int) -> None:
    for n in range(count):
        await redis.xadd(
            DEAD, {"dl.reason": "error", "dl.partition": str(n % 2), "data": '{"key": "k", "n": 3}'}
        )


async def partition_entries(redis: Redis) -> int:
    return sum([await redis.xlen(f"__strm:{{failing.jobs.{p}}}") for p in range(2)])


STOPPING = b"SIGINT: stopping after the step in flight"


async def test_a_signal_stops_the_replay_between_two_letters(redis_url: str, redis: Redis) -> None:
    await dead_letters(redis, 10)
    result = await signalled_while_paused(
        redis, "deadletters", "replay", APP, "handle", "--yes", redis_url=redis_url, said=[STOPPING]
    )
    assert result.code == 130, result.err
    assert "Traceback" not in result.err
    # The letter in flight was replayed and removed; the others were not touched.
    assert (
        "stopped by SIGINT: replayed 1 of 10 dead letter(s) of handle; the others are untouched"
        in result.err
    )
    assert await partition_entries(redis) == 1
    assert await redis.xlen(DEAD) == 9


async def test_a_signal_in_the_last_step_lets_it_finish(redis_url: str, redis: Redis) -> None:
    await dead_letters(redis, 10)
    result = await signalled_while_paused(
        redis, "deadletters", "purge", APP, "handle", "--yes", redis_url=redis_url, said=[STOPPING]
    )
    # Purging them all is one step: once it is done, there is nothing left to stop.
    assert result.code == 0, result.err
    assert result.out.strip() == "purged 10 dead letter(s) of handle"
    assert await redis.xlen(DEAD) == 0


async def test_a_second_signal_stops_at_once_and_loses_nothing(
    redis_url: str, redis: Redis
) -> None:
    await dead_letters(redis, 10)
    result = await signalled_while_paused(
        redis,
        "deadletters",
        "replay",
        APP,
        "handle",
        "--yes",
        redis_url=redis_url,
        said=[STOPPING, b"stopped at once"],
    )
    assert result.code == 130, result.err
    assert (
        "stopped at once by a second SIGINT: replayed at least 0 of 10 dead letter(s) of handle"
        in result.err
    )
    # The letter in flight is replayed or not, and still a dead letter: none is lost.
    assert await partition_entries(redis) in (0, 1)
    assert await redis.xlen(DEAD) == 10
