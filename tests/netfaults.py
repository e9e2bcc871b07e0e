"""A TCP fault proxy on the loopback, for network faults between a client and Redis.

:class:`FaultProxy` listens on a free port of 127.0.0.1 and forwards every connection
it accepts to the server behind it, byte for byte, until told to misbehave:

* :meth:`~FaultProxy.delay`: latency (each way) with jitter, order kept;
* :meth:`~FaultProxy.cap`: a bandwidth cap, each way of each connection;
* :meth:`~FaultProxy.blackhole`: bytes accepted and never forwarded, both ways or one
  (``"requests"``: nothing reaches Redis; ``"replies"``: requests reach Redis, its
  replies never come back). Connections stay open and new ones are accepted, as
  behind a firewall that drops packets. A connection that lost bytes is reset when the
  fault heals (a TCP stream with a hole in it cannot go on; a real stack would give
  up on it the same way, only later);
* :meth:`~FaultProxy.hold`: connections stay open, nothing is forwarded, nothing is
  lost: what was held is delivered when the fault heals (a stall, not a loss);
* :meth:`~FaultProxy.reset_replies`: a reply cut in the middle (half of the chunk
  forwarded) and the connection reset (RST), on each reply chunk with a probability;
* :meth:`~FaultProxy.reset_all`: every connection reset now;
* :meth:`~FaultProxy.heal`: every fault removed.

:meth:`~FaultProxy.dropped_data` tells what a blackhole dropped (which requests never
reached Redis, say).

Run it with ``proxy = await nursery.start(FaultProxy(host, port).run)``; the
``fault_proxies`` fixture (``tests/conftest.py``) puts proxies in front of the test's
``redis-server``. A small proxy of our own: toxiproxy, the well-known one, is a Go
server (only an unmaintained client of it is on PyPI), and one written on Trio runs in
the test's own event loop, where a fault starts and ends at an exact point of the test.
"""

from __future__ import annotations

import contextlib
import math
import random
import socket
import struct
from typing import Any, Literal

import attrs
import trio
import trio_util

__all__ = ["Direction", "FaultProxies", "FaultProxy", "FaultProxyStatistics", "Faults"]

#: Which way a fault acts: toward the server, toward the client, or both.
Direction = Literal["both", "requests", "replies"]

#: Bytes read at once from either side (a chunk is the unit of delay and of a reset).
CHUNK = 16 * 1024
#: Chunks read ahead of what was forwarded, per direction of a connection.
READ_AHEAD = 64
#: Bytes a proxy keeps of what its blackholes dropped, per way (the first ones).
KEEP_DROPPED = 1 << 20


def _ways(direction: Direction) -> frozenset[str]:
    if direction not in ("both", "requests", "replies"):
        raise ValueError(f"direction must be 'both', 'requests' or 'replies', got {direction!r}")
    return frozenset({"requests", "replies"}) if direction == "both" else frozenset({direction})


@attrs.frozen(kw_only=True)
class Faults:
    """The faults a proxy applies now (all off by default).

    Attributes:
        latency: seconds added to each chunk, each way.
        jitter: up to this many seconds more or less, drawn per chunk (order kept).
        bandwidth: bytes per second, each way of each connection (``None``: no cap).
        blackholed: the ways whose bytes are dropped (``"requests"``, ``"replies"``).
        held: the ways whose bytes wait, undelivered, until healed.
        reset_probability: the chance that a reply chunk is cut and its connection reset.
    """

    latency: float = 0.0
    jitter: float = 0.0
    bandwidth: float | None = None
    blackholed: frozenset[str] = frozenset()
    held: frozenset[str] = frozenset()
    reset_probability: float = 0.0


@attrs.frozen(kw_only=True)
class FaultProxyStatistics:
    """What a proxy did so far.

    Attributes:
        accepted: connections accepted.
        open: connections open now.
        forwarded: bytes forwarded per way (``"requests"``, ``"replies"``).
        dropped: bytes dropped by a blackhole, per way.
        resets: connections reset (mid-reply, by :meth:`FaultProxy.reset_all`, or
            broken by a blackhole and reset when it healed).
    """

    accepted: int
    open: int
    forwarded: dict[str, int]
    dropped: dict[str, int]
    resets: int


