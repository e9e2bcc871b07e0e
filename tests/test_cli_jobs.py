"""``streamkit jobs``: info, show, abort and the dead-letter queue, on real jobs.

Jobs are made through the API (``tests.apps.jobbing``) and run by the queue's own
``serve`` in this process; the command runs as a real subprocess against the same
private Redis.
"""

from __future__ import annotations

import asyncio
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncclick as click
import attrs
import orjson
import pytest
import trio

from streamkit import ConfigError
from streamkit._cli import cli
from streamkit.jobs import JobCall, JobNotFound, JobStatus, open_job_queue
from streamkit.jobs._inspect import _DEAD_CHUNK as DEAD_CHUNK
from streamkit.testing import free_port, wait_until
from tests.apps import jobbing
from tests.test_cli import Result, assert_no_traceback, signalled_while_paused, streamkit

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from streamkit import App, Redis
    from streamkit.jobs import JobHandle, JobQueue

APP = "tests.apps.jobbing:app"


@pytest.fixture
async def app(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[App]:
    """The jobbing app, connected to the test's Redis (the command finds it there too)."""
    monkeypatch.setattr(
        jobbing.app, "settings", attrs.evolve(jobbing.app.settings, redis_url=redis_url)
    )
    async with jobbing.app:
        yield jobbing.app


async def run_until(queue: JobQueue, condition_name: str, condition: Callable[[], object]) -> None:
    """Serve ``queue`` until ``condition()`` holds, then stop serving."""
    async with trio.open_nursery() as nursery:
        await nursery.start(queue.serve)
        await wait_until(condition, what=condition_name, within=10)
        nursery.cancel_scope.cancel()


async def make_dead(queue: JobQueue, count: int) -> list[JobHandle[Any]]:
    """``count`` dead explode jobs, run (and failed) by a worker."""
    handles = await jobbing.explode.enqueue_many(
        JobCall(args=(n,), kwargs={"why": "no reason"}) for n in range(count)
    )

    async def all_dead() -> bool:
        return (await queue.counts()).dead >= count

    await run_until(queue, f"{count} dead jobs", all_dead)
    return handles


def table_rows(out: str) -> list[list[str]]:
    lines = [line for line in out.splitlines() if line.startswith("│")]
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines]


def one_line_error(result: Result, code: int) -> str:
    assert result.code == code, (result.out, result.err)
    assert_no_traceback(result)
    message = result.err.strip()
    assert message.startswith("Error: "), message
    assert "\n" not in message, message
    return message


async def test_info_counts_by_status_priority_and_name(app: App, redis_url: str) -> None:
    with trio.fail_after(30):
        queue = app.job_queue
        await make_dead(queue, 2)
        done = await jobbing.add.delay(1, 2)

        async def succeeded() -> bool:
            return await done.status() is JobStatus.SUCCESS

        await run_until(queue, "one job succeeded", succeeded)
        # Now, with no worker: queued at two priorities, delayed, and waiting.
        await jobbing.add.enqueue(1, 1, priority="high")
        await jobbing.add.enqueue(2, 2, priority="high")
        await jobbing.add.enqueue(3, 3, priority="low")
        later = await jobbing.add.enqueue(4, 4, delay=600)
        await jobbing.add.enqueue(5, 5, after=[later])

        text = await streamkit("jobs", "info", APP, redis_url=redis_url)
        as_json = await streamkit("jobs", "info", APP, "--json", redis_url=redis_url)
    assert text.code == 0, text.err
    assert f"queue jobbing (app jobbing, 1 shard), Redis at {redis_url}" in text.out
    rows = {row[0]: row[1:] for row in table_rows(text.out)}
    assert rows["queued, high priority"] == ["2"]
    assert rows["queued, normal priority"] == ["0"]
    assert rows["queued, low priority"] == ["1"]
    assert rows["scheduled (delayed)"] == ["1"]
    assert rows["waiting for other jobs"] == ["1"]
    assert rows["running"] == ["0"]
    assert rows["dead"] == ["2"]
    assert rows["succeeded (total)"] == ["1"]
    assert rows["add"] == ["3 queued, 1 scheduled, 1 waiting, 1 succeeded"]
    assert rows["explode"] == ["2 dead"]
    assert rows["crawl"] == ["none"]  # declared, never enqueued
    assert max(len(line) for line in text.out.splitlines()) <= 80

    assert as_json.code == 0, as_json.err
    report = orjson.loads(as_json.out)
    assert report["queue"] == report["app"] == "jobbing"
    assert report["shards"] == 1
    assert report["counts"] == {
        "queued": {"high": 2, "normal": 0, "low": 1},
        "scheduled": 1,
        "waiting": 1,
        "running": 0,
        "retrying": 0,
        "held": 0,
        "dead": 2,
        "succeeded": 1,
        "aborted": 0,
        "expired": 0,
        "pending": 5,
    }
    assert report["by_name"]["explode"]["dead"] == 2
    assert report["by_name"]["add"]["queued"] == 3
    assert set(report["by_name"]) == {"add", "crawl", "explode", "flaky"}


