"""The supervisor of ``streamkit worker --processes N``: N worker processes, kept running.

::

    supervisor nursery
    └── one task per worker index 0..N-1
        └── run the worker process; when it dies, start it again (with a backoff
            when it keeps dying right after start)

Each worker is a complete ``streamkit worker`` process of its own: partitions spread
over all of them through membership, exactly as over workers started by hand. The
supervisor only starts them, restarts them and passes signals on.

Signals: the first SIGINT / SIGTERM is passed on to every worker, which stops
gracefully, and nothing is restarted any more; a later one is passed on as well, so
the workers exit at once. The workers run in sessions of their own, so a Ctrl-C in a
terminal reaches them once, through the supervisor, rather than twice.

A supervisor that dies without passing a signal on (``kill -9``, the OOM killer)
leaves no worker behind: each worker holds the read end of a pipe whose write end only
the supervisor holds (its *lifeline*); the kernel closes it when the supervisor dies,
and the worker then stops gracefully, as on SIGTERM (see :func:`watch_lifeline`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import subprocess
import threading
from typing import TYPE_CHECKING, Literal

import attrs
import trio
import trio_util

from .._backoff import Backoff
from .._errors import ConfigError
from .._signals import signal_handlers
from .._validate import positive_number

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from types import FrameType

    from .._app import Processor

__all__ = [
    "Supervisor",
    "SupervisorExit",
    "check_member_ids",
    "run_supervisor",
    "watch_lifeline",
    "worker_environment",
]

log = logging.getLogger("streamkit.supervisor")

#: The variable that tells a worker process its index (0 to N - 1).
WORKER_INDEX_VARIABLE = "STREAMKIT_WORKER_INDEX"
#: The variable of the member id setting, suffixed with the index for each worker.
MEMBER_ID_VARIABLE = "STREAMKIT_MEMBER_ID"
#: The variable that tells a worker process the descriptor of its lifeline.
LIFELINE_VARIABLE = "STREAMKIT_SUPERVISOR_FD"

#: A worker that dies within this many seconds of its start counts as failing at start.
DEFAULT_START_WINDOW = 5.0
#: Waits before restarting a worker that keeps failing at start: 1 s, 2 s, 4 s ... 30 s.
DEFAULT_RESTART_BACKOFF = Backoff(initial=1.0, maximum=30.0, factor=2.0, jitter=0.0)
#: The exit code of a worker that refused its configuration (``streamkit worker``'s
#: code for bad input: an app that does not import, an unknown processor).
DEFAULT_CONFIG_ERROR_CODE = 2

#: Seconds a worker has to exit after SIGTERM when the supervisor is cancelled.
CANCEL_KILL_AFTER = 5.0

#: The signals passed on to the workers.
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


# --------------------------------------------------------------------------- decisions


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it: 128 + N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """``exited with code 1`` or ``died with signal 9``."""
    if returncode < 0:
        return f"died with signal {-returncode}"
    return f"exited with code {returncode}"


@attrs.frozen(kw_only=True)
class Step:
    """What to do once a worker process has exited.

    Attributes:
        action: ``"restart"`` it (after ``delay`` seconds), ``"stop"`` (the
            supervisor is stopping: the exit was asked for), or ``"give up"`` (a
            configuration error, which a restart cannot cure).
        delay: seconds to wait before the restart.
        early_deaths: how many times in a row it has now died right after start.
    """

    action: Literal["restart", "stop", "give up"]
    delay: float = 0.0
    early_deaths: int = 0


def after_exit(
    returncode: int,
    *,
    stopping: bool,
    ran_for: float,
    early_deaths: int,
    config_error_code: int,
    start_window: float = DEFAULT_START_WINDOW,
    backoff: Backoff = DEFAULT_RESTART_BACKOFF,
) -> Step:
    """Decide what follows a worker process's exit (pure: no I/O, no clock).

    Args:
        returncode: how it ended (``-N``: killed by signal N).
        stopping: whether the supervisor is stopping.
        ran_for: seconds between its start and its exit.
        early_deaths: how many times in a row it had died right after start before.
        config_error_code: the exit code of a configuration error.
        start_window: a run shorter than this is a death right after start.
        backoff: the waits before restarting after 1, 2, 3 ... early deaths.
    """
    if stopping:
        return Step(action="stop")
    if returncode == config_error_code:
        return Step(action="give up")
    if ran_for >= start_window:
        return Step(action="restart")
    early = early_deaths + 1
    return Step(action="restart", delay=restart_delay(early, backoff), early_deaths=early)


def restart_delay(early_deaths: int, backoff: Backoff = DEFAULT_RESTART_BACKOFF) -> float:
    """Seconds to wait before a restart after ``early_deaths`` deaths in a row at start."""
    return next(itertools.islice(backoff.delays(), early_deaths - 1, None))


def worker_environment(index: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of worker ``index``: ``environ`` plus its index, and its own
    member id (``STREAMKIT_MEMBER_ID`` plus ``-index``) if a member id is set."""
    env = dict(environ)
    env[WORKER_INDEX_VARIABLE] = str(index)
    member_id = _member_id_from(environ)
    if member_id is not None:
        env[MEMBER_ID_VARIABLE] = f"{member_id}-{index}"
    return env