@attrs.define(eq=False)
class _Link:
    """One accepted connection and its connection to the server."""

    client: trio.SocketStream
    server: trio.SocketStream
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: Bytes were dropped: the stream has a hole, reset it when the fault heals.
    broken: bool = False
    reset: bool = False


def _abort(stream: trio.SocketStream) -> None:
    # SO_LINGER with a zero timeout: close() sends RST instead of FIN.
    with contextlib.suppress(OSError):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@attrs.define(eq=False)
class FaultProxy:
    """A TCP proxy from 127.0.0.1:``port`` to ``upstream_host:upstream_port``.

    Attributes:
        upstream_host: the server's host.
        upstream_port: the server's port.
        seed: the seed of the jitter and of the random resets.
        port: the port it listens on (known once :meth:`run` started).
    """

    upstream_host: str
    upstream_port: int
    seed: int = 0
    port: int = attrs.field(init=False, default=0)
    _faults: trio_util.AsyncValue[Faults] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(Faults())
    )
    _links: set[_Link] = attrs.field(init=False, factory=set)
    _rng: random.Random = attrs.field(init=False)
    _accepted: int = attrs.field(init=False, default=0)
    _forwarded: dict[str, int] = attrs.field(
        init=False, factory=lambda: {"requests": 0, "replies": 0}
    )
    _dropped: dict[str, int] = attrs.field(
        init=False, factory=lambda: {"requests": 0, "replies": 0}
    )
    _resets: int = attrs.field(init=False, default=0)
    _dropped_data: dict[str, bytearray] = attrs.field(
        init=False, factory=lambda: {"requests": bytearray(), "replies": bytearray()}
    )

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @property
    def url(self) -> str:
        """The ``redis://`` URL of the proxy."""
        return f"redis://127.0.0.1:{self.port}"

    @property
    def faults(self) -> Faults:
        """The faults applied now."""
        faults: Faults = self._faults.value
        return faults

    # ----------------------------------------------------------------- faults

    def _set(self, **changes: Any) -> None:
        self._faults.value = attrs.evolve(self.faults, **changes)

    def delay(self, latency: float, jitter: float = 0.0) -> None:
        """Add ``latency`` seconds each way (a round trip gains twice that), give or
        take up to ``jitter`` seconds per chunk."""
        if latency < 0 or jitter < 0 or jitter > latency:
            raise ValueError(f"need 0 <= jitter <= latency, got {latency=}, {jitter=}")
        self._set(latency=latency, jitter=jitter)

    def cap(self, bandwidth: float | None) -> None:
        """Cap each way of each connection at ``bandwidth`` bytes per second."""
        if bandwidth is not None and not bandwidth > 0:
            raise ValueError(f"bandwidth must be positive, got {bandwidth!r}")
        self._set(bandwidth=bandwidth)

    def blackhole(self, direction: Direction = "both") -> None:
        """Drop every byte going ``direction`` from now on, until :meth:`heal`."""
        self._set(blackholed=self.faults.blackholed | _ways(direction))

    def hold(self, direction: Direction = "both") -> None:
        """Stop forwarding ``direction`` (nothing lost) until :meth:`heal`."""
        self._set(held=self.faults.held | _ways(direction))

    def reset_replies(self, probability: float = 1.0) -> None:
        """Cut each reply chunk with ``probability`` and reset its connection."""
        if not 0 <= probability <= 1:
            raise ValueError(f"probability must be within [0, 1], got {probability!r}")
        self._set(reset_probability=probability)

    def reset_all(self) -> None:
        """Reset every open connection now."""
        for link in list(self._links):
            self._reset(link)

    def heal(self) -> None:
        """Remove every fault: held bytes are delivered, connections that lost bytes
        to a blackhole are reset, new bytes flow as they come."""
        self._faults.value = Faults()
        for link in list(self._links):
            if link.broken:
                self._reset(link)

    def _reset(self, link: _Link) -> None:
        if not link.reset:
            link.reset = True
            self._resets += 1
        link.scope.cancel()

    def statistics(self) -> FaultProxyStatistics:
        """Return what the proxy did so far."""
        return FaultProxyStatistics(
            accepted=self._accepted,
            open=len(self._links),
            forwarded=dict(self._forwarded),
            dropped=dict(self._dropped),
            resets=self._resets,
        )

    def dropped_data(self, way: str) -> bytes:
        """The bytes blackholes dropped going ``way`` (``"requests"``, ``"replies"``), the
        first :data:`KEEP_DROPPED` of them: which requests never reached Redis."""
        return bytes(self._dropped_data[way])

    def __repr__(self) -> str:
        return (
            f"<FaultProxy :{self.port} -> {self.upstream_host}:{self.upstream_port} "
            f"{self.faults}, {len(self._links)} open>"
        )

    # ----------------------------------------------------------------- running

    async def run(
        self, *, task_status: trio.TaskStatus[FaultProxy] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Accept and forward connections until cancelled.

        ``task_status.started`` is called with the proxy once it listens.
        """
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listener.socket.getsockname()[1]
        async with listener, trio.open_nursery() as nursery:
            task_status.started(self)
            while True:
                client = await listener.accept()
                self._accepted += 1
                nursery.start_soon(self._serve, client)

    async def _serve(self, client: trio.SocketStream) -> None:
        try:
            server = await trio.open_tcp_stream(self.upstream_host, self.upstream_port)
        except OSError:
            _abort(client)
            await client.aclose()
            return
        link = _Link(client, server)
        self._links.add(link)
        try:
            with link.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, link, client, server, "requests", nursery)
                    nursery.start_soon(self._pump, link, server, client, "replies", nursery)
        finally:
            self._links.discard(link)
            if link.reset:
                _abort(client)
                _abort(server)
            with trio.CancelScope(shield=True):
                await client.aclose()
                await server.aclose()

    async def _pump(
        self,
        link: _Link,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        way: str,
        nursery: trio.Nursery,
    ) -> None:
        send, receive = trio.open_memory_channel[tuple[float, bytes]](READ_AHEAD)
        async with trio.open_nursery() as inner:
            inner.start_soon(self._read, source, send, way)
            await self._write(link, sink, receive, way)
        # One side closed, or failed: the connection is over both ways.
        nursery.cancel_scope.cancel()

    async def _read(
        self, source: trio.SocketStream, send: trio.MemorySendChannel[tuple[float, bytes]], way: str
    ) -> None:
        last = -math.inf
        async with send:
            while True:
                try:
                    data = await source.receive_some(CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                faults = self.faults
                delay = faults.latency
                if faults.jitter:
                    delay += self._rng.uniform(-faults.jitter, faults.jitter)
                # Never before the chunk ahead of it: TCP keeps order.
                last = max(last, trio.current_time() + delay)
                await send.send((last, data))

    async def _write(
        self,
        link: _Link,
        sink: trio.SocketStream,
        receive: trio.MemoryReceiveChannel[tuple[float, bytes]],
        way: str,
    ) -> None:
        async with receive:
            async for due, data in receive:
                await trio.sleep_until(due)
                faults = await self._faults.wait_value(lambda f: way not in f.held)
                if way in faults.blackholed:
                    self._dropped[way] += len(data)
                    kept = self._dropped_data[way]
                    kept += data[: max(0, KEEP_DROPPED - len(kept))]
                    link.broken = True
                    continue
                cut = way == "replies" and self._rng.random() < faults.reset_probability
                if cut:
                    await self._send(sink, data[: max(1, len(data) // 2)])
                    self._reset(link)
                    return
                if not await self._send(sink, data):
                    return
                self._forwarded[way] += len(data)
                if faults.bandwidth is not None:
                    await trio.sleep(len(data) / faults.bandwidth)

    @staticmethod
    async def _send(sink: trio.SocketStream, data: bytes) -> bool:
        try:
            await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True


@attrs.define(eq=False)
class FaultProxies:
    """Starts :class:`FaultProxy` instances in front of one server (the
    ``fault_proxies`` fixture): ``proxy = await fault_proxies.open()``."""

    nursery: trio.Nursery
    host: str
    port: int
    opened: list[FaultProxy] = attrs.field(factory=list)

    async def open(self, *, seed: int | None = None) -> FaultProxy:
        """Start one more proxy (seeded by how many were opened, unless ``seed``)."""
        seed = len(self.opened) if seed is None else seed
        proxy: FaultProxy = await self.nursery.start(FaultProxy(self.host, self.port, seed).run)
        self.opened.append(proxy)
        return proxy