async def test_show_a_dead_job_with_its_traceback(app: App, redis_url: str) -> None:
    with trio.fail_after(30):
        [dead] = await make_dead(app.job_queue, 1)
        text = await streamkit("jobs", "show", APP, dead.id, redis_url=redis_url)
        as_json = await streamkit("jobs", "show", APP, dead.id, "--json", redis_url=redis_url)
    assert text.code == 0, text.err
    assert text.out.startswith(f"job {dead.id} of queue jobbing\n")
    fields = dict(
        line.strip().split(None, 1)
        for line in text.out.splitlines()[1:]
        if line.startswith("  ") and not line.startswith("    ")
    )
    assert fields["status"] == "dead (in the dead-letter queue)"
    assert fields["call"] == "explode(0, why='no reason')"
    assert fields["tries"] == "1 of 1"
    assert fields["error"] == "ValueError: explode 0: no reason"
    assert fields["finished"].endswith("ago)")
    assert fields["worker"] != "-"
    assert "traceback of the last failed try:" in text.out
    assert 'raise ValueError(f"explode {n}: {why}")' in text.out
    assert "tests/apps/jobbing.py" in text.out

    assert as_json.code == 0, as_json.err
    info = orjson.loads(as_json.out)
    assert info["id"] == dead.id
    assert info["status"] == "dead"
    assert info["name"] == "explode"
    assert (info["args"], info["kwargs"]) == ([0], {"why": "no reason"})
    assert (info["tries"], info["max_tries"]) == (1, 1)
    assert info["error"]["type"] == "ValueError"
    assert info["error"]["message"] == "explode 0: no reason"
    assert "Traceback (most recent call last)" in info["error"]["traceback"]
    assert info["finished_at"].endswith("+00:00")


async def test_show_progress_and_abort_a_running_job(app: App, redis_url: str) -> None:
    queue = app.job_queue
    with trio.fail_after(30):
        running = await jobbing.crawl.delay(10)
        async with trio.open_nursery() as nursery:
            await nursery.start(queue.serve)

            async def reported() -> bool:
                return (await running.info()).progress is not None

            await wait_until(reported, what="the job reported progress", within=10)
            shown = await streamkit("jobs", "show", APP, running.id, redis_url=redis_url)
            assert shown.code == 0, shown.err
            assert "status    executing (running now)" in shown.out
            assert "progress  50% page 5 of 10" in shown.out
            worker = (await running.info()).worker
            assert f"worker    {worker}" in shown.out

            aborted = await streamkit("jobs", "abort", APP, running.id, redis_url=redis_url)
            assert aborted.code == 0, aborted.err
            assert aborted.out.strip() == (
                f"job {running.id} (crawl) is running on {worker}: its worker cancels it "
                "within a second, and it ends aborted"
            )

            async def ended() -> bool:
                return await running.status() is JobStatus.ABORTED

            await wait_until(ended, what="the worker cancelled the job", within=10)
            nursery.cancel_scope.cancel()
        after = await streamkit("jobs", "show", APP, running.id, redis_url=redis_url)
        again = await streamkit("jobs", "abort", APP, running.id, redis_url=redis_url)
    assert "status    aborted\n" in after.out
    assert "error     Aborted: aborted by streamkit jobs abort" in after.out
    assert again.code == 0, again.err
    assert again.out.strip() == (
        f"job {running.id} (crawl) already ended aborted; nothing to abort"
    )


