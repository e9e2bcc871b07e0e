"""Logs: the context fields, the console and JSON formats, and what a real worker
writes with ``--log-format json`` (every line JSON, a processor's exception once with
its traceback, no line per event)."""

from __future__ import annotations

import io
import logging
import os
import signal
import socket
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import pytest
import trio

from streamkit import Backoff, ConfigError, ProcessorKeys, _logs, configure_logging, log_context
from streamkit._logs import line_for_signal_handler
from streamkit.jobs import JobFailed, open_job_queue
from streamkit.lowlevel import read_membership
from streamkit.testing import wait_until
from tests.apps import logged
from tests.jobs_serving import serving
from tests.workers import start_worker, wait_members

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from streamkit import Redis
    from tests.workers import WorkerProcess

HERE = f"{socket.gethostname()}:{os.getpid()}"

log = logging.getLogger("streamkit.test_logs")


@pytest.fixture
def captured() -> Iterator[Callable[..., io.StringIO]]:
    """``configure_logging(...)`` into a string; the loggers restored afterwards."""
    root = logging.getLogger()
    coredis = logging.getLogger("coredis")
    levels = (root.level, coredis.level)
    installed: list[logging.Handler] = []

    def configure(format: str, *, label: str | None = None, level: str = "debug") -> io.StringIO:  # noqa: A002
        out = io.StringIO()
        installed.append(configure_logging(level, format=format, label=label, stream=out))  # type: ignore[arg-type]
        return out

    yield configure
    for handler in installed:
        root.removeHandler(handler)
    root.setLevel(levels[0])
    coredis.setLevel(levels[1])
    _logs._installed = None
    _logs._format = "console"


def json_lines(out: io.StringIO) -> list[dict[str, Any]]:
    """Every line of ``out`` as JSON (failing on a line that is not)."""
    records = []
    for line in out.getvalue().splitlines():
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}")
    return records


def raise_and_log(message: str) -> None:
    try:
        raise ZeroDivisionError("the cause")
    except ZeroDivisionError:
        log.exception(message)


# ---------------------------------------------------------------------- formats


def test_json_lines_carry_time_level_logger_message_and_the_context(
    captured: Callable[..., io.StringIO],
) -> None:
    out = captured("json")
    with log_context(processor="orders", member="m-1"):
        with log_context(partition=3):
            raise_and_log("failed on\ntwo lines")
        log.info("outside the partition")
    log.warning("no context: %d", 7)

    failed, outside, plain = json_lines(out)
    assert list(failed)[:4] == ["time", "level", "logger", "message"]
    assert failed["level"] == "ERROR"
    assert failed["logger"] == "streamkit.test_logs"
    assert failed["message"] == "failed on\ntwo lines"
    assert (failed["worker"], failed["processor"], failed["member"]) == (HERE, "orders", "m-1")
    assert failed["partition"] == 3
    # The traceback: one string field, the last one, with the file and line.
    assert list(failed)[-1] == "traceback"
    assert failed["traceback"].startswith("Traceback (most recent call last):")
    assert 'raise ZeroDivisionError("the cause")' in failed["traceback"]
    assert failed["traceback"].endswith("ZeroDivisionError: the cause")
    moment = datetime.fromisoformat(failed["time"])
    assert failed["time"].endswith("Z")
    assert moment.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - moment) < timedelta(minutes=1)

    assert (outside["processor"], outside["member"]) == ("orders", "m-1")
    assert "partition" not in outside
    assert "traceback" not in outside
    assert (plain["level"], plain["message"], plain["worker"]) == ("WARNING", "no context: 7", HERE)
    assert not {"processor", "partition", "member", "queue", "job", "job_id"} & set(plain)


def test_extra_fields_win_over_the_context(captured: Callable[..., io.StringIO]) -> None:
    out = captured("json")
    with log_context(partition=3, queue="mail"):
        log.info("moved", extra={"partition": 9, "to": "elsewhere"})
        with log_context(queue="other"):
            log.info("inner")
    moved, inner = json_lines(out)
    assert (moved["partition"], moved["queue"], moved["to"]) == (9, "mail", "elsewhere")
    assert (inner["partition"], inner["queue"]) == (3, "other")


async def test_the_context_reaches_the_tasks_and_threads_started_in_it(
    captured: Callable[..., io.StringIO],
) -> None:
    out = captured("json")

    async def say(what: str) -> None:
        await trio.lowlevel.checkpoint()
        log.info(what)

    async with trio.open_nursery() as nursery:
        with log_context(partition=1):
            nursery.start_soon(say, "child")
            await trio.to_thread.run_sync(log.info, "thread")
        nursery.start_soon(say, "sibling")
    log.info("after")
    partitions = {r["message"]: r.get("partition") for r in json_lines(out)}
    assert partitions == {"child": 1, "thread": 1, "sibling": None, "after": None}


