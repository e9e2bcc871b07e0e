"""Traces from send to processor (streamkit._tracing), on a real server.

With a tracer provider set (the SDK's, exporting to memory), a record sent inside a
span by the Trio producer, the blocking client or the asyncio client carries that
span's W3C context in its entry (``trace:traceparent``); the in-process worker's
processor handles it in a span that is the sender's child and links to it, and the job
it enqueues in its commit runs in a span that is the processor span's child: one trace.
A ``take()`` batch's span links every record's sender. Without a provider nothing is
added to any entry, even inside a valid span. Every reader ignores the trace fields.

The tracer provider is a process-wide global that OpenTelemetry lets be set only once;
the ``exported`` fixture sets it for one test and takes it away again (as
OpenTelemetry's own test utilities do), so other tests of the process see none.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags
from opentelemetry.util._once import Once

from streamkit import App, Backoff, Events, ExceptionPolicy, Record
from streamkit._tracing import TRACE_PREFIX, entry_trace, provider_set
from streamkit._worker import run_worker
from streamkit.lowlevel import codec_for
from streamkit.testing import wait_until
from tests.apps.readable import Note
from tests.test_cli import streamkit

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator

    from opentelemetry.sdk.trace import ReadableSpan

    from streamkit import Redis, Stream

FAST: dict[str, Any] = {
    "lease_ttl": 1.0,
    "heartbeat_interval": 0.1,
    "session_timeout": 1.0,
    "grace_period": 1.0,
}


class Order(Record):
    order_id: int
    customer: str


def _use_provider(provider: TracerProvider | None) -> None:
    # What opentelemetry-test-utils' reset_trace_globals does.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    if provider is not None:
        trace.set_tracer_provider(provider)


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """A tracer provider set for the test, its finished spans in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _use_provider(provider)
    try:
        yield exporter
    finally:
        _use_provider(None)
        provider.shutdown()


async def in_asyncio(fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return await trio.to_thread.run_sync(lambda: asyncio.run(fn()))


def traceparent(context: SpanContext) -> bytes:
    flags = int(context.trace_flags)
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}".encode()


async def raw_entries(redis: Redis, stream: Stream[Any]) -> list[dict[bytes, bytes]]:
    out = []
    for partition in range(stream.partition_count):
        entries: Any = await redis.xrange(stream.key(partition))
        out += [dict(e.field_values) for e in entries]
    return out


def ids(context: SpanContext) -> tuple[int, int]:
    return context.trace_id, context.span_id


def named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


# ------------------------------------------------------------- one trace, three senders


async def test_a_sent_records_trace_goes_on_through_the_processor_to_its_job(
    redis_url: str, redis: Redis, exported: InMemorySpanExporter
) -> None:
    app = App("traced", redis_url=redis_url, **FAST)
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=2)
    tracer = trace.get_tracer("tests")
    ran: list[int] = []

    @app.job
    async def receipt(order_id: int) -> None:
        ran.append(order_id)

    @app.processor(orders, jobs=[receipt])
    async def take_orders(events: Events[Order]) -> None:
        async for order in events.records():
            events.enqueue(receipt, order.order_id)

    def send_blocking() -> None:
        with tracer.start_as_current_span("send blocking"), app.blocking() as client:
            client.send(orders, Order(order_id=2, customer="b"))

    async def send_asyncio() -> None:
        with tracer.start_as_current_span("send asyncio"):
            async with app.asyncio() as client:
                await client.send(orders, Order(order_id=3, customer="c"))

    async with trio.open_nursery() as nursery:
        await nursery.start(run_worker, app)
        with tracer.start_as_current_span("send trio"):
            await orders.send(Order(order_id=1, customer="a"))
        await trio.to_thread.run_sync(send_blocking)
        await in_asyncio(send_asyncio)
        await orders.send(Order(order_id=4, customer="d"))  # no span: no trace context
        await wait_until(lambda: len(ran) == 4, what="every job run", within=20)
        # (a job's span ends just after its function returns)
        await wait_until(
            lambda: len(named(exported.get_finished_spans(), "job receipt")) == 4,
            what="every job's span",
            within=5,
        )
        nursery.cancel_scope.cancel()

    spans = exported.get_finished_spans()
    senders = {s.name: s for s in named(spans, "send ")}
    processed = named(spans, "process orders")
    jobs = named(spans, "job receipt")
    assert len(processed) == len(jobs) == 4
    by_parent = {s.parent.span_id: s for s in processed if s.parent is not None}
    entries = await raw_entries(redis, orders)
    assert len(entries) == 4
    for name in ("send trio", "send blocking", "send asyncio"):
        sender = senders[name].context
        assert {TRACE_PREFIX + b"traceparent": traceparent(sender)} in [
            {k: v for k, v in e.items() if k.startswith(TRACE_PREFIX)} for e in entries
        ]
        # The processor span: the sender's child, linked to it too.
        span = by_parent[sender.span_id]
        assert span.kind is SpanKind.CONSUMER
        assert span.context.trace_id == sender.trace_id
        assert [ids(link.context) for link in span.links] == [ids(sender)]
        assert span.attributes is not None
        assert span.attributes["messaging.destination.name"] == "orders"
        assert span.attributes["messaging.consumer.group.name"] == "traced.orders.take_orders"
        # The job it enqueued: the processor span's child, in the same trace.
        (job,) = [
            j for j in jobs if j.parent is not None and j.parent.span_id == span.context.span_id
        ]
        assert job.context.trace_id == sender.trace_id
    # The record sent outside any span: a processor span of its own, no link.
    (untraced,) = [s for s in processed if s.parent is None]
    assert untraced.links == ()
    assert sum(TRACE_PREFIX + b"traceparent" in e for e in entries) == 3


