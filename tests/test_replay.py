"""``streamkit reset`` beyond start and end: from a time, from an entry id, one
partition, what is gone, nothing to do, and what ``status`` says afterwards; the same
from code."""

from __future__ import annotations

import operator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio
from coredis.tokens import PureToken

from streamkit import App, Events, Record, tumbling
from streamkit._replay import before, parse_position
from streamkit._wire import text as wire_text
from streamkit._worker import run_worker
from streamkit.lowlevel import ResetRefused
from streamkit.testing import wait_until
from tests.test_cli import streamkit
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess

APP = "tests.apps.lossy:app"  # count (a table) and watch (stateless), 4 partitions


async def group_of(redis: Redis, key: str, group: str) -> dict[str, Any]:
    for info in await redis.xinfo_groups(key):
        fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in info.items()}
        name = fields["name"]
        if (name.decode() if isinstance(name, bytes) else name) == group:
            return fields
    raise AssertionError(f"no group {group} on {key}")


async def sent_orders(redis_url: str, n: int, start: int = 0) -> list[str]:
    from tests.apps.lossy import Order, make_app

    app, orders, _ = make_app(redis_url=redis_url)
    async with app:
        return await orders.send_many(
            [Order(order_id=start + i, customer=f"c{i % 4}") for i in range(n)]
        )


def test_positions_are_read_as_times_ids_and_words() -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    assert parse_position("start") == "start"
    assert parse_position("1764583200000-3") == "1764583200000-3"
    assert parse_position("-2h", now=now) == now - timedelta(hours=2)
    assert parse_position("-90s", now=now) == now - timedelta(seconds=90)
    assert parse_position("2026-12-01T10:00:00") == datetime(2026, 12, 1, 10, tzinfo=UTC)
    offset = parse_position("2026-12-01T10:00:00+01:00")
    assert isinstance(offset, datetime)
    assert offset == datetime(2026, 12, 1, 9, tzinfo=UTC)


@pytest.mark.cluster
async def test_a_replay_from_a_time_and_from_an_id(redis_url: str, redis: Redis) -> None:
    first = await sent_orders(redis_url, 8)
    await trio.sleep(0.05)  # the scenario: two batches sent apart, told apart by time
    second = await sent_orders(redis_url, 8, start=100)
    between = min(int(entry_id.partition("-")[0]) for entry_id in second)
    at = datetime.fromtimestamp(between / 1000, UTC).isoformat(timespec="milliseconds")
    assert max(int(entry_id.partition("-")[0]) for entry_id in first) < between
    # The stateless processor; the one with a table needs --state keep.
    done = await streamkit("reset", APP, "watch", "--to", at, "-y", redis_url=redis_url)
    assert done.code == 0, done.err
    assert f"watch now reads orders from {at[:19]}" in done.out
    lag = 0
    for p in range(4):
        lag += (await group_of(redis, f"__strm:{{lossy.orders.{p}}}", "lossy.orders.watch"))["lag"]
    assert lag == len(second)  # exactly the second batch is left to process

    refused = await streamkit("reset", APP, "count", "--to", at, "-y", redis_url=redis_url)
    assert refused.code == 2  # usage errors, in one line
    assert "--state keep" in refused.err
    assert "cannot be exact" in refused.err
    clear = await streamkit(
        "reset", APP, "count", "--to", at, "--state", "clear", "-y", redis_url=redis_url
    )
    assert clear.code == 2
    assert "cannot be exact" in clear.err
    assert len(clear.err.strip().splitlines()) == 1, clear.err

    # From an id on, in one partition only.
    partition = 1
    key = f"__strm:{{lossy.orders.{partition}}}"
    entries = await redis.xrange(key)
    third = wire_text(entries[2].identifier)
    done = await streamkit(
        "reset", APP, "watch", "--to", third, "--partition", str(partition), "-y",
        redis_url=redis_url,
    )  # fmt: skip
    assert done.code == 0, done.err
    assert f"(partition {partition})" in done.out
    assert (await group_of(redis, key, "lossy.orders.watch"))["lag"] == len(entries) - 2
    status = orjson.loads((await streamkit("status", APP, "--json", redis_url=redis_url)).out)
    watch = next(p for p in status["processors"] if p["processor"] == "watch")
    assert watch["last_reset"]["partitions"] == str(partition)
    row = watch["partitions"][partition]
    assert row["reads_after"] == before(third)  # the last id before the third entry
    text = await streamkit("status", APP, redis_url=redis_url)
    assert f"ago: reads orders from entry {third} (partitions {partition})" in text.out, text.out