async def test_abort_a_queued_job_with_a_reason(app: App, redis_url: str) -> None:
    with trio.fail_after(30):
        later = await jobbing.add.enqueue(1, 2, delay=600)
        waiting = await jobbing.add.enqueue(3, 4, after=[later])
        result = await streamkit(
            "jobs", "abort", APP, later.id, "--reason", "not needed", redis_url=redis_url
        )
        assert result.code == 0, result.err
        assert result.out.strip() == f"aborted job {later.id} (add)"
        info = await later.info()
        assert info.status is JobStatus.ABORTED
        assert info.error is not None
        assert (info.error.type, info.error.message) == ("Aborted", "not needed")
        # The job that waited for it can never run: it ended dead.
        assert await waiting.status() is JobStatus.DEAD


async def test_unknown_job_is_one_line_and_exit_code_1(app: App, redis_url: str) -> None:
    results: dict[str, Result] = {}

    async def run(name: str, *args: str) -> None:
        results[name] = await streamkit(*args, redis_url=redis_url)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "show", "jobs", "show", APP, "nope")
            nursery.start_soon(run, "abort", "jobs", "abort", APP, "nope")
            nursery.start_soon(run, "queue", "jobs", "show", "--queue", "jobbing", "nope")
    for result in results.values():
        message = one_line_error(result, 1)
        assert "no job 'nope' on queue 'jobbing'" in message


async def test_dlq_list_replay_and_purge(app: App, redis: Redis, redis_url: str) -> None:
    queue = app.job_queue
    with trio.fail_after(30):
        await make_dead(queue, 3)
        # Oldest first: in the order they failed (they ran concurrently).
        first, second, third = [queue.handle(i.id) for i in await queue.dead_letters()]
        listed = await streamkit("jobs", "dlq", "list", APP, redis_url=redis_url)
        limited = await streamkit("jobs", "dlq", "list", APP, "--limit", "2", redis_url=redis_url)
        as_json = await streamkit(
            "jobs", "dlq", "list", APP, "--limit", "2", "--json", redis_url=redis_url
        )
    assert listed.code == 0, listed.err
    rows = table_rows(listed.out)
    assert [row[0] for row in rows if row[0]] == [first.id, second.id, third.id]
    assert all(row[1:2] == ["explode"] for row in rows if row[0])
    assert all(row[3] == "1/1" for row in rows if row[0])
    errors = " ".join(" ".join(row[4] for row in rows).split())
    for n in range(3):
        assert f"ValueError: explode {n}: no reason" in errors
    assert "showing 2 of 3 dead jobs; pass --limit 3 to see them all" in limited.out
    report = orjson.loads(as_json.out)
    assert report["total"] == 3
    assert [job["id"] for job in report["jobs"]] == [first.id, second.id]
    assert report["jobs"][0]["error"]["type"] == "ValueError"

    with trio.fail_after(30):
        refused = await streamkit("jobs", "dlq", "replay", APP, redis_url=redis_url)
        assert refused.code == 1
        assert "Replay all 3 dead job(s) of queue jobbing" in refused.err
        assert "nothing was replayed" in refused.err
        assert (await queue.counts()).dead == 3

        replayed = await streamkit(
            "jobs", "dlq", "replay", APP, "--id", second.id, "--yes", redis_url=redis_url
        )
        assert replayed.code == 0, replayed.err
        assert replayed.out.strip() == (
            "replayed 1 dead job(s) of queue jobbing, queued again with their tries reset"
        )
        info = await second.info()
        assert (info.status, info.tries) == (JobStatus.SENT, 0)
        assert info.replayed_at is not None
        assert info.finished_at is None
        shown = await streamkit("jobs", "show", APP, second.id, redis_url=redis_url)
        history = shown.out[shown.out.index("history") :]
        # its first life, then the replay, in time order
        assert history.index("try 1 of 1 failed") < history.index(
            "replayed from the dead letters (tries begin again)"
        )

        purged = await streamkit("jobs", "dlq", "purge", APP, "-y", redis_url=redis_url)
        assert purged.code == 0, purged.err
        assert purged.out.strip() == "purged 2 dead job(s) of queue jobbing"
        for gone in (first, third):
            with pytest.raises(JobNotFound):
                await gone.info()
        counts = await queue.counts()
        assert (counts.dead, counts.queued["normal"]) == (0, 1)

        empty = await streamkit("jobs", "dlq", "list", APP, redis_url=redis_url)
        assert empty.out.strip() == "queue jobbing has no dead jobs"
        nothing = await streamkit("jobs", "dlq", "purge", APP, "--yes", redis_url=redis_url)
        assert nothing.code == 0, nothing.err
        assert nothing.out.strip() == "queue jobbing has no dead jobs; nothing was purged"


