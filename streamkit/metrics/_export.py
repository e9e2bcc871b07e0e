"""Exporting a worker's metrics: into a Prometheus registry, and over HTTP."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import attrs
import trio
from prometheus_client import REGISTRY, CollectorRegistry, make_asgi_app

from .._errors import ConfigError
from .._http import serve_asgi
from .._http_access import Access, check_token, guarded
from .._meter import DEFAULT_REFRESH_INTERVAL, TIMING
from .._nurseries import open_service_nursery
from .._validate import positive_finite_number
from ._collector import WorkerCollector
from ._readings import Readings

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from ._source import Worker

__all__ = ["Metrics", "open_metrics", "serve_metrics"]


@attrs.define(eq=False)
class Metrics:
    """A worker's metrics, exported to a Prometheus registry (from :func:`open_metrics`).

    Attributes:
        worker: the worker.
        registry: the registry its metrics are in.
    """

    worker: Worker
    registry: CollectorRegistry
    _readings: Readings

    async def refresh(self) -> None:
        """Read lag, pending and job queue depths from Redis now, rather than at the
        next refresh.

        Error handling:
            :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
        """
        await self._readings.refresh(self.worker)

    def __repr__(self) -> str:
        processors = [e.processor.name for e in self.worker.executors]
        return f"<Metrics of {self.worker.app.name} processors={processors}>"


@contextlib.asynccontextmanager
async def open_metrics(
    worker: Worker,
    *,
    registry: CollectorRegistry | None = None,
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
) -> AsyncIterator[Metrics]:
    """Export ``worker``'s metrics to ``registry`` while the block runs.

    Registers a collector that reads the worker's counters when the registry is
    scraped, turns on the timing of latencies (per batch), and refreshes lag,
    pending and job queue depths from Redis every ``refresh_interval`` seconds in a
    background task. Serve the registry however the service serves HTTP, e.g. by
    mounting ``prometheus_client.make_asgi_app(registry)``, or use
    :func:`serve_metrics`. Processors the worker starts later are exported too.

    Args:
        worker: a running worker (what ``nursery.start(streamkit.run_worker, app)``
            returns).
        registry: where to register the metrics: prometheus-client's default
            registry (``prometheus_client.REGISTRY``) unless given, so they appear
            beside the service's own and the process's.
        refresh_interval: seconds between two readings from Redis.

    Cancellation:
        Leaving the block stops the refreshing and unregisters the collector.

    Error handling:
        :class:`~streamkit.ConfigError` if the registry has streamkit's metrics
        already (another worker's), or for a bad ``refresh_interval``. Redis being
        unavailable leaves lag and queue depths out of the scrapes until it is back
        (logged once); the counters are exported all the same.
    """
    positive_finite_number.check("refresh_interval", refresh_interval)
    registry = REGISTRY if registry is None else registry
    readings = Readings()
    collector = WorkerCollector(worker, readings)
    try:
        registry.register(collector)
    except ValueError as exc:
        raise ConfigError(
            "registry", f"it exports streamkit's metrics already (of another worker?): {exc}"
        ) from None
    TIMING.enable()
    try:
        async with open_service_nursery(reason="metrics closed") as nursery:
            await nursery.start(readings.run, worker, refresh_interval)
            yield Metrics(worker, registry, readings)
    finally:
        TIMING.disable()
        registry.unregister(collector)


async def serve_metrics(
    worker: Worker,
    *,
    host: str = "127.0.0.1",
    port: int,
    registry: CollectorRegistry | None = None,
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
    token: str | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``worker``'s metrics over HTTP until cancelled:
    ``url = await nursery.start(functools.partial(serve_metrics, worker, port=9100))``.

    The endpoint answers any path with the registry in Prometheus's text format (or
    OpenMetrics, when asked). ``task_status.started()`` gets its URL once it accepts
    connections. See :func:`open_metrics` for ``registry`` and ``refresh_interval``.

    With ``token`` (at least 16 characters), only requests carrying
    ``Authorization: Bearer TOKEN`` are answered (compared in constant time); others
    get 401. Prometheus sends it with ``authorization: {credentials: TOKEN}`` in the
    scrape configuration.

    Cancellation:
        Cancelling the task closes the endpoint and unregisters the metrics.

    Error handling:
        :class:`~streamkit.ConfigError` from ``nursery.start()`` when the port
        cannot be bound (in use, or not allowed), when hypercorn (in the
        ``metrics`` extra) is not installed, or for a token shorter than 16
        characters.
    """
    check_token("token", token)
    try:
        import hypercorn  # noqa: F401
    except ImportError:
        raise ConfigError(
            "metrics", "serving metrics needs hypercorn: pip install '/path/to/streamkit[metrics]'"
        ) from None
    async with open_metrics(
        worker, registry=registry, refresh_interval=refresh_interval
    ) as metrics:
        await serve_asgi(
            guarded(make_asgi_app(metrics.registry), Access(token=token, what="metrics")),
            host=host,
            port=port,
            what="metrics",
            task_status=task_status,
        )
