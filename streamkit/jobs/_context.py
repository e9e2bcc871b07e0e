"""The running job's context: what :func:`current_job` returns inside a job, and the
middleware type that wraps each try."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime  # noqa: TC003 (attrs resolves the annotations)
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from .._spec import HasSpec, StreamSpec

__all__ = ["JobContext", "JobMiddleware", "current_job"]


@attrs.frozen(kw_only=True)
class JobContext:
    """The job running in this task (see :func:`current_job`).

    Attributes:
        id: the job's id.
        name: its job name.
        queue: its queue's name.
        try_number: which try this is (1 for the first).
        max_tries: tries it may have in all (retries + 1).
        enqueued_at: when it was enqueued (the Redis server's clock).
        headers: the headers it was enqueued with (``traceparent`` among them when
            the enqueuer traced with OpenTelemetry).
        worker: the worker running it (its consumer name).
        state: what the worker's lifespan yielded (``None`` without one).
    """

    id: str
    name: str
    queue: str
    try_number: int
    max_tries: int
    enqueued_at: datetime | None
    headers: Mapping[str, str]
    worker: str
    state: Any = None

    def emit(self, stream: StreamSpec[Any] | HasSpec[Any], record: Any) -> None:
        """Emit ``record`` to ``stream`` if, and once, this try succeeds.

        The record is appended by the script that records the try's success, and only
        for the try that holds the job's claim: a failed, retried, aborted, timed-out
        or taken-over try's records are discarded (see the jobs guide). Records land in
        the order emitted, at most 1,000 per try.

        Error handling:
            ``RuntimeError`` outside this job's try; :class:`~streamkit.ConfigError`
            for something that is not a stream, or a 1,001st record;
            :class:`~streamkit.EncodeError` if ``record`` does not fit the stream.
        """
        try:
            current = running.get()[1]
        except LookupError:
            current = None
        if current is None or current.id != self.id:
            raise RuntimeError("emit() is called from inside the job's running try")
        current.emit(stream, record)

    def progress(self, value: Any) -> None:
        """Report how far this try got: a number or a small JSON value (a dict of
        counts, say), read by :meth:`JobHandle.progress
        <streamkit.jobs.JobHandle.progress>` and ``streamkit jobs show``.

        Cheap enough to call per item of a long job: it does no I/O; the worker writes
        the newest value at most every half second per try (and the last one with the
        try's outcome, so the last value reported is the one kept). Fenced: a
        try taken over by another worker reports nothing.

        Error handling:
            ``RuntimeError`` outside this job's try; :class:`~streamkit.EncodeError`
            for a value that is not JSON, or over 8,000 bytes encoded.
        """
        try:
            current = running.get()[1]
        except LookupError:
            current = None
        if current is None or current.id != self.id or current.progress_writer is None:
            raise RuntimeError("progress() is called from inside the job's running try")
        current.progress_writer.report(current, value)

    def stream(self, chunk: Any) -> None:
        """Stream ``chunk`` (a JSON value: a token of a model's output, a row) to
        whoever reads the job's :meth:`JobHandle.stream
        <streamkit.jobs.JobHandle.stream>`, in order.

        Cheap: it does no I/O; the worker appends the try's chunks every few
        milliseconds (and all that are left before the try's outcome, which then ends
        the stream). Fenced: a try taken over appends nothing more. At most 64 KiB a
        chunk; the stream keeps the newest 10,000.

        Error handling:
            ``RuntimeError`` outside this job's try; :class:`~streamkit.EncodeError`
            for a chunk that is not JSON or too big; :class:`~streamkit.ConfigError`
            when 10,000 chunks wait to be written already (Redis unreachable).
        """
        try:
            current = running.get()[1]
        except LookupError:
            current = None
        if current is None or current.id != self.id or current.chunk_writer is None:
            raise RuntimeError("stream() is called from inside the job's running try")
        current.chunk_writer.report(current, chunk)


#: A middleware: ``async def middleware(context, call_next)``, which runs the try (the
#: next middleware, or the job) by awaiting ``call_next()`` and returns its result.
JobMiddleware = Callable[[JobContext, Callable[[], Awaitable[Any]]], Awaitable[Any]]

#: The queue, the try and (made when first asked for) the context of the job running
#: in this task (the first two typed loosely: this module sits below the queue and the
#: tries).
running: contextvars.ContextVar[tuple[Any, Any, Callable[[], JobContext]]] = contextvars.ContextVar(
    "streamkit_job"
)


def current_job() -> JobContext:
    """The context of the job running in this task (or thread, for a plain ``def``
    job): its id, name, try number, enqueue time, headers and the lifespan's state.

    Error handling:
        ``RuntimeError`` outside a running job.
    """
    try:
        make = running.get()[2]
    except LookupError:
        raise RuntimeError("current_job() is called from inside a running job") from None
    return make()
