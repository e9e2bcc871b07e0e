"""W3C trace context in stream entries, and the processor's spans, through OpenTelemetry.

With the ``otel`` extra (``opentelemetry-api``) and a tracer provider set (an SDK
configured), a record sent inside a valid span carries that span's context in its
entry: one extra field per key the global propagator writes, named ``trace:`` and the
key (``trace:traceparent``, ``trace:tracestate``); a name with a colon is no record
field's (primitive records' fields are Python names) and no payload's (``data``,
``data:<compression>``), and every reader ignores fields it does not know. The
processor then handles it in a span (kind CONSUMER) linked to that context, current
while the processor's code runs, so that jobs it enqueues continue the trace.

Without the package, or without a tracer provider, nothing is added to any entry and
no span is made: the senders pay one check per call (:func:`entry_trace`), the
processor one per partition (:func:`processor_spans`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["TRACE_PREFIX", "ProcessorSpans", "entry_trace", "processor_spans", "provider_set"]

_trace: Any
try:
    from opentelemetry import context as _context, propagate as _propagate, trace as _trace
except ImportError:  # the otel extra is not installed
    _trace = None

#: The prefix of an entry's trace fields: ``trace:`` and the propagator's key.
TRACE_PREFIX = b"trace:"
_PREFIX_SIZE = len(TRACE_PREFIX)
_UNKNOWN = object()


def provider_set() -> bool:
    """Whether OpenTelemetry is installed and a tracer provider (an SDK) is set: a
    global read, a few tens of nanoseconds."""
    if _trace is None:
        return False
    # set_tracer_provider() sets this global once; its default is None
    provider = getattr(_trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:  # another version of the API: ask it, the slower way
        return not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)
    return provider is not None


def entry_trace() -> tuple[bytes, ...]:
    """The current trace context as an entry's extra fields, flat (``name, value,
    ...``); ``()`` without a tracer provider or a valid current span."""
    if not provider_set() or not _trace.get_current_span().get_span_context().is_valid:
        return ()
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    flat: list[bytes] = []
    for key, value in carrier.items():
        flat += (TRACE_PREFIX + key.encode(), value.encode())
    return tuple(flat)


def _sender_context(flat: Sequence[bytes]) -> Any:
    """The context and span context an entry's trace fields carry, or ``None``."""
    carrier: dict[str, str] | None = None
    for i in range(0, len(flat) - 1, 2):
        name = flat[i]
        if name.startswith(TRACE_PREFIX):
            if carrier is None:
                carrier = {}
            # Anyone can write to a stream: what is not text is no context.
            carrier[name[_PREFIX_SIZE:].decode(errors="replace")] = flat[i + 1].decode(
                errors="replace"
            )
    if carrier is None:
        return None
    try:
        sent = _propagate.extract(carrier)
        span_context = _trace.get_current_span(sent).get_span_context()
    except Exception:  # a propagator of the user's that refuses what it reads
        return None
    return (sent, span_context) if span_context.is_valid else None


class ProcessorSpans:
    """The spans of one partition's processor: one per record of ``records()`` and
    ``raw()``, one per batch of ``take()``; at most one open, current while the
    processor holds what it stands for.

    A record's span is a child of the sender's span, and links to it too; a batch's is
    a child of the processor's own context, and links to each record's sender span
    (each distinct one once), as OpenTelemetry's messaging conventions ask for
    batches, whose records come from many traces.
    """

    __slots__ = ("_attributes", "_name", "_span", "_token", "_tracer", "inflight")

    def __init__(self, inflight: Any, stream: str, group: str, partition: int) -> None:
        #: What the processor holds: ``inflight()`` lists ``(entry id, flat fields)``.
        self.inflight = inflight
        self._tracer = _trace.get_tracer("streamkit")
        self._name = f"process {stream}"
        self._attributes = {
            "messaging.system": "streamkit",
            "messaging.operation.type": "process",
            "messaging.destination.name": stream,
            "messaging.destination.partition.id": str(partition),
            "messaging.consumer.group.name": group,
        }
        self._span: Any = None
        self._token: Any = None

    def begin(self, *, batch: bool) -> None:
        """Open the span of what the processor now holds (ending the one before) and
        make it current."""
        self.end()
        entries = self.inflight()
        links = []
        seen: set[tuple[int, int]] = set()
        parent = None
        for _, flat in entries:
            sender = _sender_context(flat)
            if sender is None:
                continue
            sent, span_context = sender
            if parent is None and not batch:
                parent = sent
            key = (span_context.trace_id, span_context.span_id)
            if key not in seen:
                seen.add(key)
                links.append(_trace.Link(span_context))
        attributes: dict[str, Any] = dict(self._attributes)
        if batch:
            attributes["messaging.batch.message_count"] = len(entries)
        elif entries:
            attributes["messaging.message.id"] = entries[0][0].decode()
        span = self._tracer.start_span(
            self._name,
            context=parent,
            kind=_trace.SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )
        self._span = span
        self._token = _context.attach(_trace.set_span_in_context(span))

    def end(self, error: BaseException | None = None) -> None:
        """End the open span, if any (recording ``error``, the processor's, if given),
        and make the context before it current again."""
        span = self._span
        if span is None:
            return
        self._span = None
        token, self._token = self._token, None
        if error is not None:
            span.record_exception(error)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, f"{type(error).__name__}"))
        span.end()
        _context.detach(token)


def processor_spans(
    inflight: Any, stream: str, group: str, partition: int
) -> ProcessorSpans | None:
    """The spans of a partition's processor, or ``None`` (no span at all) without a
    tracer provider: see :class:`ProcessorSpans`."""
    if not provider_set():
        return None
    return ProcessorSpans(inflight, stream, group, partition)