def _member_id_from(environ: Mapping[str, str]) -> str | None:
    # As Settings.from_env reads it: empty, "none" or "null" unset it.
    text = environ.get(MEMBER_ID_VARIABLE)
    if text is None or text.strip().lower() in ("", "none", "null"):
        return None
    return text


def check_member_ids(
    processors: Sequence[Processor], environ: Mapping[str, str], *, processes: int
) -> None:
    """Refuse a member id fixed in code: the worker processes cannot share one.

    A member id from ``STREAMKIT_MEMBER_ID`` is fine: each worker gets its own (see
    :func:`worker_environment`). One given as a keyword argument wins over the
    environment, so every worker would run with the same id.

    Error handling:
        :class:`ConfigError` on ``member_id``, naming the processor.
    """
    from_env = _member_id_from(environ)
    for processor in processors:
        member_id = processor.settings.member_id
        if member_id is not None and member_id != from_env:
            raise ConfigError(
                "member_id",
                f"processor {processor.name!r} has the member id {member_id!r}, given in "
                f"code, which {processes} worker processes cannot share; set "
                f"{MEMBER_ID_VARIABLE} instead (worker N gets '<id>-N'), or run one "
                f"process per member id",
            )


# --------------------------------------------------------------------------- runtime


@attrs.frozen(kw_only=True)
class SupervisorExit:
    """How a supervisor ended.

    Attributes:
        code: the exit code for the command: 0 after a clean stop, the configuration
            error's code when it gave up, else the worst worker's exit status.
        reason: one line saying why, for the command's last message.
    """

    code: int
    reason: str


@attrs.frozen(kw_only=True)
class SupervisorStatistics:
    """A snapshot of a :class:`Supervisor`.

    Attributes:
        processes: how many worker processes it keeps running.
        running: how many run right now.
        restarts: how many times a worker was started again, in all.
        stopping: whether it stops (a signal, or it gave up).
    """

    processes: int
    running: int
    restarts: int
    stopping: bool


@attrs.define(eq=False)
class WorkerSlot:
    """Worker index ``index`` of a supervisor: its current process and history."""

    index: int
    #: The current (or last) process; ``None`` before the first start.
    process: trio.Process | None = None
    #: How many times it was started again.
    restarts: int = 0
    #: How its process exited while the supervisor stopped (``None``: still running,
    #: or it had exited before).
    final: int | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def __repr__(self) -> str:
        pid = self.process.pid if self.process is not None else None
        return f"<WorkerSlot {self.index} pid={pid} restarts={self.restarts}>"


