"""One trace from a web request to a processor to a job, printed as a tree of spans.

A web view (blocking code, as under a WSGI server) sends an order inside the span of
its request; the worker's processor handles it in a span that is the request span's
child (and links to it), and enqueues a job in its commit; the job runs in a span that
is the processor span's child. OpenTelemetry's SDK keeps the finished spans in memory
(in production: a ``BatchSpanProcessor`` and the exporter of your choice), and the demo
prints them as a tree once the job has run.

Run it on its own (it starts a private ``redis-server``)::

    python examples/traces.py

or against a server of yours::

    python examples/traces.py --redis-url redis://localhost:6379

Needs the ``otel`` extra and OpenTelemetry's SDK: ``pip install 'streamkit[otel]'
opentelemetry-sdk``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import streamkit
from streamkit.testing import RedisServer, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from opentelemetry.sdk.trace import ReadableSpan

# docs: start setup
# Once, at start-up: a tracer provider (here the SDK's, its spans kept in memory).
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("shop.web")
# docs: end setup


class Order(streamkit.Record):
    order_id: int
    customer: str


# docs: start app
app = streamkit.App("traces_demo")
orders = app.stream("orders", record=Order, partition_by="customer", partition_count=4)


@app.job
async def send_receipt(order_id: int) -> str:
    return f"receipt for order {order_id}"


@app.processor(orders, jobs=[send_receipt])
async def take_orders(events: streamkit.Events[Order]) -> None:
    async for order in events.records():
        # Runs in the processor's span: the job's headers get its trace context.
        events.enqueue(send_receipt, order.order_id)


def checkout(client: streamkit.clients.BlockingClient, order_id: int) -> None:
    """A web view; a web framework's instrumentation opens the request's span."""
    with tracer.start_as_current_span("POST /checkout", kind=trace.SpanKind.SERVER):
        client.send(orders, Order(order_id=order_id, customer="ada"))


# docs: end app


def tree(spans: Sequence[ReadableSpan]) -> list[str]:
    """The spans as a tree of names, children under their parent, with their links."""
    by_id = {span.context.span_id: span for span in spans}
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        children.setdefault(parent if parent in by_id else None, []).append(span)
    lines: list[str] = []

    def show(span: ReadableSpan, lead: str, last: bool, root: bool) -> None:
        linked = [
            by_id[link.context.span_id].name for link in span.links if link.context.span_id in by_id
        ]
        note = f", linked to {', '.join(linked)}" if linked else ""
        branch = "" if root else ("└── " if last else "├── ")
        lines.append(f"{lead}{branch}{span.name}  [{span.kind.name.lower()}{note}]")
        below = sorted(children.get(span.context.span_id, []), key=lambda s: s.start_time or 0)
        for i, child in enumerate(below):
            extra = "" if root else ("    " if last else "│   ")
            show(child, lead + extra, i == len(below) - 1, False)

    for root in sorted(children.get(None, []), key=lambda s: s.start_time or 0):
        show(root, "", True, True)
    traces = {span.context.trace_id for span in spans}
    lines.append(
        f"{len(spans)} spans, {'one trace' if len(traces) == 1 else f'{len(traces)} traces'}"
    )
    return lines


async def demo(url: str) -> int:
    app.settings = streamkit.Settings.from_env(redis_url=url)

    def view() -> None:
        with app.blocking() as client:
            checkout(client, 1)

    async with app, trio.open_nursery() as nursery:
        await nursery.start(streamkit.run_worker, app)
        await trio.to_thread.run_sync(view)

        def job_done() -> bool:
            return any(s.name == "job send_receipt" for s in exporter.get_finished_spans())

        await wait_until(job_done, what="the job run", within=20)
        nursery.cancel_scope.cancel()
    lines = tree(exporter.get_finished_spans())
    print("\n".join(lines))
    return 0 if lines[-1] == "3 spans, one trace" else 1


@contextlib.contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    if given:
        yield given
    else:
        with RedisServer() as server:
            yield server.url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="Redis to use (default: start a private one)")
    args = parser.parse_args()
    with redis_url(args.redis_url) as url:
        return trio.run(demo, url)


if __name__ == "__main__":
    sys.exit(main())
