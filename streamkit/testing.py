"""Helpers for testing streamkit applications against a real, private Redis server.

:class:`RedisServer` starts ``redis-server`` on a free loopback port in a throwaway
directory and stops it again. streamkit's own tests, demo and benchmarks use it; so can
yours. In Trio code, run it in a nursery::

    async with trio.open_nursery() as nursery:
        server = await nursery.start(RedisServer().run)
        app = App("test", redis_url=server.url)
        ...
        nursery.cancel_scope.cancel()  # stops the server and deletes its directory

From synchronous code (a session fixture, a script), use it as a context manager::

    with RedisServer() as server:
        ...

:func:`wait_until` waits for a condition that nothing can notify about, such as state
in Redis written by another process.

Why one room (about 620 lines): the public testing helpers (a server, a cluster, the
waits) in the one module users import them from.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Self

import attrs
import trio

from ._errors import StreamkitError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

__all__ = ["RedisCluster", "RedisServer", "RedisServerError", "free_port", "wait_until"]

#: How long ``redis-server`` has to answer ``PING`` after it was started.
STARTUP_TIMEOUT = 10.0

#: How many ports a server whose port was chosen for it tries, when the chosen port
#: is taken by someone else before ``redis-server`` binds it.
PORT_ATTEMPTS = 5

#: How long a new cluster has to reach ``cluster_state:ok`` on every node.
CLUSTER_TIMEOUT = 30.0

#: How often a starting server is pinged.
_PING_INTERVAL = 0.01

#: What ``redis-server`` logs when its port is taken.
_PORT_TAKEN = "Address already in use"


class RedisServerError(StreamkitError):
    """The private ``redis-server`` could not be found or started."""


class _PortTaken(RedisServerError):
    """``redis-server`` exited because its port was taken."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now.

    The port is found by binding port 0 and closing the socket again, so someone else
    may take it before you bind it: :class:`RedisServer` retries with another port
    when that happens.
    """
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_until(
    condition: Callable[[], object],
    *,
    what: str,
    within: float,
    interval: float = 0.02,
) -> None:
    """Wait until ``condition()`` is true, checking every ``interval`` seconds.

    For state nothing can notify about: keys in Redis written by another process, a
    subprocess's output, a server coming up. State of your own process is better
    waited for with the ``trio_util.AsyncValue`` the component exposes
    (``await rebalancer.owned.wait_value(...)``).

    Args:
        condition: a function or an async function returning whether the awaited
            state is reached.
        what: the awaited state, for the error message (``"3 members in the group"``).
        within: how long to wait at most. The deadline is the helper's own (not the
            caller's ``trio.fail_after``) so that the error can name ``what``.
        interval: the pause between two checks.

    Cancellation:
        Safe to cancel.

    Error handling:
        :class:`trio.TooSlowError` naming ``what`` when ``within`` seconds ran out.
        Exceptions raised by ``condition`` propagate.
    """
    with trio.move_on_after(within):
        # The one audited polling loop: what it waits for cannot be watched.
        while not await _holds(condition):  # noqa: ASYNC110
            await trio.sleep(interval)
        return
    raise trio.TooSlowError(f"gave up after {within}s waiting for {what}")


async def _holds(condition: Callable[[], object]) -> bool:
    result = condition()
    if inspect.isawaitable(result):
        result = await result
    return bool(result)


def _binary(name: str, package: str) -> str:
    """The path of the program ``name`` (Debian's ``package`` has it)."""
    binary = shutil.which(name) or (
        f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None
    )
    if binary is None:
        raise RedisServerError(
            f"{name} is not installed; install it (Debian: apt-get install {package}) "
            "or run ./dev, which installs it for you"
        )
    return binary


class _StartedInWith:
    """``with thing:`` starts it (blocking) and closes it on the way out."""

    __slots__ = ()

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@attrs.define(eq=False)
class RedisServer(_StartedInWith):
    """A private ``redis-server`` process on 127.0.0.1.

    Start it with ``await nursery.start(server.run)`` in Trio code, or as a context
    manager (``with RedisServer() as server:``) from synchronous code.

    Args:
        port: the port to listen on. By default a free one is chosen when the server
            first starts (if someone takes it before ``redis-server`` binds it,
            another one is tried); either way it is kept across restarts.
        appendonly: turn on the append-only file, so a restart keeps every write.
        extra_args: more ``redis-server`` command-line arguments.
        executable: the server program to run: ``redis-server`` (found on ``PATH``)
            by default; a ``valkey-server`` (Valkey 8, which streamkit is tested on
            too) takes the same arguments.
        cluster_bus: a cluster node: its bus port (``--cluster-port``) is chosen free
            with each port tried at the first start, and kept across restarts.
    """

    _requested_port: int | None = attrs.field(default=None, kw_only=True, alias="port")
    appendonly: bool = attrs.field(default=False, kw_only=True)
    extra_args: Sequence[str] = attrs.field(default=(), kw_only=True)
    executable: str | None = attrs.field(default=None, kw_only=True)
    cluster_bus: bool = attrs.field(default=False, kw_only=True)
    _bus_port: int | None = attrs.field(default=None, init=False)
    _port: int | None = attrs.field(default=None, init=False)
    _dir: Path | None = attrs.field(default=None, init=False)
    _process: subprocess.Popen[bytes] | None = attrs.field(default=None, init=False)
    # Where the current process's part of the log starts.
    _log_offset: int = attrs.field(default=0, init=False)

    @property
    def port(self) -> int:
        """The port the server listens on.

        Error handling:
            :class:`RedisServerError` if no port was given and the server has not been
            started yet (the port is chosen when it starts).
        """
        port = self._port if self._port is not None else self._requested_port
        if port is None:
            raise RedisServerError("the server's port is chosen when it starts; start it first")
        return port

    @property
    def url(self) -> str:
        """The ``redis://`` URL of the server (see :attr:`port`)."""
        return f"redis://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    # ----------------------------------------------------------------- starting

    def _ports(self) -> Iterator[tuple[int, bool]]:
        """The ports to try, each with whether another may be tried after it."""
        if self._port is not None or self._requested_port is not None:
            yield self.port, False
            return
        for attempt in range(PORT_ATTEMPTS):
            yield free_port(), attempt < PORT_ATTEMPTS - 1

    def _spawn(self, port: int) -> None:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="streamkit-redis-"))
        log = self._dir / "redis.log"
        self._log_offset = log.stat().st_size if log.exists() else 0
        args = [
            self.executable or _binary("redis-server", "redis-server"),
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--dir", str(self._dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always" if self.appendonly else "no",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--loglevel", "warning",
            "--logfile", str(log),
            *self.extra_args,
        ]  # fmt: skip
        if self.cluster_bus:
            if self._bus_port is None:
                self._bus_port = free_port()
            args += ["--cluster-port", str(self._bus_port)]
        self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL)

    def _check_alive(self, port: int) -> None:
        """Raise if the process starting on ``port`` has exited."""
        assert self._process is not None
        code = self._process.poll()
        if code is None:
            return
        self._process = None
        log = self._new_log()
        if _PORT_TAKEN in log:
            raise _PortTaken(f"port {port} is taken: {log.strip()}")
        raise RedisServerError(f"redis-server exited with code {code}; log: {log.strip()}")

    def _new_log(self) -> str:
        """What the current (or last) process wrote to the log."""
        if self._dir is None or not (self._dir / "redis.log").exists():
            return "(no log)"
        with (self._dir / "redis.log").open("rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    def _give_up(self, port: int, timeout: float) -> RedisServerError:
        self.stop()
        return RedisServerError(
            f"redis-server on port {port} did not answer within {timeout}s; "
            f"log: {self._new_log().strip()}"
        )

    def start(self) -> None:
        """Start the server and wait until it answers ``PING`` (blocking).

        From Trio code, prefer ``await nursery.start(server.run)``.

        Error handling:
            :class:`RedisServerError` if ``redis-server`` is missing or does not come
            up (its port was taken and none was free after :data:`PORT_ATTEMPTS`
            tries, say).
        """
        if self.running:
            return
        for port, may_retry in self._ports():
            self._spawn(port)
            try:
                self._wait_ready(port)
            except _PortTaken as exc:
                if may_retry:
                    self._bus_port = None  # (the one taken may be the bus port)
                    continue
                raise self._port_error(exc) from None
            self._port = port
            return

    def _port_error(self, exc: _PortTaken) -> RedisServerError:
        if self._port is None and self._requested_port is None:
            return RedisServerError(f"no port was free in {PORT_ATTEMPTS} attempts; last: {exc}")
        return RedisServerError(str(exc))

    def _wait_ready(self, port: int) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            self._check_alive(port)
            if self._answers_ping(port):
                return
            time.sleep(_PING_INTERVAL)
        raise self._give_up(port, STARTUP_TIMEOUT)

    @staticmethod
    def _answers_ping(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    async def run(self, *, task_status: trio.TaskStatus[Self] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the server while this task runs: ``server = await nursery.start(s.run)``.

        ``start()`` returns the server once it answers ``PING``; when the task is
        cancelled, the server is stopped and its directory deleted (as :meth:`close`).
        :meth:`stop`, :meth:`restart`, :meth:`pause` and :meth:`resume` may be used
        meanwhile.

        Cancellation:
            Cancelling stops the server.

        Error handling:
            :class:`RedisServerError` from ``nursery.start()`` if ``redis-server`` is
            missing or does not come up.
        """
        try:
            await self._start_async()
            task_status.started(self)
            await trio.sleep_forever()
        finally:
            self.close()

    async def _start_async(self) -> None:
        if self.running:
            return
        for port, may_retry in self._ports():
            self._spawn(port)
            try:
                await wait_until(
                    functools.partial(self._ready, port),
                    what=f"redis-server on port {port} to answer PING",
                    within=STARTUP_TIMEOUT,
                    interval=_PING_INTERVAL,
                )
            except _PortTaken as exc:
                if may_retry:
                    self._bus_port = None  # (the one taken may be the bus port)
                    continue
                raise self._port_error(exc) from None
            except trio.TooSlowError:
                raise self._give_up(port, STARTUP_TIMEOUT) from None
            except BaseException:
                self.stop()
                raise
            self._port = port
            return

    async def _ready(self, port: int) -> bool:
        self._check_alive(port)
        try:
            with trio.move_on_after(0.5):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(b"PING\r\n")
                    return (await stream.receive_some(64)).startswith(b"+PONG")
        except (OSError, trio.BrokenResourceError):
            pass
        return False

    # ----------------------------------------------------------------- the rest

    def log_tail(self, lines: int = 20) -> str:
        """Return the last lines of the server's log, for error messages."""
        if self._dir is None or not (self._dir / "redis.log").exists():
            return "(no log)"
        return "\n".join((self._dir / "redis.log").read_text().splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server at once (data not in the append-only file is lost)."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        self._process = None

    def restart(self) -> None:
        """Stop and start again on the same port and directory (blocking)."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """Freeze the server process (SIGSTOP), as a hung or partitioned server."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Thaw a paused server (SIGCONT)."""
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


@attrs.define(eq=False)
class RedisCluster(_StartedInWith):
    """A private Redis Cluster on 127.0.0.1: masters with replicas, each a ``redis-server``.

    ``masters`` nodes share the 16384 hash slots; each has ``replicas`` replicas
    (``redis-cli --cluster create ... --cluster-replicas N``). Start it with
    ``await nursery.start(cluster.run)`` in Trio code, or as a context manager from
    synchronous code; either returns once ``CLUSTER INFO`` says ``cluster_state:ok`` on
    every node, every node knows every other, and every replica has synced with its
    master.

    Args:
        masters: how many masters (at least 3, as ``redis-cli`` requires).
        replicas: how many replicas each master has.
        node_timeout: ``cluster-node-timeout`` in milliseconds: how long a master may
            be unreachable before its replica is promoted.
        extra_args: more ``redis-server`` command-line arguments for every node.
        executable: every node's server program (see :class:`RedisServer`).
    """

    masters: int = attrs.field(default=3, kw_only=True)
    replicas: int = attrs.field(default=1, kw_only=True)
    node_timeout: int = attrs.field(default=2000, kw_only=True)
    extra_args: Sequence[str] = attrs.field(default=(), kw_only=True)
    executable: str | None = attrs.field(default=None, kw_only=True)
    _nodes: list[RedisServer] = attrs.field(factory=list, init=False)

    @property
    def nodes(self) -> list[RedisServer]:
        """Every node (masters first, as created; a failover changes who is master)."""
        return list(self._nodes)

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL of the cluster (naming its first node).

        Error handling:
            :class:`RedisServerError` if the cluster has not been started yet.
        """
        if not self._nodes:
            raise RedisServerError("the cluster's ports are chosen when it starts; start it first")
        return f"redis+cluster://127.0.0.1:{self._nodes[0].port}"

    @property
    def running(self) -> bool:
        """Whether every node's process is alive."""
        return bool(self._nodes) and all(node.running for node in self._nodes)

    def _new_nodes(self) -> None:
        count = self.masters * (1 + self.replicas)
        self._nodes = [
            RedisServer(extra_args=self._node_args(), executable=self.executable, cluster_bus=True)
            for _ in range(count)
        ]

    def _node_args(self) -> list[str]:
        return [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout),
            # (The bus port, by default port + 10000, which may be taken or beyond
            # 65535, is chosen free by each node: cluster_bus.)
            # Replicas sync at once (the default waits 5 s for more replicas to come).
            "--repl-diskless-sync-delay", "0",
            *self.extra_args,
        ]  # fmt: skip

    def _create_args(self) -> list[str]:
        return [
            _binary("redis-cli", "redis-tools"),
            "--cluster", "create",
            *(f"127.0.0.1:{node.port}" for node in self._nodes),
            "--cluster-replicas", str(self.replicas),
            "--cluster-yes",
        ]  # fmt: skip

    def _create_failed(self, code: int, output: bytes) -> RedisServerError:
        self.close()
        return RedisServerError(
            f"redis-cli --cluster create exited with code {code}: "
            f"{output.decode(errors='replace').strip()}"
        )

    def _cluster_ok(self) -> bool:
        expected = len(self._nodes)
        for node in self._nodes:
            info = _cluster_info(node.port)
            if info.get("cluster_state") != "ok" or info.get("cluster_known_nodes") != str(
                expected
            ):
                return False
            # Replicas have synced: a failover from now on loses only what had not
            # reached them, and WAIT counts them.
            replication = _cluster_info(node.port, b"INFO replication")
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return False
        return True

    def start(self) -> None:
        """Start the nodes, create the cluster and wait until it is ok (blocking).

        From Trio code, prefer ``await nursery.start(cluster.run)``.

        Error handling:
            :class:`RedisServerError` if ``redis-server`` or ``redis-cli`` is missing,
            or the cluster does not come up within :data:`CLUSTER_TIMEOUT` seconds.
        """
        if self.running:
            return
        self._new_nodes()
        try:
            for node in self._nodes:
                node.start()
            done = subprocess.run(
                self._create_args(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=CLUSTER_TIMEOUT,
                check=False,
            )
            if done.returncode != 0:
                raise self._create_failed(done.returncode, done.stdout + done.stderr)
            deadline = time.monotonic() + CLUSTER_TIMEOUT
            while not self._cluster_ok():
                if time.monotonic() > deadline:
                    raise RedisServerError(
                        f"the cluster was not ok on every node within {CLUSTER_TIMEOUT}s"
                    )
                time.sleep(_PING_INTERVAL * 5)
        except BaseException:
            self.close()
            raise

    async def run(self, *, task_status: trio.TaskStatus[Self] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the cluster while this task runs: ``cluster = await nursery.start(c.run)``.

        ``start()`` returns the cluster once every node says ``cluster_state:ok``;
        when the task is cancelled, every node is stopped and its directory deleted.

        Cancellation:
            Cancelling stops the cluster.

        Error handling:
            :class:`RedisServerError` from ``nursery.start()`` if a node or the cluster
            does not come up.
        """
        try:
            self._new_nodes()
            for node in self._nodes:
                await node._start_async()
            with trio.fail_after(CLUSTER_TIMEOUT):
                done = await trio.run_process(
                    self._create_args(),
                    stdin=b"",
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            if done.returncode != 0:
                raise self._create_failed(done.returncode, done.stdout + done.stderr)
            await wait_until(
                lambda: trio.to_thread.run_sync(self._cluster_ok),
                what="cluster_state:ok on every node",
                within=CLUSTER_TIMEOUT,
                interval=_PING_INTERVAL * 5,
            )
            task_status.started(self)
            await trio.sleep_forever()
        finally:
            self.close()

    def close(self) -> None:
        """Stop every node and delete its directory."""
        for node in self._nodes:
            node.close()


def _cluster_info(port: int, command: bytes = b"CLUSTER INFO") -> dict[str, str]:
    """``CLUSTER INFO`` (or another command replying ``name:value`` lines, such as
    ``INFO replication``) of the node on ``port`` as a dict; empty if it does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(command + b"\r\n")
            reply = b""
            while b"\r\n" not in reply:
                chunk = sock.recv(4096)
                if not chunk:
                    return {}
                reply += chunk
            header, _, body = reply.partition(b"\r\n")
            if not header.startswith(b"$"):
                return {}
            length = int(header[1:])
            while len(body) < length:
                chunk = sock.recv(4096)
                if not chunk:
                    return {}
                body += chunk
    except (OSError, ValueError):
        return {}
    fields = (line.partition(":") for line in body[:length].decode().splitlines())
    return {name: value for name, _, value in fields if name}
