"""The asyncio side of bench_jobs.py: one peer job queue's producer or worker process.

Each ``peer_NAME.py`` beside this file defines the three jobs with its library's own API
(``noop``, ``sleep`` of 0.05 s and ``slow``, the crash-recovery job) and two coroutines,
``produce`` and ``work``, and hands itself to :func:`main`. bench_jobs.py runs it with
the python of that peer's virtualenv (``.venv-peers/NAME``), which holds the peer's own
redis client: nothing here imports streamkit or any redis client. The completion markers
are written on a connection of this file's own (a few lines of RESP on an asyncio
stream), the same for every peer:

* throughput jobs (``noop``, ``sleep``) call :func:`job_started` and :func:`job_done`,
  which only count and take the time in the process; a flusher task adds the count to
  ``bench:done`` every 10 ms (``INCRBY``), after writing the process's first job start
  and last job end to the ``bench:times`` hash, so that a marker costs the queue being
  measured nothing, whatever redis client its jobs would have used;
* the crash-recovery job writes at once: ``HSET bench:started I:PID NOW`` when it
  starts and ``HSET bench:finished I NOW`` when it ends.

A worker adds its pid to the set ``bench:ready`` just before it starts its queue's
worker; with ``--wait-go`` it first waits for a line on its standard input (the crash
scenario's idle worker B, imported and connected before it is needed).

Usage (bench_jobs.py does this)::

    PY peer_NAME.py produce --url URL --kind noop|sleep|slow --jobs N [--config authors]
    PY peer_NAME.py work --url URL --concurrency 32 [--wait-go] [--config authors]

``--config authors`` runs the peer as its authors recommend (a peer that says how
sets ``AUTHORS``, a line for the report, and reads :data:`CONFIG`): uvloop for those
with ``AUTHORS_UVLOOP``, and the options the peer itself sets.

``produce`` prints one JSON line, ``{"enqueue_s": ...}``: the time the enqueueing took,
from the first job built to the last one acknowledged by Redis (connecting is not
counted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence

SLEEP = 0.05  # the `sleep` job's sleep
SLOW = 5.0  # the crash-recovery job's sleep
FLUSH_EVERY = 0.01
ENQUEUE_WINDOW = 50  # concurrent enqueues in flight, for peers without a batch API


class Peer(Protocol):
    NAME: str

    async def produce(self, url: str, kind: str, calls: Sequence[tuple[Any, ...]]) -> float: ...

    async def work(self, url: str, concurrency: int) -> None: ...


# --- a minimal RESP client, for the markers --------------------------------------


class Resp:
    """One connection to Redis speaking RESP2 by hand: only what the markers need."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, url: str) -> Resp:
        parts = urllib.parse.urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 6379)
        client = cls(reader, writer)
        db = parts.path.strip("/")
        if db and db != "0":
            await client.call("SELECT", db)
        return client

    @staticmethod
    def _encode(args: Sequence[object]) -> bytes:
        out = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        return b"".join(out)

    async def _reply(self) -> object:
        line = await self._reader.readuntil(b"\r\n")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            return (await self._reader.readexactly(size + 2))[:-2]
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [await self._reply() for _ in range(size)]
        raise RuntimeError(f"unexpected reply {line!r}")

    async def pipeline(self, commands: Iterable[Sequence[object]]) -> list[object]:
        commands = list(commands)
        async with self._lock:
            self._writer.write(b"".join(self._encode(c) for c in commands))
            await self._writer.drain()
            return [await self._reply() for _ in commands]

    async def call(self, *args: object) -> object:
        return (await self.pipeline([args]))[0]

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


# --- markers ---------------------------------------------------------------------


class _Marks:
    def __init__(self) -> None:
        self.client: Resp | None = None
        self.done = 0
        self.first_start: float | None = None
        self.last_end = 0.0


_marks = _Marks()


def job_started() -> None:
    """A throughput job begins (no I/O)."""
    if _marks.first_start is None:
        _marks.first_start = time.time()


def job_done() -> None:
    """A throughput job ends (no I/O: the flusher writes the marker)."""
    _marks.done += 1
    _marks.last_end = time.time()


async def slow_job(i: int, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
    """The crash-recovery job's body: marks its start, sleeps 5 s, marks its end."""
    assert _marks.client is not None
    await _marks.client.call("HSET", "bench:started", f"{i}:{os.getpid()}", repr(time.time()))
    await sleep(SLOW)
    await _marks.client.call("HSET", "bench:finished", i, repr(time.time()))


async def _flush_forever(client: Resp) -> None:
    pid = os.getpid()
    flushed = 0
    while True:
        await asyncio.sleep(FLUSH_EVERY)
        done = _marks.done
        if done == flushed or _marks.first_start is None:
            continue
        # The times first, then the count: a reader that sees the count sees the times.
        await client.pipeline(
            [
                (
                    "HSET",
                    "bench:times",
                    f"first:{pid}",
                    repr(_marks.first_start),
                    f"last:{pid}",
                    repr(_marks.last_end),
                ),
                ("INCRBY", "bench:done", done - flushed),
            ]
        )
        flushed = done


async def gather_windowed(calls: Iterable[Callable[[], Awaitable[object]]]) -> None:
    """Run the enqueue coroutines concurrently (``asyncio.gather``), at most
    ENQUEUE_WINDOW in flight: for the peers whose enqueue takes one job at a time
    (20,000 at once would open as many connections)."""
    window = asyncio.Semaphore(ENQUEUE_WINDOW)

    async def one(call: Callable[[], Awaitable[object]]) -> None:
        async with window:
            await call()

    await asyncio.gather(*(one(call) for call in calls))


# --- the process -----------------------------------------------------------------


def _calls(kind: str, n: int) -> list[tuple[Any, ...]]:
    return [(i,) for i in range(n)] if kind == "slow" else [() for _ in range(n)]


async def _produce(peer: Peer, url: str, kind: str, n: int) -> None:
    seconds = await peer.produce(url, kind, _calls(kind, n))
    print(json.dumps({"enqueue_s": seconds}), flush=True)


async def _work(peer: Peer, url: str, concurrency: int, wait_go: bool) -> None:
    client = await Resp.connect(url)
    _marks.client = client
    if wait_go:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    flusher = asyncio.create_task(_flush_forever(client))
    await client.call("SADD", "bench:ready", os.getpid())
    try:
        await peer.work(url, concurrency)
    finally:
        flusher.cancel()


#: The configuration the peer runs in: ``"defaults"``, or ``"authors"`` (the event loop
#: and options its authors recommend, for the peers that say; see each peer's
#: ``AUTHORS``).
CONFIG = "defaults"


def _run(peer: Peer, main: Awaitable[None]) -> None:
    if CONFIG == "authors" and getattr(peer, "AUTHORS_UVLOOP", False):
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main)  # type: ignore[arg-type]
    else:
        asyncio.run(main)  # type: ignore[arg-type]


def main(peer: Peer) -> None:
    global CONFIG
    parser = argparse.ArgumentParser(description=f"{peer.NAME} side of bench_jobs.py")
    parser.add_argument("role", choices=["produce", "work"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--kind", choices=["noop", "sleep", "slow"], default="noop")
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--wait-go", action="store_true")
    parser.add_argument("--config", choices=["defaults", "authors"], default="defaults")
    args = parser.parse_args()
    CONFIG = args.config
    if args.role == "produce":
        _run(peer, _produce(peer, args.url, args.kind, args.jobs))
    else:
        _run(peer, _work(peer, args.url, args.concurrency, args.wait_go))
