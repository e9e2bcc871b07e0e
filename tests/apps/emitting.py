"""An app for the fault scenarios of records jobs emit on success.

The job ``announce(n)`` emits an :class:`Announced` (``n`` and its try number) to the
stream ``announced``; its first try then waits ``EMITTING_HOLD`` seconds (default 0)
before it returns, long enough for a test to kill or freeze its worker after it
emitted and before it finished. Exactly once means: ``announced`` holds one record,
from the try that succeeded.

``make_app()`` builds an app for in-process use (the enqueuer and the checks); the
module-level ``app`` is for ``streamkit worker tests.apps.emitting:app`` subprocesses.
"""

from __future__ import annotations

import os
from typing import Any

import trio

from streamkit import App, Record
from streamkit.jobs import current_job


class Announced(Record):
    n: int
    try_number: int


class Emitting:
    """The app and its pieces."""

    def __init__(self, hold: float, settings: dict[str, Any]) -> None:
        self.app = app = App("emitting", **settings)
        self.announced = app.stream(
            "announced", record=Announced, partition_by="n", partition_count=4
        )
        announced = self.announced

        @app.job(retries=3)
        async def announce(n: int) -> int:
            job = current_job()
            job.emit(announced, Announced(n=n, try_number=job.try_number))
            if job.try_number == 1:
                await trio.sleep(hold)
            return n

        self.announce = announce


def make_app(
    *, hold: float = float(os.environ.get("EMITTING_HOLD", "0")), **settings: Any
) -> Emitting:
    return Emitting(hold, settings)


app = make_app().app
