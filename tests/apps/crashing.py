"""An app whose background task fails at once: a bug that ends the worker."""

from __future__ import annotations

from streamkit import App

app = App("crashing")


@app.task
async def broken() -> None:
    raise RuntimeError("a bug in a background task")