async def test_what_is_gone_and_nothing_to_do(redis_url: str, redis: Redis) -> None:
    await sent_orders(redis_url, 40)
    for p in range(4):
        await redis.xtrim(f"__strm:{{lossy.orders.{p}}}", PureToken.MAXLEN, 4)
    kept = sum([await redis.xlen(f"__strm:{{lossy.orders.{p}}}") for p in range(4)])
    yesterday = await streamkit(
        "reset", APP, "watch", "--to", "-1d", redis_url=redis_url, stdin=b"n\n"
    )
    assert yesterday.code == 1  # refused at the prompt: nothing changed
    assert f"{kept} event(s) will be processed again" in yesterday.err
    assert f"{40 - kept} event(s) sent before" in yesterday.err
    assert "no longer retained" in yesterday.err

    # With -y there is no prompt: the summary says what is gone all the same, and
    # status (and its JSON) keeps it with the reset.
    done = await streamkit(
        "reset", APP, "count", "--to", "start", "--state", "clear", "-y", redis_url=redis_url
    )
    assert done.code == 0, done.err
    assert "count now reads orders from the start, its state cleared" in done.out
    assert f"{40 - kept} event(s) sent before" in done.out
    assert "no longer retained (trimmed, in partitions 0, 1, 2, 3)" in done.out
    status = orjson.loads((await streamkit("status", APP, "--json", redis_url=redis_url)).out)
    count = next(p for p in status["processors"] if p["processor"] == "count")
    assert count["last_reset"]["gone"] == 40 - kept
    text = await streamkit("status", APP, redis_url=redis_url)
    assert f"{40 - kept} event(s) were gone (trimmed): not replayed" in text.out, text.out

    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    nothing = await streamkit("reset", APP, "watch", "--to", later, "-y", redis_url=redis_url)
    assert nothing.code == 0, nothing.err
    assert "nothing to replay" in nothing.out
    assert "nothing was reset" in nothing.out


class Tick(Record):
    key: str
    n: int


async def test_the_same_from_code(redis_url: str, redis: Redis) -> None:
    app = App("codereset", redis_url=redis_url)
    ticks = app.stream("ticks", record=Tick, partition_by="key", partition_count=2)
    totals = app.table("totals", value=int, default=0)

    @app.processor(ticks, tables=[totals])
    async def add(events: Events[Tick]) -> None:
        async for tick in events.records():
            totals.set(tick.key, await totals.get(tick.key) + tick.n)

    async with app:
        await ticks.send_many([Tick(key=f"k{i % 3}", n=i) for i in range(30)])

        async def processed() -> bool:
            return sum(await totals.read_many(["k0", "k1", "k2"])) == sum(range(30))

        for _ in range(2):  # the first run, then the rebuild: the same totals
            async with trio.open_nursery() as nursery:
                worker = await nursery.start(run_worker, app)
                await wait_until(processed, what="every tick added", within=20)
                await worker.stop()
            with pytest.raises(ResetRefused, match="--state clear"):
                await app.plan_reset("add", to="start")
            plan = await app.plan_reset("add", to="start", state="clear")
            assert plan.events == 30
            assert "rebuilt from the retained events" in "\n".join(plan.describe())
            await app.reset("add", to="start", state="clear")
            assert await totals.read_many(["k0", "k1", "k2"]) == [0, 0, 0]


async def test_what_is_gone_is_dated_by_the_partitions_that_lost_it(
    redis_url: str, redis: Redis
) -> None:
    """Only partition 2 is trimmed, after the others' events were sent: the events gone
    were sent before partition 2's oldest retained one, not before the oldest retained
    of all partitions."""
    from tests.apps.lossy import make_app

    await sent_orders(redis_url, 16)
    await trio.sleep(0.05)  # the scenario: partition 2's events retained are newer
    await sent_orders(redis_url, 16, start=100)
    key = "__strm:{lossy.orders.2}"
    sent_there = await redis.xlen(key)
    assert sent_there > 2
    await redis.xtrim(key, PureToken.MAXLEN, 2)
    first = (await redis.xrange(key))[0]
    oldest = datetime.fromtimestamp(int(wire_text(first.identifier).split("-")[0]) / 1000, UTC)
    lossy, _, _ = make_app(redis_url=redis_url)
    async with lossy:
        plan = await lossy.plan_reset("watch", to="start")
    assert [p.partition for p in plan.partitions if p.gone] == [2]
    assert plan.gone == sent_there - 2
    earliest = min(p.first for p in plan.partitions if p.first)
    assert earliest < wire_text(first.identifier)  # the others retain older events
    assert plan.loss() == (
        f"{sent_there - 2} event(s) sent before {oldest.isoformat(timespec='seconds')} are no "
        f"longer retained (trimmed, in partition 2): they are not processed"
    )


