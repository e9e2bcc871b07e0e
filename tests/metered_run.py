"""A real ``streamkit worker tests.apps.metered:app --metrics-port`` run, for the tests that
scrape one: the backlog to send, and waits on what a scrape shows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamkit.testing import wait_until
from tests.apps.metered import PARTITIONS, make_app, order_list
from tests.scrape import Scrape, scrape

if TYPE_CHECKING:
    from collections.abc import Callable

APP = "tests.apps.metered:app"
#: Lag and queue depths read every 0.2 s rather than every 5 s.
FAST_METRICS = {"STREAMKIT_METRICS_REFRESH_INTERVAL": "0.2"}


async def fill(redis_url: str, *, orders: int, jobs: int) -> None:
    """Send ``orders`` orders and enqueue ``jobs`` jobs, before any worker runs."""
    app, stream = make_app(redis_url=redis_url)
    async with app:
        await stream.send_many(order_list(orders))
        await app.jobs["double"].enqueue_many([(x,) for x in range(jobs)])


async def scrape_when(url: str, condition: str, check: Callable[[Scrape], bool]) -> Scrape:
    """Scrape ``url`` until ``check(scrape)`` holds; return that scrape."""
    found: list[Scrape] = []

    async def holds() -> bool:
        try:
            current = await scrape(url)
        except OSError:
            return False  # not listening yet
        found[:] = [current]
        return check(current)

    await wait_until(holds, what=condition, within=60)
    return found[0]


def backlog(s: Scrape, processor: str) -> float:
    """Lag plus pending over the processor's owned partitions."""
    return s.total("streamkit_partition_lag", processor=processor) + s.total(
        "streamkit_partition_pending", processor=processor
    )


def all_done(orders: int, jobs: int) -> Callable[[Scrape], bool]:
    """Whether a scrape shows every order processed by both processors, no backlog
    (every partition read), and every job succeeded."""

    def check(s: Scrape) -> bool:
        return (
            s.total("streamkit_events_processed_total", processor="tally") == orders
            and s.total("streamkit_events_processed_total", processor="audit") == orders
            and s.total("streamkit_jobs_finished_total", outcome="succeeded") == jobs
            and all(
                set(s.by_partition(name, processor=p)) == set(range(PARTITIONS))
                for name in ("streamkit_partition_lag", "streamkit_partition_pending")
                for p in ("tally", "audit")
            )
            and backlog(s, "tally") == 0
            and backlog(s, "audit") == 0
        )

    return check
