"""Expiry over time: a steady stream of fresh keys into a table with a ttl keeps the
table's size and Redis's memory flat.

One private redis-server, one worker (``run_worker``) counting events per key in a
table with ``--ttl`` seconds, a producer sending ``--rate`` events/s, each of a key
never seen before (a session id, say), for ``--minutes``. Every ``--every`` seconds it
prints the table's keys (``HLEN`` over the partitions), its expiry index's
(``ZCARD``) and Redis's ``used_memory``: after the first ttl they stay flat, since
the commits delete what expired as fast as new keys come (without expiry they would
grow by ``rate x every`` keys a line). ``./dev bench`` runs it for 10 minutes.
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import timedelta
from typing import Any

import trio

from streamkit import App, Events, Record, open_redis, run_worker
from streamkit.testing import RedisServer


class Visit(Record):
    session: str


async def run(args: argparse.Namespace) -> None:
    print(
        f"\nExpiry: {args.rate:,} fresh keys/s into a table with a {args.ttl:g}s ttl, "
        f"for {args.minutes:g} minutes (one worker, 8 partitions)\n"
    )
    with RedisServer() as server:
        app = App("expiry", redis_url=server.url)
        # The stream keeps its newest entries only (trimmed once processed), so that what
        # grows, if anything, is the table.
        visits = app.stream(
            "visits",
            record=Visit,
            partition_by="session",
            partition_count=8,
            partition_size=2_000,
        )
        sessions = app.table("sessions", value=int, default=0, ttl=timedelta(seconds=args.ttl))

        @app.processor(visits, tables=[sessions])
        async def count(events: Events[Visit]) -> None:
            async for visit in events.records():
                sessions.set(visit.session, await sessions.get(visit.session) + 1)

        async def produce() -> None:
            period = 0.01
            per_tick = max(1, round(args.rate * period))
            start = trio.current_time()
            k = 0
            while True:
                batch = [Visit(session=uuid.uuid4().hex) for _ in range(per_tick)]
                await visits.send_many(batch)
                k += 1
                await trio.sleep_until(start + k * period)

        async with app, open_redis(server.url) as redis, trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)
            nursery.start_soon(produce)
            print(f"  {'minute':>8}{'table keys':>12}{'index':>10}{'used_memory':>14}")
            began = time.monotonic()
            sizes: list[int] = []
            while (elapsed := time.monotonic() - began) < args.minutes * 60:
                await trio.sleep(args.every)
                keys = sum(await sessions.sizes(redis=redis))
                index = 0
                for p in range(8):
                    index += await redis.zcard(sessions.expiry_key(p))
                info: Any = await redis.info("memory")
                memory = int(info["used_memory"])
                sizes.append(keys)
                print(f"  {elapsed / 60:>8.1f}{keys:>12,}{index:>10,}{memory / 2**20:>12.1f} MiB")
            await worker.stop()
            nursery.cancel_scope.cancel()
    steady = sizes[len(sizes) // 2 :]
    if steady:
        print(
            f"\n  After the first half: keys between {min(steady):,} and {max(steady):,} "
            f"(about rate x ttl = {args.rate * args.ttl:,.0f}); without expiry they would "
            f"have reached {round(args.rate * args.minutes * 60):,}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--ttl", type=float, default=30.0)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=30.0)
    args = parser.parse_args()
    trio.run(run, args)


if __name__ == "__main__":
    main()
