"""Real ``streamkit worker`` subprocesses for tests that stop, kill or pause them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

import attrs
import trio

from streamkit import ProcessorKeys
from streamkit._locks import lock_key
from streamkit.lowlevel import read_membership
from streamkit.testing import wait_until
from tests import cli_forkserver

if TYPE_CHECKING:
    from streamkit import Redis

ROOT = Path(__file__).resolve().parent.parent
SCENARIO_PROCESSOR = ProcessorKeys(app="scenario", stream="numbered", processor="record")
SCENARIO_GROUP = SCENARIO_PROCESSOR.group

FAST_ENV = {
    "STREAMKIT_LEASE_TTL": "1.5",
    "STREAMKIT_HEARTBEAT_INTERVAL": "0.1",
    "STREAMKIT_SESSION_TIMEOUT": "1.5",
    "STREAMKIT_GRACE_PERIOD": "2",
    "STREAMKIT_CONNECT_GIVE_UP_AFTER": "10",
}


@attrs.define(eq=False)
class WorkerProcess:
    """A ``streamkit worker`` subprocess whose output goes to a log file."""

    process: subprocess.Popen[bytes] | cli_forkserver.Forked
    log_path: Path
    _log: IO[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)

    async def wait_exit(self, within: float = 30) -> int:
        """Wait until the process exits; return its exit code (``-N``: killed by signal N)."""
        with trio.fail_after(within):
            if isinstance(self.process, cli_forkserver.Forked):
                return await self.process.wait_async()
            if self.process.poll() is None:
                # Not reaped yet, so the pid is still this process's: its pidfd turns
                # readable when it exits.
                pidfd = os.pidfd_open(self.process.pid)
                try:
                    await trio.lowlevel.wait_readable(pidfd)
                finally:
                    os.close(pidfd)
        return self.process.wait()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


def start_worker(
    redis_url: str,
    log_dir: Path,
    *,
    app: str = "tests.apps.scenario:app",
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> WorkerProcess:
    """Start ``streamkit worker APP`` against ``redis_url`` with fast timings, in
    ``cwd`` (the repository, whose ``tests.apps`` it imports, by default)."""
    log_path = log_dir / f"worker-{len(list(log_dir.glob('worker-*')))}.log"
    log = log_path.open("wb")
    environment = {**os.environ, **FAST_ENV, "STREAMKIT_REDIS_URL": redis_url, **(env or {})}
    command = ["worker", app, *args]
    # Forked from a process that imported streamkit already (see tests/cli_forkserver.py),
    # a process of its own all the same: killed, stopped and signalled like any.
    forked = cli_forkserver.spawn(command, cwd=cwd, env=environment, stdout=log.fileno())
    if forked is not None:
        return WorkerProcess(forked, log_path, log)
    process = subprocess.Popen(
        [sys.executable, "-m", "streamkit", *command],
        cwd=cwd,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return WorkerProcess(process, log_path, log)


async def wait_members(redis: Redis, count: int, *, group: str = SCENARIO_GROUP) -> None:
    """Wait until the scenario processor's group (or ``group``) has ``count`` members."""

    async def members() -> bool:
        snapshot = await read_membership(redis, group)
        return snapshot is not None and len(snapshot.members) == count

    await wait_until(members, what=f"{count} member(s) in {group}", within=30)


def _pid_of(lock_value: bytes | str | None) -> int | None:
    if lock_value is None:
        return None
    text = lock_value.decode() if isinstance(lock_value, bytes) else lock_value
    # "<hostname>:<pid>:<random>:<token>"
    parts = text.rsplit(":", 3)
    try:
        return int(parts[-3])
    except (IndexError, ValueError):
        return None


async def lock_holders(
    redis: Redis, partitions: int = 8, *, processor: ProcessorKeys = SCENARIO_PROCESSOR
) -> dict[int, int | None]:
    """Per partition of the scenario app (or ``processor``), the pid of the worker
    holding its lease."""
    holders: dict[int, int | None] = {}
    for p in range(partitions):
        holders[p] = _pid_of(await redis.get(lock_key(processor.lock_name(p))))
    return holders
