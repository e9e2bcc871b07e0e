"""``streamkit dashboard`` as a real subprocess, against a real worker and Redis: its
HTTP API, and its page rendered by a real headless Chromium (Debian's ``chromium``
and ``chromium-driver``, which ``./dev`` installs)."""

from __future__ import annotations

import os
import shutil
import socket
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any, Literal

import attrs
import orjson
import pytest
import trio

from streamkit.jobs import JobFailed
from streamkit.testing import wait_until
from tests.apps import fleet
from tests.cli_processes import serving_dashboard
from tests.test_cli import streamkit
from tests.workers import start_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.workers import WorkerProcess

APP = "tests.apps.fleet:app"
CLICKS = 1_000
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HOSTILE_NAME = '<img src=x onerror="document.title=1"><b class="pwned">[/]</b>'


@attrs.frozen
class Fleet:
    """A dashboard's URL, the worker it shows, and a job of the queue."""

    url: str
    worker: WorkerProcess
    job_id: str


def get(
    url: str, *, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return int(reply.status), bytes(reply.read())
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()


async def get_json(url: str) -> tuple[int, Any]:
    status, body = await trio.to_thread.run_sync(get, url)
    return status, orjson.loads(body)


@pytest.fixture
async def running(
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    workers: list[WorkerProcess],
) -> AsyncIterator[Fleet]:
    """A worker that processed a backlog of clicks and runs one long job (it runs one
    at a time) while others wait: 5 normal, 2 low, 1 scheduled; and the dashboard."""
    monkeypatch.setattr(
        fleet.app, "settings", attrs.evolve(fleet.app.settings, redis_url=redis_url)
    )
    async with fleet.app:
        await fleet.clicks.send_many(fleet.Click(user=f"u{n % 50}", n=n) for n in range(CLICKS))
        held = await fleet.hold.enqueue(60, priority="high")
        await fleet.tally.enqueue_many([(n,) for n in range(5)])
        await fleet.tally.enqueue_many([(n,) for n in range(2)], priority="low")
        await fleet.tally.enqueue(9, delay=600)
        # A job name from another producer, with markup in it: shown as text.
        queue = fleet.app.job_queue
        await queue.redis.hincrby(queue.shard_keys[0].counts, f"succeeded|{HOSTILE_NAME}", 1)
    worker = start_worker(redis_url, tmp_path, app=APP, env={"STREAMKIT_JOB_CONCURRENCY": "1"})
    workers.append(worker)
    async with serving_dashboard(redis_url, APP, "--interval", "0.2") as line:
        assert line.startswith("serving the dashboard of app fleet on http://127.0.0.1:"), line
        url = line.split(" on ", 1)[1].split()[0]
        yield Fleet(url=url, worker=worker, job_id=held.id)  # then Ctrl-C stops it cleanly


def settled(doc: dict[str, Any]) -> bool:
    """The backlog processed, every partition owned, the long job running."""
    [count] = doc["processors"]
    return bool(
        count["lag"] == 0
        and all(p["worker"] for p in count["partitions"])
        and doc["jobs"]["counts"]["running"] == 1
    )


async def wait_settled(url: str) -> dict[str, Any]:
    latest: dict[str, Any] = {}

    async def check() -> bool:
        nonlocal latest
        status, latest = await get_json(f"{url}/api/status")
        assert status == 200
        return settled(latest)

    await wait_until(check, what="the worker to process the backlog and run a job", within=30)
    return latest


async def test_api_status_shows_the_worker_and_the_job_queue(running: Fleet) -> None:
    doc = await wait_settled(running.url)
    assert doc["app"] == "fleet"
    assert doc["error"] is None
    [count] = doc["processors"]
    name = f"{socket.gethostname()}:{running.worker.pid}"
    assert [p["partition"] for p in count["partitions"]] == [0, 1, 2, 3]
    assert {p["worker"] for p in count["partitions"]} == {name}
    assert sum(p["entries"] for p in count["partitions"]) == CLICKS
    counts = doc["jobs"]["counts"]
    assert counts["queued"] == {"high": 0, "normal": 5, "low": 2}
    assert counts["scheduled"] == 1
    assert counts["running"] == 1
    assert doc["jobs"]["by_name"]["tally"]["queued"] == 7


async def test_api_jobs_and_read_only_routes(running: Fleet) -> None:
    await wait_settled(running.url)
    status, job = await get_json(f"{running.url}/api/jobs/{running.job_id}")
    assert status == 200
    assert job["name"] == "hold"
    assert job["status"] == "executing"
    assert job["tries"] == 1
    assert job["worker"]
    assert [event["text"] for event in job["timeline"]] == [
        "enqueued (high priority)",
        f"try 1 of 4 started on {job['worker']}",
    ]

    status, missing = await get_json(f"{running.url}/api/jobs/no-such-job")
    assert status == 404
    assert "no-such-job" in missing["error"]
    status, _ = await trio.to_thread.run_sync(
        lambda: get(f"{running.url}/api/status", method="POST")
    )
    assert status == 405  # read-only
    status, _ = await trio.to_thread.run_sync(get, f"{running.url}/nothing-here")
    assert status == 404
    status, page = await trio.to_thread.run_sync(get, running.url + "/")
    assert status == 200
    assert b"<script>" in page
    # Everything inline: the machine that shows it may be offline.
    assert b"http://" not in page
    assert b"https://" not in page
    assert b" src=" not in page


async def test_actions_need_the_pages_token_and_this_origin(running: Fleet) -> None:
    doc = await wait_settled(running.url)
    controls = doc["controls"]
    assert controls["actions"] is True
    assert controls["paused"] == []
    token = controls["csrf"]

    async def post(path: str, **headers: str) -> tuple[int, Any]:
        status, body = await trio.to_thread.run_sync(
            lambda: get(f"{running.url}{path}", method="POST", headers=headers)
        )
        return status, orjson.loads(body)

    # Forged: no token, a wrong one, another site's page, another origin.
    status, refused = await post("/api/pause")
    assert (status, refused["error"]) == (403, "refused: missing or wrong X-CSRF-Token")
    assert (await post("/api/pause", **{"X-CSRF-Token": "guess"}))[0] == 403
    cross_site = {"X-CSRF-Token": token, "Sec-Fetch-Site": "cross-site"}
    assert (await post("/api/pause", **cross_site))[0] == 403
    other_origin = {"X-CSRF-Token": token, "Origin": "http://evil.example"}
    assert (await post("/api/pause", **other_origin))[0] == 403
    async with fleet.app:
        assert await fleet.app.job_queue.paused() == []  # none of them paused anything
        # With the token, from this origin: done.
        host = running.url.split("//", 1)[1]
        ok = {"X-CSRF-Token": token, "Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"}
        assert await post("/api/pause/tally", **ok) == (200, {"paused": ["tally"]})
        assert await fleet.app.job_queue.paused() == ["tally"]
        assert await post("/api/resume/tally", **ok) == (200, {"paused": []})
        gone = await fleet.tally.enqueue(1, after=["no-such-job"])  # dead at once
        assert await post(f"/api/jobs/{gone.id}/purge", **ok) == (
            200,
            {"job": gone.id, "purge": True},
        )
        assert (await post(f"/api/jobs/{gone.id}/purge", **ok))[0] == 404
    # Other routes stay read-only.
    assert (await post("/api/status", **ok))[0] == 405


async def test_a_taken_port_is_one_line_and_exit_code_2(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = await streamkit("dashboard", APP, "--port", str(port), redis_url=redis_url)
    assert result.code == 2
    assert f"cannot serve the dashboard on 127.0.0.1:{port}" in result.err
    assert "Traceback" not in result.err


def browse(url: str, screenshot: Path) -> dict[str, Any]:
    """Open the dashboard in headless Chromium; wait until it shows the partitions and
    the job depths; save a screenshot. Return what the page shows."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    # The system's browser and driver, named explicitly: Selenium Manager must never
    # try to download either.
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1100",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.get(url)

        def shown_when_rendered(_: object) -> dict[str, Any] | Literal[False]:
            # Read the page in one script: it redraws itself every second, so elements
            # found one call earlier may be gone.
            shown: dict[str, Any] = driver.execute_script(READ_PAGE)
            running = shown["depths"].get("running")
            return shown if len(shown["partitions"]) == 4 and running == "1" else False

        shown: dict[str, Any] = WebDriverWait(driver, 30, poll_frequency=0.2).until(
            shown_when_rendered
        )
        driver.save_screenshot(str(screenshot))
        # What the browser logged: a content security policy violation would be here.
        logged = driver.get_log("browser")  # type: ignore[no-untyped-call]
        shown["console"] = [entry["message"] for entry in logged]
        return shown
    finally:
        driver.quit()


def _driver() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def use_controls(url: str, held_id: str, dead_id: str) -> dict[str, str]:
    """In headless Chromium: pause the queue and resume it, abort the running job and
    replay a dead one, with the page's buttons (accepting their confirmations); what
    the page said after each."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _driver()
    said: dict[str, str] = {}
    try:
        driver.get(url)
        wait = WebDriverWait(driver, 30, poll_frequency=0.1)

        def text_of(element_id: str, wanted: str) -> str:
            wait.until(lambda d: wanted in d.find_element(By.ID, element_id).text)
            return str(driver.find_element(By.ID, element_id).text)

        wait.until(lambda d: d.find_element(By.ID, "queue-toggle").is_displayed())
        driver.find_element(By.ID, "queue-toggle").click()
        wait.until(expected_conditions.alert_is_present())
        driver.switch_to.alert.accept()
        said["paused"] = text_of("paused", "the queue is paused")
        said["toggle"] = text_of("queue-toggle", "Resume queue")
        driver.find_element(By.ID, "queue-toggle").click()  # resuming asks nothing
        said["resumed"] = text_of("paused", "running")
        for job_id, action, question in (
            (held_id, "abort", True),
            (dead_id, "replay", False),
        ):
            field = driver.find_element(By.ID, "job-id")
            field.clear()
            field.send_keys(job_id)
            driver.find_element(By.CSS_SELECTOR, "#job-form button").click()
            selector = f'#job button[data-action="{action}"]'

            def shown(d: Any, selector: str = selector) -> Any:
                return d.find_element(By.CSS_SELECTOR, selector)

            button = wait.until(shown)
            if action == "abort":  # the running job's progress, as its try reported it
                said["progress"] = text_of("job", "25% holding")
            button.click()
            if question:
                wait.until(expected_conditions.alert_is_present())
                driver.switch_to.alert.accept()
            said[action] = text_of("job-said", f"{action}:")
        logged = driver.get_log("browser")
        said["console"] = " | ".join(entry["message"] for entry in logged)
        return said
    finally:
        driver.quit()


async def test_the_controls_in_a_real_browser(
    running: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SE_OFFLINE", "true")
    await wait_settled(running.url)
    async with fleet.app:
        dead = await fleet.tally.enqueue(2, after=["no-such-job"])  # dead at once
        with trio.fail_after(90):
            said = await trio.to_thread.run_sync(use_controls, running.url, running.job_id, dead.id)
        held = fleet.app.job_queue.handle(running.job_id)
        with pytest.raises(JobFailed) as aborted:
            await held.result(timeout=10)  # its worker cancelled it
        # replayed: queued again, its tries reset (a replay does not look at after=)
        assert await dead.result(timeout=20) == 2
        assert await fleet.app.job_queue.paused() == []
    assert said["paused"] == "the queue is paused"
    assert said["resumed"] == "running"
    assert (
        "progress\t25% holding" in said["progress"] or "progress 25% holding" in said["progress"]
    ), said["progress"]
    assert said["abort"] == "abort: executing"
    assert said["replay"] == "replay: done"
    assert (aborted.value.status, aborted.value.message) == (
        "aborted",
        "aborted from the dashboard",
    )
    assert "Content Security Policy" not in said["console"], said["console"]


#: What the page shows: the cells of the partitions table, the job depths, the text.
READ_PAGE = """
const rows = [...document.querySelectorAll("#partitions-count tr[data-partition]")];
const boxes = [...document.querySelectorAll("#jobs [data-count]")];
return {
  partitions: rows.map((row) => [...row.cells].map((cell) => cell.textContent)),
  depths: Object.fromEntries(boxes.map((b) => [b.dataset.count, b.querySelector("b").textContent])),
  text: document.body.innerText,
  jobNames: [...document.querySelectorAll("#jobs-by-name tr[data-job] td:first-child")]
    .map((cell) => cell.textContent),
  injected: document.querySelectorAll("#jobs-by-name img, .pwned").length,
  title: document.title,
  viewport: [innerWidth * devicePixelRatio, innerHeight * devicePixelRatio],
};
"""


async def test_the_page_in_a_real_browser(
    running: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.fail(
            f"{CHROMIUM} and {CHROMEDRIVER} are needed (Debian's chromium and "
            f"chromium-driver): run ./dev test, whose set-up installs them"
        )
    assert shutil.which("chromedriver") in (CHROMEDRIVER, None)
    # Selenium Manager is not needed (both paths are given); were it ever asked, it
    # must not try to download a browser or a driver.
    monkeypatch.setenv("SE_OFFLINE", "true")
    await wait_settled(running.url)
    screenshot = tmp_path / "dashboard.png"
    with trio.fail_after(90):
        shown = await trio.to_thread.run_sync(browse, running.url, screenshot)

    name = f"{socket.gethostname()}:{running.worker.pid}"
    assert [row[0] for row in shown["partitions"]] == ["0", "1", "2", "3"]
    assert all(row[1] == name for row in shown["partitions"]), shown["partitions"]
    assert all(row[2] == "0" for row in shown["partitions"])  # no lag left
    depths = shown["depths"]
    assert depths["queued-high"] == "0"
    assert depths["queued-normal"] == "5"
    assert depths["queued-low"] == "2"
    assert depths["scheduled"] == "1"
    assert depths["running"] == "1"
    assert "Processor count" in shown["text"]
    assert "queue fleet" in shown["text"]
    # Names from Redis are text, never markup; the page's policy blocked nothing of its own.
    assert HOSTILE_NAME in shown["jobNames"]
    assert shown["injected"] == 0
    assert shown["title"] == "streamkit · fleet"
    assert not [m for m in shown["console"] if "Content Security Policy" in m], shown["console"]

    from PIL import Image

    with Image.open(screenshot) as image:
        assert list(image.size) == [round(v) for v in shown["viewport"]]
        pixels = image.convert("RGB")
        colors = pixels.getcolors(maxcolors=1 << 20) or []
        # Not blank: the page's header (dark), cards (white), text and chart colours.
        assert len(colors) > 50, len(colors)
        header = pixels.getpixel((5, 5))
        assert isinstance(header, tuple)
        assert sum(header[:3]) < 150  # the dark header bar was drawn
        body = pixels.getpixel((image.width // 2, image.height - 5))
        assert isinstance(body, tuple)
        assert sum(body[:3]) > 600  # a light page below it


async def test_a_job_of_a_named_queue_is_shown_and_counted(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dashboard finds a job on the named queue it was routed to, and counts it on
    its name's row, as ``streamkit jobs show`` and ``status`` do."""
    from tests.apps import routed

    monkeypatch.setattr(
        routed.app, "settings", attrs.evolve(routed.app.settings, redis_url=redis_url)
    )
    async with routed.app:
        frame = await routed.render.delay(3)
    async with serving_dashboard(redis_url, "tests.apps.routed:app", "--interval", "0.2") as line:
        url = line.split(" on ", 1)[1].split()[0]
        status, job = await get_json(f"{url}/api/jobs/{frame.id}")
        assert status == 200, job
        assert job["name"] == "render"

        async def counted() -> bool:
            _, doc = await get_json(f"{url}/api/status")
            jobs = doc.get("jobs") or {}
            return bool(jobs) and "render" in str(jobs) and doc["error"] is None

        await wait_until(counted, what="the status read", within=20)
        _, doc = await get_json(f"{url}/api/status")
        assert doc["jobs"]["by_name"]["render"]["queued"] == 1, doc["jobs"]
