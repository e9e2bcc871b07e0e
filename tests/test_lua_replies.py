"""Every Redis script, run through the loader against a real Redis: its reply has the
shape its header's REPLY says (each alternative a call here can reach).

A new script gets a call here: ``test_every_script_is_called_here`` fails until it does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import _keys, _lua, _redispy
from streamkit._produce import append_reply, marker_key
from streamkit._redis import NOT_LOADED, LuaScript, run_blocking_between
from streamkit.jobs._layout import ShardKeys
from streamkit.spark._client import connect

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from streamkit import Redis

STREAM = _keys.stream_key("shop", "orders", 3)
LOCK = _keys.lock_key(_keys.partition_lock_name("shop", "orders", "printer", 3))
OUTBOX = _keys.outbox_key("shop", "orders", "printer", 3)
LEASE = "me:1"
SHARD = ShardKeys("shop", 0)
BASE = SHARD.base
JOB_KEYS = list(SHARD.keys)


class Calls:
    """Runs scripts by name, keeping each reply for the shape check."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.replies: list[tuple[str, Any]] = []

    async def __call__(self, name: str, keys: list[str], args: list[Any]) -> Any:
        script = _lua.script(name)
        assert script.numkeys in (None, len(keys)), f"{name} takes {script.numkeys} keys"
        reply = await LuaScript(script)(self.redis, keys=keys, args=args)
        self.replies.append((name, reply))
        return reply


async def streams(call: Calls) -> None:
    redis = call.redis
    fence = _keys.fence_key(_keys.partition_lock_name("shop", "orders", "printer", 3))
    assert await call("admin/reset", [STREAM, LOCK, fence], ["g", "0", -1, "reset", 0]) == [0, 0]
    await redis.set(LOCK, LEASE, px=10_000)  # a worker runs the partition: its lease is taken
    assert await call("admin/reset", [STREAM, LOCK, fence], ["g", "0", -1, "reset", 0]) == [0, 1]
    assert await redis.get(LOCK) == b"reset:1"
    await redis.delete([LOCK])
    meta = _keys.meta_key("shop", "orders")
    assert await call("streams/metadata", [meta], ["partition_count", "4"]) == []
    assert len(await call("streams/metadata", [meta], ["partition_count", "8"])) == 2
    # (a join asks whether a forwarder's group has every entry behind it)
    caught_up = await call("streams/caught_up", [STREAM + ":none"], ["g"])
    assert caught_up[0] == 1  # no entries: nothing to forward
    marker = marker_key(STREAM, "t1")
    head = [1000, 0, 300]
    first = await call(
        "streams/append", [STREAM, marker], [*head, 0, 1, b"f", b"v", -2, b"d", b"x", b"y"]
    )
    again = await call(
        "streams/append", [STREAM, marker, marker_key(STREAM, "t0")], [*head, 1, 1, b"f", b"v"]
    )
    ids, _, _ = append_reply(first)
    assert (len(ids), first[1], first[2]) == (3, 0, 0)
    if type(first[0]) is not list:  # a call that crossed a millisecond says its ids one by one
        assert first[3] == 3, "consecutive: the first and a count"
    assert append_reply(again) == (ids, 0, True)
    # Ids that cannot be said as a first and a count (a sequence number past 2^53):
    # one by one, in the reply and in the marker.
    far_stream = _keys.stream_key("shop", "orders", 4)
    await redis.xadd(far_stream, {"f": "v"}, identifier="99999999999999-1000000000000000")
    far_marker = marker_key(far_stream, "t2")
    far = await call("streams/append", [far_stream, far_marker], [*head, 0, 1, b"f", b"v"])
    far_again = await call("streams/append", [far_stream, far_marker], [*head, 1, 1, b"f", b"v"])
    assert far[0] == far_again[0] == [b"99999999999999-1000000000000001"]
    spark = _keys.spark_marker_key("shop", "orders", 3, "w", "b", 0, 0)
    assert await call("spark/write", [STREAM, spark], [*head, 1, b"f", b"v"]) == [1, 0]
    assert await call("spark/write", [STREAM, spark], [*head, 1, b"f", b"v"]) == [-1, 0]
    assert len(await call("spark/ids", [STREAM], ["-", "+", 10])) == 4
    assert (await call("streams/caught_up", [STREAM], ["nobody"]))[0] == 0  # no such group
    await redis.xgroup_create(STREAM, "behind", "0")
    assert (await call("streams/caught_up", [STREAM], ["behind"]))[0] == 0
    await redis.xgroup_create(STREAM, "level", "$")
    assert (await call("streams/caught_up", [STREAM], ["level"]))[0] == 1
    # (the entries after an id, counted up to a limit: a group's lag)
    assert await call("streams/undelivered", [STREAM], ["0-0", 2]) == 2
    assert await call("streams/undelivered", [STREAM], ["0-0", 100]) == 4
    assert await call("streams/undelivered", [STREAM + ":none"], ["0-0", 10]) == 0
    relayed = _keys.relay_key(STREAM, "shop.in.1")
    assert await call("streams/relay", [STREAM, relayed], [0, "5-0", 1, b"f", b"v"]) == 1
    assert await call("streams/relay", [STREAM, relayed], [0, "5-0", 1, b"f", b"v"]) == 0
    await redis.set(LOCK, LEASE)
    entry = await redis.xadd(OUTBOX, {"f": "v"})
    progress = OUTBOX + ":relayed"
    assert await call("streams/outbox_read", [OUTBOX, LOCK, progress], ["other", 10]) == -1
    assert len(await call("streams/outbox_read", [OUTBOX, LOCK, progress], [LEASE, 10])) == 1
    assert await call("streams/outbox_delete", [OUTBOX, LOCK], ["other", entry]) == -1
    assert await call("streams/outbox_delete", [OUTBOX, LOCK], [LEASE, entry]) == 1


