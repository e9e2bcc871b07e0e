"""The web recipes run: examples/web_flask.py served by gunicorn (preloaded, forked
workers) and examples/web_fastapi.py served by uvicorn, each called over HTTP, with a
real ``streamkit worker`` running the jobs they enqueue (examples/web_shop.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from typing import IO, TYPE_CHECKING, Any

import pytest
import trio

from examples.web_shop import Order, orders
from streamkit.testing import free_port, wait_until
from tests.workers import ROOT, WorkerProcess, start_worker

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from streamkit import Redis


def http(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One HTTP request; (status, JSON body)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[list[tuple[subprocess.Popen[bytes], IO[bytes]]]]:
    """Web server processes the test starts; stopped at its end."""
    started: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
    yield started
    for process, log in started:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def spawn(
    started: list[tuple[subprocess.Popen[bytes], IO[bytes]]],
    command: list[str],
    redis_url: str,
    log_path: Path,
) -> subprocess.Popen[bytes]:
    log = log_path.open("wb")
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "STREAMKIT_REDIS_URL": redis_url},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    started.append((process, log))
    return process


async def serve(
    started: list[tuple[subprocess.Popen[bytes], IO[bytes]]],
    command: list[str],
    redis_url: str,
    log_path: Path,
    port: int,
) -> None:
    """Start a web server process and wait until it answers."""
    process = spawn(started, command, redis_url, log_path)

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"{command[2]} exited: {log_path.read_text()}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
        except urllib.error.HTTPError:
            return True  # it answers (404 for /)
        except OSError:
            return False
        return True

    async def ready() -> bool:
        return await trio.to_thread.run_sync(answers)

    await wait_until(ready, what=f"{command[2]} to answer", within=30)


async def orders_in(redis: Redis) -> list[Order]:
    found: list[Order] = []
    for key in orders.partition_keys():
        entries: Any = await redis.xrange(key)
        found += [orders.codec.decode(e.field_values, stream="orders") for e in entries]
    return found


@pytest.mark.timeout(120)
async def test_a_flask_view_served_by_gunicorn_enqueues_jobs_a_worker_runs(
    redis_url: str,
    redis: Redis,
    tmp_path: Path,
    workers: list[WorkerProcess],
    web_server: list[tuple[subprocess.Popen[bytes], IO[bytes]]],
) -> None:
    workers.append(start_worker(redis_url, tmp_path, app="examples.web_shop:app"))
    port = free_port()
    command = [
        sys.executable, "-m", "gunicorn", "--preload", "--workers", "2", "--threads", "4",
        "--bind", f"127.0.0.1:{port}", "examples.web_flask:web",
    ]  # fmt: skip
    await serve(web_server, command, redis_url, tmp_path / "gunicorn.log", port)
    base = f"http://127.0.0.1:{port}"

    def place(n: int) -> str:
        status, body = http(
            "POST", f"{base}/orders", {"order_id": n, "customer": f"c{n}", "amount": 10.0 * n}
        )
        assert status == 202, body
        assert body["order_id"] == n
        return str(body["receipt_job"])

    jobs = [await trio.to_thread.run_sync(place, n) for n in range(6)]

    async def receipted() -> bool:
        statuses = [await trio.to_thread.run_sync(http, "GET", f"{base}/jobs/{j}") for j in jobs]
        return all(body["status"] == "success" for _, body in statuses)

    await wait_until(receipted, what="every receipt sent", within=30)
    results = [(await trio.to_thread.run_sync(http, "GET", f"{base}/jobs/{j}"))[1] for j in jobs]
    assert [r["result"] for r in results] == [
        f"receipt {n} sent to c{n}@example.com" for n in range(6)
    ]
    assert (await trio.to_thread.run_sync(http, "GET", f"{base}/jobs/nope"))[0] == 404
    placed = await orders_in(redis)
    assert sorted(o.order_id for o in placed) == list(range(6))


@pytest.mark.timeout(120)
async def test_a_fastapi_endpoint_served_by_uvicorn_awaits_a_jobs_result(
    redis_url: str,
    redis: Redis,
    tmp_path: Path,
    workers: list[WorkerProcess],
    web_server: list[tuple[subprocess.Popen[bytes], IO[bytes]]],
) -> None:
    workers.append(start_worker(redis_url, tmp_path, app="examples.web_shop:app"))
    port = free_port()
    command = [
        sys.executable, "-m", "uvicorn", "examples.web_fastapi:web",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    await serve(web_server, command, redis_url, tmp_path / "uvicorn.log", port)
    url = f"http://127.0.0.1:{port}/orders/quote"

    async def ask(n: int, country: str) -> dict[str, Any]:
        order = {"order_id": n, "customer": f"c{n}", "amount": 100.0 + n, "country": country}
        status, body = await trio.to_thread.run_sync(http, "POST", url, order)
        assert status == 200, body
        return dict(body)

    async with trio.open_nursery() as nursery:
        answers: dict[int, dict[str, Any]] = {}

        async def one(n: int) -> None:
            answers[n] = await ask(n, "DE" if n % 2 else "FR")

        for n in range(8):  # at once: the requests' tasks share the client
            nursery.start_soon(one, n)
    for n, body in answers.items():
        rate = 1.19 if n % 2 else 1.20
        assert body == {"order_id": n, "total": round((100.0 + n) * rate, 2)}
    placed = await orders_in(redis)
    assert sorted(o.order_id for o in placed) == list(range(8))


def test_the_readme_opens_with_the_tested_web_recipe() -> None:
    """The README's first example is examples/web_shop.py and examples/web_flask.py,
    which the test above serves (the module named as a file beside it)."""

    def region(name: str, marker: str) -> str:
        text = (ROOT / "examples" / name).read_text()
        return text.split(f"# docs: start {marker}\n")[1].split(f"# docs: end {marker}")[0]

    readme = (ROOT / "README.md").read_text().split("\n## Quickstart\n")[0]
    blocks = [block.split("\n```")[0] for block in readme.split("```python\n")[1:]]
    assert len(blocks) == 2
    shop, web = (block.split("\n", 1)[1] for block in blocks)  # past the file name line
    assert shop.strip() == region("web_shop.py", "app").strip()
    assert (
        web.strip() == region("web_flask.py", "flask").replace("examples.web_shop", "shop").strip()
    )
