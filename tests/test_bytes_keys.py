"""Partition keys that are ``bytes`` but not UTF-8 (``b"\\xff\\x01"``), end to end, on a
real worker: a join's pairs and unmatched events, a windowed table's results, tables
read from Trio, the blocking and asyncio clients and the command line, all with the
key's text form (:func:`streamkit.lowlevel.key_text`: ``"\\\\xff\\x01"``), never a
``UnicodeDecodeError`` halting a partition or a traceback."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson
import trio

from streamkit import partition_for
from streamkit._state import CHANGE_FIELD
from streamkit._worker import run_worker
from streamkit.testing import wait_until
from tests.apps.bytekeys import ByteKeys, Ev, make_app
from tests.test_cli import assert_no_traceback, streamkit
from tests.test_joins import FAST, results

if TYPE_CHECKING:
    from streamkit import Redis

APP = "tests.apps.bytekeys:app"

#: Keys 1, 2, 3 and 5 are in partition 0, 4 and 6 in partition 1. Key 1 pairs, 2 and 4
#: are lefts alone, 3 a right alone; 5 and 6 (a pair each, at 2000) move each
#: partition's event time on, so that the others' windows close.
LEFTS = [Ev(k=1, t=1000), Ev(k=2, t=1000), Ev(k=4, t=1000), Ev(k=5, t=2000), Ev(k=6, t=2000)]
RIGHTS = [Ev(k=1, t=1001), Ev(k=3, t=1030), Ev(k=5, t=2000), Ev(k=6, t=2000)]


def text(k: int) -> str:
    """The text form of key ``bytes([0xFF, k])`` (k below 0x20: a control character)."""
    return f"\\xff{chr(k)}"


async def run(redis_url: str, redis: Redis) -> ByteKeys:
    """The app, its worker run until every result is in."""
    made = make_app(redis_url=redis_url, **FAST)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, made.app)
        await made.lefts.send_many(LEFTS)
        await made.rights.send_many(RIGHTS)

        async def done() -> bool:
            return (
                len(await results(redis, made.joined)) == 6
                and len(await results(redis, made.sums_out)) == 3
                and len(await results(redis, made.keyed)) == 5
                and len([kv async for kv in made.both.items()]) == 6
                and len([kv async for kv in made.ks.items()]) == 5
            )

        await wait_until(done, what="every result", within=30)
        await worker.stop()
    return made


async def test_a_join_and_a_window_emit_the_text_form_of_the_key(
    redis_url: str, redis: Redis
) -> None:
    made = await run(redis_url, redis)
    joined = sorted(
        (r["key"], r["left"] and r["left"]["t"], r["right"] and r["right"]["t"])
        for r in await results(redis, made.joined)
    )
    assert joined == sorted(
        [
            (text(1), 1000.0, 1001.0),
            (text(2), 1000.0, None),  # (unmatched, of each side)
            (text(3), None, 1030.0),
            (text(4), 1000.0, None),
            (text(5), 2000.0, 2000.0),
            (text(6), 2000.0, 2000.0),
        ]
    )
    sums = sorted((r["key"], r["value"]) for r in await results(redis, made.sums_out))
    assert sums == [(text(1), 1), (text(2), 2), (text(4), 4)]
    # A result function gets it too.
    keyed = sorted(r["key"] for r in await results(redis, made.keyed))
    assert keyed == sorted([text(1), text(2), text(4), text(5), text(6)])


async def test_tables_list_the_text_form_and_read_by_the_key_itself(
    redis_url: str, redis: Redis
) -> None:
    made = await run(redis_url, redis)
    lefts = {text(k): 1 for k in (1, 2, 4, 5, 6)}
    pair, left, right = (
        {"left": 1, "right": 1},
        {"left": 1, "right": None},
        {"left": None, "right": 1},
    )
    both = {
        text(k): v for k, v in [(1, pair), (2, left), (3, right), (4, left), (5, pair), (6, pair)]
    }
    async with made.app:
        trio_view = {
            "lefts": dict([kv async for kv in made.lefts_seen.items()]),
            "both": dict([kv async for kv in made.both.items()]),
            "ks": dict([kv async for kv in made.ks.items()]),
            "sums": sorted([kv async for kv in made.sums.items()]),
            "one": await made.both.read(bytes([0xFF, 1])),
            "global": await made.ks.read(bytes([0xFF, 4])),
        }
    assert trio_view["lefts"] == lefts
    assert trio_view["both"] == both
    assert trio_view["ks"] == {text(k): k for k in (1, 2, 4, 5, 6)}
    # (The windows still open: those of 1, 2 and 4 closed, and are kept no longer.)
    assert [(key, [v for _, v in w]) for key, w in trio_view["sums"]] == [
        (text(5), [5]),
        (text(6), [6]),
    ]
    assert trio_view["one"] == {"left": 1, "right": 1}
    assert trio_view["global"] == 4

    def read_blocking() -> dict[str, Any]:
        with made.app.blocking() as client:
            return {
                "lefts": dict(client.items(made.lefts_seen)),
                "both": dict(client.items(made.both)),
                "ks": dict(client.items(made.ks)),
                "sums": sorted(client.items(made.sums)),
                "one": client.read(made.both, bytes([0xFF, 1])),
                "global": client.read(made.ks, bytes([0xFF, 4])),
            }

    async def read_asyncio() -> dict[str, Any]:
        async with made.app.asyncio() as client:
            return {
                "lefts": dict([kv async for kv in client.items(made.lefts_seen)]),
                "both": dict([kv async for kv in client.items(made.both)]),
                "ks": dict([kv async for kv in client.items(made.ks)]),
                "sums": sorted([kv async for kv in client.items(made.sums)]),
                "one": await client.read(made.both, bytes([0xFF, 1])),
                "global": await client.read(made.ks, bytes([0xFF, 4])),
            }

    assert await trio.to_thread.run_sync(read_blocking) == trio_view
    assert await trio.to_thread.run_sync(asyncio.run, read_asyncio()) == trio_view


async def test_the_command_line_shows_the_text_form_and_takes_the_key_s_bytes(
    redis_url: str, redis: Redis
) -> None:
    await run(redis_url, redis)
    for name, expected in [
        ("lefts_seen", {f"\\xff\\x0{k}": "1" for k in (1, 2, 4, 5, 6)}),
        ("ks", {f"\\xff\\x0{k}": str(k) for k in (1, 2, 4, 5, 6)}),
        ("both", {f"\\xff\\x0{k}" for k in range(1, 7)}),
        ("sums", {f"\\xff\\x0{k}" for k in (5, 6)}),
    ]:
        listed = await streamkit("table", "list", APP, name, redis_url=redis_url)
        assert listed.code == 0, listed.err
        assert_no_traceback(listed)
        rows = dict(line.split("\t") for line in listed.out.splitlines())
        assert (rows if isinstance(expected, dict) else set(rows)) == expected
    # A key that is not text is given as its bytes ($'\xff\x01' in bash), which Python
    # hands over surrogate-escaped.
    key = "\udcff\x01"
    got = await streamkit("table", "get", APP, "both", key, redis_url=redis_url)
    assert (got.code, got.out) == (0, '{"left":1,"right":1}\n'), got.err
    got = await streamkit("table", "get", APP, "ks", key, redis_url=redis_url)
    assert (got.code, got.out) == (0, "1\n"), got.err
    got = await streamkit("table", "get", APP, "sums", "\udcff\x05", redis_url=redis_url)
    assert got.code == 0, got.err
    assert [w["value"] for w in orjson.loads(got.out)] == [5]
    read = await streamkit("read", "tests.apps.bytekeys:lefts", "--key", key, redis_url=redis_url)
    assert read.code == 0, read.err
    assert [orjson.loads(line.split("\t")[2]) for line in read.out.splitlines()] == [
        {"k": 1, "t": 1000.0}
    ]
    inner = await streamkit(
        "read", "tests.apps.bytekeys:jb__in", "--key", key, "--json", redis_url=redis_url
    )
    assert inner.code == 0, inner.err
    shown = [orjson.loads(line) for line in inner.out.splitlines()]
    # (the two sides' forwarders run side by side: in either order)
    assert sorted((r["side"], r["key"], r["record"]["t"]) for r in shown) == [
        ("left", text(1), 1000.0),
        ("right", text(1), 1001.0),
    ]


async def test_the_command_line_reads_a_table_s_inner_stream_as_changes(
    redis_url: str, redis: Redis
) -> None:
    made = await run(redis_url, redis)
    changes = await streamkit("read", "tests.apps.bytekeys:both__changes", redis_url=redis_url)
    assert changes.code == 0, changes.err
    assert sorted(line.split("\t")[2] for line in changes.out.splitlines()) == sorted(
        [f"left \\xff\\x0{k}: 1" for k in (1, 2, 4, 5, 6)]
        + [f"right \\xff\\x0{k}: 1" for k in (1, 3, 5, 6)]
    )
    applied = await streamkit(
        "read", "tests.apps.bytekeys:ks__global", "--json", redis_url=redis_url
    )
    assert applied.code == 0, applied.err
    shown = [orjson.loads(line) for line in applied.out.splitlines()]
    assert sorted((r["key"], r["value"]) for r in shown) == [(text(k), k) for k in (1, 2, 4, 5, 6)]
    assert all("side" not in r for r in shown)
    # A deletion, then an entry that is no change: said so, as in any stream.
    key = made.app.streams["both__changes"].key(partition_for(bytes([0xFF, 1]), 2))
    await redis.xadd(key, {CHANGE_FIELD: orjson.dumps(["R", "\xff\x01", None])})
    await redis.xadd(key, {CHANGE_FIELD: b'["X", 1]'})
    one = await streamkit(
        "read", "tests.apps.bytekeys:both__changes", "--key", "\udcff\x01", redis_url=redis_url
    )
    assert one.code == 0, one.err
    *changed, deleted = [line.split("\t")[2] for line in one.out.splitlines()]
    assert sorted(changed) == ["left \\xff\\x01: 1", "right \\xff\\x01: 1"]
    assert deleted == "right \\xff\\x01 deleted"
    tail = await streamkit(
        "tail", "tests.apps.bytekeys:both__changes", "-n", "2", "--json", redis_url=redis_url
    )
    last = [orjson.loads(line) for line in tail.out.splitlines()]
    assert {k: v for k, v in last[0].items() if k not in ("id", "partition")} == {
        "side": "right",
        "key": text(1),
        "deleted": True,
    }
    assert last[1]["undecodable"] == "the JSON payload is a list, not an object"
