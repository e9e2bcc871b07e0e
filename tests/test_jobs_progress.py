"""Progress a job reports with ``current_job().progress(value)``: read from the Trio
queue's handle and the blocking and asyncio clients' handles, shown by ``streamkit jobs
show``, rate-limited, fenced, and the last value reported kept."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, EncodeError
from streamkit._cli._jobs_view import job_lines
from streamkit.jobs import current_job
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit import Redis

ITEMS = 20_000


async def test_progress_per_item_is_read_everywhere_and_written_rarely(
    redis_url: str, redis: Redis
) -> None:
    app = App("progressing", redis_url=redis_url)
    halfway, finish = trio.Event(), trio.Event()

    @app.job
    async def import_rows(rows: int) -> int:
        job = current_job()
        for row in range(rows // 2):
            job.progress({"done": row + 1, "of": rows})  # per item: no I/O
        halfway.set()
        await finish.wait()
        for row in range(rows // 2, rows):
            job.progress({"done": row + 1, "of": rows})
        with pytest.raises(EncodeError):
            job.progress({"rows": object()})
        return rows

    async with app, trio.open_nursery() as nursery:
        worker = await nursery.start(app.job_queue.serve)
        handle = await import_rows.delay(ITEMS)
        await halfway.wait()
        half = {"done": ITEMS // 2, "of": ITEMS}

        async def reported() -> bool:
            return bool(await handle.progress() == half)

        await wait_until(reported, what="the progress written", within=10)
        assert await trio.to_thread.run_sync(_blocking_progress, app, handle.id) == half
        asyncio_value = await trio.to_thread.run_sync(
            lambda: asyncio.run(_asyncio_progress(app, handle.id))
        )
        assert asyncio_value == half
        shown = job_lines(await handle.info(), datetime.now(UTC))  # streamkit jobs show
        assert '  progress  {"done":10000,"of":20000}' in shown
        finish.set()
        assert await handle.result(timeout=10) == ITEMS
        # The last value reported is kept: written before the outcome.
        assert await handle.progress() == {"done": ITEMS, "of": ITEMS}
        assert (await handle.info()).progress_value == {"done": ITEMS, "of": ITEMS}
        # 20,000 reports, a handful of writes.
        assert worker.progress_writes <= 4
        nursery.cancel_scope.cancel()


def _blocking_progress(app: App, job_id: str) -> Any:
    with app.blocking() as client:
        return client.handle(job_id).progress()


async def _asyncio_progress(app: App, job_id: str) -> Any:
    async with app.asyncio() as client:
        return await client.handle(job_id).progress()


@pytest.mark.timeout(30)
async def test_a_def_job_reports_from_its_thread_in_a_fresh_worker(redis_url: str) -> None:
    # The first report of a fresh worker wakes its writers, waiting: from a thread,
    # through the event loop's token.
    app = App("threaded", redis_url=redis_url)

    @app.job
    def crunch(rows: int) -> int:
        job = current_job()
        job.progress({"done": 0, "of": rows})
        job.stream("first")
        for row in range(rows):
            job.progress({"done": row + 1, "of": rows})
            job.stream(row)
        return rows

    async with app, trio.open_nursery() as nursery:
        await nursery.start(app.job_queue.serve)
        handle = await crunch.delay(100)
        assert await handle.result(timeout=10) == 100
        assert await handle.progress() == {"done": 100, "of": 100}
        chunks = [chunk.value async for chunk in handle.stream()]
        assert chunks == ["first", *range(100)]
        nursery.cancel_scope.cancel()
