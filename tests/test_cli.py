"""The command line, run as a real subprocess against a private Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import orjson
import pytest
import trio
from coredis.tokens import PureToken

from streamkit.testing import free_port, wait_until
from tests import cli_forkserver

if TYPE_CHECKING:
    from collections.abc import Sequence

    from streamkit._redis import Redis

ROOT = Path(__file__).resolve().parent.parent
ORDERS = "examples.orders.app:orders"


@attrs.frozen
class Result:
    code: int
    out: str
    err: str


async def streamkit(*args: str, redis_url: str, stdin: bytes = b"") -> Result:
    """``python -m streamkit ARGS`` run to its end, a process of its own (forked from one
    that imported streamkit already: see tests/cli_forkserver.py)."""
    env = {**os.environ, "STREAMKIT_REDIS_URL": redis_url, "STREAMKIT_CONNECT_GIVE_UP_AFTER": "0"}
    with trio.fail_after(60):
        code, out, err = await cli_forkserver.run(list(args), cwd=ROOT, env=env, stdin=stdin)
    return Result(code, out.decode(), err.decode())


async def signalled_while_paused(
    redis: Redis, *args: str, redis_url: str, said: Sequence[bytes], pause_after: bytes = b""
) -> Result:
    """``streamkit ARGS``, sent SIGINT while one of its writes waits on a paused Redis.

    Once the command wrote ``pause_after`` to standard error, writes are paused;
    once one of its commands waits (a blocked client), it gets SIGINT, once per item
    of ``said``, each time waiting until the command wrote that item to standard
    error; then writes go through (after the command exited, for more than one
    signal).
    """
    env = {**os.environ, "STREAMKIT_REDIS_URL": redis_url, "STREAMKIT_CONNECT_GIVE_UP_AFTER": "0"}
    out, err = bytearray(), bytearray()

    async def blocked() -> bool:
        info = await redis.info("clients")
        return int(str(info["blocked_clients"])) > 0

    with trio.fail_after(60):
        if not pause_after:
            await redis.client_pause(60_000, mode=PureToken.WRITE)
        async with trio.open_nursery() as nursery:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "streamkit", *args],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for stream, into in ((process.stdout, out), (process.stderr, err)):
                nursery.start_soon(read_into, stream, into)
            try:
                if pause_after:
                    await wait_until(lambda: pause_after in err, what=repr(pause_after), within=30)
                    await redis.client_pause(60_000, mode=PureToken.WRITE)
                await wait_until(blocked, what="a write waiting on the paused Redis", within=30)
                for answer in said:
                    process.send_signal(signal.SIGINT)
                    await wait_until(lambda: answer in err, what=repr(answer), within=10)  # noqa: B023
                if len(said) > 1:
                    await process.wait()
            except BaseException:
                process.kill()
                raise
            finally:
                with trio.CancelScope(shield=True):
                    await redis.client_unpause()
            code = await process.wait()
    return Result(code, out.decode(), err.decode())


async def read_into(stream: trio.abc.ReceiveStream | None, into: bytearray) -> None:
    assert stream is not None
    async for data in stream:
        into.extend(data)


def order(i: int, **changes: object) -> dict[str, object]:
    return {
        "order_id": i,
        "customer": f"c{i % 5}",
        "amount": i * 1.5,
        "created_at": "2026-01-01T00:00:00+00:00",
        **changes,
    }


async def count_orders(redis: Redis) -> int:
    return sum([await redis.xlen(f"__strm:{{orders_demo.orders.{p}}}") for p in range(8)])


def assert_no_traceback(result: Result) -> None:
    assert "Traceback" not in result.err + result.out


@pytest.mark.cluster
async def test_send_one_record(redis_url: str, redis: Redis) -> None:
    result = await streamkit("send", ORDERS, orjson.dumps(order(1)).decode(), redis_url=redis_url)
    assert result.code == 0, result.err
    assert "sent to orders_demo.orders partition" in result.out
    assert await count_orders(redis) == 1


@pytest.mark.cluster
async def test_sendmany_from_a_file(redis_url: str, redis: Redis, tmp_path: Path) -> None:
    lines = b"\n".join(orjson.dumps(order(i)) for i in range(500)) + b"\n\n"
    path = tmp_path / "orders.jsonl"
    path.write_bytes(lines)
    result = await streamkit("sendmany", ORDERS, str(path), redis_url=redis_url)
    assert result.code == 0, result.err
    assert "sent 500 records" in result.out
    assert await count_orders(redis) == 500


async def test_sendmany_from_stdin(redis_url: str, redis: Redis) -> None:
    lines = b"\n".join(orjson.dumps(order(i)) for i in range(10))
    result = await streamkit("sendmany", ORDERS, "-", redis_url=redis_url, stdin=lines)
    assert result.code == 0, result.err
    assert await count_orders(redis) == 10


@pytest.mark.cluster
async def test_sendmany_names_bad_lines_and_sends_nothing(redis_url: str, redis: Redis) -> None:
    lines = [
        orjson.dumps(order(1)),
        b"{not json",
        orjson.dumps(order(3, order_id="three")),
        orjson.dumps([1, 2]),
        orjson.dumps(order(5)),
    ]
    result = await streamkit("sendmany", ORDERS, "-", redis_url=redis_url, stdin=b"\n".join(lines))
    assert result.code == 2
    assert "line 2: invalid JSON" in result.err
    assert "line 3:" in result.err
    assert "order_id" in result.err
    assert "line 4: expected a JSON object" in result.err
    assert "nothing was sent" in result.err
    assert_no_traceback(result)
    assert await count_orders(redis) == 0


async def test_a_malformed_line_is_shown_cut_to_a_width(redis_url: str, redis: Redis) -> None:
    long = orjson.dumps(order(2, customer="x" * 300))
    lines = [orjson.dumps(order(1)), long[:-1] + b", oops}"]
    result = await streamkit("sendmany", ORDERS, "-", redis_url=redis_url, stdin=b"\n".join(lines))
    assert result.code == 2
    [error] = [line for line in result.err.splitlines() if line.startswith("line ")]
    # One "line 2", the input's: the position is a column of that line.
    assert error.count("line ") == 1, error
    assert error.startswith("line 2: invalid JSON (")
    assert "at column " in error
    # The offending text around the position, cut to a width, ellipsis marking the cuts.
    shown = error.split("): ", 1)[1]
    assert "oops" in shown
    assert shown.startswith("…")
    assert len(shown) <= 62
    assert await count_orders(redis) == 0


async def test_send_names_the_field_of_a_wrong_type(redis_url: str, redis: Redis) -> None:
    """The field, the type declared and the type given, as every producer says it (a
    float field given a string included)."""
    result = await streamkit(
        "send", ORDERS, orjson.dumps(order(1, amount="9.5")).decode(), redis_url=redis_url
    )
    assert result.code == 2
    assert "invalid record: orders: Order.amount: expected float, got str '9.5'" in result.err
    assert_no_traceback(result)
    assert await count_orders(redis) == 0


async def test_send_bad_json(redis_url: str) -> None:
    result = await streamkit("send", ORDERS, "{oops", redis_url=redis_url)
    assert result.code == 2
    assert "invalid JSON" in result.err
    assert_no_traceback(result)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("examples.orders.app:nothing", "has no attribute 'nothing'"),
        ("examples.nowhere:orders", "cannot import 'examples.nowhere'"),
        ("examples.orders.app:app", "not a stream"),
        ("orders", "expected MODULE:NAME"),
    ],
)
async def test_unknown_stream(redis_url: str, path: str, message: str) -> None:
    result = await streamkit("send", path, orjson.dumps(order(1)).decode(), redis_url=redis_url)
    assert result.code == 2
    assert message in result.err
    assert_no_traceback(result)


#: What each of the inner streams of tests.apps.joined is, and where to send instead.
INNER = {
    "pay__in": "join 'pay': streamkit writes it, from the streams it joins (orders, payments); "
    "send to those instead",
    "counted__changes": "table join 'counted': streamkit writes it, from the writes of the "
    "tables order_counts and payment_counts; write those instead",
    "payments_seen__global": "global table 'payments_seen': streamkit writes it, from the "
    "writes of the table payments_seen; write that instead",
}


@pytest.mark.parametrize("stream", sorted(INNER))
async def test_an_inner_stream_is_refused(redis_url: str, stream: str) -> None:
    path = f"tests.apps.joined:{stream}"
    for args in (["send", path, "{}"], ["sendmany", path, "-"]):
        result = await streamkit(*args, redis_url=redis_url, stdin=b"{}\n")
        assert result.code == 2, result.err
        assert result.err == f"Error: {path} is the inner stream of {INNER[stream]}\n"


async def test_unreachable_redis(redis_url: str) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}"
    result = await streamkit("send", ORDERS, orjson.dumps(order(1)).decode(), redis_url=nowhere)
    assert result.code == 1
    assert f"Redis at {nowhere} is unavailable" in result.err
    assert "nothing was sent" in result.err
    assert_no_traceback(result)


def test_help_lists_the_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "streamkit", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "sendmany" in done.stdout
    assert "send" in done.stdout
    # The top line covers both halves of the product: events and jobs.
    top = done.stdout.split("\n\n")[1].strip()
    assert top.startswith("streamkit: partitioned, ordered event processing and a job queue")
