"""Thousands of partitions started at once on one rebalancer and lock manager.

``python tests/benchmarks/partitions_start.py [PARTITIONS] [LEASE_TTL]`` (4,096 and 5 s
by default), inside .venv, on a private redis-server: the seconds (and this process's
CPU seconds) until every partition is owned, then, over one lease TTL, the extensions
and the leases lost. A worker that owns many partitions starts this way; an event loop
blocked for longer than the lease's TTL allows loses leases.
"""

from __future__ import annotations

import logging
import sys
import time

import trio
import trio_util

from streamkit._locks import open_lock_manager
from streamkit._rebalancer import Claim, open_rebalancer
from streamkit._redis import open_redis
from streamkit.testing import RedisServer


async def main(partitions: int, ttl: float) -> None:
    with RedisServer() as server:
        async with open_redis(server.url) as redis, open_lock_manager(redis) as locks:
            every = frozenset(range(partitions))

            async def run(claim: Claim) -> None:
                await claim.wait_draining()

            began, cpu = time.perf_counter(), time.process_time()
            async with open_rebalancer(
                trio_util.AsyncValue(every),
                locks,
                lock_name=lambda p: f"start.{p}",
                run=run,
                lease_ttl=ttl,
            ) as rebalancer:
                await rebalancer.owned.wait_value(every)
                print(
                    f"{partitions:,} partitions owned in {time.perf_counter() - began:.2f} s "
                    f"({time.process_time() - cpu:.2f} s of CPU); "
                    f"leases lost {rebalancer.statistics().lost}"
                )
                extended = locks.statistics().extended
                await trio.sleep(ttl)
                print(
                    f"over the next {ttl:g} s: {locks.statistics().extended - extended:,} "
                    f"extensions, leases lost {rebalancer.statistics().lost}"
                )


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)
    trio.run(
        main,
        int(sys.argv[1]) if len(sys.argv) > 1 else 4096,
        float(sys.argv[2]) if len(sys.argv) > 2 else 5.0,
    )
