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

Each rate runs ``--rounds`` rounds (3 by default), the two loops alternating, and each
round's ratios are printed: a moment of load from other work on the machine (the
bare loop's own p99 moves by half from one 3 s run to the next) falls on one round of
one loop, and the median of the per-round ratios is what the target is judged on.

Target: streamkit's p50 and p99 within 1.5x of the bare loop's at each rate (the
median of the per-round ratios).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import math
import statistics
import sys
import time
import urllib.parse
from typing import TYPE_CHECKING, Literal

import attrs
import orjson
import trio

from streamkit import App, Events, Record, Redis, open_redis, run_worker
from streamkit.testing import RedisServer, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

    from streamkit import Stream

    Seen = Callable[[int, float, float, int], None]
    Send = Callable[[Sequence["Ping"]], Awaitable[None]]

Loop = Literal["bare", "streamkit"]
Producer = Literal["socket", "streamkit"]
#: streamkit's p50 and p99, each at most this many times the bare loop's.
TARGET = 1.5
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
    #: (send time, latency, partition) of every counted record, in arrival order.
    samples: list[tuple[float, float, int]]
    producer: dict[str, float]
    #: CPU used while the counted records flowed, in cores: this process, redis-server.
    consumer_cpu: float
    redis_cpu: float

    @property
    def latencies(self) -> list[float]:
        return [latency for _, latency, _ in self.samples]

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
    samples: list[tuple[float, float, int]] = []
    received = 0
    finished = trio.Event()
    counting = trio.Event()
    producer: dict[str, float] = {"rate": math.nan, "worst_lag": math.nan}
    cpu: dict[str, float] = {}

    async def measure_cpu(redis: Redis) -> None:
        await counting.wait()
        began, own, server = time.perf_counter(), time.process_time(), await redis_cpu(redis)
        await finished.wait()
        wall = time.perf_counter() - began
        cpu["consumer"] = (time.process_time() - own) / wall
        cpu["redis"] = (await redis_cpu(redis) - server) / wall

    def seen(seq: int, sent: float, now: float, partition: int) -> None:
        nonlocal received
        if seq < 0:
            return
        received += 1
        if seq >= plan.first_counted:
            samples.append((sent, now - sent, partition))
            counting.set()
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
                    seen(ping.seq, ping.sent, time.time(), events.partition)

            await nursery.start(run_worker, app)
        nursery.start_soon(measure_cpu, app.redis)
        with trio.move_on_after(plan.warmup + plan.seconds + 30):
            producer = await run_producer(url, app_name, plan)
            await finished.wait()
            await wait_until(lambda: "redis" in cpu, what="the CPU figures", within=10)
        nursery.cancel_scope.cancel()
    if received != plan.total:
        print(f"  warning: {loop} at {plan.rate:,}/s received {received:,} of {plan.total:,}")
    return Result(
        loop,
        plan.rate,
        samples,
        producer,
        cpu.get("consumer", math.nan),
        cpu.get("redis", math.nan),
    )


async def redis_cpu(redis: Redis) -> float:
    """CPU seconds redis-server has used so far."""
    info = await redis.info("cpu")
    return sum(float(str(info[name])) for name in ("used_cpu_user", "used_cpu_sys"))


async def bare_loop(url: str, keys: Sequence[str], seen: Seen) -> None:
    """Blocking XREADGROUP over all partitions on one connection; read, process, ack."""
    streams: dict[str | bytes, str | bytes] = dict.fromkeys(keys, ">")
    partition_of: dict[str | bytes, int] = {}
    for partition, name in enumerate(keys):
        partition_of[name] = partition_of[name.encode()] = partition
    async with open_redis(url) as redis:
        while True:
            reply = await redis.xreadgroup("g", "c", streams=streams, count=500, block=1000)
            if not reply:
                continue
            for stream_key, entries in reply.items():
                partition = partition_of[stream_key]
                for entry in entries:
                    ping = orjson.loads(entry.field_values[b"data"])
                    seen(ping["seq"], ping["sent"], time.time(), partition)
            async with redis.pipeline(transaction=False) as pipe:
                for stream_key, entries in reply.items():
                    pipe.xack(stream_key, "g", [entry.identifier for entry in entries])


# --- report -----------------------------------------------------------------------


LABELS: dict[Loop, str] = {
    "bare": "bare XREADGROUP BLOCK (coredis)",
    "streamkit": "worker, records()",
}