# --------------------------------------------------------------------- take() batches


async def test_a_batch_span_links_every_records_sender_and_failures_are_recorded(
    redis_url: str, exported: InMemorySpanExporter
) -> None:
    app = App("batched", redis_url=redis_url, **FAST)
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=1)
    tracer = trace.get_tracer("tests")
    batches: list[list[int]] = []
    failed = False
    policy = ExceptionPolicy(action="retry", backoff=Backoff(initial=0.01, maximum=0.02))

    @app.processor(orders, policy=policy)
    async def take_orders(events: Events[Order]) -> None:
        nonlocal failed
        async for batch in events.take(3):
            if not failed:
                failed = True
                raise ValueError("the first try of a batch fails")
            batches.append([order.order_id for order in batch])

    senders = []
    async with app:
        for n in range(3):
            with tracer.start_as_current_span(f"send {n}") as span:
                await orders.send(Order(order_id=n, customer="same"))
                senders.append(span.get_span_context())
    async with trio.open_nursery() as nursery:
        await nursery.start(run_worker, app)
        await wait_until(lambda: batches, what="the batch processed", within=20)
        nursery.cancel_scope.cancel()
    assert batches == [[0, 1, 2]]
    tries = named(exported.get_finished_spans(), "process orders")
    assert len(tries) == 2
    for tried in tries:
        assert tried.parent is None  # a batch's records come from many traces: links
        assert [ids(link.context) for link in tried.links] == [ids(s) for s in senders]
        assert tried.attributes is not None
        assert tried.attributes["messaging.batch.message_count"] == 3
    first, second = sorted(tries, key=lambda s: s.start_time or 0)
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert second.status.status_code is StatusCode.UNSET


# ------------------------------------------------------------------- no provider, no cost


