"""The connection layer: clients from URLs, retries, and translated errors."""

from __future__ import annotations

import contextlib
import logging
import urllib.parse
import warnings
from typing import TYPE_CHECKING, Any

import anyio
import coredis.exceptions
import pytest
import trio

from streamkit import BackendError, ConfigError, OutcomeUnknown, RedisUnavailable
from streamkit._backoff import Backoff
from streamkit._redis import Redis, mask_url, open_redis, redis_errors
from streamkit._redis._translate import translate
from streamkit.lowlevel import (
    GroupExists,
    NoSuchGroup,
    call_once,
    redis_statistics,
    retry_idempotent,
    run_blocking,
)
from streamkit.testing import RedisServer, free_port, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


async def test_ping_through_open_redis(redis: Redis) -> None:
    assert await redis.ping() == b"PONG"


async def test_unreachable_server_is_reported_clearly() -> None:
    url = f"redis://127.0.0.1:{free_port()}"
    with pytest.raises(RedisUnavailable) as info:
        async with open_redis(url):
            pytest.fail("must not connect")
    assert info.value.url == url
    assert url in str(info.value)


async def test_connecting_retries_until_the_server_comes_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # No server yet: something listens on the port but never answers, so the first
    # attempt times out. Once the client has given up on it, the server starts there.
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    async with trio.open_nursery() as nursery:

        async def start_after_the_first_attempt() -> None:
            async with listener, await listener.accept() as first:
                with contextlib.suppress(trio.BrokenResourceError):
                    while await first.receive_some():  # until the client hangs up
                        pass
            await nursery.start(RedisServer(port=port).run)

        nursery.start_soon(start_after_the_first_attempt)
        with caplog.at_level(logging.WARNING, logger="streamkit.redis"), trio.fail_after(20):
            async with open_redis(
                f"redis://127.0.0.1:{port}",
                connect_timeout=0.1,
                give_up_after=None,
                backoff=Backoff(initial=0.05, jitter=0),
            ) as client:
                assert await client.ping() == b"PONG"
        nursery.cancel_scope.cancel()
    assert any("retrying in" in r.message for r in caplog.records)


async def test_gives_up_after_the_configured_time() -> None:
    url = f"redis://127.0.0.1:{free_port()}"
    with trio.fail_after(10), pytest.raises(RedisUnavailable):
        async with open_redis(url, give_up_after=0.3, backoff=Backoff(initial=0.05)):
            pass


async def test_password_is_masked_in_errors() -> None:
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}"
    with pytest.raises(RedisUnavailable) as info:
        async with open_redis(url):
            pass
    assert "s3cret" not in str(info.value)
    assert mask_url(url) == url.replace("s3cret", "***")


async def connect_once(side: str, url: str) -> None:
    """Connect to ``url`` with the Trio client or the Spark executors' one."""
    if side == "trio":
        async with open_redis(url):
            return
    from streamkit.spark._client import connect

    def spark_connect() -> None:
        with connect(url):
            pass

    await trio.to_thread.run_sync(spark_connect)


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cret@127.0.0.1:{port}?pass%77ord=s3cret",
        "redis://127.0.0.1:{port}?db=0&password=s3cret",
        # Malformed: no port number, no scheme, a database that is no number.
        "redis://:s3cret@127.0.0.1:port?pass%77ord=s3cret",
        "127.0.0.1:{port}?password=s3cret",
        "redis://127.0.0.1:{port}/x?pwd=s3cret",
        "rediss://127.0.0.1:{port}?ssl_password=s3cret&ssl_cert_reqs=maybe",
    ],
)
@pytest.mark.parametrize("side", ["trio", "spark"])
async def test_no_message_shows_a_password(side: str, url: str) -> None:
    url = url.format(port=free_port())
    with pytest.raises((RedisUnavailable, ConfigError)) as info:
        await connect_once(side, url)
    assert "s3cret" not in str(info.value)
    assert "***" in str(info.value)


