"""W3C trace context in job headers, through OpenTelemetry's API when it is installed.

The enqueuer's current trace context goes into the job's headers (``traceparent``,
``tracestate``, by the globally configured propagator, W3C trace context by default);
the worker runs each try in a span whose parent is that context. Without the
``opentelemetry-api`` package (the ``otel`` extra) both are no-ops and cost nothing.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = ["inject_trace", "job_span", "tracing"]

_trace: Any
try:
    from opentelemetry import context as _context, propagate as _propagate, trace as _trace
except ImportError:  # the otel extra is not installed
    _trace = None


def inject_trace() -> dict[str, str]:
    """The current trace context as headers; ``{}`` without a valid current span (or
    without OpenTelemetry)."""
    if _trace is None or not _trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return carrier


def tracing(raw_headers: bytes | str) -> bool:
    """Whether a try is run in a span: when OpenTelemetry is installed, and the job
    carries a trace context or a tracer provider (an SDK) is configured. Otherwise the
    try costs nothing more (the worker's hot path: a few hundred nanoseconds)."""
    if _trace is None:
        return False
    if raw_headers and (
        b"traceparent" in raw_headers
        if isinstance(raw_headers, bytes)
        else "traceparent" in raw_headers
    ):
        return True
    # set_tracer_provider() sets this global once; its default is None
    provider = getattr(_trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:  # another version of the API: ask it, the slower way
        return not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)
    return provider is not None


_UNKNOWN = object()


@contextlib.contextmanager
def job_span(
    name: str, job_id: str, queue: str, tries: int, headers: Mapping[str, str]
) -> Iterator[Any]:
    """A span for one try of a job, child of the trace context in its ``headers``,
    current while the try runs; nothing without OpenTelemetry."""
    if _trace is None:
        yield None
        return
    parent = _propagate.extract(headers) if headers else _context.get_current()
    tracer = _trace.get_tracer("streamkit.jobs")
    with tracer.start_as_current_span(
        f"job {name}",
        context=parent,
        kind=_trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "streamkit",
            "messaging.destination.name": queue,
            "messaging.message.id": job_id,
            "streamkit.job.name": name,
            "streamkit.job.try": tries,
        },
    ) as span:
        yield span