async def test_replay_resets_the_tries(app: App, redis_url: str) -> None:
    queue = app.job_queue
    with trio.fail_after(30):
        job = await jobbing.flaky.delay(7)

        async def dead() -> bool:
            return await job.status() is JobStatus.DEAD

        await run_until(queue, "the flaky job dead after its 2 tries", dead)
        assert (await job.info()).tries == 2
        replayed = await streamkit("jobs", "dlq", "replay", APP, "--yes", redis_url=redis_url)
        assert "replayed 1 dead job(s)" in replayed.out
        assert (await job.info()).tries == 0
        # Both tries run again (with a try count from zero, not 3 of 2).
        await run_until(queue, "the flaky job dead again", dead)
        info = await job.info()
        assert (info.tries, info.max_tries) == (2, 2)
        assert info.error is not None
        assert info.error.message == "flaky 7"


async def test_dlq_ids_that_are_not_dead_change_nothing(app: App, redis_url: str) -> None:
    queue = app.job_queue
    with trio.fail_after(30):
        [dead] = await make_dead(queue, 1)
        queued = await jobbing.add.delay(1, 1)
        results = [
            await streamkit(
                "jobs",
                "dlq",
                action,
                APP,
                "--id",
                dead.id,
                "--id",
                queued.id,
                "--id",
                "nope",
                "--yes",
                redis_url=redis_url,
            )
            for action in ("replay", "purge")
        ]
        for result, done in zip(results, ("replayed", "purged"), strict=True):
            message = one_line_error(result, 2)
            assert f"not dead jobs of queue jobbing: {queued.id} (sent), nope (no such job)" in (
                message
            )
            assert f"`streamkit jobs dlq list {APP}` lists the dead ones" in message
            assert message.endswith(f"nothing was {done}")
        assert await dead.status() is JobStatus.DEAD
        assert await queued.status() is JobStatus.SENT


async def test_many_dead_jobs_in_chunks(app: App, redis_url: str) -> None:
    queue = app.job_queue
    with trio.fail_after(30):
        [cause] = await make_dead(queue, 1)
        # Jobs that depend on a dead job end dead as they are enqueued: many, fast.
        await jobbing.add.enqueue_many(JobCall(args=(n, n), after=[cause]) for n in range(1200))
        assert (await queue.counts()).dead == 1201
        replayed = await streamkit("jobs", "dlq", "replay", APP, "--yes", redis_url=redis_url)
        assert replayed.code == 0, replayed.err
        assert replayed.out.startswith("replayed 1,201 dead job(s) of queue jobbing")
        counts = await queue.counts()
        assert (counts.dead, counts.queued["normal"]) == (0, 1201)


