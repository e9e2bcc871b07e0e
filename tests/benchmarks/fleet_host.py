"""Several worker instances in one process, for ``bench_fleet.py --per-process K``.

``python tests/benchmarks/fleet_host.py K`` (with ``FLEET_REDIS_URL`` and
``FLEET_PARTITIONS`` set, as for ``fleet_app.py``) runs K workers of the fleet's app in
one Trio run, each :func:`streamkit.run_worker` of its own ``App`` (``make_app()``): so
each has its own Redis connections, its own lock manager (its own lease owner id), its
own membership member (its own heartbeat) and its own rebalancer and fetcher, and Redis
sees K workers, exactly what K ``streamkit worker`` processes would send it. What K
instances share is this process's event loop and CPU: a host is a stricter test of
keeping leases than K processes would be (one loop does K workers' renewals), and it
saves the K - 1 interpreters' start-up and memory that 128 processes cost on 2 cores.

SIGTERM or SIGINT stops every instance gracefully, as it stops a worker (partitions
drained, leases released, groups left).
"""

from __future__ import annotations

import signal
import sys

import trio

from streamkit import Worker, run_worker
from streamkit._logs import configure_logging
from tests.benchmarks.fleet_app import make_app


async def main(instances: int) -> None:
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            workers: list[Worker] = [
                await nursery.start(run_worker, make_app()) for _ in range(instances)
            ]
            async for _ in signals:
                async with trio.open_nursery() as stopping:
                    for worker in workers:
                        stopping.start_soon(worker.stop)
                return


if __name__ == "__main__":
    configure_logging("info")
    trio.run(main, int(sys.argv[1]))