async def commit(call: Calls) -> None:
    redis = call.redis
    await redis.xgroup_create(STREAM, "g", "0", mkstream=True)
    await redis.set(LOCK, LEASE)
    for i in range(3):
        await redis.xadd(STREAM, {"n": str(i)})
    read = ["g", "c", 2]
    assert await call("commit/read", [STREAM, LOCK], ["other", *read, ">0-0", 0, 0]) == 0
    new = await call("commit/read", [STREAM, LOCK], [LEASE, *read, ">0-0", 0, 0])
    history = await call("commit/read", [STREAM, LOCK], [LEASE, *read, "0", 0, 0])
    assert len(new[0]) == len(history[0]) == 2
    assert history[3] == [2, 2]
    last = new[0][-1]
    rest = await call("commit/read", [STREAM, LOCK], [LEASE, "g", "c", 10, b">" + last, 0, 0])
    assert len(rest[0]) == 1
    seen = rest[0][-1]
    idle = await call("commit/read", [STREAM, LOCK], [LEASE, "g", "c", 10, b">" + seen, 0, 0])
    assert (idle[0], idle[5]) == ([], seen)
    assert await call("commit/ack", [STREAM, LOCK], ["other", "g", 0, 1, last]) == -1
    assert await call("commit/ack", [STREAM, LOCK], [LEASE, "g", 0, 1, last]) == 1
    await redis.xadd(STREAM, {"n": "3"})
    woken = await call(
        "commit/woken_read",
        [STREAM, LOCK, STREAM, LOCK],
        ["g", 10, "other", "c", "0-0", "0-0", LEASE, "c", seen, seen],
    )
    assert woken[0] == 0
    assert len(woken[1][0]) == 1
    unseen = await call("commit/woken_read", [STREAM, LOCK], ["g", 10, LEASE, "c", "0-0", "0-0"])
    assert unseen == [-1]  # delivered to c after 0-0 and pending: read the usual way
    # Nothing after the id the wait waited after: not read at all.
    newest = woken[1][0][-1]
    quiet = await call("commit/woken_read", [STREAM, LOCK], ["g", 10, LEASE, "c", "0-0", newest])
    assert quiet == []  # nothing new anywhere: no reply per partition
    permit = _keys.permit_key(LOCK)
    fence = [STREAM, LOCK, permit]
    assert await call("commit/permit", fence, ["other", "g", "c", seen, 0, 1, seen]) == -1
    # Delivered to c after 0-0 and pending: no permit, read the usual way.
    assert await call("commit/permit", fence, [LEASE, "g", "c", "0-0", 0, 0]) == [0, 0]
    assert await call("commit/permit", fence, [LEASE, "g", "c", newest, 0, 1, newest]) == [1, 1]
    assert await redis.exists([permit]) == 1


async def locks(call: Calls) -> None:
    lock = _keys.lock_key("jobs-leader")
    fence = _keys.fence_key("jobs-leader")
    assert await call("locks/inspect", [lock], []) == [None, -2]
    won = await call("locks/acquire", [lock, fence], ["me", 10_000])
    assert won == [1, 1]
    lost = await call("locks/acquire", [lock, fence], ["you", 10_000])
    assert lost[0] == 0
    value = "me:1"
    assert await call("locks/extend", [lock], [value, 10_000]) == [1]
    assert (await call("locks/extend", [lock], ["you:2", 10_000]))[0] == 0
    assert (await call("locks/inspect", [lock], []))[0] == value.encode()
    other = _keys.lock_key("jobs-other")
    many = await call("locks/extend_many", [lock, other], [10_000, value, "me:2"])
    assert many == [1, [0, None]]
    assert (await call("locks/release", [lock], ["you:2"]))[0] == 0
    assert await call("locks/release", [lock], [value]) == [1]
    assert await call("locks/release", [lock], [value]) == [0, None]
    group = _keys.processor_group("shop", "orders", "printer")
    state = _keys.membership_key(group)
    me = _keys.heartbeat_key(group, "m1")
    # No state: the member is told so, whatever it watches.
    assert await call("membership/heartbeat", [me, state], ["alive", 1000]) == -1
    await call.redis.set(state, "{}")
    assert await call("membership/heartbeat", [me, state], ["alive", 1000]) == 0
    watched = [_keys.heartbeat_key(group, m) for m in ("m1", "m3")]
    assert await call("membership/heartbeat", [me, state, *watched], ["alive", 1000]) == 1