async def test_a_signal_stops_the_replay_between_two_steps(
    app: App, redis: Redis, redis_url: str
) -> None:
    queue = app.job_queue
    with trio.fail_after(60):
        [cause] = await make_dead(queue, 1)
        await jobbing.add.enqueue_many(JobCall(args=(n, n), after=[cause]) for n in range(4000))
    result = await signalled_while_paused(
        redis,
        "jobs",
        "dlq",
        "replay",
        APP,
        "--yes",
        redis_url=redis_url,
        pause_after=b"replaying 4,001 dead job(s)",
        said=[b"SIGINT: stopping after the step in flight"],
    )
    assert result.code == 130, result.err
    assert_no_traceback(result)
    # Steps of DEAD_CHUNK jobs (one script each): the one in flight finished, no other
    # began.
    found = re.search(r"stopped by SIGINT: replayed ([\d,]+) of 4,001 dead job\(s\)", result.err)
    assert found is not None, result.err
    replayed = int(found[1].replace(",", ""))
    assert replayed % DEAD_CHUNK == 0
    assert DEAD_CHUNK <= replayed < 4001
    assert "queue jobbing; the others are untouched" in result.err
    counts = await queue.counts()
    assert (counts.dead, counts.queued["normal"]) == (4001 - replayed, replayed)


async def test_a_queue_without_an_app(redis: Redis, redis_url: str) -> None:
    """--queue NAME (and --shards) for a queue opened with open_job_queue."""
    with trio.fail_after(30):
        async with open_job_queue(redis, "loose", shards=4) as queue:

            @queue.job(retries=0)
            async def boom(n: int) -> None:
                raise ValueError(f"boom {n}")

            await boom.enqueue_many((n,) for n in range(8))

            async def dead() -> bool:
                return (await queue.counts()).dead == 8

            await run_until(queue, "8 dead jobs over 4 shards", dead)
            [some] = await queue.dead_letters(limit=1)
            where = ("--queue", "loose", "--shards", "4", "--redis-url", redis_url)
            info = await streamkit("jobs", "info", *where, "--json", redis_url="redis://unused")
            shown = await streamkit("jobs", "show", some.id, *where, redis_url="redis://unused")
            listed = await streamkit(
                "jobs", "dlq", "list", *where, "--json", redis_url="redis://unused"
            )
            replayed = await streamkit(
                "jobs", "dlq", "replay", *where, "--yes", redis_url="redis://unused"
            )
            assert (await queue.counts()).queued["normal"] == 8
    report = orjson.loads(info.out)
    assert (report["queue"], report["app"], report["shards"]) == ("loose", None, 4)
    assert "has nothing in this Redis" not in info.err  # (a queue that is there)
    # A mistyped name is said so, not shown as an empty queue (which it also is).
    typo = await streamkit("jobs", "info", "--queue", "lose", "--json", redis_url=redis_url)
    assert typo.code == 0, typo.err
    assert "note: queue lose (1 shard) has nothing in this Redis" in typo.err
    assert orjson.loads(typo.out)["counts"]["dead"] == 0
    assert report["counts"]["dead"] == 8
    assert shown.code == 0, shown.err
    assert f"job {some.id} of queue loose" in shown.out
    assert "error     ValueError: boom" in shown.out
    assert orjson.loads(listed.out)["total"] == 8
    assert len(orjson.loads(listed.out)["jobs"]) == 8
    assert replayed.out.strip() == (
        "replayed 8 dead job(s) of queue loose, queued again with their tries reset"
    )


async def run_cases(redis_url: str, cases: dict[str, tuple[int, list[str], str]]) -> None:
    """Run ``streamkit jobs ARGS`` per case, concurrently; each fails with one line."""
    results: dict[str, Result] = {}

    async def run(name: str, args: list[str]) -> None:
        results[name] = await streamkit("jobs", *args, redis_url=redis_url)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for name, (_, args, _) in cases.items():
                nursery.start_soon(run, name, args)
    for name, (code, _, expected) in cases.items():
        message = one_line_error(results[name], code)
        assert expected in message, (name, message)


