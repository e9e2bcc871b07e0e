"""The fault proxy of the test suite (``tests/netfaults.py``), against a real Redis.

Each fault is checked from both ends: what the client behind the proxy gets (a reply,
none, a cut reply and a reset) and what reached Redis (read on a direct connection).
Delays are checked as lower bounds only: a proxy can be slower than asked on a busy
machine, never faster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from streamkit.testing import wait_until
from tests.netfaults import FaultProxy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from streamkit import Redis
    from tests.netfaults import FaultProxies

pytestmark = pytest.mark.timeout(30)

#: How long a test waits to see that nothing comes.
QUIET = 0.3


def resp(*args: str | bytes) -> bytes:
    """A command in RESP."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else arg
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class Conn:
    """A raw connection through the proxy: bytes in, replies out, nothing hidden."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def send(self, *args: str | bytes) -> None:
        await self.stream.send_all(resp(*args))

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise EOFError("the proxy closed the connection")
        self.buffer += data

    async def reply(self) -> bytes:
        """One reply: a simple string or an error (its line), or a bulk string."""
        while b"\r\n" not in self.buffer:
            await self._fill()
        line, _, rest = self.buffer.partition(b"\r\n")
        if not line.startswith(b"$"):
            self.buffer = rest
            return line
        size = int(line[1:])
        while len(rest) < size + 2:
            await self._fill()
            _, _, rest = self.buffer.partition(b"\r\n")
        self.buffer = rest[size + 2 :]
        return rest[:size]

    async def call(self, *args: str | bytes) -> bytes:
        await self.send(*args)
        return await self.reply()

    async def no_reply(self) -> bool:
        """Whether nothing comes back for :data:`QUIET` seconds."""
        with trio.move_on_after(QUIET):
            await self._fill()
            return False
        return True

    async def reset(self) -> bool:
        """Whether the connection is (or soon is) reset or closed by the proxy."""
        try:
            with trio.fail_after(5):
                while True:
                    await self._fill()
        except (trio.BrokenResourceError, EOFError, ConnectionResetError):
            return True

    async def aclose(self) -> None:
        await self.stream.aclose()


if TYPE_CHECKING:
    Connect = Callable[[FaultProxy], Awaitable[Conn]]


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Opens raw connections through a proxy; closes them at the test's end."""
    opened: list[Conn] = []

    async def to(proxy: FaultProxy) -> Conn:
        conn = Conn(await trio.open_tcp_stream("127.0.0.1", proxy.port))
        opened.append(conn)
        return conn

    yield to
    for conn in opened:
        await conn.aclose()


async def test_forwards_both_ways(
    fault_proxies: FaultProxies, connect: Connect, redis: Redis
) -> None:
    proxy = await fault_proxies.open()
    conn = await connect(proxy)
    assert await conn.call("PING") == b"+PONG"
    assert await conn.call("SET", "k", "v") == b"+OK"
    assert await redis.get("k") == b"v"
    stats = proxy.statistics()
    assert stats.accepted == stats.open == 1
    assert stats.forwarded["requests"] > 0
    assert stats.forwarded["replies"] > 0
    await conn.aclose()
    await wait_until(lambda: proxy.statistics().open == 0, what="the link closed", within=5)


async def test_latency_and_jitter_keep_order(fault_proxies: FaultProxies, connect: Connect) -> None:
    proxy = await fault_proxies.open()
    conn = await connect(proxy)
    assert await conn.call("PING") == b"+PONG"
    proxy.delay(0.05, jitter=0.02)
    began = trio.current_time()
    assert await conn.call("PING") == b"+PONG"
    # At least the latency less the jitter, each way.
    assert trio.current_time() - began >= 2 * (0.05 - 0.02)
    # Commands sent one by one, their replies in their order, jitter or not.
    for i in range(40):
        await conn.send("ECHO", str(i))
        await trio.sleep(0.001)
    assert [await conn.reply() for _ in range(40)] == [str(i).encode() for i in range(40)]


async def test_bandwidth_cap(fault_proxies: FaultProxies, connect: Connect, redis: Redis) -> None:
    await redis.set("big", b"x" * 200_000)
    proxy = await fault_proxies.open()
    proxy.cap(400_000)
    conn = await connect(proxy)
    began = trio.current_time()
    assert len(await conn.call("GET", "big")) == 200_000
    # Every chunk but the first waits for its share of the cap.
    assert trio.current_time() - began >= (200_000 - 16 * 1024) / 400_000