async def jobs(call: Calls) -> None:
    redis = call.redis
    for ready in JOB_KEYS[:3]:
        await redis.xgroup_create(ready, "workers", "0", mkstream=True)
    defaults = [BASE, "job", 1, 0, 1, 60, 60, 0, ""]
    jobs_ = ["j1", "[[],{}]", "", "j2", "[[],{}]", "", "j3", "[[],{}]", '{"after":["j2"]}']
    assert await call("jobs/enqueue", JOB_KEYS, [*defaults, *jobs_]) == [1, 1, 1]
    assert await call("jobs/watch", JOB_KEYS, [BASE, "nope"]) is None
    assert (await call("jobs/watch", JOB_KEYS, [BASE, "j1"]))[0] == b"sent"
    claimed = await call("jobs/claim", JOB_KEYS, [BASE, "w1", 1, 30_000, 0, 5, "{}"])
    [job] = claimed[0]
    job_id, token = job[0], job[4]
    assert await call("jobs/renew", JOB_KEYS, [BASE, "w1", job_id, token, "gone", "w1:9"]) == [
        [b"gone"],
        [],
    ]
    assert await call("jobs/progress", JOB_KEYS, [BASE, job_id, token, "{}"]) == 1
    assert await call("jobs/progress", JOB_KEYS, [BASE, job_id, token, "", '{"done":7}']) == 1
    chunks = [BASE, job_id, token, 1, 1, 100, 60, '"a"', '"b"']
    assert await call("jobs/stream", JOB_KEYS, chunks) == 2
    assert await call("jobs/stream", JOB_KEYS, chunks) == 0  # sent again: nothing twice
    assert await call("jobs/stream", JOB_KEYS, [BASE, job_id, "w1:9", 1, 3, 100, 60, "1"]) == -1
    assert await call("jobs/progress", JOB_KEYS, [BASE, job_id, "w1:9", "{}"]) == 0
    assert await call("jobs/recover", JOB_KEYS, [BASE, "w1", 30_000, 100, "-", "-", "-"]) == [
        1,
        [b"", b"", b""],
    ]
    claimed = await call("jobs/claim", JOB_KEYS, [BASE, "w1", 1, 30_000, 0, 5, "{}"])
    [job] = claimed[0]
    job_id, token = job[0], job[4]
    error = '{"type":"Boom","message":"no"}'
    last_progress = [job_id, token, "p", "5", 0]  # the try's last progress, first
    finished = await call(
        "jobs/finish", JOB_KEYS, [BASE, 30_000, *last_progress, job_id, token, "dead", error, 0]
    )
    assert finished[0] == [1, 1]
    counts = await call("jobs/counts", JOB_KEYS, [BASE, 100, "-", "-", "-"])
    assert counts[1] == [0, 1, 0]
    assert await call("jobs/replay", JOB_KEYS, [BASE, job_id, "nope"]) == [job_id]
    assert await call("jobs/abort", JOB_KEYS, [BASE, job_id, "why"]) == [b"aborted", 0]
    assert (await call("jobs/abort", JOB_KEYS, [BASE, "nope", "why"]))[0] == b"unknown"
    other = ShardKeys("shop", 1)
    member = '["shop",1,"x1"]'
    linked = await call("jobs/link", JOB_KEYS, [BASE, job_id, member, "nope", member, "j1", member])
    assert [answer[0] for answer in linked] == [b"aborted", b"unknown", b"linked"]
    message = f'["shop",0,"early","{other.base}:x",1,"null",false,false,"success"]'
    assert await call("jobs/deliver", JOB_KEYS, [BASE, message]) >= 0
    assert await call("jobs/delivered", JOB_KEYS, [BASE, "not there"]) == 0
    assert await call("jobs/settle", JOB_KEYS, [BASE, 100]) == 0
    assert await call("jobs/control", JOB_KEYS, [BASE, "pause", "job", 100]) == [0, 0]
    assert await call("jobs/control", JOB_KEYS, [BASE, "resume", "job", 100]) == [0, 0]
    assert await call("jobs/schedule", JOB_KEYS, [BASE, "set", "nightly", "{}"]) == 1
    assert await call("jobs/schedule", JOB_KEYS, [BASE, "del", "nightly"]) == 1
    assert await call("jobs/schedule", JOB_KEYS, [BASE, "del", "nightly"]) == 0
    # A dead job, purged.
    await call("jobs/enqueue", JOB_KEYS, [*defaults, "j4", "[[],{}]", ""])
    claimed = await call("jobs/claim", JOB_KEYS, [BASE, "w1", 5, 30_000, 0, 5, "{}"])
    ran = {job[0]: job[4] for job in claimed[0]}
    await call("jobs/finish", JOB_KEYS, [BASE, 30_000, b"j4", ran[b"j4"], "dead", error, 0])
    assert await call("jobs/purge", JOB_KEYS, [BASE, "j4"]) == [b"j4"]
    # Debounced (merged into the first) and throttled (the first kept) by key "k".
    bounced = ["d1", "[[1],{}]", '{"b":["k",60000,0]}', "d2", "[[2],{}]", '{"b":["k",60000,0]}']
    assert await call("jobs/enqueue", JOB_KEYS, [*defaults, *bounced]) == [1, b"d1"]
    throttled = ["t1", "[[],{}]", '{"th":["k",60000]}', "t2", "[[],{}]", '{"th":["k",60000]}']
    assert await call("jobs/enqueue", JOB_KEYS, [*defaults, *throttled]) == [1, b"t1"]


