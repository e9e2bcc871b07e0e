"""What the metrics read from a worker, as protocols.

:class:`streamkit.Worker` satisfies them; naming them here keeps this package from
importing the worker, which itself starts the metrics endpoint (the ``metrics_port``
setting).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import trio_util

    from .._app import App
    from .._data_loss import DataLossWatch
    from .._fetcher import Fetcher
    from .._halts import HaltRecord
    from .._membership import Membership
    from .._rebalancer import Rebalancer
    from ..jobs._serve import JobWorker


class Executor(Protocol):
    """One processor running in a worker (:class:`streamkit.Executor`)."""

    @property
    def processor(self) -> Any: ...
    @property
    def membership(self) -> Membership: ...
    @property
    def rebalancer(self) -> Rebalancer: ...
    @property
    def halted(self) -> trio_util.AsyncValue[Mapping[int, HaltRecord]]: ...
    @property
    def fetcher(self) -> Fetcher[Any] | None: ...


class Worker(Protocol):
    """A running worker (:class:`streamkit.Worker`)."""

    @property
    def app(self) -> App: ...
    @property
    def executors(self) -> Sequence[Executor]: ...
    @property
    def jobs(self) -> JobWorker | None: ...
    @property
    def data_loss(self) -> DataLossWatch | None: ...
