"""``python -m streamkit ARGS`` as a real process, forked from one that imported it already.

The suite runs the command line a few hundred times. A fresh interpreter spends about
half a second of CPU importing streamkit and its dependencies before it parses its
arguments, minutes over the suite on two cores. So each test process starts one *fork
server* (this file, run as a script): it imports ``streamkit._cli`` once and then, for
each command, forks a child that becomes ``python -m streamkit ARGS``: its own
process, its own pid, its standard streams the caller's pipes, the caller's
environment, working directory and ``sys.path`` (``PYTHONPATH`` included), the exit
status Python gives (``SystemExit``'s code, 1 and a traceback for an uncaught
exception). The command's code runs in the child exactly as in a fresh process; what
is shared is only the modules imported before it (streamkit, its dependencies), which
read nothing from the environment at import time.

:func:`run` runs a command to its end; :func:`spawn` starts one (a worker, see
tests/workers.py) and gives a handle with what tests use of a ``Popen``. The commands
a test reads while they run (``--follow``, ``--watch``, a dashboard) and the docs'
commands run ``python -m streamkit`` itself, a cold start. If the fork server cannot
start (streamkit does not import), both fall back to a real subprocess, so the error
is the one a user sees.

The protocol, over ``AF_UNIX`` ``SOCK_SEQPACKET`` sockets: the caller sends the
server, on its control socket, one message per command: JSON (argv, env, cwd) and
four file descriptors (a socket of the command's own, its stdin, stdout and stderr).
On the command's socket the server answers the child's pid, then its exit code.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

ROOT = Path(__file__).resolve().parent.parent
MESSAGE_BYTES = 1 << 20


# -- the server (this file run as a script) --


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """Become ``python -m streamkit ARGV``; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds[1:]):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        # sys.path as `python -m` makes it: the working directory, PYTHONPATH, then the
        # interpreter's own (what the server's started with, less its own first entries).
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *extra, *request["base_path"]]
        import importlib
        import runpy

        importlib.invalidate_caches()
        sys.argv = ["-m", *request["argv"]]
        try:
            runpy.run_module("streamkit", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            sys.excepthook(*sys.exc_info())
            code = 128 + signal.SIGINT
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    finally:
        os._exit(code)


def serve(control: socket.socket) -> None:
    """Fork a command per request on ``control`` until it closes; answer on each
    command's socket its pid and then its exit code."""
    import selectors

    # The interpreter's own sys.path, without this file's directory (first) and
    # PYTHONPATH: each command gets its own.
    del sys.path[0]
    ours = set(os.environ.get("PYTHONPATH", "").split(os.pathsep))
    base_path = [p for p in sys.path if p not in ours]
    import streamkit._cli  # noqa: F401  (the imports the children are spared)

    waker_r, waker_w = os.pipe()
    os.set_blocking(waker_w, False)
    os.set_blocking(waker_r, False)
    signal.set_wakeup_fd(waker_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    replies: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(waker_r, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in selector.select(timeout=1.0):
                if key.fileobj is not control:
                    continue
                data, fds, _flags, _addr = socket.recv_fds(control, MESSAGE_BYTES, 4)
                if not data:
                    return
                request = json.loads(data)
                request["base_path"] = base_path
                reply = socket.socket(fileno=fds[0])
                pid = os.fork()
                if pid == 0:
                    control.close()
                    for other in replies.values():
                        other.close()
                    os.close(waker_r)
                    os.close(waker_w)
                    reply.detach()
                    _child(request, fds)
                for fd in fds[1:]:
                    os.close(fd)
                replies[pid] = reply
                reply.send(json.dumps({"pid": pid}).encode())
            with contextlib.suppress(BlockingIOError):
                os.read(waker_r, 4096)
            while replies:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                reply = replies.pop(pid)
                with contextlib.suppress(OSError):
                    reply.send(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode())
                reply.close()
    finally:
        for pid in replies:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# -- the caller's side --

_server: tuple[subprocess.Popen[bytes], socket.socket] | None = None
_unavailable = False
_forked_count = 0


def forked_once() -> bool:
    """Whether a command of this process ran through the fork server."""
    return _forked_count > 0


def _control() -> socket.socket | None:
    """This process's fork server's control socket (started at the first call, not
    waited for: requests wait in the socket until it has imported streamkit); None
    once it could not start."""
    global _server
    if _unavailable:
        return None
    if _server is not None and _server[0].poll() is None:
        return _server[1]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    process = subprocess.Popen(
        [sys.executable, __file__, str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    theirs.close()
    _server = (process, ours)
    atexit.register(_stop, process, ours)
    return ours


def _stop(process: subprocess.Popen[bytes], control: socket.socket) -> None:
    """At exit: the server sees its control socket close and ends (killing what still
    runs); it is waited for."""
    control.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def _request(
    args: list[str], cwd: Path | str, env: Mapping[str, str], stdio: tuple[int, int, int]
) -> socket.socket | None:
    """Ask the fork server for ``python -m streamkit ARGS`` on the file descriptors
    ``stdio`` (stdin, stdout, stderr; the caller still closes its own): the socket its
    pid and then its exit code come on, or None if the server is not there."""
    control = _control()
    if control is None:
        return None
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    request = json.dumps({"argv": args, "env": dict(env), "cwd": str(cwd)}).encode()
    try:
        socket.send_fds(control, [request], [theirs.fileno(), *stdio])
    except OSError:
        mine.close()
        return None
    finally:
        theirs.close()
    return mine


class Forked:
    """A command the fork server started, with what tests use of a ``Popen``: its
    ``pid``, ``returncode``, ``poll()``, ``wait()``, ``send_signal()`` and ``kill()``;
    ``wait_async()`` waits in Trio."""

    def __init__(self, pid: int, replies: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._replies = replies

    def _ended(self, data: bytes) -> int:
        if not data:
            raise RuntimeError(f"the CLI fork server ended while process {self.pid} ran")
        self.returncode = int(json.loads(data)["code"])
        self._replies.close()
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                data = self._replies.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            self._ended(data)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        self._replies.settimeout(timeout)
        try:
            data = self._replies.recv(4096)
        except TimeoutError:
            raise subprocess.TimeoutExpired(["streamkit"], timeout or 0) from None
        finally:
            self._replies.settimeout(None)
        return self._ended(data)

    async def wait_async(self) -> int:
        import trio

        while (code := self.poll()) is None:
            await trio.lowlevel.wait_readable(self._replies)
        return code

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(
    args: list[str], *, cwd: Path | str, env: Mapping[str, str], stdout: int
) -> Forked | None:
    """Start ``python -m streamkit ARGS``, its stdin empty and its stdout and stderr
    file descriptor ``stdout``, without waiting for it; None if the fork server is not
    there (the caller starts the command itself)."""
    global _unavailable
    with open(os.devnull, "rb") as devnull:
        replies = _request(args, cwd, env, (devnull.fileno(), stdout, stdout))
    if replies is None:
        return None
    started = replies.recv(4096)
    if not started:
        replies.close()
        _unavailable = True
        return None
    _count()
    return Forked(json.loads(started)["pid"], replies)


def _count() -> None:
    global _forked_count
    _forked_count += 1


async def run(
    args: list[str], *, cwd: Path | str, env: Mapping[str, str], stdin: bytes = b""
) -> tuple[int, bytes, bytes]:
    """``python -m streamkit ARGS`` run to its end: its exit code, stdout and stderr."""
    global _unavailable
    forked = await _forked(args, cwd=cwd, env=env, stdin=stdin)
    if forked is not None:
        return forked
    _unavailable = True
    return await cold(args, cwd=cwd, env=env, stdin=stdin)


async def cold(
    args: list[str], *, cwd: Path | str, env: Mapping[str, str], stdin: bytes = b""
) -> tuple[int, bytes, bytes]:
    """:func:`run` as a fresh ``python -m streamkit ARGS``, a cold start."""
    import trio

    done = await trio.run_process(
        [sys.executable, "-m", "streamkit", *args],
        cwd=cwd,
        env=dict(env),
        stdin=stdin,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


async def _forked(
    args: list[str], *, cwd: Path | str, env: Mapping[str, str], stdin: bytes
) -> tuple[int, bytes, bytes] | None:
    """:func:`run` through the fork server; None if it is not there."""
    import trio

    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        mine = _request(args, cwd, env, (in_r, out_w, err_w))
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    started = b""
    if mine is not None:
        started = await trio.socket.from_stdlib_socket(mine).recv(4096)
    if mine is None or not started:
        # the server is gone (streamkit did not import): a real subprocess says why
        for fd in (in_w, out_r, err_r):
            os.close(fd)
        if mine is not None:
            mine.close()
        return None
    _count()
    process = Forked(json.loads(started)["pid"], mine)
    out, err = bytearray(), bytearray()

    async def drain(fd: int, into: bytearray) -> None:
        async with trio.lowlevel.FdStream(fd) as stream:
            async for data in stream:
                into.extend(data)

    async def feed() -> None:
        async with trio.lowlevel.FdStream(in_w) as stream:
            if stdin:
                with contextlib.suppress(trio.BrokenResourceError):
                    await stream.send_all(stdin)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed)
            nursery.start_soon(drain, out_r, out)
            nursery.start_soon(drain, err_r, err)
            code = await process.wait_async()
    except BaseException:
        process.kill()
        raise
    return code, bytes(out), bytes(err)


if __name__ == "__main__":
    sock = socket.socket(fileno=int(sys.argv[1]))
    serve(sock)
