"""``streamkit jobs pause/resume`` and ``streamkit jobs schedules``, as real subprocesses
against the queue of ``tests.apps.jobbing`` on a private Redis."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import orjson
import pytest

from streamkit.jobs import open_job_queue
from tests.apps import jobbing
from tests.test_cli import assert_no_traceback, streamkit

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import App, Redis

APP = "tests.apps.jobbing:app"


@pytest.fixture
async def app(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[App]:
    monkeypatch.setattr(
        jobbing.app, "settings", attrs.evolve(jobbing.app.settings, redis_url=redis_url)
    )
    async with jobbing.app:
        yield jobbing.app


async def test_pause_and_resume_a_job_name_and_the_queue(app: App, redis_url: str) -> None:
    paused = await streamkit("jobs", "pause", APP, "--job", "add", redis_url=redis_url)
    assert paused.code == 0, paused
    assert paused.out.strip() == "paused job add of queue jobbing (paused: add)"
    assert await app.job_queue.paused() == ["add"]
    whole = await streamkit("jobs", "pause", APP, redis_url=redis_url)
    assert whole.out.strip() == "paused queue jobbing (paused: *, add)"
    resumed = await streamkit("jobs", "resume", APP, "--job", "add", redis_url=redis_url)
    assert resumed.code == 0, resumed
    assert resumed.out.strip() == (
        "resumed job add of queue jobbing, 0 held job(s) queued again (still paused: *)"
    )
    again = await streamkit("jobs", "resume", APP, redis_url=redis_url)
    assert again.out.strip() == "resumed queue jobbing"
    assert await app.job_queue.paused() == []
    typo = await streamkit("jobs", "pause", APP, "--job", "ad", redis_url=redis_url)
    assert typo.code == 2, typo
    assert typo.err.strip() == (
        "Error: job: queue 'jobbing' has no job 'ad' (known: add, crawl, explode, flaky)"
    )
    assert await app.job_queue.paused() == []
    # resume refuses the typo as pause does (it said "resumed job ad"); a paused name the
    # app no longer declares is still resumed.
    typo = await streamkit("jobs", "resume", APP, "--job", "ad", redis_url=redis_url)
    assert typo.code == 2, typo
    assert_no_traceback(typo)
    assert typo.err.strip() == (
        "Error: job: queue 'jobbing' has no job 'ad' (known: add, crawl, explode, flaky)"
    )
    queue = app.job_queue
    async with open_job_queue(queue.redis, queue.name, shards=queue.shards) as by_name:
        await by_name.pause("gone")  # (a queue by name alone knows no jobs to check)
    assert await queue.paused() == ["gone"]
    gone = await streamkit("jobs", "resume", APP, "--job", "gone", redis_url=redis_url)
    assert gone.code == 0, gone
    assert await app.job_queue.paused() == []


async def test_pausing_a_queue_by_a_name_redis_knows_nothing_of_needs_force(
    app: App, redis: Redis, redis_url: str
) -> None:
    """A mistyped ``--queue`` is refused (exit code 2, nothing written), as ``jobs info``
    notes it; ``--force`` pauses it anyway (a queue before its first job); a queue
    that is there is paused without it."""
    typo = await streamkit("jobs", "pause", "--queue", "jobbin", redis_url=redis_url)
    assert typo.code == 2, typo
    assert_no_traceback(typo)
    assert "queue jobbin (1 shard) has nothing in this Redis" in typo.err
    assert "--force pauses it anyway" in typo.err
    assert await redis.keys("__jobs:{jobbin*") == set()
    info = await streamkit("jobs", "info", "--queue", "jobbin", redis_url=redis_url)
    assert info.code == 0, info
    assert "note: queue jobbin (1 shard) has nothing in this Redis" in info.err
    forced = await streamkit("jobs", "pause", "--queue", "jobbin", "--force", redis_url=redis_url)
    assert forced.code == 0, forced
    assert forced.out.strip() == "paused queue jobbin (paused: *)"
    await jobbing.add.delay(1, 2)
    known = await streamkit("jobs", "pause", "--queue", "jobbing", redis_url=redis_url)
    assert known.code == 0, known
    assert await app.job_queue.paused() == ["*"]


async def test_schedules_are_set_listed_and_removed(app: App, redis_url: str) -> None:
    set_ = await streamkit(
        "jobs", "schedules", "set", APP, "nightly", "add", "0 3 * * *",
        "--tz", "Europe/Paris", "--args", "[1, 2]", redis_url=redis_url,
    )  # fmt: skip
    assert set_.code == 0, set_
    assert set_.out.startswith("schedule nightly of queue jobbing: add at '0 3 * * *', next ")
    listed = await streamkit("jobs", "schedules", "list", APP, "--json", redis_url=redis_url)
    [schedule] = orjson.loads(listed.out)["schedules"]
    assert {k: schedule[k] for k in ("name", "job", "cron", "tz", "args", "declared")} == {
        "name": "nightly",
        "job": "add",
        "cron": "0 3 * * *",
        "tz": "Europe/Paris",
        "args": [1, 2],
        "declared": False,
    }
    # 03:00 in Paris is 01:00 or 02:00 UTC, by the season
    assert schedule["next_at"].endswith(("T01:00:00+00:00", "T02:00:00+00:00"))
    text = await streamkit("jobs", "schedules", "list", APP, redis_url=redis_url)
    assert text.out.startswith("nightly: add(1, 2) at '0 3 * * *' (Europe/Paris), runtime, next ")
    bad = await streamkit(
        "jobs", "schedules", "set", APP, "x", "add", "0 3 * * *", "--args", "[1]",
        redis_url=redis_url,
    )  # fmt: skip
    assert bad.code == 2
    assert "missing a required argument: 'b'" in bad.err
    assert_no_traceback(bad)
    removed = await streamkit("jobs", "schedules", "remove", APP, "nightly", redis_url=redis_url)
    assert removed.out.strip() == "removed schedule nightly of queue jobbing"
    missing = await streamkit("jobs", "schedules", "remove", APP, "nightly", redis_url=redis_url)
    assert missing.code == 2
    assert "has no schedule 'nightly'" in missing.err
    assert await app.job_queue.schedules() == []


async def test_a_worker_refuses_a_queue_the_app_does_not_have(redis_url: str) -> None:
    result = await streamkit("worker", APP, "--queues", "default,gpu", redis_url=redis_url)
    assert result.code == 2
    assert "unknown job queue 'gpu' (known: default)" in result.err
    assert_no_traceback(result)


async def test_a_schedule_of_a_debounced_job_is_refused_in_one_line(redis_url: str) -> None:
    bad = await streamkit(
        "jobs", "schedules", "set", "tests.apps.debouncing:app", "every", "settle",
        "* * * * * */5", "--args", '["u", 1, "cron"]', redis_url=redis_url,
    )  # fmt: skip
    assert bad.code == 2, bad
    assert bad.err.strip() == (
        "Error: debounce: schedule every: job settle is debounced by its key, and a "
        "schedule enqueues each tick with an id of its own; schedule a job without debounce="
    )
    assert_no_traceback(bad)
