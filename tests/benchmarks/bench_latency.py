"""End-to-end latency at fixed rates: send to processor, streamkit against a bare loop.

Run with ``./dev bench`` (or ``python tests/benchmarks/bench_latency.py`` inside .venv).

For each rate (``--rates``, 1k and 10k events/s by default), a producer process sends
small records at that rate for ``--warmup`` + ``--seconds`` seconds, each record
carrying its send time (``time.time()``, taken just before the send). The producer is
paced drift-free: tick ``k`` is sent at ``start + k * tick`` (``--tick-ms``, 1 ms by
default), a group of ``rate * tick`` records per tick (1 at 1k/s, 10 at 10k/s); a late
tick is sent at once, never skipped. By default it encodes and routes each record with
the stream's own codec and partitioner and appends it with ``XADD`` written by hand on
a trio socket: ``Stream.send`` costs about a millisecond per small group through
coredis, too much to hold 10k/s in groups of 10 on two busy cores, and the producer
must not be what is measured (``--producer streamkit`` uses ``Stream.send`` anyway).
While it sends, this process consumes with one of two loops and takes ``time.time()``
when a record reaches the processing code:

* **bare**: a blocking ``XREADGROUP COUNT 500 BLOCK`` over all partitions on one
  coredis connection, decoding the JSON payload with orjson, then acknowledging the
  batch (one pipelined ``XACK`` per partition);
* **streamkit**: one worker (``run_worker``), one processor with ``events.records()``.

Both see the same stream shape (``--partitions``) and the same producer. Records sent
during the warm-up (worker start-up, first reads) are not counted. The producer runs
in its own process so that its pacing and the consumer do not share an event loop; the
two clocks are one (``time.time()`` on one machine).

Target: streamkit's p99 within 2x of the bare loop's at each rate.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import sys
import time
import urllib.parse
from typing import TYPE_CHECKING, Literal

import attrs
import orjson
import trio

from streamkit import App, Events, Record, open_redis, run_worker
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

    from streamkit import Stream

    Seen = Callable[[int, float, float], None]
    Send = Callable[[Sequence["Ping"]], Awaitable[None]]

Loop = Literal["bare", "streamkit"]
Producer = Literal["socket", "streamkit"]
P99_TARGET = 2.0
KEYS = 64


class Ping(Record):
    key: str
    seq: int
    sent: float


def ping_stream(app: App, partitions: int) -> Stream[Ping]:
    return app.stream("pings", record=Ping, partition_by="key", partition_count=partitions)


@attrs.frozen
class Plan:
    """One run's shape, shared with the producer process."""

    rate: int
    partitions: int
    seconds: float
    warmup: float
    tick: float
    producer: Producer

    @property
    def per_tick(self) -> int:
        return max(1, round(self.rate * self.tick))

    @property
    def total(self) -> int:
        """Records sent, warm-up included: whole ticks."""
        return self.per_tick * math.ceil(self.rate * (self.warmup + self.seconds) / self.per_tick)

    @property
    def first_counted(self) -> int:
        """The ``seq`` of the first record sent after the warm-up."""
        return self.per_tick * math.ceil(self.rate * self.warmup / self.per_tick)


# --- producer (a child process) ---------------------------------------------------