@pytest.mark.parametrize("url", ["http://localhost", "localhost:6379"])
async def test_malformed_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError, match="redis_url"):
        async with open_redis(url):
            pass


async def test_server_errors_become_backend_errors(redis: Redis) -> None:
    from streamkit import BackendError

    await redis.set("k", "v")
    with pytest.raises(BackendError, match="wrong kind"), redis_errors():
        await redis.xlen("k")


async def test_a_restarted_server_is_reconnected(private_redis: RedisServer) -> None:
    async with open_redis(private_redis.url) as client:
        await client.set("k", "v")
        await trio.to_thread.run_sync(private_redis.restart)

        async def reconnected() -> bool:
            try:
                with redis_errors():
                    assert await client.get("k") == b"v"
            except RedisUnavailable:
                return False
            return True

        await wait_until(reconnected, what="the client to reach the restarted server", within=10)


# -- outcome-unknown errors, retries, group errors, connection logs -----------------


async def wait_for_client(killer: Redis, cmd: str) -> int:
    """The id of the (one) client whose current command is ``cmd``, once there is one."""
    found: list[int] = []

    async def running() -> bool:
        found[:] = [int(c["id"]) for c in await killer.client_list() if c["cmd"] == cmd]
        return bool(found)

    await wait_until(running, what=f"a client running {cmd}", within=5, interval=0.005)
    return found[0]


def _wait_for_replicas(redis: Redis) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # coredis prefers ensure_replication
        return redis.wait(1, 5000)


async def test_refused_connections_are_not_outcome_unknown() -> None:
    url = f"redis://127.0.0.1:{free_port()}"
    with pytest.raises(RedisUnavailable) as info:
        async with open_redis(url):
            pass
    assert not isinstance(info.value, OutcomeUnknown)


@pytest.mark.parametrize(
    ("cmd", "command"),
    [
        # A blocking command, on a dedicated connection.
        ("blpop", lambda r: r.blpop(["nothing"], timeout=5)),
        # A simple command, on the shared connection (WAIT blocks only its client).
        ("wait", lambda r: _wait_for_replicas(r)),
    ],
)
async def test_a_connection_killed_mid_command_is_outcome_unknown(
    redis_url: str, cmd: str, command: Any
) -> None:
    async with open_redis(redis_url) as client, open_redis(redis_url) as killer:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                with pytest.raises(OutcomeUnknown) as info, redis_errors(redis_url):
                    await command(client)
                assert "may or may not have run" in str(info.value)

            nursery.start_soon(run)
            await killer.client_kill(identifier=await wait_for_client(killer, cmd))
        # The client recovers on a fresh connection.
        assert await client.ping() == b"PONG"
        assert redis_statistics(client).lost == 1


async def test_call_once_does_not_resend_and_retry_idempotent_does(redis_url: str) -> None:
    async with open_redis(redis_url) as client, open_redis(redis_url) as killer:
        calls = 0

        async def blocking_pop() -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                return await client.blpop(["jobs"], timeout=5)
            return "second attempt"

        async with trio.open_nursery() as nursery:

            async def once() -> None:
                with pytest.raises(OutcomeUnknown):
                    await call_once(blocking_pop, what="popping a job")

            nursery.start_soon(once)
            await killer.client_kill(identifier=await wait_for_client(killer, "blpop"))
        assert calls == 1

        calls = 0
        async with trio.open_nursery() as nursery:

            async def idempotent() -> None:
                assert await retry_idempotent(blocking_pop, what="reading") == "second attempt"

            nursery.start_soon(idempotent)
            await killer.client_kill(identifier=await wait_for_client(killer, "blpop"))
        assert calls == 2