def test_console_lines_show_the_context_compactly(captured: Callable[..., io.StringIO]) -> None:
    out = captured("console", label="worker 2")
    with log_context(processor="orders", member="m-1", partition=3):
        raise_and_log("halting")
    with log_context(queue="mail", job="send_email", job_id="j-1"):
        log.warning("retrying")
    with log_context(processor="orders"):
        log.info("joined")
    log.info("plain")
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(" ERROR   [worker 2] [orders p3] streamkit.test_logs: halting")
    # The traceback follows its line, as usual.
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-4] == "ZeroDivisionError: the cause"
    assert lines[-3].endswith(
        " WARNING [worker 2] [job send_email j-1] streamkit.test_logs: retrying"
    )
    assert lines[-2].endswith(" INFO    [worker 2] [orders] streamkit.test_logs: joined")
    assert lines[-1].endswith(" INFO    [worker 2] streamkit.test_logs: plain")
    # A line starts with the local time: 2026-01-01 12:00:00,123
    datetime.strptime(lines[-1][:19], "%Y-%m-%d %H:%M:%S")


def test_console_lines_show_text_from_outside_literally(
    captured: Callable[..., io.StringIO],
) -> None:
    out = captured("console")
    hostile = "a\nforged\x1b[2J\u202e"
    with log_context(job=hostile, job_id="j\r1"):
        log.warning("failed: %s", hostile)
    try:
        raise ValueError(f"bad {hostile}")
    except ValueError:
        log.exception("caught")
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(
        r" WARNING [job a\nforged\x1b[2J\u202e j\r1] streamkit.test_logs: failed: "
        r"a\nforged\x1b[2J\u202e"
    )
    # A traceback keeps its lines; no control character reaches the output raw.
    assert lines[-1] == r"forged\x1b[2J\u202e"
    assert not any(c in out.getvalue() for c in "\x1b\r\u202e")


def test_configure_logging_replaces_its_own_handler(captured: Callable[..., io.StringIO]) -> None:
    first = captured("console")
    second = captured("json", level="warning")
    log.info("hidden")
    log.warning("shown")
    assert first.getvalue() == ""
    assert [r["message"] for r in json_lines(second)] == ["shown"]
    assert _logs.current_format() == "json"
    with pytest.raises(ConfigError, match="log_format: must be one of console, json"):
        configure_logging(format="xml")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="log_level: unknown level 'loud'"):
        configure_logging("loud")


def test_a_signal_handlers_line_follows_the_format(captured: Callable[..., io.StringIO]) -> None:
    captured("console")
    assert line_for_signal_handler("stopping", logger="streamkit.worker") == b"stopping\n"
    captured("json")
    line = line_for_signal_handler("stopping", logger="streamkit.worker")
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    record = orjson.loads(line)
    assert {k: record[k] for k in ("level", "logger", "message", "worker")} == {
        "level": "WARNING",
        "logger": "streamkit.worker",
        "message": "stopping",
        "worker": HERE,
    }


# ---------------------------------------------------------------------- jobs


async def test_a_failing_job_is_logged_once_per_try_with_its_traceback(
    redis: Redis, captured: Callable[..., io.StringIO]
) -> None:
    out = captured("json", level="info")
    async with open_job_queue(redis, "work", lease_ttl=1.0) as queue:

        @queue.job(retries=1, backoff=Backoff(initial=0.01, jitter=0))
        async def doomed(n: int) -> None:
            raise ValueError(f"no luck with {n}")

        async with serving(queue):
            handle = await doomed.delay(7)
            with pytest.raises(JobFailed):
                await handle.result(timeout=10)
    failures = [r for r in json_lines(out) if "no luck with 7" in orjson.dumps(r).decode()]
    assert [r["level"] for r in failures] == ["WARNING", "ERROR"]
    retried, dead = failures
    assert "failed on try 1 of 2 (ValueError: no luck with 7); retrying in" in retried["message"]
    assert "failed on try 2 of 2 (ValueError: no luck with 7); it is dead" in dead["message"]
    for record in failures:
        assert (record["queue"], record["job"], record["job_id"]) == ("work", "doomed", handle.id)
        assert 'raise ValueError(f"no luck with {n}")' in record["traceback"]


# ---------------------------------------------------------------------- a real worker

APP = "tests.apps.logged:app"
KEYS = ProcessorKeys(app="logged", stream="items", processor="handle")
EVENTS = 200


def item(n: int) -> logged.Item:
    return logged.Item(key=f"k{n % 10}", n=n)


