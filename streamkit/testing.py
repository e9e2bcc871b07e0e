"""Helpers for testing streamkit applications against a real, private Redis server.

:class:`RedisServer` starts ``redis-server`` on a free loopback port in a throwaway
directory and stops it again. streamkit's own tests, demo and benchmarks use it; so can
yours::

    with RedisServer() as server:
        app = App("test", redis_url=server.url)
        ...
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Self

import attrs

from ._errors import StreamkitError

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType

__all__ = ["RedisServer", "RedisServerError", "free_port"]

STARTUP_TIMEOUT = 10.0


class RedisServerError(StreamkitError):
    """The private ``redis-server`` could not be found or started."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _redis_server_binary() -> str:
    binary = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    )
    if binary is None:
        raise RedisServerError(
            "redis-server is not installed; install it (Debian: apt-get install "
            "redis-server) or run ./dev, which installs it for you"
        )
    return binary


@attrs.define(eq=False)
class RedisServer:
    """A private ``redis-server`` process on 127.0.0.1.

    Args:
        port: the port to listen on; a free one by default. Kept across restarts.
        appendonly: turn on the append-only file, so a restart keeps every write.
        extra_args: more ``redis-server`` command-line arguments.
    """

    port: int = attrs.field(factory=free_port, kw_only=True)
    appendonly: bool = attrs.field(default=False, kw_only=True)
    extra_args: Sequence[str] = attrs.field(default=(), kw_only=True)
    _dir: Path | None = attrs.field(default=None, init=False)
    _process: subprocess.Popen[bytes] | None = attrs.field(default=None, init=False)

    @property
    def url(self) -> str:
        """The ``redis://`` URL of the server."""
        return f"redis://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server and wait until it answers ``PING``.

        Error handling:
            :class:`RedisServerError` if ``redis-server`` is missing or does not come up.
        """
        if self.running:
            return
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="streamkit-redis-"))
        args = [
            _redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self._dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always" if self.appendonly else "no",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--loglevel", "warning",
            "--logfile", str(self._dir / "redis.log"),
            *self.extra_args,
        ]  # fmt: skip
        self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RedisServerError(
                    f"redis-server exited with code {self._process.returncode}; "
                    f"log: {self.log_tail()}"
                )
            if self._answers_ping():
                return
            time.sleep(0.01)
        self.stop()
        raise RedisServerError(f"redis-server on port {self.port} did not answer in time")

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

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
        """Stop and start again on the same port and directory."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """Freeze the server process (SIGSTOP), as a hung or partitioned server."""
        assert self._process is not None
        self._process.send_signal(19)

    def resume(self) -> None:
        """Thaw a paused server (SIGCONT)."""
        assert self._process is not None
        self._process.send_signal(18)

    def close(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
