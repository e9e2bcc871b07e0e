"""Who may use the dashboard and the metrics endpoint, over real HTTP: the Host it is
asked for (DNS rebinding), a token (bearer or a browser's cookie), security headers.

The dashboard and the worker run as real subprocesses; requests go over TCP with
``http.client``, which sends exactly the headers given (a forged ``Host`` included)
and follows no redirect.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import sys
from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from streamkit._cli._dashboard import dashboard_access, page_policy
from streamkit._http_access import host_name
from streamkit.testing import wait_until
from tests.cli_processes import serving_dashboard
from tests.test_cli import ROOT, streamkit
from tests.workers import start_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.workers import WorkerProcess

APP = "tests.apps.fleet:app"
TOKEN = "a-test-token-0123456789abcdef"


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def fetch(port: int, path: str = "/", **headers: str) -> Reply:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers={"Host": f"127.0.0.1:{port}", **headers})
        reply = connection.getresponse()
        return Reply(reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read())
    finally:
        connection.close()


async def get(port: int, path: str = "/", **headers: str) -> Reply:
    return await trio.to_thread.run_sync(lambda: fetch(port, path, **headers))


@contextlib.asynccontextmanager
async def dashboard(
    redis_url: str, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[int]:
    """``streamkit dashboard APP --port 0 ARGS`` running; its port."""
    async with serving_dashboard(redis_url, APP, *args, env=env) as first:
        found = re.search(r"on http://[^ ]+:(\d+)", first)
        assert found is not None, first
        yield int(found[1])


def assert_secured(reply: Reply) -> None:
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in reply.headers["content-security-policy"]


async def test_only_the_hosts_it_serves(redis_url: str) -> None:
    async with dashboard(redis_url, "--allowed-host", "Dash.Example") as port:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "dash.example", "dash.example."):
            reply = await get(port, "/api/status", Host=host)
            assert reply.status == 200, (host, reply)
            assert_secured(reply)
        # DNS rebinding: a page of evil.example whose name now points here.
        for host in (f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil"):
            reply = await get(port, "/api/status", Host=host)
            assert reply.status == 421, (host, reply)
            assert b'"processors"' not in reply.body
            assert_secured(reply)
        page = await get(port, "/")
    assert page.status == 200
    assert_secured(page)
    policy = page.headers["content-security-policy"]
    assert policy == page_policy(page.body)
    assert "script-src 'sha256-" in policy
    assert "'unsafe-inline'" not in policy


async def test_a_reachable_address_needs_a_token(redis_url: str) -> None:
    refused = await streamkit(
        "dashboard", APP, "--port", "0", "--host", "0.0.0.0", redis_url=redis_url
    )
    assert refused.code == 2
    assert refused.err.startswith("Error: --token: the dashboard would listen on 0.0.0.0")
    assert refused.err.count("\n") == 1
    short = await streamkit(
        "dashboard", APP, "--port", "0", "--token", "short", redis_url=redis_url
    )
    assert short.code == 2
    assert "at least 16 characters" in short.err
    async with dashboard(redis_url, "--host", "0.0.0.0", "--no-auth") as port:
        assert (await get(port, "/api/status")).status == 200
        # No token, but the Host check all the same.
        assert (await get(port, "/api/status", Host="evil.example")).status == 421


async def test_the_token_as_bearer_or_cookie(redis_url: str) -> None:
    env = {"STREAMKIT_DASHBOARD_TOKEN": TOKEN}
    async with dashboard(redis_url, "--host", "0.0.0.0", env=env) as port:
        for path in ("/", "/api/status", "/api/jobs/x"):
            reply = await get(port, path)
            assert reply.status == 401, (path, reply)
            assert reply.headers["www-authenticate"] == 'Bearer realm="streamkit"'
            assert b'"processors"' not in reply.body
            assert_secured(reply)
        assert (await get(port, "/api/status", Authorization="Bearer wrong")).status == 401
        assert (await get(port, "/api/status", Authorization=f"Basic {TOKEN}")).status == 401
        bearer = await get(port, "/api/status", Authorization=f"Bearer {TOKEN}")
        assert bearer.status == 200
        assert b'"processors"' in bearer.body

        # A browser: ?token= once, then a cookie; the token leaves the address bar.
        wrong = await get(port, "/?token=wrong")
        assert wrong.status == 401
        login = await get(port, f"/?token={TOKEN}&view=jobs")
        assert login.status == 303
        assert login.headers["location"] == "/?view=jobs"
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert TOKEN not in cookie
        session = cookie.split(";", 1)[0]
        page = await get(port, "/", Cookie=session)
        assert page.status == 200
        assert b"<script>" in page.body
        assert (await get(port, "/api/status", Cookie=session)).status == 200
        forged = session[:-4] + "0000"
        assert (await get(port, "/api/status", Cookie=forged)).status == 401
        # The Host check comes first, token or not.
        rebound = await get(
            port, "/api/status", Host="evil.example", Authorization=f"Bearer {TOKEN}"
        )
        assert rebound.status == 421


def test_host_names_and_who_is_let_in() -> None:
    assert host_name("[::1]:8000") == "::1"
    assert host_name("Example.COM.:80") == "example.com"
    assert host_name("example.com") == "example.com"
    local = dashboard_access("127.0.0.1", token=None)
    assert local.token is None
    assert local.host_allowed("localhost:1", None)
    assert local.host_allowed("[::1]:1", None)
    assert not local.host_allowed("evil.example", None)
    assert not local.host_allowed(None, None)
    # The address a client connected to is always its own name.
    assert local.host_allowed("10.1.2.3:80", "10.1.2.3")
    assert dashboard_access("10.0.0.5", token=TOKEN).host_allowed("10.0.0.5", None)
    assert dashboard_access("::1", token=None, allowed_hosts=["*"]).allowed_hosts is None
    assert dashboard_access("0.0.0.0", token=TOKEN, no_auth=True).token is None


async def test_the_metrics_endpoint_takes_a_token(
    redis_url: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(
        redis_url,
        tmp_path,
        app="tests.apps.failing:app",
        args=("--metrics-port", "0", "--metrics-token", TOKEN),
    )
    workers.append(worker)
    serving = re.compile(r"serving metrics on http://[^ ]+:(\d+)")
    await wait_until(lambda: serving.search(worker.log()), what="the metrics endpoint", within=30)
    found = serving.search(worker.log())
    assert found is not None
    port = int(found[1])
    refused = await get(port, "/metrics")
    assert refused.status == 401
    assert refused.headers["www-authenticate"] == 'Bearer realm="streamkit"'
    assert b"streamkit_" not in refused.body
    scraped = await get(port, "/metrics", Authorization=f"Bearer {TOKEN}")
    assert scraped.status == 200
    assert b"streamkit_" in scraped.body
    assert scraped.headers["x-content-type-options"] == "nosniff"
    # Prometheus scrapes by whatever name it knows the target by: no Host check.
    assert (
        await get(port, "/metrics", Host="worker-3.internal", Authorization=f"Bearer {TOKEN}")
    ).status == 200


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--metrics-token", "short"], {}), ([], {"STREAMKIT_METRICS_TOKEN": "short"})],
    ids=["flag", "setting"],
)
async def test_a_short_metrics_token_is_one_line(
    redis_url: str, args: list[str], env: dict[str, str]
) -> None:
    command = ["worker", "tests.apps.failing:app", "--metrics-port", "0", *args]
    environment = {**os.environ, "STREAMKIT_REDIS_URL": redis_url, **env}
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "streamkit", *command],
            cwd=ROOT,
            env=environment,
            capture_stderr=True,
            check=False,
        )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "metrics_token: a token must be at least 16 characters long" in err
    assert "Traceback" not in err