@attrs.define(eq=False)
class Supervisor:
    """A running supervisor, as handed to ``task_status.started()`` by
    :func:`run_supervisor` once every worker process has been started.

    Attributes:
        command: the worker command each process runs.
        slots: one per worker index.
    """

    command: tuple[str, ...]
    slots: list[WorkerSlot]
    _config_error_code: int
    _environ: Mapping[str, str]
    _start_window: float
    _backoff: Backoff
    #: The read end of the lifeline, passed to every worker (-1: none).
    _lifeline: int = -1
    _stopping: trio_util.AsyncBool = attrs.field(init=False, factory=trio_util.AsyncBool)
    # The signals passed on so far, in order: a worker started meanwhile gets them too.
    _signals: list[int] = attrs.field(init=False, factory=list)
    _gave_up: SupervisorExit | None = attrs.field(init=False, default=None)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Pass ``signum`` on to every worker process, and restart none of them any
        more. A worker stops gracefully on its first signal and exits at once on the
        next, so a second call stops them at once."""
        self._signals.append(signum)
        self._stopping.value = True
        for slot in self.slots:
            if slot.running:
                assert slot.process is not None
                slot.process.send_signal(signum)

    def statistics(self) -> SupervisorStatistics:
        return SupervisorStatistics(
            processes=len(self.slots),
            running=sum(slot.running for slot in self.slots),
            restarts=sum(slot.restarts for slot in self.slots),
            stopping=self._stopping.value,
        )

    def outcome(self) -> SupervisorExit:
        """How the supervisor ended (or would end now, if every worker had exited)."""
        if self._gave_up is not None:
            return self._gave_up
        failed = [
            slot
            for slot in self.slots
            if slot.final is not None and not self._stopped_as_asked(slot.final)
        ]
        if not failed:
            return SupervisorExit(code=0, reason=f"all {len(self.slots)} workers stopped")
        details = "; ".join(
            f"worker {slot.index} (pid {slot.process.pid if slot.process else '?'}) "
            f"{describe_exit(slot.final or 0)}"
            for slot in failed
        )
        worst = max(exit_status(slot.final or 0) for slot in failed)
        return SupervisorExit(code=worst, reason=f"not every worker stopped cleanly: {details}")

    def _stopped_as_asked(self, returncode: int) -> bool:
        # 0: a graceful stop. Killed by a signal passed on: the worker had not set up
        # its handlers yet (it was still importing the app), so there was nothing to
        # drain.
        return returncode == 0 or -returncode in self._signals

    def _on_signal(self, signum: int) -> None:
        """Act on a SIGINT / SIGTERM received by the supervisor (in the Trio thread)."""
        name = signal.Signals(signum).name
        if not self._signals:
            log.info(
                "%s: stopping the workers gracefully (send it again to stop them at once)", name
            )
        else:
            log.info("%s: stopping the workers at once", name)
        self.stop(signum)

    def _give_up(self, slot: WorkerSlot, returncode: int) -> None:
        if self._gave_up is None:
            assert slot.process is not None
            self._gave_up = SupervisorExit(
                code=returncode,
                reason=(
                    f"worker {slot.index} (pid {slot.process.pid}) {describe_exit(returncode)}, "
                    f"a configuration error (its message is above): not restarting it; "
                    f"stopped the other workers"
                ),
            )
            log.error(
                "worker %d (pid %d) %s, a configuration error: not restarting it; "
                "stopping the other workers",
                slot.index,
                slot.process.pid,
                describe_exit(returncode),
            )
        if not self._signals:
            self.stop(signal.SIGTERM)

    async def _run_slot(
        self, slot: WorkerSlot, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run worker ``slot.index`` until the supervisor stops, restarting it."""
        started = False

        def announce() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        early_deaths = 0
        attempts = 0
        while not self._stopping.value:
            if attempts:
                slot.restarts += 1
            attempts += 1
            try:
                process, ran_for = await self._run_process(slot, announce)
            except OSError as exc:
                # No fork or exec (out of memory, too many processes): like a death at
                # start, it is tried again later and later.
                early_deaths += 1
                delay = restart_delay(early_deaths, self._backoff)
                log.error(
                    "cannot start worker %d: %s; trying again in %g s", slot.index, exc, delay
                )
                await self._sleep_unless_stopping(delay)
                continue
            returncode = process.returncode
            assert returncode is not None
            step = after_exit(
                returncode,
                stopping=self._stopping.value,
                ran_for=ran_for,
                early_deaths=early_deaths,
                config_error_code=self._config_error_code,
                start_window=self._start_window,
                backoff=self._backoff,
            )
            if step.action == "stop":
                slot.final = returncode
                level = logging.INFO if self._stopped_as_asked(returncode) else logging.WARNING
                log.log(
                    level,
                    "worker %d (pid %d) %s",
                    slot.index,
                    process.pid,
                    describe_exit(returncode),
                )
                return
            if step.action == "give up":
                self._give_up(slot, returncode)
                return
            early_deaths = step.early_deaths
            log.warning(
                "worker %d (pid %d) %s; restarting%s",
                slot.index,
                process.pid,
                describe_exit(returncode),
                f" in {step.delay:g} s (it died {early_deaths} time(s) in a row within "
                f"{self._start_window:g} s of its start)"
                if step.delay
                else "",
            )
            await self._sleep_unless_stopping(step.delay)
        announce()

    async def _run_process(
        self, slot: WorkerSlot, announce: Callable[[], None]
    ) -> tuple[trio.Process, float]:
        """Start worker ``slot.index``'s process and wait for its exit; return it and
        how long it ran.

        Cancellation:
            The process gets SIGTERM, and SIGKILL if it is still alive
            ``CANCEL_KILL_AFTER`` seconds later (as with ``trio.run_process``).

        Error handling:
            ``OSError`` if the process cannot be started.
        """
        env = worker_environment(slot.index, self._environ)
        if self._lifeline >= 0:
            env[LIFELINE_VARIABLE] = str(self._lifeline)
        process = await trio.lowlevel.open_process(
            self.command,
            stdin=subprocess.DEVNULL,
            env=env,
            pass_fds=(self._lifeline,) if self._lifeline >= 0 else (),
            # Out of the terminal's process group: a Ctrl-C reaches the workers once,
            # through the supervisor, not a second time directly (which would stop
            # them at once rather than gracefully).
            start_new_session=True,
        )
        start = trio.current_time()
        slot.process = process
        log.info("started worker %d (pid %d)", slot.index, process.pid)
        for signum in self._signals:  # signals that came while it was being started
            process.send_signal(signum)
        announce()
        try:
            await process.wait()
        finally:
            if process.returncode is None:
                with trio.CancelScope(shield=True):
                    process.terminate()
                    with trio.move_on_after(CANCEL_KILL_AFTER):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
        return process, trio.current_time() - start

    async def _sleep_unless_stopping(self, seconds: float) -> None:
        if seconds > 0:
            with trio.move_on_after(seconds):
                await self._stopping.wait_value(True)

    def __repr__(self) -> str:
        stats = self.statistics()
        state = "stopping" if stats.stopping else "running"
        return (
            f"<Supervisor {state} {stats.running}/{stats.processes} workers "
            f"restarts={stats.restarts}>"
        )


