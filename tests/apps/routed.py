"""An app with a job on its default queue and one routed to a named queue (``gpu``),
for the app-level views of ``streamkit status``/``jobs`` and the clients' handles."""

from __future__ import annotations

from streamkit import App

app = App("routed")


@app.job
async def add(a: int, b: int) -> int:
    return a + b


@app.job(queue="gpu")
async def render(n: int) -> str:
    return f"frame {n}"