async def test_a_bad_queue_is_one_line_never_a_traceback(redis_url: str) -> None:
    unreachable = f"redis://127.0.0.1:{free_port()}"
    cases = {
        "unknown module": (2, ["info", "tests.apps.nope:app"], "cannot import 'tests.apps.nope'"),
        "not an app": (2, ["info", "tests.apps.jobbing:add"], "is a Job, not a streamkit App"),
        "no jobs": (
            2,
            ["info", "tests.apps.failing:app"],
            "app failing declares no jobs (@app.job), and its queue failing holds none",
        ),
        "no dead jobs, no jobs": (
            2,
            ["dlq", "list", "tests.apps.failing:app"],
            "app failing declares no jobs (@app.job), and its queue failing holds none",
        ),
        "no events, no jobs": (
            2,
            ["events", "tests.apps.failing:app"],
            "app failing declares no jobs (@app.job), and its queue failing holds none",
        ),
        "no queue": (2, ["info"], "give MODULE:APP (an app that declares jobs), or --queue"),
        "both": (2, ["info", APP, "--queue", "jobbing"], "give MODULE:APP or --queue NAME, not"),
        "bad queue name": (2, ["info", "--queue", "no{good}"], "--queue: must be letters"),
        "shards with an app": (2, ["info", APP, "--shards", "2"], "--shards goes with --queue"),
        # exit code 1, a ConfigError raised while reading
        "bad cursor": (2, ["events", APP, "--after", "garbage"], "--after: must be a cursor"),
        "bad cursor, no redis": (
            2,
            ["events", APP, "--after", "1-0,2-0", "--redis-url", unreachable],
            "cursor of this queue's 1 shard(s), got '1-0,2-0'",
        ),
        "no redis": (
            1,
            ["info", APP, "--redis-url", unreachable],
            f"Redis at {unreachable} is unavailable",
        ),
    }
    await run_cases(redis_url, cases)


async def test_a_bad_job_id_is_one_line_never_a_traceback(redis_url: str) -> None:
    cases = {
        "no id": (2, ["show", APP], "missing the job ID"),
        "no id with --queue": (2, ["show", "--queue", "jobbing"], "missing the job ID"),
        "empty id": (2, ["abort", APP, ""], "the job ID is empty"),
        "empty --id": (2, ["dlq", "purge", APP, "--id", "", "--yes"], "--id: a job id is not"),
    }
    await run_cases(redis_url, cases)


async def test_show_a_jobs_history_try_by_try(app: App, redis_url: str) -> None:
    queue = app.job_queue
    with trio.fail_after(30):
        handle = await jobbing.flaky.delay(7)  # fails every try; one retry

        async def dead() -> bool:
            return await handle.status() is JobStatus.DEAD

        await run_until(queue, "the flaky job dead", dead)
        text = await streamkit("jobs", "show", APP, handle.id, redis_url=redis_url)
        as_json = await streamkit("jobs", "show", APP, handle.id, "--json", redis_url=redis_url)
    assert as_json.code == 0, as_json.err
    info = orjson.loads(as_json.out)
    worker = info["worker"]
    assert [try_["outcome"] for try_ in info["history"]] == ["retry", "dead"]
    assert [event["text"] for event in info["timeline"]] == [
        "enqueued (normal priority)",
        f"try 1 of 2 started on {worker}",
        "try 1 of 2 failed; tried again (RuntimeError)",
        f"try 2 of 2 started on {worker}",
        "try 2 of 2 failed; no try left (RuntimeError)",
        "ended dead: RuntimeError: flaky 7",
    ]
    assert text.code == 0, text.err
    assert "  history   oldest first\n" in text.out
    assert "failed; tried again (RuntimeError)" in text.out


def shown_jobs_commands() -> list[tuple[str, list[str]]]:
    """The ``streamkit jobs`` command lines of the docs' console blocks, as arguments:
    an optional part given (``[--id JOB_ID ...]`` as ``--id JOB_ID``), a placeholder
    (``JOB_ID``, ``N``) as a value, comments left out."""
    root = Path(__file__).parent.parent
    shown: list[tuple[str, list[str]]] = []
    for page in (root / "README.md", root / "docs" / "jobs.md", root / "docs" / "cli.md"):
        for block in re.findall(r"```console\n(.*?)```", page.read_text(), re.DOTALL):
            for line in block.splitlines():
                if line.startswith("streamkit jobs "):
                    args = shlex.split(line, comments=True)[1:]
                    args = [a.strip("[]") for a in args if a.strip("[]") not in ("", "...")]
                    args = ["1" if a == "N" else a for a in args]
                    shown.append((f"{page.name}: {line}", args))
    return shown