async def tables(call: Calls) -> None:
    """A table whose keys expire: reads and pages never show an expired key."""
    redis = call.redis
    table = _keys.table_key("shop", "orders", "counts", 3)
    expiry = _keys.table_expiry_key("shop", "orders", "counts", 3)
    await redis.hset(table, {b"a": b"1", b"b": b"2", b"c": b"3"})
    await redis.zadd(expiry, {b"a": 1, b"b": 2**52})  # a expired long ago; c has none
    assert await call("tables/read", [table, expiry], [b"a", b"b", b"c", b"d"]) == [
        None,
        b"2",
        b"3",
        None,
    ]
    cursor, items = await call("tables/scan", [table, expiry], [0, 100])
    assert cursor == b"0"
    assert dict(zip(items[::2], items[1::2], strict=True)) == {b"b": b"2", b"c": b"3"}
    due, after = await call("tables/due", [expiry], [2**53, 10])
    assert due[::2] == [b"a"], "a key's deadline beyond Redis's clock is not due yet"
    assert int(after) == 2**52


SCENARIOS: dict[str, Callable[[Calls], Awaitable[None]]] = {
    "streams": streams,
    "tables": tables,
    "commit": commit,
    "locks": locks,
    "jobs": jobs,
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_each_reply_has_the_shape_its_header_says(redis: Redis, scenario: str) -> None:
    call = Calls(redis)
    with trio.fail_after(30):
        await SCENARIOS[scenario](call)
    wrong = [f"{name}: {reply!r}" for name, reply in call.replies if not shape_of(name)(reply)]
    assert wrong == []


def shape_of(name: str) -> Callable[[Any], bool]:
    header = _lua.script(name).header
    assert header is not None
    return header.reply.matches


async def test_every_script_is_called_here(redis: Redis) -> None:
    called: set[str] = set()
    for scenario in SCENARIOS.values():
        await redis.flushall()
        call = Calls(redis)
        with trio.fail_after(30):
            await scenario(call)
        called.update(name for name, _ in call.replies)
    assert sorted(called) == _lua.names()


def test_a_reply_of_another_shape_is_told() -> None:
    read = _lua.script("commit/read").header
    assert read is not None
    assert not read.reply.matches([[b"1-0"], [], 0, [], b">"])  # one field short
    assert not read.reply.matches(-1)


async def test_the_spark_side_runs_a_script_the_server_lacks(redis_url: str) -> None:
    def run() -> Any:
        with connect(redis_url) as client:
            client.script_flush()
            return _redispy.run_script(client, _lua.script("spark/ids"), [STREAM], ["-", "+", 1])

    assert await trio.to_thread.run_sync(run) == []


async def test_a_script_behind_a_blocking_command_is_loaded_for_the_next_call(
    redis: Redis,
) -> None:
    behind = LuaScript(_lua.inline("return 'behind a wait'"))
    await redis.script_flush()
    blocking: list[bytes | str | int] = [
        b"XREAD",
        b"COUNT",
        1,
        b"BLOCK",
        1,
        b"STREAMS",
        STREAM,
        b"0-0",
    ]
    for expected in (NOT_LOADED, b"behind a wait"):
        _, last = await run_blocking_between(
            redis, blocking, after=(behind, [STREAM], []), replies_before=[], within=5, what="x"
        )
        assert last is expected or last == expected
