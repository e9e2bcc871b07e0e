"""The worker: runs an app's processors and background tasks as one task tree.

::

    worker nursery
    ├── leadership            on_leader tasks run while this worker holds the leader lease
    ├── background tasks      task / timer / crontab
    └── executor (one per processor)
        ├── membership        join, heartbeat, reap, watch -> AsyncValue of partitions
        ├── fetcher           one read loop for all owned partitions -> bounded buffers
        └── rebalancer        one cancel scope per owned partition: lease + processor
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import attrs
import trio

from . import _keys
from ._background import run_background_task
from ._errors import ConfigError
from ._fetcher import open_fetcher
from ._leadership import open_leader_election
from ._locks import LockManager, open_lock_manager
from ._membership import Membership, open_membership
from ._policies import run_processor
from ._rebalancer import Claim, Rebalancer, open_rebalancer
from ._refusals import ride_out_refusals

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from types import FrameType

    from ._app import App, Processor

__all__ = ["Executor", "Worker", "run_worker"]

log = logging.getLogger("streamkit.worker")


@attrs.define(eq=False)
class Executor:
    """One processor running in a worker: its membership and rebalancer."""

    processor: Processor
    membership: Membership
    rebalancer: Rebalancer

    def __repr__(self) -> str:
        return f"<Executor {self.processor.name} member={self.membership.id} {self.rebalancer!r}>"


@attrs.define(eq=False)
class Worker:
    """A running worker, as handed to ``task_status.started()`` by :func:`run_worker`.

    Attributes:
        app: the app it runs.
        executors: one per processor it runs.
    """

    app: App
    executors: list[Executor] = attrs.field(factory=list)
    _cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _stopping: bool = attrs.field(default=False)
    # Connecting to Redis; cancelled by a signal that arrives before the worker runs.
    _starting: trio.CancelScope = attrs.field(init=False, factory=trio.CancelScope)
    # The worker's nursery while it runs (None before and after).
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None)
    _phase: Literal["starting", "running", "stopped"] = attrs.field(init=False, default="starting")

    async def stop(self, *, grace: float | None = None) -> None:
        """Stop gracefully: let every partition finish and acknowledge its current
        event (up to ``grace`` seconds, the ``grace_period`` setting by default),
        release the leases, leave the groups, and end :func:`run_worker`."""
        if self._stopping:
            return
        self._stopping = True
        log.info("stopping: draining %d processor(s)", len(self.executors))
        async with trio.open_nursery() as nursery:
            for executor in self.executors:
                nursery.start_soon(executor.rebalancer.drain, grace)
        self._cancel_scope.cancel("worker stopped")

    def stop_now(self) -> None:
        """Stop at once: cancel everything (leases are still released, shielded)."""
        self._cancel_scope.cancel("worker stopped at once")

    def _on_first_signal(self, signum: int) -> None:
        """Act on the first SIGINT / SIGTERM (called in the Trio thread)."""
        name = signal.Signals(signum).name
        if self._nursery is not None:
            log.info("%s: stopping gracefully (send it again to exit at once)", name)
            self._nursery.start_soon(self.stop)
        elif self._phase == "starting":
            # Still connecting: there is nothing to drain yet.
            log.info("%s: stopping before the worker started", name)
            self._starting.cancel(f"{name} while starting")
        # Otherwise the worker has stopped already and is only cleaning up.


def select_processors(app: App, names: Sequence[str] | None) -> list[Processor]:
    """The processors to run: all of the app's, or those named.

    Error handling:
        :class:`ConfigError` naming an unknown processor and listing the known ones.
    """
    if not names:
        return list(app.processors.values())
    unknown = [name for name in names if name not in app.processors]
    if unknown:
        known = ", ".join(app.processors) or "none"
        raise ConfigError("processors", f"unknown processor {unknown[0]!r} (known: {known})")
    return [app.processors[name] for name in names]


async def run_worker(
    app: App,
    *,
    processors: Sequence[str] | None = None,
    handle_signals: bool = False,
    task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``app``'s processors and background tasks until stopped.

    With ``handle_signals``, SIGINT and SIGTERM stop the worker gracefully (see
    :meth:`Worker.stop`; while it is still connecting, it simply stops), and a second
    signal, at any time after the first, exits the process at once with code 128 +
    the signal number (130 for SIGINT, 143 for SIGTERM). Signal handling needs the
    main thread.

    Cancellation:
        Cancelling stops everything at once; leases are released and the groups left
        (shielded, time-limited), so other workers take over without waiting.

    Error handling:
        :class:`ConfigError` for unknown processors; :class:`RedisUnavailable` when
        Redis stays unreachable for ``connect_give_up_after`` seconds at start;
        :class:`~streamkit.ProcessorHalted` when a processor's policy halts.
    """
    selected = select_processors(app, processors)
    worker = Worker(app)
    with (
        _stop_on_signals(worker) if handle_signals else contextlib.nullcontext(),
        worker._starting,  # cancelled only by a signal that arrives while connecting
    ):
        async with app, open_lock_manager(app.redis) as locks:
            with worker._cancel_scope:
                try:
                    async with trio.open_nursery() as nursery:
                        worker._nursery = nursery
                        worker._phase = "running"
                        for processor in selected:
                            executor: Executor = await nursery.start(
                                _run_executor, app, processor, locks
                            )
                            worker.executors.append(executor)
                        if app.background:
                            await nursery.start(_run_background, app, locks)
                        log.info(
                            "worker of %s running %s",
                            app.name,
                            ", ".join(p.name for p in selected) or "no processors",
                        )
                        # Everything allocated so far (modules, the app, the pieces)
                        # lives as long as the worker: keep it out of the cyclic
                        # collector's full passes, which otherwise stall every
                        # partition for tens of milliseconds on a big heap.
                        gc.freeze()
                        task_status.started(worker)
                finally:
                    worker._nursery = None
                    worker._phase = "stopped"
    if worker._starting.cancelled_caught:
        log.info("worker of %s stopped before it started", app.name)
        return
    log.info("worker of %s stopped", app.name)