async def test_call_once_retries_what_never_reached_redis() -> None:
    server = RedisServer()
    attempts = 0

    async def incr(client: Redis) -> int:
        nonlocal attempts
        attempts += 1
        if attempts == 2:
            # The server comes up between the second and third attempts.
            await trio.to_thread.run_sync(server.start)
        return await client.incr("n")

    try:
        await trio.to_thread.run_sync(server.start)
        url = server.url  # the port is chosen when the server first starts
        async with open_redis(url) as client:
            await trio.to_thread.run_sync(server.stop)
            await wait_until(
                lambda: redis_statistics(client).lost > 0,
                what="the connection to be lost",
                within=5,
                interval=0.005,
            )
            # Attempt 1 is refused (never sent), attempt 2 runs.
            with trio.fail_after(20):
                assert await call_once(incr, client, what="counting", give_up_after=15) == 1
        assert attempts == 2
    finally:
        server.close()


async def test_group_errors_are_typed(redis: Redis) -> None:
    await redis.xgroup_create("s", "g", "0", mkstream=True)
    with pytest.raises(GroupExists), redis_errors():
        await redis.xgroup_create("s", "g", "0", mkstream=True)
    with pytest.raises(NoSuchGroup), redis_errors():
        await redis.xreadgroup("missing", "c", streams={"s": ">"})
    # Redis 7's form inside a script: "No such key '...' or consumer group '...'".
    with pytest.raises(NoSuchGroup, match="No such key"), redis_errors():
        await redis.eval(
            "return redis.call('XREADGROUP', 'GROUP', 'missing', 'c', 'STREAMS', KEYS[1], '>')",
            keys=["s"],
        )
    with pytest.raises(GroupExists), redis_errors():
        await redis.eval("return redis.call('XGROUP', 'CREATE', KEYS[1], 'g', '0')", keys=["s"])
    assert issubclass(GroupExists, BackendError)
    assert issubclass(NoSuchGroup, BackendError)


async def test_a_lost_connection_is_logged_once_with_the_url_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    acl = ("--user", "default", "on", "nopass", "~*", "&*", "+@all")
    alice = ("--user", "alice", "on", ">s3cret", "~*", "&*", "+@all")
    with RedisServer(extra_args=(*acl, *alice)) as server:
        url = f"redis://alice:s3cret@127.0.0.1:{server.port}"
        async with open_redis(url) as client, open_redis(server.url) as killer:
            await client.set("k", "v")
            with caplog.at_level(logging.DEBUG, logger="streamkit.redis"):
                await killer.client_kill(user="alice")
                # The next commands find the connection gone and open a new one.
                with trio.fail_after(5):
                    while True:
                        try:
                            with redis_errors():
                                assert await client.get("k") == b"v"
                            break
                        except RedisUnavailable:
                            await trio.sleep(0.01)
            stats = redis_statistics(client)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([w for w in warnings if "unreachable: lost a connection" in w]) == 1, warnings
    assert len([w for w in warnings if " back after " in w]) == 1, warnings
    assert len(warnings) == 2, warnings
    assert all(r.name == "streamkit.redis" for r in caplog.records if r.levelno >= logging.WARNING)
    assert all("s3cret" not in w and "alice:***@" in w for w in warnings), warnings
    assert (stats.lost, stats.reconnects) == (1, 1)


async def test_run_blocking(redis: Redis) -> None:
    reply = await run_blocking(
        redis, lambda r: r.xread({"s": "$"}, count=1, block=10), within=5, what="reading"
    )
    assert reply is None
    with pytest.raises(RedisUnavailable, match="no answer within"):
        await run_blocking(
            redis, lambda r: r.blpop(["none"], timeout=5), within=0.05, what="popping"
        )
    assert redis_statistics(redis).dedicated_in_use == 0


async def test_blocking_helpers_refuse_foreign_clients(redis_url: str) -> None:
    import coredis

    async with coredis.Redis.from_url(redis_url) as foreign:
        with pytest.raises(ConfigError, match="open_redis"):
            await run_blocking(
                foreign, lambda r: r.xread({"s": "$"}, block=10), within=1, what="reading"
            )
        with pytest.raises(ConfigError, match="open_redis"):
            redis_statistics(foreign)