async def run_supervisor(
    command: Sequence[str],
    *,
    processes: int,
    handle_signals: bool = False,
    config_error_code: int = DEFAULT_CONFIG_ERROR_CODE,
    environ: Mapping[str, str] | None = None,
    start_window: float = DEFAULT_START_WINDOW,
    backoff: Backoff = DEFAULT_RESTART_BACKOFF,
    task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED,
) -> SupervisorExit:
    """Run ``processes`` copies of the worker ``command`` until stopped.

    Worker ``i`` gets the environment ``environ`` (``os.environ`` by default) plus
    ``STREAMKIT_WORKER_INDEX=i``, and, if ``STREAMKIT_MEMBER_ID`` is set, its own member
    id (see :func:`worker_environment`). A worker that exits is started again at
    once, or after ``backoff`` if it died within ``start_window`` seconds of its start
    (1 s, 2 s, 4 s ... 30 s by default; a longer run starts the series over). Each
    exit is logged with its code or signal.

    With ``handle_signals``, SIGINT and SIGTERM are passed on to every worker (see
    :meth:`Supervisor.stop`): the first stops them gracefully, a later one at once.
    Signal handling needs the main thread.

    Returns:
        How it ended, once every worker has exited: after a stop (a signal,
        :meth:`Supervisor.stop`) whose workers all stopped cleanly, code 0.

    Cancellation:
        Each running worker gets SIGTERM, then SIGKILL if it is still alive
        ``CANCEL_KILL_AFTER`` (5) seconds later.

    Error handling:
        A worker exiting with ``config_error_code`` (a configuration error, which a
        restart cannot cure) is not restarted: the others are stopped and the result
        has that code and the reason. A process that cannot be started (``OSError``:
        no memory, too many processes) is logged and tried again with the backoff.
    """
    if processes < 1:
        raise ConfigError("processes", f"must be at least 1, got {processes}")
    positive_number.check("start_window", start_window)
    # The lifeline: its write end stays here, unwritten, until this process ends.
    lifeline, keep = os.pipe()
    supervisor = Supervisor(
        tuple(command),
        [WorkerSlot(index) for index in range(processes)],
        config_error_code,
        os.environ if environ is None else environ,
        start_window,
        backoff,
        lifeline,
    )
    try:
        with _forward_signals(supervisor) if handle_signals else contextlib.nullcontext():
            async with trio.open_nursery() as nursery:
                for slot in supervisor.slots:
                    await nursery.start(supervisor._run_slot, slot)
                task_status.started(supervisor)
    finally:
        os.close(lifeline)
        os.close(keep)
    outcome = supervisor.outcome()
    if outcome.code == 0:
        log.info("%s", outcome.reason)
    return outcome