async def test_the_jobs_commands_the_docs_show_are_the_commands_syntax() -> None:
    # jobs.md showed `jobs dlq replay shop:app [JOB_ID ...]`: the command takes --id.
    shown = shown_jobs_commands()
    assert any("dlq replay" in line for line, _ in shown)
    for line, args in shown:
        command: click.Command = cli
        context: click.Context | None = None
        try:
            while isinstance(command, click.Group):  # (no group options in these lines)
                context = await command.make_context(
                    command.name, [], parent=context, resilient_parsing=True
                )
                found = command.get_command(context, args[0])
                assert found is not None, f"{line}: no command {args[0]!r}"
                command, args = found, args[1:]
            await command.make_context(command.name, args, parent=context)
        except click.UsageError as exc:
            pytest.fail(f"{line}: {exc.format_message()}")


async def test_the_app_views_find_a_job_on_its_named_queue(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job routed to a named queue is counted on its row by ``status`` and ``jobs
    info`` of the app, found by ``jobs show`` of the app, and reached by the clients'
    ``handle(job_id, queue=...)``; where it is not looked for, the error says where."""
    from tests.apps import routed

    monkeypatch.setattr(
        routed.app, "settings", attrs.evolve(routed.app.settings, redis_url=redis_url)
    )
    async with routed.app:
        await routed.add.delay(1, 2)
        frame = await routed.render.delay(3)
    path = "tests.apps.routed:app"

    status = await streamkit("status", path, redis_url=redis_url)
    assert status.code == 0, status.err
    rows = {line.split()[0]: line.split()[1:] for line in status.out.splitlines() if line}
    assert rows["render"][0] == "1", status.out
    assert rows["add"][0] == "1", status.out

    info = await streamkit("jobs", "info", path, "--json", redis_url=redis_url)
    assert info.code == 0, info.err
    report = orjson.loads(info.out)
    assert report["named_queues"] == ["routed.gpu"]
    assert report["by_name"]["render"]["queued"] == 1
    assert report["counts"]["queued"]["normal"] == 2
    text = await streamkit("jobs", "info", path, redis_url=redis_url)
    assert "with its named queue routed.gpu, counted together" in text.out
    assert re.search(r"render\s+│ 1 queued", text.out), text.out

    shown = await streamkit("jobs", "show", path, frame.id, redis_url=redis_url)
    assert shown.code == 0, shown.err
    assert f"job {frame.id} of queue routed.gpu" in shown.out
    missing = await streamkit("jobs", "show", path, "nope", redis_url=redis_url)
    assert missing.code == 1
    assert "not on the app's named queue routed.gpu either" in missing.err
    elsewhere = await streamkit("jobs", "show", "--queue", "routed", frame.id, redis_url=redis_url)
    assert elsewhere.code == 1
    assert "--queue routed.QUEUE" in elsewhere.err
    assert_no_traceback(elsewhere)

    def with_blocking() -> None:
        with routed.app.blocking() as client:
            assert client.handle(frame.id, queue="gpu").status() is JobStatus.SENT
            with pytest.raises(JobNotFound, match=r"handle\(job_id, queue='gpu'\)"):
                client.handle(frame.id).status()
            with pytest.raises(ConfigError, match="has no queue 'cpu' \\(known: default, gpu\\)"):
                client.handle(frame.id, queue="cpu")

    async def with_asyncio() -> None:
        async with routed.app.asyncio() as client:
            assert await client.handle(frame.id, queue="gpu").status() is JobStatus.SENT
            info = await client.handle(frame.id, queue="gpu").info()
            assert info.name == "render"
            with pytest.raises(JobNotFound, match="named queue gpu"):
                await client.handle(frame.id).info()

    await trio.to_thread.run_sync(with_blocking)
    await trio.to_thread.run_sync(lambda: asyncio.run(with_asyncio()))
