"""streamkit.jobs: a job queue on Redis Streams, for Trio.

Jobs with results and statuses, delays and ETAs, cron, retries on a schedule, leases
renewed while a job runs, fenced completion, dead letters, abort, dedupe, priorities
and dependencies. See the jobs guide in the documentation.
"""

from typing import TYPE_CHECKING

from .._errors import (
    JobError as JobError,
    JobFailed as JobFailed,
    JobNotFound as JobNotFound,
    ResultNotKept as ResultNotKept,
)
from .._public import fix_module_metadata as _fix_module_metadata, moved as _moved
from ._context import (
    JobContext as JobContext,
    JobMiddleware as JobMiddleware,
    current_job as current_job,
)
from ._cron import ScheduleInfo as ScheduleInfo
from ._handle import Job as Job, JobHandle as JobHandle, WorkflowHandle as WorkflowHandle
from ._inspect import QueueCounts as QueueCounts
from ._limits import RateLimit as RateLimit
from ._model import (
    JobCall as JobCall,
    JobChunk as JobChunk,
    JobErrorInfo as JobErrorInfo,
    JobEvent as JobEvent,
    JobInfo as JobInfo,
    JobOptions as JobOptions,
    JobStatus as JobStatus,
    JobTry as JobTry,
    Priority as Priority,
    Schedule as Schedule,
)
from ._outcome import Retry as Retry
from ._queue import JobQueue as JobQueue, open_job_queue as open_job_queue
from ._run import progress as progress
from ._serve import JobWorker as JobWorker
from ._workflow import (
    Chain as Chain,
    Chord as Chord,
    Group as Group,
    Step as Step,
    chain as chain,
    chord as chord,
    group as group,
)

__all__ = [
    "Chain",
    "Chord",
    "Group",
    "Job",
    "JobCall",
    "JobChunk",
    "JobContext",
    "JobError",
    "JobErrorInfo",
    "JobEvent",
    "JobFailed",
    "JobHandle",
    "JobInfo",
    "JobMiddleware",
    "JobNotFound",
    "JobOptions",
    "JobQueue",
    "JobStatus",
    "JobTry",
    "JobWorker",
    "Priority",
    "QueueCounts",
    "RateLimit",
    "ResultNotKept",
    "Retry",
    "Schedule",
    "ScheduleInfo",
    "Step",
    "WorkflowHandle",
    "chain",
    "chord",
    "current_job",
    "group",
    "open_job_queue",
    "progress",
]

_fix_module_metadata(__name__, globals())

if not TYPE_CHECKING:
    # Renamed (streamkit.Middleware is the events' middleware): the old name resolves,
    # with a DeprecationWarning, for a while.
    __getattr__ = _moved(__name__, __name__, {"Middleware": "JobMiddleware"})

del TYPE_CHECKING, _fix_module_metadata, _moved