async def test_an_exhausted_pool_is_reported_as_never_sent(redis_url: str) -> None:
    # ?timeout= is coredis's wait for a free pool slot.
    async with open_redis(f"{redis_url}?timeout=1", max_connections=1) as client:

        async def hold_the_slot() -> None:
            await client.blpop(["never"], timeout=3)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold_the_slot)
            await wait_until(
                lambda: redis_statistics(client).dedicated_in_use > 0,
                what="the blocking command to hold its slot",
                within=5,
                interval=0.005,
            )
            with pytest.raises(RedisUnavailable, match="pool exhausted") as info, redis_errors():
                await client.blpop(["never"], timeout=1)
            assert not isinstance(info.value, OutcomeUnknown)
            nursery.cancel_scope.cancel()
        assert redis_statistics(client).dedicated_in_use == 0


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://user:s3cret@h:1/0", "redis://user:***@h:1/0"),
        ("redis://:s3cret@h:1", "redis://:***@h:1"),
        ("redis://:s3%40cr%2Fet@h:1", "redis://:***@h:1"),
        # Unencoded characters that end the password early for a URL parser.
        ("redis://:s3/cr@et@h:1", "redis://:***@h:1"),
        ("redis://:s3?cr#et@h:1", "redis://:***@h:1"),
        ("redis://s3cret@h:1", "redis://***@h:1"),
        ("redis://h:1?password=s3cret&db=2", "redis://h:1?password=***&db=2"),
        ("redis://h:1/0", "redis://h:1/0"),
        # Query keys are decoded before they are matched, as clients decode them.
        ("redis://h:1?pass%77ord=s3cret", "redis://h:1?pass%77ord=***"),
        ("redis://h:1?%70assword=s3cret&db=2", "redis://h:1?%70assword=***&db=2"),
        ("redis://h:1?PASSWORD=s3cret", "redis://h:1?PASSWORD=***"),
        # Any password-like argument.
        ("redis://h:1?db=2&passwd=s3cret", "redis://h:1?db=2&passwd=***"),
        ("redis://h:1?pwd=s3cret", "redis://h:1?pwd=***"),
        ("redis://h:1?auth_token=s3cret", "redis://h:1?auth_token=***"),
        ("redis://h:1?client_secret=s3cret#x", "redis://h:1?client_secret=***#x"),
        ("redis://h:1?ssl_password=s3cret", "redis://h:1?ssl_password=***"),
        ("redis://h:1?api%2Dkey=s3cret", "redis://h:1?api%2Dkey=***"),
        ("redis://h:1?credentials=s3cret", "redis://h:1?credentials=***"),
        # A value holding the separator's encoding stays masked whole.
        ("redis://h:1?password=s3%26cr%3Det&db=2", "redis://h:1?password=***&db=2"),
        # Harmless arguments are left as they are.
        (
            "rediss://h:1?ssl_ca_certs=/etc/ca.pem&ssl_keyfile=/k.pem",
            "rediss://h:1?ssl_ca_certs=/etc/ca.pem&ssl_keyfile=/k.pem",
        ),
    ],
)
def test_every_password_form_is_masked(url: str, masked: str) -> None:
    assert mask_url(url) == masked
    assert mask_url(masked) == masked


@pytest.fixture
async def password_redis() -> AsyncIterator[RedisServer]:
    """A private server that requires the password ``p@ss/w:rd`` (set once it is up)."""
    async with trio.open_nursery() as nursery:
        server: RedisServer = await nursery.start(RedisServer().run)
        async with open_redis(server.url) as client:
            await client.config_set({"requirepass": PASSWORD})
        yield server
        nursery.cancel_scope.cancel()


PASSWORD = "p@ss/w:rd"


async def test_a_percent_encoded_password_is_decoded(password_redis: RedisServer) -> None:
    encoded = urllib.parse.quote(PASSWORD, safe="")
    with trio.fail_after(10):
        async with open_redis(f"redis://:{encoded}@127.0.0.1:{password_redis.port}") as client:
            assert await client.ping() == b"PONG"


