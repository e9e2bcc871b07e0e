"""Run jobs in your own Trio service: a job queue without an App.

A price service: it opens a Redis client and the job queue ``prices``, declares two
jobs on it, starts a worker for them in its own nursery (``await
nursery.start(queue.serve)``), enqueues a batch and collects every result. One job is
``async def``; the other is a plain ``def``, which runs in a worker thread. The
supplier is flaky: each item's first quote fails, and the retry (after a short
backoff) succeeds. Producers and workers may just as well be different processes:
anything that opens the queue ``prices`` on the same Redis can enqueue, follow or run
its jobs.

Run it on its own (it starts a private ``redis-server``)::

    python examples/jobs_standalone.py

or against a server of yours::

    python examples/jobs_standalone.py --redis-url redis://localhost:6379 --items 20
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import sys
import zlib
from typing import TYPE_CHECKING

import trio

from streamkit import Backoff, open_redis
from streamkit.jobs import JobFailed, open_job_queue
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from collections.abc import Iterator

quoted: set[str] = set()  # items quoted once: the flaky supplier fails their first quote


# docs: start jobs
async def quote(item: str) -> float:
    """Ask the (flaky) supplier for a price: an ``async def`` job."""
    await trio.sleep(0.01)  # the supplier's API, over the network
    if item not in quoted:
        quoted.add(item)
        raise ConnectionError(f"supplier timed out quoting {item}")
    return zlib.crc32(item.encode()) % 1000 / 100


def with_tax(price: float, rate: float = 0.2) -> float:
    """Plain ``def``: runs in a worker thread, so it may block or compute."""
    return round(price * (1 + rate), 2)


async def serve_prices(url: str, items: list[str]) -> int:
    async with (
        open_redis(url) as redis,
        open_job_queue(redis, "prices") as queue,
        trio.open_nursery() as nursery,
    ):
        # Declare the jobs: retried twice on a failure, 0.1 s then 0.2 s later.
        quote_job = queue.job(quote, retries=2, backoff=Backoff(initial=0.1, maximum=1.0))
        tax_job = queue.job(with_tax)
        # A worker in this service: 8 jobs at once. start() returns once it is ready.
        await nursery.start(functools.partial(queue.serve, concurrency=8))

        before = await queue.counts()
        quotes = await quote_job.enqueue_many((item,) for item in items)
        failed = 0
        for item, handle in zip(items, quotes, strict=True):
            try:
                price = await handle.result(timeout=30)
            except JobFailed as exc:
                print(f"{item}: no price ({exc})")
                failed += 1
                continue
            taxed = await (await tax_job.delay(price)).result(timeout=30)
            tries = (await handle.info()).tries
            print(f"{item}: {price} ({taxed} with tax), quoted in {tries} tries")
        counts = await queue.counts()
        nursery.cancel_scope.cancel()  # stop the worker: the service is done
    # docs: end jobs
    succeeded = counts.succeeded - before.succeeded
    print(f"{succeeded} jobs succeeded, {counts.pending} pending")
    if failed or counts.pending or succeeded != 2 * len(items):
        print("FAILED")
        return 1
    print("ok: every item was quoted and taxed")
    return 0


@contextlib.contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    if given:
        yield given
    else:
        with RedisServer() as server:
            yield server.url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="Redis to use (default: start a private one)")
    parser.add_argument("--items", type=int, default=5, help="items to price")
    args = parser.parse_args()
    # The worker logs each failed try (a warning) on the logger streamkit.jobs.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    items = [f"item-{n}" for n in range(args.items)]
    with redis_url(args.redis_url) as url:
        return trio.run(serve_prices, url, items)


if __name__ == "__main__":
    sys.exit(main())
