"""Apps named ``shop`` for the ACL tests: every path a role's Redis user must allow.

- :func:`make_streams_app`: the stream ``orders`` and two processors. ``handle``
  dead-letters the events that fail (``fail=True``), after one retry in place;
  ``strict`` halts its partition on them. A leader-only timer runs every half second.
- :func:`make_jobs_app`: the app's job queue: ``double`` (fails for a negative number,
  runs for ``n == 99`` until aborted), ``echo`` (a plain function, run in a thread),
  and a cron job every second.

Processors and jobs touch only the app's own keys, which is all their users may touch:
tests read what happened from the streams, groups and queue. The module-level apps
are for ``streamkit worker tests.apps.acl:streams_app`` (or ``jobs_app``) subprocesses,
on ``STREAMKIT_REDIS_URL``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from streamkit import App, Backoff, Events, ExceptionPolicy, Record

if TYPE_CHECKING:
    from streamkit import Stream
    from streamkit.jobs import Job


class Order(Record):
    key: str
    n: int
    fail: bool = False


def make_streams_app(**settings: Any) -> tuple[App, Stream[Order]]:
    """The app (with ``partition_count=4``) and its stream ``orders``."""
    app = App("shop", **{"partition_count": 4, "partition_size": 20, **settings})
    orders = app.stream("orders", record=Order, partition_by="key", compression="zstd")

    @app.processor(
        orders,
        policy=ExceptionPolicy(
            action="retry", retries=1, backoff=Backoff(initial=0.01), on_exhausted="dead_letter"
        ),
    )
    async def handle(events: Events[Order]) -> None:
        async for order in events.records():
            if order.fail:
                raise ValueError(f"order {order.key}:{order.n} fails")

    @app.processor(orders)
    async def strict(events: Events[Order]) -> None:
        async for batch in events.take(10, within=0.05):
            for order in batch:
                if order.fail:
                    raise ValueError(f"order {order.key}:{order.n} fails")

    @app.timer(interval=0.5, on_leader=True)
    async def tick() -> None:
        pass

    return app, orders


def make_jobs_app(**settings: Any) -> tuple[App, Job[Any, Any], Job[Any, Any]]:
    """The app and its jobs ``double`` and ``echo`` (and a cron job, ``limited`` with
    limits, ``render`` on the app's queue ``gpu`` and ``total``, for workflows)."""
    app = App("shop", **settings)

    @app.job(concurrency=2, rate_limit="20/s", limit_key="account", key_concurrency=1)
    async def limited(account: str) -> str:
        await trio.sleep(0.05)
        return account

    @app.job(queue="gpu", retries=0)
    async def render(n: int) -> str:
        if n < 0:
            raise ValueError("cannot render")
        return f"frame {n}"

    @app.job()
    async def total(frames: list[str], label: str = "") -> str:
        return label + ", ".join(frames)

    @app.job(retries=1, backoff=Backoff(initial=0.05), timeout=30)
    async def double(n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        if n == 99:
            await trio.sleep(60)
        return n * 2

    @app.job()
    def echo(text: str) -> str:
        return text

    @app.cron("* * * * * *")
    async def every_second() -> None:
        pass

    return app, double, echo


streams_app, orders = make_streams_app()
jobs_app, _, _ = make_jobs_app()
