"""An app with jobs, for ``streamkit jobs``: one that succeeds, ones that fail, and one
that reports its progress and then runs until it is aborted."""

from __future__ import annotations

import trio

from streamkit import App, Backoff
from streamkit.jobs import progress

app = App("jobbing")


@app.job
async def add(a: int, b: int) -> int:
    return a + b


@app.job(retries=0)
async def explode(n: int, *, why: str = "bad input") -> None:
    raise ValueError(f"explode {n}: {why}")


@app.job(retries=1, backoff=Backoff(initial=0.01, maximum=0.01, jitter=0))
async def flaky(n: int) -> None:
    raise RuntimeError(f"flaky {n}")


@app.job
async def crawl(pages: int) -> None:
    await progress(0.5, f"page {pages // 2} of {pages}")
    await trio.sleep_forever()