@contextlib.contextmanager
def _forward_signals(supervisor: Supervisor) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM go to :meth:`Supervisor._on_signal`.

    Plain Python signal handlers, like the worker's: a Trio signal receiver would
    deliver the signals it had not handed out yet again when it closes, to the
    default handlers, which would kill the supervisor as it exits.
    """
    token = trio.lowlevel.current_trio_token()

    def handle(signum: int, frame: FrameType | None) -> None:
        token.run_sync_soon(supervisor._on_signal, signum)

    with signal_handlers(FORWARDED_SIGNALS, handle):
        yield


def watch_lifeline(environ: Mapping[str, str]) -> None:
    """In a worker process of a supervisor, stop gracefully when the supervisor dies.

    A daemon thread waits for the end of the lifeline named by ``environ``
    (:data:`LIFELINE_VARIABLE`) and then sends this process SIGTERM, which stops the
    worker as a signal passed on by the supervisor would (or ends it at once while it
    still starts). Nothing happens outside a supervisor.
    """
    text = environ.get(LIFELINE_VARIABLE)
    if text is None or not text.isdigit():
        return
    fd = int(text)
    threading.Thread(
        target=_wait_for_the_end, args=(fd, os.getppid()), name="lifeline", daemon=True
    ).start()


def _wait_for_the_end(fd: int, supervisor: int) -> None:
    try:
        while os.read(fd, 512):
            pass  # nothing is ever written; read on until the end
    except OSError:
        return  # not a pipe of ours: no lifeline
    log.warning(
        "the supervisor (pid %d) is gone: stopping this worker as if it had passed on SIGTERM",
        supervisor,
    )
    os.kill(os.getpid(), signal.SIGTERM)