async def run(plans: Sequence[Plan], rounds: int, by_partition: float | None = None) -> None:
    loops: tuple[Loop, ...] = ("bare", "streamkit")
    results: list[Result] = []
    with RedisServer() as server:
        for plan in plans:
            # Alternating, so that a moment of load from other work on the machine falls
            # on one round of one loop, not on the whole of it.
            for _ in range(rounds):
                for loop in loops:
                    results.append(await measure(server.url, loop, plan))  # noqa: PERF401
    plan = plans[0]
    print(
        f"end-to-end latency, send to processor, 1 worker, {plan.partitions} partitions, "
        f"{plan.seconds:g} s per rate and round after a {plan.warmup:g} s warm-up, "
        f"{rounds} rounds alternating; producer: {plan.producer}, one group every "
        f"{plan.tick * 1000:g} ms"
    )
    header = f"  {'rate':>8}  {'loop':<34}{'events':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
    print(f"{header}{'p50, p99 vs bare':>18}")
    bare: dict[int, tuple[float, float]] = {}
    ratios: dict[int, list[tuple[float, float]]] = {}
    for result in results:
        p50, p99 = result.percentile(0.50), result.percentile(0.99)
        worst = max(result.latencies)
        line = (
            f"  {result.rate:>6,}/s  {LABELS[result.loop]:<34}{len(result.latencies):>8,}"
            f"{p50 * 1000:>9.2f}{p99 * 1000:>9.2f}{worst * 1000:>9.2f}"
        )
        if result.loop == "bare":
            bare[result.rate] = (p50, p99)
        else:
            bare_p50, bare_p99 = bare[result.rate]
            ratios.setdefault(result.rate, []).append((p50 / bare_p50, p99 / bare_p99))
            line += f"{p50 / bare_p50:>11.2f}x{p99 / bare_p99:>6.2f}x"
        print(line)
    print("  median of the per-round ratios, worker / bare loop:")
    for rate, pairs in ratios.items():
        p50_ratio = statistics.median(p for p, _ in pairs)
        p99_ratio = statistics.median(p for _, p in pairs)
        verdict = "met" if max(p50_ratio, p99_ratio) <= TARGET else "NOT met"
        print(
            f"  {rate:>6,}/s  p50 {p50_ratio:.2f}x, p99 {p99_ratio:.2f}x  "
            f"target <= {TARGET:g}x both: {verdict}"
        )
    print(
        "  load while the counted records flowed: the producer's achieved rate and latest "
        "tick, CPU used (1.00 = one core)"
    )
    print(
        f"  {'rate':>8}  {'loop':<34}{'sent/s':>8}{'late ms':>9}{'CPU here':>10}{'CPU redis':>11}"
    )
    for result in results:
        print(
            f"  {result.rate:>6,}/s  {LABELS[result.loop]:<34}{result.producer['rate']:>8,.0f}"
            f"{result.producer['worst_lag'] * 1000:>9.1f}{result.consumer_cpu:>10.2f}"
            f"{result.redis_cpu:>11.2f}"
        )
    if by_partition is not None:
        for result in results:
            print_by_partition(result, by_partition)


def print_by_partition(result: Result, window: float) -> None:
    """The worst latency of each partition in each window of send time: shows whether
    a tail is a pause of the whole process or some partitions waiting."""
    start = min(sent for sent, _, _ in result.samples)
    partitions = 1 + max(partition for _, _, partition in result.samples)
    worst: dict[int, list[float]] = {}
    for sent, latency, partition in result.samples:
        row = worst.setdefault(int((sent - start) / window), [0.0] * partitions)
        row[partition] = max(row[partition], latency)
    print(
        f"  {result.rate:,}/s, {LABELS[result.loop]}: worst latency (ms) per partition "
        f"and {window * 1000:g} ms of send time"
    )
    print(f"  {'sent at':>8} " + "".join(f"{f'p{p}':>7}" for p in range(partitions)))
    for index in sorted(worst):
        cells = "".join(f"{latency * 1000:>7.0f}" for latency in worst[index])
        print(f"  {index * window:>7.2f}s {cells}")


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
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of each loop per rate, alternating"
    )
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds not counted")
    parser.add_argument("--tick-ms", type=float, default=1.0, help="producer tick")
    parser.add_argument(
        "--by-partition",
        type=float,
        default=None,
        metavar="SECONDS",
        help="also print each partition's worst latency per window of this many seconds",
    )
    parser.add_argument(
        "--producer",
        choices=["socket", "streamkit"],
        default="socket",
        help="socket: XADD by hand on a trio socket (default); streamkit: Stream.send",
    )
    args = parser.parse_args()
    if args.producer == "socket" and importlib.util.find_spec("hiredis") is None:
        print("  (hiredis, a dev dependency, is not installed: the producer uses Stream.send)")
        args.producer = "streamkit"
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
    trio.run(run, plans, args.rounds, args.by_partition)


if __name__ == "__main__":
    main()