def worker_records(worker: WorkerProcess) -> list[dict[str, Any]]:
    """Every line the worker wrote (standard output and error), parsed as JSON."""
    return json_lines(io.StringIO(worker.log()))


def mentions(record: dict[str, Any], text: str) -> bool:
    return text in orjson.dumps(record).decode()


@pytest.mark.timeout(60)
async def test_a_json_worker_writes_only_json_lines_with_the_context(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # At debug level: the per-partition lines, the context's carriers here, are detail.
    worker = start_worker(
        redis_url, tmp_path, app=APP, args=("--log-format", "json", "--log-level", "debug")
    )
    workers.append(worker)
    await wait_members(redis, 1, group=KEYS.group)
    snapshot = await read_membership(redis, KEYS.group)
    assert snapshot is not None
    [member] = [m.id for m in snapshot.members]

    bad_partition = logged.items.partition_of(item(logged.BAD))
    processed = [
        n
        for n in range(EVENTS)
        if n < logged.BAD or logged.items.partition_of(item(n)) != bad_partition
    ]
    logged.app.settings = attrs.evolve(logged.app.settings, redis_url=redis_url)
    async with logged.app:
        await logged.items.send_many(item(n) for n in range(EVENTS))
        job = await logged.flaky.delay(1)
        with pytest.raises(JobFailed):
            await job.result(timeout=20)

    async def all_but_the_halted_done() -> bool:
        return int(await redis.get(logged.DONE) or 0) == len(processed)

    await wait_until(all_but_the_halted_done, what="the events before the halt", within=20)
    await wait_until(
        lambda: any(mentions(r, "streamkit resume") for r in worker_records(worker)),
        what="the halt logged",
        within=10,
    )
    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit(within=20) == 0, worker.log()

    records = worker_records(worker)
    name = f"{socket.gethostname()}:{worker.pid}"
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record), record
        assert record["worker"] == name, record

    # The processor's exception: once, with its traceback, in its partition's context.
    [failed] = [r for r in records if mentions(r, "boom on item 13")]
    assert (failed["level"], failed["logger"]) == ("ERROR", "streamkit.policies")
    assert (failed["processor"], failed["partition"], failed["member"]) == (
        "handle",
        bad_partition,
        member,
    )
    assert 'tests/apps/logged.py", line' in failed["traceback"]
    assert 'raise RuntimeError(f"boom on item {item.n}")' in failed["traceback"]
    # What follows, said by the worker without repeating the exception.
    [halted] = [r for r in records if mentions(r, "streamkit resume")]
    assert halted["level"] == "WARNING"
    assert halted["partition"] == bad_partition
    assert f"streamkit resume {APP} handle --partition {bad_partition}" in halted["message"]

    # Each partition's own lines carry it (the rebalancer's, here).
    claims = [r for r in records if r["message"].startswith("claimed partition ")]
    assert sorted(r["partition"] for r in claims) == list(range(logged.items.partition_count))
    for record in claims:
        assert record["message"].startswith(f"claimed partition {record['partition']} ")
        assert (record["processor"], record["member"]) == ("handle", member)

    # The job's failures: a warning for the retried try, an error for the last one.
    tries = [r for r in records if mentions(r, "flaky job 1 fails")]
    assert [r["level"] for r in tries] == ["WARNING", "ERROR"]
    for record in tries:
        assert (record["queue"], record["job"], record["job_id"]) == ("logged", "flaky", job.id)
        assert "traceback" in record

    # No line per event: the info lines are about the worker's life, not its events.
    infos = [r["message"] for r in records if r["level"] == "INFO"]
    assert len(infos) < len(processed) / 4, infos


async def test_a_json_workers_error_is_a_json_line(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(
        "redis://127.0.0.1:1",
        tmp_path,
        app=APP,
        args=("--processors", "nope"),
        env={"STREAMKIT_LOG_FORMAT": "json"},
    )
    workers.append(worker)
    assert await worker.wait_exit(within=20) == 2, worker.log()
    [record] = worker_records(worker)
    assert (record["level"], record["logger"]) == ("ERROR", "streamkit.cli")
    assert "unknown processor 'nope' (known: handle)" in record["message"]


async def test_a_json_workers_crash_is_a_json_line_with_its_traceback(
    redis_url: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(
        redis_url, tmp_path, app="tests.apps.crashing:app", args=("--log-format", "json")
    )
    workers.append(worker)
    assert await worker.wait_exit(within=20) == 1, worker.log()
    records = worker_records(worker)
    [crash] = [r for r in records if mentions(r, "a bug in a background task")]
    assert (crash["level"], crash["logger"]) == ("CRITICAL", "streamkit.cli")
    assert 'tests/apps/crashing.py", line' in crash["traceback"]
