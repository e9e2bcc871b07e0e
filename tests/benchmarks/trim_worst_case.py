"""The longest a streamkit script holds Redis up, on a partition of millions of entries.

Run with ``python tests/benchmarks/trim_worst_case.py`` inside .venv (``--entries``
sets the partition's length, 2,000,000 by default). Redis runs one command at a time,
so the time one script takes is the time every other client waits. Each case fills a
partition on a private redis-server, runs streamkit's scripts against it the way the
producer and the fetcher do, and reads each call's own duration from the server's
``SLOWLOG`` (measured by Redis itself, microseconds). The figures are in
docs/streams.md, "Trimming".

Cases:

* ``hard cap``: a partition of N unprocessed entries gets ``max_len=1000`` (a cap set
  or lowered on a long partition); appends of one record until it is down to the cap.
* ``processed backlog``: a partition of N entries that every consumer group has
  processed, with ``partition_size=1000``; appends of one record until it is trimmed.
* ``acknowledgement``: the same backlog, trimmed by the fenced acknowledgement script
  (one id acknowledged per call) instead.
* ``large appends``: ``send_many`` of 64 MiB of 64 KiB records, split into calls by
  count and by bytes (1 MiB).
"""

from __future__ import annotations

import argparse
import time

import trio

from streamkit import App, Record
from streamkit._lua import script
from streamkit._redis import LuaScript
from streamkit.testing import RedisServer


class Blob(Record):
    key: str
    body: str


LOCK = "__lock:{bench.blobs.0}.proc"
GROUP = "bench.blobs.proc"


async def fill(app: App, key: str, entries: int) -> None:
    """Append ``entries`` small entries to ``key``, pipelined."""
    for start in range(0, entries, 10_000):
        async with app.redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(entries, start + 10_000)):
                pipe.xadd(key, {b"data": b'{"key":"k","body":"%d"}' % i})


async def slowest_calls(app: App) -> tuple[str, int]:
    """The script calls since the last reset: their median and longest durations (as
    text, in ms), and how many ran."""
    entries = await app.redis.slowlog_get(100_000)
    durations = sorted(
        entry.duration
        for entry in entries
        if entry.command and entry.command[0].lower() in (b"evalsha", b"eval", "evalsha", "eval")
    )
    await app.redis.slowlog_reset()
    if not durations:
        return "no calls", 0
    median = durations[len(durations) // 2] / 1000
    p99 = durations[len(durations) * 99 // 100] / 1000
    longest = durations[-1] / 1000
    return f"{median:6.2f} / {p99:6.2f} / {longest:6.2f} ms", len(durations)


async def case_hard_cap(app: App, entries: int) -> str:
    stream = app.stream("capped", record=Blob, partition_by="key", partition_count=1, max_len=1000)
    await fill(app, stream.key(0), entries)
    await app.redis.slowlog_reset()
    sends = 0
    while await app.redis.xlen(stream.key(0)) > 1000:
        await stream.send(Blob(key="k", body="x"))
        sends += 1
    slowest, _ = await slowest_calls(app)
    return f"hard cap          {slowest}   ({sends} appends to come down to the cap)"


async def case_processed_backlog(app: App, entries: int) -> str:
    stream = app.stream(
        "backlog", record=Blob, partition_by="key", partition_count=1, partition_size=1000
    )
    key = stream.key(0)
    await fill(app, key, entries)
    await app.redis.xgroup_create(key, GROUP, "$")
    await app.redis.slowlog_reset()
    sends = 0
    while await app.redis.xlen(key) > 1100:
        await stream.send(Blob(key="k", body="x"))
        sends += 1
    slowest, _ = await slowest_calls(app)
    return f"processed backlog {slowest}   ({sends} appends to trim it)"


async def case_acknowledgement(app: App, entries: int) -> str:
    key = "__strm:{bench.acked.0}"
    await fill(app, key, entries)
    await app.redis.xgroup_create(key, GROUP, "$")
    await app.redis.set(LOCK, "me")
    ack = LuaScript(script("commit/ack"))
    await app.redis.slowlog_reset()
    acks = 0
    while await app.redis.xlen(key) > 1100:
        await ack(app.redis, keys=[key, LOCK], args=["me", GROUP, 1000, 1, "0-1"])
        acks += 1
    slowest, _ = await slowest_calls(app)
    return f"acknowledgement   {slowest}   ({acks} acknowledgements to trim it)"


async def case_large_appends(app: App) -> str:
    stream = app.stream("large", record=Blob, partition_by="key", partition_count=1)
    body = "x" * (64 * 1024)
    await stream.check_metadata()
    await app.redis.slowlog_reset()
    await stream.send_many([Blob(key="k", body=body) for _ in range(1024)])
    slowest, calls = await slowest_calls(app)
    return f"large appends     {slowest}   ({calls} calls for 64 MiB)"


async def run(entries: int) -> None:
    with RedisServer(
        extra_args=("--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000")
    ) as server:
        async with App("bench", redis_url=server.url) as app:
            print(
                f"script calls on a partition of {entries:,} entries, server-side time: "
                f"median / p99 / longest"
            )
            for case in (case_hard_cap, case_processed_backlog, case_acknowledgement):
                began = time.monotonic()
                await app.redis.flushall()
                line = await case(app, entries)
                print(f"  {line}   [{time.monotonic() - began:.0f}s]")
            await app.redis.flushall()
            print(f"  {await case_large_appends(app)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=2_000_000)
    args = parser.parse_args(argv)
    trio.run(run, args.entries)


if __name__ == "__main__":
    main()