async def test_without_a_provider_no_entry_carries_a_trace(redis_url: str, redis: Redis) -> None:
    assert not provider_set()
    app = App("untraced", redis_url=redis_url)
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=2)
    valid = SpanContext(
        trace_id=0x5CE0E9A56015FEC5AADFA328AE398115,
        span_id=0xAB54A98CEB1F0AD2,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    with trace.use_span(NonRecordingSpan(valid)):
        assert entry_trace() == ()
        async with app:
            await orders.send(Order(order_id=1, customer="a"))

            def send_blocking() -> None:
                with app.blocking() as client:
                    client.send_many(orders, [Order(order_id=2, customer="b")])

            async def send_asyncio() -> None:
                async with app.asyncio() as client:
                    await client.send(orders, Order(order_id=3, customer="c"))

            await trio.to_thread.run_sync(send_blocking)
            await in_asyncio(send_asyncio)
    entries = await raw_entries(redis, orders)
    assert len(entries) == 3
    assert all(list(e) == [b"data"] for e in entries)


# ------------------------------------------------------------ readers ignore the fields


class Flat(Record, primitive=True):
    order_id: int
    customer: str


@pytest.mark.parametrize(("record", "compression"), [(Order, None), (Order, "zstd"), (Flat, None)])
def test_every_decoder_ignores_the_trace_fields(record: type[Any], compression: str | None) -> None:
    codec = codec_for(record, compression=compression)
    value = record(order_id=7, customer="a")
    fields = {
        **codec.encode(value),
        TRACE_PREFIX + b"traceparent": b"00-5ce0e9a56015fec5aadfa328ae398115-ab54a98ceb1f0ad2-01",
        TRACE_PREFIX + b"tracestate": b"vendor=1",
    }
    flat = [part for pair in fields.items() for part in pair]
    assert codec.decode(fields, stream="orders") == value
    assert codec.entry_decoder(stream="orders")(flat, b"1-0") == value
    missing = object()
    assert codec.batch_decoder(missing)([flat, flat]) == ([value, value], 0)


# ------------------------------------------------------------------ examples/traces.py

EXAMPLE = Path(__file__).parent.parent / "examples" / "traces.py"


@pytest.mark.timeout(60)
async def test_the_example_prints_one_trace_from_the_request_to_the_job(redis_url: str) -> None:
    with trio.fail_after(50):
        result = await trio.run_process(
            [sys.executable, str(EXAMPLE), "--redis-url", redis_url],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    # The picture of docs/observability.md, word for word.
    page = (Path(__file__).parent.parent / "docs" / "observability.md").read_text()
    assert out.strip() in page
    assert out.splitlines() == [
        "POST /checkout  [server]",
        "└── process orders  [consumer, linked to POST /checkout]",
        "    └── job send_receipt  [consumer]",
        "3 spans, one trace",
    ]


async def test_streamkit_read_shows_traced_entries_as_their_records(
    redis_url: str, redis: Redis, exported: InMemorySpanExporter
) -> None:
    app = App("readable", redis_url=redis_url)
    notes = app.stream("notes", record=Note, partition_by="key", partition_count=4)
    with trace.get_tracer("tests").start_as_current_span("send notes"):
        async with app:
            await notes.send_many([Note(key=f"k{n}", n=n) for n in range(3)])
    assert all(TRACE_PREFIX + b"traceparent" in e for e in await raw_entries(redis, notes))
    result = await streamkit("read", "tests.apps.readable:notes", "--json", redis_url=redis_url)
    assert result.code == 0, result.err
    documents = [orjson.loads(line) for line in result.out.splitlines()]
    assert sorted(d["record"]["n"] for d in documents) == [0, 1, 2]
    assert "trace" not in result.out


async def test_a_job_enqueued_straight_from_raw_continues_the_trace(
    redis_url: str, exported: InMemorySpanExporter
) -> None:
    app = App("straight", redis_url=redis_url, **FAST)
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=1)
    ran: list[int] = []

    @app.job
    async def receipt(order_id: int) -> None:
        ran.append(order_id)

    @app.processor(orders)
    async def take_orders(events: Events[Order]) -> None:
        async for event in events.raw():
            await receipt.enqueue(event.record.order_id)  # to the queue, not the commit

    async with trio.open_nursery() as nursery:
        await nursery.start(run_worker, app)
        with trace.get_tracer("tests").start_as_current_span("send") as sent:
            await orders.send(Order(order_id=1, customer="a"))
        await wait_until(lambda: ran == [1], what="the job run", within=20)
        await wait_until(
            lambda: named(exported.get_finished_spans(), "job receipt"), what="its span", within=5
        )
        nursery.cancel_scope.cancel()
    spans = exported.get_finished_spans()
    (processed,) = named(spans, "process orders")
    (job,) = named(spans, "job receipt")
    assert processed.parent is not None
    assert processed.parent.span_id == sent.get_span_context().span_id
    assert job.parent is not None
    assert job.parent.span_id == processed.context.span_id
    assert job.context.trace_id == sent.get_span_context().trace_id
