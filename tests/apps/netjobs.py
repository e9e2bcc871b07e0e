"""The state fault scenarios' app with a job beside its processor, for the network
fault scenarios: each worker counts events and runs jobs through the one link it has.

``tests.apps.stateful``'s app, unchanged, plus the job ``chore(seconds)``: it takes
``seconds`` and returns the worker's pid, recording each run's start and end as
``"<job id> start|end <pid> <unix time>"`` entries of the list :data:`RUNS`. The
entries go to the server of ``JOBS_MARKERS_URL`` through a client of their own
(``tests.apps.jobs_app``'s markers), not through the worker's link: a run is seen
even while its worker is cut off from Redis, as an effect outside Redis would be.

``make_app()`` builds it for in-process use (enqueueing and the checks); the
module-level ``app`` is for ``streamkit worker tests.apps.netjobs:app``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

from streamkit.jobs import current_job
from tests.apps.jobs_app import PID, markers, with_markers
from tests.apps.stateful import make_app as make_stateful

if TYPE_CHECKING:
    from streamkit import App
    from streamkit.jobs import Job
    from tests.apps.stateful import Stateful

#: The list of every run's start and end.
RUNS = "netjobs:runs"


@attrs.frozen
class NetJobs:
    """The stateful app and its job."""

    stateful: Stateful
    chore: Job[[float], int]

    @property
    def app(self) -> App:
        return self.stateful.app


async def _mark(kind: str) -> None:
    client = await markers()
    await client.rpush(RUNS, [f"{current_job().id} {kind} {PID} {time.time()}"])


def make_app(**settings: Any) -> NetJobs:
    stateful = make_stateful(**settings)
    app = with_markers(stateful.app)

    @app.job
    async def chore(seconds: float) -> int:
        await _mark("start")
        await trio.sleep(seconds)
        await _mark("end")
        return PID

    return NetJobs(stateful, chore)


app = make_app().app