@pytest.mark.parametrize(
    ("credentials", "says"),
    [
        (":wrong@", "refused the user name or password in the URL"),
        ("", "requires a password: give it in the URL"),
    ],
)
async def test_a_refused_password_fails_at_once(
    password_redis: RedisServer, credentials: str, says: str
) -> None:
    url = f"redis://{credentials}127.0.0.1:{password_redis.port}"
    with trio.fail_after(5), pytest.raises(ConfigError, match=r"^redis_url: ") as info:
        async with open_redis(url, give_up_after=30):
            pytest.fail("must not connect")
    assert says in str(info.value)
    assert "wrong" not in str(info.value)
    assert mask_url(url) in str(info.value)


async def test_tls_to_a_plain_server_fails_at_once(redis_url: str) -> None:
    url = redis_url.replace("redis://", "rediss://:s3cret@")
    with trio.fail_after(10), pytest.raises(ConfigError) as info:
        async with open_redis(url, connect_timeout=0.5, give_up_after=30):
            pytest.fail("must not connect")
    assert "is the server speaking TLS? Use redis://" in str(info.value)
    assert "s3cret" not in str(info.value)


async def test_an_unknown_host_fails_at_once() -> None:
    with trio.fail_after(10), pytest.raises(ConfigError, match="unknown host") as info:
        async with open_redis("redis://no-such-host.invalid:6379", give_up_after=30):
            pytest.fail("must not connect")
    assert "check the host name" in str(info.value)


async def test_retries_are_logged_once_then_summarised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"redis://:s3cret@127.0.0.1:{free_port()}"
    with (
        caplog.at_level(logging.DEBUG, logger="streamkit.redis"),
        trio.fail_after(10),
        pytest.raises(RedisUnavailable) as info,
    ):
        async with open_redis(url, give_up_after=0.5, backoff=Backoff(initial=0.02, jitter=0)):
            pass
    warnings_logged = [r.message for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings_logged) == 1, warnings_logged
    assert "retrying" in warnings_logged[0]
    assert "gave up after" in str(info.value)
    assert "s3cret" not in caplog.text + str(info.value)


async def test_errors_name_the_url_of_the_client_in_use(redis_url: str) -> None:
    # Two clients open: each block's errors name the innermost one's URL.
    with trio.fail_after(10):
        async with open_redis(redis_url) as client:
            await client.set("k", "v")
            async with open_redis(redis_url.replace("127.0.0.1", "localhost")):
                unavailable = RedisUnavailable(None, "testing")
                assert "localhost" in str(unavailable)
            with pytest.raises(RedisUnavailable) as info, redis_errors():
                raise coredis.exceptions.ConnectionError("Connection not usable")
    assert f"Redis at {redis_url} is unavailable" in str(info.value)


async def test_connecting_gives_up_after_the_configured_time_not_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The last attempt is made at the deadline: give_up_after is the time it takes."""
    from streamkit._backoff import retry_unavailable
    from streamkit._outage import OutageLog

    attempts: list[float] = []

    async def refuse() -> None:
        attempts.append(trio.current_time())
        raise RedisUnavailable("redis://example:1", "refused")

    began = trio.current_time()
    with pytest.raises(RedisUnavailable, match="gave up after"):
        await retry_unavailable(
            refuse,
            backoff=Backoff(initial=0.4, maximum=5.0, jitter=0),
            give_up_after=3.0,
            what="x",
            outage=OutageLog("Redis at redis://example:1"),
        )
    assert attempts[-1] - began == pytest.approx(3.0)
    assert len(attempts) >= 3


@pytest.mark.parametrize(
    "error",
    [anyio.ClosedResourceError(), anyio.BrokenResourceError(), trio.ClosedResourceError()],
)
def test_a_connection_closed_under_a_command_is_outcome_unknown(error: Exception) -> None:
    # coredis queues a command on a connection whose streams closed as it ended (it
    # still counted it usable): the caller gets a streamkit error, never anyio's.
    assert isinstance(translate(error, "redis://127.0.0.1:6379"), OutcomeUnknown)