@pytest.mark.timeout(90)
async def test_usage_errors_come_first_and_exit_2(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """A missing --state, --state clear with a time, an id or the end: a usage error in
    one line (exit 2), said before anything about running workers."""
    await sent_orders(redis_url, 8)
    workers.append(start_worker(redis_url, tmp_path, app=APP))
    await wait_members(redis, 1, group="lossy.orders.count")
    entry = wire_text((await redis.xrange("__strm:{lossy.orders.1}"))[0].identifier)
    for args, said in [
        (("--to", "start"), "say --state clear"),
        (("--to", "-1h", "--state", "clear"), "cannot be exact"),
        (("--to", entry, "--state", "clear"), "cannot be exact"),
        (("--to", "end", "--state", "clear"), "--to end replays none"),
    ]:
        refused = await streamkit("reset", APP, "count", *args, "-y", redis_url=redis_url)
        assert refused.code == 2, (args, refused)
        assert said in refused.err, refused.err
        assert "worker(s) run" not in refused.err
        assert len(refused.err.strip().splitlines()) == 1, refused.err
    # A stateless processor's --state clear --to end is as contradictory.
    refused = await streamkit(
        "reset", APP, "watch", "--to", "end", "--state", "clear", "-y", redis_url=redis_url
    )
    assert refused.code == 2, refused
    # What is asked being fine, the running worker is what stops it (exit 1).
    busy = await streamkit("reset", APP, "count", "--to", "end", "-y", redis_url=redis_url)
    assert busy.code == 1, busy
    assert "1 worker(s) run count right now" in busy.err
    # With --force, the prompt says what becomes of the worker's partitions.
    asked = await streamkit(
        "reset", APP, "count", "--to", "end", "--force", redis_url=redis_url, stdin=b"n\n"
    )
    assert asked.code == 1, asked
    assert "1 worker(s) run count: the reset takes their leases" in asked.err, asked.err
    assert "nothing was reset" in asked.err


class Hit(Record):
    key: str
    n: int


async def test_what_a_replay_against_kept_windows_does_is_said(
    redis_url: str, redis: Redis
) -> None:
    """--state keep with windows: the events of closed windows are late (dropped or
    dead-lettered), those windows' results are not emitted again, the open windows count
    the events twice; the plain tables count them twice, the plain outputs are emitted
    again."""
    app = App("keepwin", redis_url=redis_url)
    hits = app.stream("hits", record=Hit, partition_by="key", partition_count=2)
    echoes = app.stream("echoes", record=Hit, partition_by="key", partition_count=2)
    sums = app.stream("sums", record=dict, partition_by=lambda r: r["key"], partition_count=2)
    totals = app.table("totals", value=int, default=0)
    tens = app.window(
        "tens", tumbling(timedelta(seconds=10)), value=int, initial=0, output=sums, idle=False
    )

    @app.processor(hits, tables=[totals, tens], outputs=[echoes])
    async def add(events: Events[Hit]) -> None:
        async for hit in events.records():
            totals.set(hit.key, await totals.get(hit.key) + hit.n)
            await tens.update(hit.key, hit, operator.add, hit.n)
            events.emit(echoes, hit)

    async with app:
        await hits.send_many([Hit(key=f"k{i}", n=i) for i in range(4)])
        keep = "\n".join((await app.plan_reset("add", to="start", state="keep")).describe())
        clear = "\n".join((await app.plan_reset("add", to="start", state="clear")).describe())
    assert "Its state (totals) is kept: the events are processed again against it" in keep
    assert "Its windows (tens) are kept, with the watermark" in keep
    assert "is late (dropped, or dead-lettered" in keep
    assert "closed windows neither change nor emit again" in keep
    assert "windows still open fold the replayed events again" in keep
    assert "What it emits to echoes during the replay is emitted again." in keep
    assert "sums" not in keep  # a closed window's result is not emitted again
    assert "Its state (totals, tens) is cleared with the reset and rebuilt" in clear
    assert "What it emits to echoes, sums during the replay is emitted again." in clear
