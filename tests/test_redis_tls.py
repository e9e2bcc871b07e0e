"""TLS to Redis: the certificate chain and the host name are checked by default.

A real ``redis-server`` serves TLS on a second port with certificates from a
throwaway CA (trustme), for the Trio client (coredis) and the Spark executors'
client (redis-py) alike: a certificate for another host is refused with one line
naming the host, one for the URL's IP address (an IP SAN) or for ``localhost`` is
accepted, and turning a check off is an explicit choice in the URL that logs one
warning per process.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trustme

from streamkit import ConfigError, RedisUnavailable, _urls as urls, open_redis
from streamkit._redis import LuaScript
from streamkit.lowlevel import redis_errors
from streamkit.testing import RedisServer, free_port

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SIDES = ["trio", "spark"]


@attrs.frozen
class TlsRedis:
    """A server with a plain port (to change its certificate) and a TLS port."""

    server: RedisServer
    tls_port: int
    ca: Path
    certificates: dict[str, tuple[Path, Path]]

    def url(self, host: str = "127.0.0.1", query: str = "") -> str:
        """The ``rediss://`` URL of the TLS port, trusting the test CA unless ``query``
        says otherwise."""
        query = query if query else f"ssl_ca_certs={self.ca}"
        return f"rediss://{host}:{self.tls_port}?{query}"

    async def serve(self, name: str) -> None:
        """Make the server present the certificate issued for ``name``."""
        cert, key = self.certificates[name]
        async with open_redis(self.server.url) as plain:
            await plain.config_set({"tls-cert-file": str(cert), "tls-key-file": str(key)})


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(folder / "ca.pem")
    certificates = {}
    for name in ("other.example", "127.0.0.1", "localhost"):
        issued = ca.issue_cert(name)
        cert, key = folder / f"{name}.crt", folder / f"{name}.key"
        issued.cert_chain_pems[0].write_to_path(cert)
        issued.private_key_pem.write_to_path(key)
        certificates[name] = (cert, key)
    tls_port = free_port()
    first_cert, first_key = certificates["other.example"]
    tls = [
        "--tls-port", str(tls_port),
        "--tls-cert-file", str(first_cert),
        "--tls-key-file", str(first_key),
        "--tls-ca-cert-file", str(folder / "ca.pem"),
        "--tls-auth-clients", "no",
    ]  # fmt: skip
    server = RedisServer(extra_args=tls)
    with server:
        yield TlsRedis(server, tls_port, folder / "ca.pem", certificates)


@pytest.fixture(autouse=True)
def _warnings_not_yet_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the process's first warning about a check turned off."""
    monkeypatch.setattr(urls, "_warned", set(), raising=False)


def _spark_ping(url: str) -> Any:
    from streamkit.spark._client import connect

    with connect(url) as client:
        return client.ping()


async def ping(side: str, url: str) -> bool:
    """PING the server at ``url`` through the Trio client or the Spark executors' one."""
    if side == "trio":
        async with open_redis(url) as client:
            return bool(await client.ping())
    return bool(await trio.to_thread.run_sync(_spark_ping, url))


@pytest.mark.parametrize("side", SIDES)
async def test_a_certificate_for_another_host_is_refused(side: str, tls_redis: TlsRedis) -> None:
    await tls_redis.serve("other.example")
    with pytest.raises(ConfigError) as info:
        await ping(side, tls_redis.url())
    message = str(info.value)
    assert "\n" not in message
    assert "not valid for host '127.0.0.1'" in message, message
    assert f"rediss://127.0.0.1:{tls_redis.tls_port}" in message


@pytest.mark.parametrize("side", SIDES)
async def test_a_certificate_for_the_ip_address_is_accepted(side: str, tls_redis: TlsRedis) -> None:
    await tls_redis.serve("127.0.0.1")
    assert await ping(side, tls_redis.url())


@pytest.mark.parametrize("side", SIDES)
async def test_a_certificate_for_localhost_is_accepted(side: str, tls_redis: TlsRedis) -> None:
    await tls_redis.serve("localhost")
    assert await ping(side, tls_redis.url("localhost"))


@pytest.mark.parametrize("side", SIDES)
async def test_a_certificate_from_an_unknown_ca_is_refused(side: str, tls_redis: TlsRedis) -> None:
    await tls_redis.serve("127.0.0.1")
    with pytest.raises(ConfigError, match=r"was refused .*ssl_ca_certs") as info:
        await ping(side, tls_redis.url(query="ssl_check_hostname=false"))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("side", SIDES)
async def test_turning_verification_off_is_explicit_and_warned_once(
    side: str, tls_redis: TlsRedis, caplog: pytest.LogCaptureFixture
) -> None:
    await tls_redis.serve("other.example")
    url = tls_redis.url(query="ssl_cert_reqs=none")
    with caplog.at_level(logging.WARNING, logger="streamkit.redis"):
        assert await ping(side, url)
        assert await ping(side, url)
    warnings = [r.getMessage() for r in caplog.records if "ssl_cert_reqs=none" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "certificate" in warnings[0]


@pytest.mark.parametrize("side", SIDES)
async def test_turning_host_name_checks_off_is_explicit_and_warned_once(
    side: str, tls_redis: TlsRedis, caplog: pytest.LogCaptureFixture
) -> None:
    await tls_redis.serve("other.example")
    url = tls_redis.url(query=f"ssl_ca_certs={tls_redis.ca}&ssl_check_hostname=false")
    with caplog.at_level(logging.WARNING, logger="streamkit.redis"):
        assert await ping(side, url)
        assert await ping(side, url)
    warnings = [
        r.getMessage() for r in caplog.records if "ssl_check_hostname=false" in r.getMessage()
    ]
    assert len(warnings) == 1, warnings


@pytest.mark.parametrize(
    "query", ["ssl_cert_reqs=maybe", "ssl_check_hostname=perhaps", "ssl_ca_certs=/no/such/ca.pem"]
)
@pytest.mark.parametrize("side", SIDES)
async def test_bad_tls_arguments_are_config_errors(
    side: str, query: str, tls_redis: TlsRedis
) -> None:
    with pytest.raises(ConfigError, match=query.partition("=")[0]) as info:
        await ping(side, tls_redis.url(query=query))
    assert "\n" not in str(info.value)


async def test_hot_scripts_go_over_tls_and_check_the_certificate(tls_redis: TlsRedis) -> None:
    """The hot scripts' connections (streamkit/_redis/_hot.py) are TLS connections like
    every other: a script runs over one, and a new one checks the certificate."""
    script = LuaScript("return ARGV[1]", hot=True)
    await tls_redis.serve("127.0.0.1")
    async with open_redis(tls_redis.url()) as redis:
        with redis_errors():
            assert await script(redis, keys=[], args=[b"over tls"]) == b"over tls"
    async with open_redis(tls_redis.url()) as redis:
        # The shared connection was made with the good certificate; the hot pool's
        # first connection meets the bad one.
        await tls_redis.serve("other.example")
        with pytest.raises(RedisUnavailable) as info, redis_errors():
            await script(redis, keys=[], args=[b"refused"])
        chain: list[BaseException] = []
        cause: BaseException | None = info.value
        while cause is not None and len(chain) < 10:
            chain.append(cause)
            cause = cause.__cause__ or cause.__context__
        assert any("CERTIFICATE_VERIFY_FAILED" in repr(e) for e in chain), chain