@pytest.mark.parametrize(
    ("direction", "lands"), [("both", False), ("requests", False), ("replies", True)]
)
async def test_blackhole(
    fault_proxies: FaultProxies, connect: Connect, redis: Redis, direction: str, lands: bool
) -> None:
    proxy = await fault_proxies.open()
    conn = await connect(proxy)
    assert await conn.call("PING") == b"+PONG"
    proxy.blackhole(direction)  # type: ignore[arg-type]
    await conn.send("SET", "k", "v")
    assert await conn.no_reply()
    if lands:
        await wait_until(lambda: redis.exists(["k"]), what="the request reaching Redis", within=5)
    else:
        assert await redis.exists(["k"]) == 0
    # New connections are accepted and get nothing back either.
    other = await connect(proxy)
    await other.send("PING")
    assert await other.no_reply()
    assert sum(proxy.statistics().dropped.values()) > 0
    proxy.heal()
    # Both lost bytes: reset when the fault healed; a new connection works.
    assert await conn.reset()
    assert await other.reset()
    assert await (await connect(proxy)).call("PING") == b"+PONG"
    assert proxy.statistics().resets == 2


async def test_hold_delivers_on_heal(
    fault_proxies: FaultProxies, connect: Connect, redis: Redis
) -> None:
    proxy = await fault_proxies.open()
    conn = await connect(proxy)
    assert await conn.call("PING") == b"+PONG"
    proxy.hold()
    await conn.send("SET", "k", "v")
    assert await conn.no_reply()
    assert await redis.exists(["k"]) == 0
    proxy.heal()
    # Nothing lost: the held request reaches Redis, its reply the client.
    assert await conn.reply() == b"+OK"
    assert await redis.get("k") == b"v"
    assert proxy.statistics().resets == 0


async def test_hold_replies_only(
    fault_proxies: FaultProxies, connect: Connect, redis: Redis
) -> None:
    proxy = await fault_proxies.open()
    conn = await connect(proxy)
    proxy.hold("replies")
    await conn.send("SET", "k", "v")
    await wait_until(lambda: redis.exists(["k"]), what="the request reaching Redis", within=5)
    assert await conn.no_reply()
    proxy.heal()
    assert await conn.reply() == b"+OK"


async def test_reset_mid_reply(fault_proxies: FaultProxies, connect: Connect, redis: Redis) -> None:
    await redis.set("big", b"x" * 100_000)
    proxy = await fault_proxies.open()
    conn = await connect(proxy)
    assert await conn.call("PING") == b"+PONG"
    proxy.reset_replies()
    await conn.send("GET", "big")
    assert await conn.reset()
    # Half of the first chunk came through, then the reset: a reply cut short.
    assert 0 < len(conn.buffer) < 100_000
    assert proxy.statistics().resets == 1
    proxy.heal()
    assert len(await (await connect(proxy)).call("GET", "big")) == 100_000


async def test_random_resets_and_reset_all(fault_proxies: FaultProxies, connect: Connect) -> None:
    proxy = await fault_proxies.open(seed=7)
    proxy.reset_replies(0.5)
    outcomes = []
    for _ in range(20):
        conn = await connect(proxy)
        try:
            outcomes.append(await conn.call("PING") == b"+PONG")
        except (trio.BrokenResourceError, EOFError, ConnectionResetError):
            outcomes.append(False)
    # Seeded: some replies came, some were reset.
    assert 0 < sum(outcomes) < 20
    proxy.heal()
    conns = [await connect(proxy) for _ in range(3)]
    for conn in conns:
        assert await conn.call("PING") == b"+PONG"
    proxy.reset_all()
    for conn in conns:
        assert await conn.reset()


async def test_bad_settings_are_refused() -> None:
    proxy = FaultProxy("127.0.0.1", 1)
    with pytest.raises(ValueError, match="jitter"):
        proxy.delay(0.01, jitter=0.02)
    with pytest.raises(ValueError, match="bandwidth"):
        proxy.cap(0)
    with pytest.raises(ValueError, match="direction"):
        proxy.blackhole("sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="probability"):
        proxy.reset_replies(2)
