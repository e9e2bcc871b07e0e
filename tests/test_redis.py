"""The connection layer: clients from URLs, retries, and translated errors."""

from __future__ import annotations

import contextlib
import logging

import pytest
import trio

from streamkit import ConfigError, RedisUnavailable
from streamkit._backoff import Backoff
from streamkit._redis import Redis, mask_url, open_redis, redis_errors
from streamkit.testing import RedisServer, free_port, wait_until


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
