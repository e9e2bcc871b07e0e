"""``streamkit table get`` and ``table list`` on a table a real worker committed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
import trio

from streamkit._worker import run_worker
from streamkit.testing import wait_until
from tests.apps.stateful import Number, make_app
from tests.test_cli import assert_no_traceback, streamkit

if TYPE_CHECKING:
    from streamkit import Redis

APP = "tests.apps.stateful:app"


async def fill(redis_url: str) -> None:
    stateful = make_app(
        redis_url=redis_url, delay=0, lease_ttl=1.0, heartbeat_interval=0.1, grace_period=0.5
    )
    numbers = [Number(key=f"k{n % 4}", n=n) for n in range(40)]
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, stateful.app)
        await stateful.numbers.send_many(numbers)

        async def counted() -> bool:
            return sum(await stateful.counts.read_many([f"k{k}" for k in range(4)])) == 40

        await wait_until(counted, what="40 numbers counted", within=20)
        await worker.stop()


async def test_get_and_list_print_committed_values(redis_url: str, redis: Redis) -> None:
    await fill(redis_url)
    got = await streamkit("table", "get", APP, "counts", "k1", redis_url=redis_url)
    assert got.code == 0, got.err
    assert got.out == "10\n"
    missing = await streamkit("table", "get", APP, "sums", "nobody", redis_url=redis_url)
    assert missing.out == "0\n"  # the table's default
    listed = await streamkit("table", "list", APP, "sums", redis_url=redis_url)
    assert listed.code == 0, listed.err
    sums = dict(line.split("\t") for line in listed.out.splitlines())
    assert {k: int(v) for k, v in sums.items()} == {
        f"k{k}": sum(n for n in range(40) if n % 4 == k) for k in range(4)
    }
    limited = await streamkit("table", "list", APP, "counts", "--limit", "2", redis_url=redis_url)
    assert len(limited.out.splitlines()) == 2
    windows = await streamkit("table", "get", APP, "tens", "k0", redis_url=redis_url)
    assert windows.code == 0, windows.err
    assert all({"start", "end", "value"} <= set(w) for w in orjson.loads(windows.out))


async def test_unknown_tables_and_partitions_are_one_line(redis_url: str) -> None:
    unknown = await streamkit("table", "get", APP, "nope", "k", redis_url=redis_url)
    assert unknown.code == 2
    assert "has no table 'nope' (its tables: counts, sums, tens)" in unknown.err
    assert_no_traceback(unknown)
    bad = await streamkit("table", "list", APP, "counts", "--partition", "99", redis_url=redis_url)
    assert bad.code == 2
    assert "--partition must be 0..7" in bad.err
    assert_no_traceback(bad)