#: The signals that stop a worker run with ``handle_signals``.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _stop_on_signals(worker: Worker) -> Iterator[None]:
    """While the block runs, the first SIGINT or SIGTERM stops ``worker`` gracefully
    and a second one exits the process at once, with code 128 + the signal number.

    These are plain Python signal handlers, in place from before the worker connects
    until after its last cleanup: each runs in the main thread the moment its signal
    arrives, so whether a signal is the first or the second is decided then, whatever
    the worker is doing. (A Trio signal receiver would count signals only as a task
    reads them, and give them back to the previous handlers, Python's
    ``KeyboardInterrupt`` for SIGINT, once it is closed.)
    """
    token = trio.lowlevel.current_trio_token()
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        if received:
            _exit_at_once(signum)
        received.append(signum)
        token.run_sync_soon(worker._on_first_signal, signum)

    previous = {signum: signal.signal(signum, handle) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _exit_at_once(signum: int) -> NoReturn:
    # The second signal must not wait for anything, not even the shielded lease
    # releases: leases expire by themselves. Nothing here may block or take a lock the
    # interrupted main thread could hold (the logging module's, say): one raw write.
    message = f"streamkit worker: {signal.Signals(signum).name} again: exiting at once\n"
    with contextlib.suppress(OSError):
        os.write(2, message.encode())
    os._exit(128 + signum)


async def _run_executor(
    app: App,
    processor: Processor,
    locks: LockManager,
    *,
    task_status: trio.TaskStatus[Executor] = trio.TASK_STATUS_IGNORED,
) -> None:
    settings = processor.settings
    stream = processor.stream
    keys = processor.keys
    # Refuse to consume a stream whose recorded layout differs from ours: reading
    # the wrong partition count would silently skip partitions.
    # Refused (Redis out of memory, say, for a new stream): wait, saying so, rather
    # than exit; nothing else would drain a full Redis.
    await ride_out_refusals(stream.check_metadata, what=f"recording stream {stream.name!r}")

    async with (
        open_membership(
            app.redis,
            keys.group,
            partitions=stream.partition_count,
            member_id=settings.member_id,
            static=settings.member_id is not None,
            heartbeat_interval=settings.heartbeat_interval,
            session_timeout=settings.session_timeout,
            static_grace=settings.static_grace,
        ) as membership,
        open_fetcher(
            app.redis,
            stream.spec,
            group=keys,
            batch_size=settings.batch_size,
            prefetch=settings.prefetch,
        ) as fetcher,
    ):

        async def run(claim: Claim) -> None:
            async with fetcher.partition(claim.partition, claim.held) as feed:
                await run_processor(
                    processor.fn,
                    feed,
                    processor.policy,
                    redis=app.redis,
                    draining=claim.draining,
                    middleware=processor.middleware,
                    ack_batch=settings.batch_size,
                )

        async with open_rebalancer(
            membership.partitions,
            locks,
            lock_name=keys.lock_name,
            run=run,
            lease_ttl=settings.lease_ttl,
            grace=settings.grace_period,
        ) as rebalancer:
            task_status.started(Executor(processor, membership, rebalancer))
            await trio.sleep_forever()


async def _run_background(
    app: App, locks: LockManager, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    everywhere = [task for task in app.background if not task.on_leader]
    on_leader = [task for task in app.background if task.on_leader]
    async with trio.open_nursery() as nursery:
        for task in everywhere:
            nursery.start_soon(run_background_task, task, name=f"background {task.name}")
        if on_leader:
            election: Any = await nursery.start(_campaign, app, locks)
            for task in on_leader:
                nursery.start_soon(
                    election.run_while_leader, run_background_task, task, name=f"leader {task.name}"
                )
        task_status.started()


async def _campaign(
    app: App, locks: LockManager, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
) -> None:
    async with open_leader_election(
        locks, _keys.leader_lock_name(app.name), ttl=app.settings.lease_ttl
    ) as election:
        task_status.started(election)
        await trio.sleep_forever()