def _command(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


@contextlib.asynccontextmanager
async def socket_sender(stream: Stream[Ping], url: str) -> AsyncIterator[Send]:
    """Records encoded by the stream's own codec and partitioner, appended with ``XADD``
    written by hand on a trio socket (replies parsed by hiredis): a producer whose own
    cost is small enough to hold 10k/s on two busy cores."""
    import hiredis  # a dev dependency, like the socket loop of bench_consume.py

    keys = [key.encode() for key in stream.partition_keys()]
    parts = urllib.parse.urlsplit(url)
    reader = hiredis.Reader()
    sock = await trio.open_tcp_stream(parts.hostname or "127.0.0.1", parts.port or 6379)

    async def send(group: Sequence[Ping]) -> None:
        out = bytearray()
        for ping in group:
            fields = stream.codec.encode(ping)
            key = keys[stream.partition_of(ping)]
            out += _command(b"XADD", key, b"*", *itertools.chain.from_iterable(fields.items()))
        await sock.send_all(out)
        replies = 0
        while replies < len(group):
            reply = reader.gets()
            if reply is False:
                data = await sock.receive_some(1 << 16)
                if not data:
                    raise ConnectionError("redis closed the connection")
                reader.feed(data)
            elif isinstance(reply, hiredis.ReplyError):
                raise reply
            else:
                replies += 1

    async with sock:
        yield send


@contextlib.asynccontextmanager
async def streamkit_sender(stream: Stream[Ping]) -> AsyncIterator[Send]:
    """``Stream.send``: pipelined, one Lua call per partition (it also trims)."""

    async def send(group: Sequence[Ping]) -> None:
        await stream.send(*group)

    yield send


async def produce(url: str, app_name: str, plan: Plan) -> None:
    period = plan.per_tick / plan.rate
    worst_lag = 0.0
    async with App(app_name, redis_url=url) as app:
        stream = ping_stream(app, plan.partitions)
        await stream.send(Ping(key="warm", seq=-1, sent=time.time()))  # connect, metadata
        if plan.producer == "socket":
            opened = socket_sender(stream, url)
        else:
            opened = streamkit_sender(stream)
        async with opened as send:
            start = trio.current_time()
            for seq in range(0, plan.total, plan.per_tick):
                due = start + seq // plan.per_tick * period
                await trio.sleep_until(due)
                worst_lag = max(worst_lag, trio.current_time() - due)
                sent = time.time()
                await send(
                    [
                        Ping(key=f"k{i % KEYS}", seq=i, sent=sent)
                        for i in range(seq, seq + plan.per_tick)
                    ]
                )
            elapsed = trio.current_time() - start
    print(json.dumps({"rate": plan.total / elapsed, "worst_lag": worst_lag}))


# --- consumers --------------------------------------------------------------------


@attrs.define
class Result:
    loop: Loop
    rate: int
    latencies: list[float]
    producer: dict[str, float]

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_producer(url: str, app_name: str, plan: Plan) -> dict[str, float]:
    args = [sys.executable, __file__, "--produce", url, app_name, json.dumps(attrs.asdict(plan))]
    done = await trio.run_process(args, capture_stdout=True)
    report: dict[str, float] = json.loads(done.stdout.decode().splitlines()[-1])
    return report


async def measure(url: str, loop: Loop, plan: Plan) -> Result:
    app_name = f"lat{time.monotonic_ns()}"
    latencies: list[float] = []
    received = 0
    finished = trio.Event()
    producer: dict[str, float] = {"rate": math.nan, "worst_lag": math.nan}

    def seen(seq: int, sent: float, now: float) -> None:
        nonlocal received
        if seq < 0:
            return
        received += 1
        if seq >= plan.first_counted:
            latencies.append(now - sent)
        if received == plan.total:
            finished.set()

    async with App(app_name, redis_url=url) as app, trio.open_nursery() as nursery:
        stream = ping_stream(app, plan.partitions)
        if loop == "bare":
            keys = stream.partition_keys()
            for key in keys:
                await app.redis.xgroup_create(key, "g", "0", mkstream=True)
            nursery.start_soon(bare_loop, url, keys, seen)
        else:

            @app.processor(stream)
            async def process(events: Events[Ping]) -> None:
                async for ping in events.records():
                    seen(ping.seq, ping.sent, time.time())

            await nursery.start(run_worker, app)
        with trio.move_on_after(plan.warmup + plan.seconds + 30):
            producer = await run_producer(url, app_name, plan)
            await finished.wait()
        nursery.cancel_scope.cancel()
    if received != plan.total:
        print(f"  warning: {loop} at {plan.rate:,}/s received {received:,} of {plan.total:,}")
    return Result(loop, plan.rate, latencies, producer)


async def bare_loop(url: str, keys: Sequence[str], seen: Seen) -> None:
    """Blocking XREADGROUP over all partitions on one connection; read, process, ack."""
    streams: dict[str | bytes, str | bytes] = dict.fromkeys(keys, ">")
    async with open_redis(url) as redis:
        while True:
            reply = await redis.xreadgroup("g", "c", streams=streams, count=500, block=1000)
            if not reply:
                continue
            for entries in reply.values():
                for entry in entries:
                    ping = orjson.loads(entry.field_values[b"data"])
                    seen(ping["seq"], ping["sent"], time.time())
            async with redis.pipeline(transaction=False) as pipe:
                for key, entries in reply.items():
                    pipe.xack(key, "g", [entry.identifier for entry in entries])


# --- report -----------------------------------------------------------------------


LABELS: dict[Loop, str] = {
    "bare": "bare XREADGROUP BLOCK (coredis)",
    "streamkit": "worker, records()",
}


async def run(plans: Sequence[Plan]) -> None:
    loops: tuple[Loop, ...] = ("bare", "streamkit")
    results: list[Result] = []
    with RedisServer() as server:
        for plan in plans:
            for loop in loops:
                results.append(await measure(server.url, loop, plan))  # noqa: PERF401
    plan = plans[0]
    print(
        f"end-to-end latency, send to processor, 1 worker, {plan.partitions} partitions, "
        f"{plan.seconds:g} s per rate after a {plan.warmup:g} s warm-up; producer: "
        f"{plan.producer}, one group every {plan.tick * 1000:g} ms"
    )
    header = f"  {'rate':>8}  {'loop':<34}{'events':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
    print(f"{header}{'p99 vs bare':>13}")
    bare_p99: dict[int, float] = {}
    for result in results:
        p50, p99 = result.percentile(0.50), result.percentile(0.99)
        worst = max(result.latencies)
        line = (
            f"  {result.rate:>6,}/s  {LABELS[result.loop]:<34}{len(result.latencies):>8,}"
            f"{p50 * 1000:>9.2f}{p99 * 1000:>9.2f}{worst * 1000:>9.2f}"
        )
        if result.loop == "bare":
            bare_p99[result.rate] = p99
        else:
            ratio = p99 / bare_p99[result.rate]
            line += f"{ratio:>12.2f}x  target <= {P99_TARGET:g}x"
        print(line)
    print("  producer: achieved rate, and the latest a tick was sent behind its schedule")
    for result in results:
        print(
            f"    {result.rate:>6,}/s, {LABELS[result.loop]:<34}"
            f"{result.producer['rate']:>8,.0f}/s {result.producer['worst_lag'] * 1000:>7.1f} ms"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--produce":
        url, app_name, plan = sys.argv[2], sys.argv[3], Plan(**json.loads(sys.argv[4]))
        trio.run(produce, url, app_name, plan)
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=int, nargs="+", default=[1_000, 10_000], metavar="N")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds not counted")
    parser.add_argument("--tick-ms", type=float, default=1.0, help="producer tick")
    parser.add_argument(
        "--producer",
        choices=["socket", "streamkit"],
        default="socket",
        help="socket: XADD by hand on a trio socket (default); streamkit: Stream.send",
    )
    args = parser.parse_args()
    plans = [
        Plan(
            rate=rate,
            partitions=args.partitions,
            seconds=args.seconds,
            warmup=args.warmup,
            tick=args.tick_ms / 1000,
            producer=args.producer,
        )
        for rate in args.rates
    ]
    trio.run(run, plans)


if __name__ == "__main__":
    main()
