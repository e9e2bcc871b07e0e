"""``streamkit sendmany``: every line checked first; exact accounting when it stops early."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import orjson
import pytest
import trio
from coredis.tokens import PureToken

from streamkit import open_redis
from streamkit.testing import RedisServer, wait_until
from tests.test_cli import ORDERS, ROOT, assert_no_traceback, streamkit

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis

PARTITIONS = 8


def order_line(i: int) -> bytes:
    return orjson.dumps(
        {
            "order_id": i,
            "customer": f"customer-{i % 97}-" + "x" * 500,
            "amount": 1.5,
            "created_at": "2026-01-01T00:00:00+00:00",
        }
    )


async def order_ids(redis: Redis) -> list[int]:
    """Every order id in the stream, as often as it is there."""
    ids = []
    for p in range(PARTITIONS):
        entries = await redis.xrange(f"__strm:{{orders_demo.orders.{p}}}")
        ids += [orjson.loads(dict(e.field_values)[b"data"])["order_id"] for e in entries]
    return ids


def resume_args(err: str) -> list[str]:
    """The arguments of the resume command that sendmany's message gives."""
    [line] = [x for x in err.splitlines() if "to send the rest without duplicates" in x]
    command = shlex.split(line.split(": ", 1)[1])
    assert command[:2] == ["streamkit", "sendmany"]
    return command[1:]


@pytest.mark.cluster
async def test_bad_partition_keys_are_found_before_anything_is_sent(
    redis_url: str, redis: Redis
) -> None:
    good = [orjson.dumps({"n": n, "key": n}) for n in range(9000)]
    lines = [*good, orjson.dumps({"n": 9000}), orjson.dumps({"n": 9001, "key": 1.5})]
    result = await streamkit(
        "sendmany", "tests.apps.keys:items", "-", redis_url=redis_url, stdin=b"\n".join(lines)
    )
    assert result.code == 2, result.err
    assert "line 9001: partition key (field 'key')" in result.err
    assert "None is not a partition key" in result.err
    assert "line 9002: partition key (field 'key')" in result.err
    assert "float keys" in result.err
    assert "nothing was sent" in result.err
    assert_no_traceback(result)
    assert await redis.keys("__strm:*") == set()


async def test_a_full_redis_midway_reports_the_exact_lines_and_the_resume_command(
    tmp_path: Path,
) -> None:
    path = tmp_path / "orders.jsonl"
    total = 4000
    path.write_bytes(b"\n".join(order_line(i) for i in range(total)) + b"\n")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                RedisServer(extra_args=["--maxmemory-policy", "noeviction"]).run
            )
            async with open_redis(server.url) as redis:
                info = await redis.info("memory")
                # Room for some chunks of 100 records (about 60 kB each, and the
                # arguments of the call that appends one count too), not for all.
                await redis.config_set({"maxmemory": int(str(info["used_memory"])) + 1_000_000})
                failed = await streamkit(
                    "sendmany", ORDERS, str(path), "--chunk-size", "100", redis_url=server.url
                )
                assert failed.code == 1, failed.err
                assert_no_traceback(failed)
                assert "OOM" in failed.err
                sent = sorted(await order_ids(redis))
                assert 0 < len(sent) < total, failed.err
                assert f"sent {len(sent):,} of {total:,} records" in failed.err

                await redis.config_set({"maxmemory": 0})
                resumed = await streamkit(*resume_args(failed.err), redis_url=server.url)
                assert resumed.code == 0, resumed.err
                assert f"sent {total - len(sent):,} records" in resumed.out
                assert sorted(await order_ids(redis)) == list(range(total))
            nursery.cancel_scope.cancel()


async def test_ctrl_c_stops_after_the_records_in_flight_and_says_how_to_resume(
    redis_url: str, redis: Redis, tmp_path: Path
) -> None:
    path = tmp_path / "orders.jsonl"
    total = 20_000
    path.write_bytes(b"\n".join(order_line(i) for i in range(total)))
    env = {**os.environ, "STREAMKIT_REDIS_URL": redis_url}
    command = [
        sys.executable,
        "-m",
        "streamkit",
        "sendmany",
        ORDERS,
        str(path),
        "--chunk-size",
        "50",
    ]
    err = bytearray()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            process = await trio.lowlevel.open_process(
                command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )

            async def read_err() -> None:
                assert process.stderr is not None
                async for data in process.stderr:
                    err.extend(data)

            nursery.start_soon(read_err)

            async def some_sent() -> bool:
                return bool(await order_ids(redis))

            # Hold the sender's next appends in flight: writes wait while paused.
            await wait_until(some_sent, what="the first records in Redis", within=30)
            await redis.client_pause(30_000, mode=PureToken.WRITE)
            process.send_signal(signal.SIGINT)
            await wait_until(lambda: b"stopping once" in err, what="the stop message", within=10)
            await redis.client_unpause()
            code = await process.wait()
    text = err.decode()
    assert code == 130, text
    assert "Traceback" not in text
    sent = sorted(await order_ids(redis))
    assert 0 < len(sent) < total, text
    assert f"sent {len(sent):,} of {total:,} records" in text
    assert "may or may not" not in text  # the records in flight were finished

    resumed = await streamkit(*resume_args(text), redis_url=redis_url)
    assert resumed.code == 0, resumed.err
    assert sorted(await order_ids(redis)) == list(range(total))


@pytest.mark.cluster
async def test_skip_sent_is_checked(redis_url: str) -> None:
    result = await streamkit(
        "sendmany", ORDERS, "-", "--skip-sent", "9:10", redis_url=redis_url, stdin=b""
    )
    assert result.code == 2
    assert "--skip-sent: '9:10' is not PARTITION:LINE (a partition from 0 to 7" in result.err
