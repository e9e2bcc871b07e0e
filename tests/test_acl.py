"""The Redis users of docs/security.md: each role runs under exactly its ``ACL SETUSER`` line.

The users are created from the page itself, fed to ``redis-cli`` as an administrator
would, on a private server. Each test runs one role the way it runs in production (a
real ``streamkit worker`` process, the command line, the job queue, the Spark data
source's reading and writing code) under its user, checks that the work was done, and
that Redis refused nothing (``ACL LOG``): the page lists everything each role needs.
The last tests take a permission away and check the error: one line naming the
command, also inside a Lua script.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from streamkit import App, NotReplicated, ProcessorKeys, open_redis
from streamkit.jobs import JobFailed, chain, chord
from streamkit.lowlevel import NotPermitted, redis_errors
from streamkit.testing import RedisServer, free_port, wait_until
from tests.apps.acl import Order, make_jobs_app, make_streams_app, orders
from tests.test_cli import streamkit
from tests.workers import WorkerProcess, start_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from streamkit import Redis

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "security.md"
STREAMS_APP = "tests.apps.acl:streams_app"
JOBS_APP = "tests.apps.acl:jobs_app"


def acl_lines() -> dict[str, str]:
    """The page's ``ACL SETUSER`` lines, by user name."""
    lines = [line for line in PAGE.read_text().splitlines() if line.startswith("ACL SETUSER ")]
    return {line.split()[2]: line for line in lines}


def password(user: str) -> str:
    match = re.search(r" >(\S+)", acl_lines()[user])
    assert match is not None
    return match[1]


@pytest.fixture
async def server() -> AsyncIterator[RedisServer]:
    """A private server with the page's users, created with ``redis-cli``."""
    async with trio.open_nursery() as nursery:
        server: RedisServer = await nursery.start(RedisServer().run)
        await create_users(server)
        yield server
        nursery.cancel_scope.cancel()


async def create_users(server: RedisServer) -> None:
    """Feed the page's lines to ``redis-cli``, as an administrator would."""
    script = "\n".join(acl_lines().values()) + "\n"
    done = await trio.run_process(
        ["redis-cli", "-p", str(server.port)],
        stdin=script.encode(),
        capture_stdout=True,
        capture_stderr=True,
    )
    assert done.stdout.decode().split() == ["OK"] * len(acl_lines()), done.stdout


def url_of(server: RedisServer, user: str) -> str:
    return f"redis://{user}:{password(user)}@127.0.0.1:{server.port}"


@pytest.fixture
async def admin(server: RedisServer) -> AsyncIterator[Redis]:
    """The server's default user: every command, to set up and inspect."""
    async with open_redis(server.url) as client:
        yield client


async def refusals(admin: Redis) -> list[str]:
    """What Redis refused since the last call, as ``user: reason object``."""
    raw: Any = await admin.acl_log()
    await admin.acl_log(reset=True)
    found = []
    for entry in raw:
        fields = {text(k): text(v) for k, v in entry.items()}
        found.append(f"{fields['username']}: {fields['reason']} {fields['object']}")
    return found


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def without_config_get(found: list[str]) -> list[str]:
    """Refusals other than the producers' documented ``CONFIG GET proto-max-bulk-len``."""
    return [r for r in found if not r.endswith("command config|get")]


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.close()


# ---------------------------------------------------------------------------- roles


async def test_the_producer_sends_under_its_user(server: RedisServer, admin: Redis) -> None:
    url = url_of(server, "shop-producer")
    # A group that has read everything, so that appends trim what it processed.
    for partition in range(4):
        await admin.xgroup_create(orders.key(partition), "shop.orders.x", "$", mkstream=True)
    app, stream = make_streams_app(redis_url=url)
    async with app:
        await stream.send(Order(key="a", n=0))
        await stream.send_many([Order(key=f"k{i % 7}", n=i) for i in range(300)])
        with pytest.raises(NotReplicated):
            await stream.send(Order(key="a", n=1), replicas=1, replica_timeout=0.05)
    app, capped = make_streams_app(redis_url=url, max_len=30)
    async with app:
        await capped.send_many([Order(key=f"k{i % 7}", n=i) for i in range(200)])
    assert [await admin.xlen(orders.key(p)) for p in range(4)] == [30] * 4
    sent = await streamkit("send", "tests.apps.acl:orders", '{"key": "z", "n": 1}', redis_url=url)
    assert sent.code == 0, sent.err
    lines = b"".join(b'{"key": "y%d", "n": %d}\n' % (i, i) for i in range(20))
    many = await streamkit("sendmany", "tests.apps.acl:orders", "-", redis_url=url, stdin=lines)
    assert many.code == 0, many.err
    assert sum([await admin.xlen(orders.key(p)) for p in range(4)]) == 4 * 30 + 21
    assert without_config_get(await refusals(admin)) == []


@pytest.mark.timeout(120)
async def test_a_worker_runs_under_its_user(
    server: RedisServer, admin: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    producer = url_of(server, "shop-producer")
    url = url_of(server, "shop-worker")
    events = [Order(key=f"k{i % 9}", n=i, fail=i in (17, 18)) for i in range(200)]
    app, stream = make_streams_app(redis_url=producer)
    async with app:
        await stream.send_many(events[:100])
    # An undecodable entry, written as any client could.
    await admin.xadd(orders.key(0), {b"data": b"not json"})

    # Two workers, the first with its metrics endpoint; it is killed mid-way, and the
    # second takes its partitions over (pending entries first).
    first = start_worker(url, tmp_path, app=STREAMS_APP, args=("--metrics-port", "0"))
    workers.append(first)
    second = start_worker(url, tmp_path, app=STREAMS_APP)
    workers.append(second)
    handle = ProcessorKeys(app="shop", stream="orders", processor="handle")

    async def dead_letters(count: int) -> bool:
        return await admin.xlen(handle.dead_letter_key) >= count

    await wait_until(lambda: dead_letters(2), what="2 dead letters", within=60)
    first.kill()
    async with app:
        await stream.send_many(events[100:])
    await wait_until(lambda: dead_letters(3), what="3 dead letters", within=60)

    async def handled_everything() -> bool:
        for partition in range(4):
            groups: Any = await admin.xinfo_groups(orders.key(partition))
            info = next(g for g in groups if g[b"name"] == handle.group.encode())
            if info[b"lag"] != 0 or info[b"pending"] != 0:
                return False
        return True

    await wait_until(handled_everything, what="handle done with every event", within=60)
    # strict halted on the failing events' partition.
    assert await admin.keys("__halt:{shop.orders.*}.strict")
    # The second worker renews its leases (a script of its own) before it stops.
    lease = min(await admin.keys("__lock:{shop.orders.*"))
    ttl_before = await admin.pttl(lease)

    async def renewed() -> bool:
        return await admin.pttl(lease) > ttl_before

    await wait_until(renewed, what=f"a renewal of {lease!r}", within=30)
    second.send_signal(signal.SIGTERM)
    assert await second.wait_exit() == 0, second.log()
    for worker in (first, second):
        assert "NOPERM" not in worker.log()
    # (The producer tried CONFIG GET, as documented; the workers asked for nothing.)
    assert without_config_get(await refusals(admin)) == []


@pytest.mark.timeout(120)
async def test_a_job_queue_runs_under_its_users(
    server: RedisServer, admin: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    enqueuer = url_of(server, "shop-jobs-enqueuer")
    worker = start_worker(url_of(server, "shop-jobs-worker"), tmp_path, app=JOBS_APP)
    workers.append(worker)
    app, double, echo = make_jobs_app(redis_url=enqueuer)
    with trio.fail_after(60):
        async with app:
            doubled = await double.delay(21)
            failing = await double.delay(-1)
            later = await double.enqueue(3, delay=0.2, job_id="later")
            await double.enqueue(3, delay=0.2, job_id="later")  # dedupe
            after = await double.enqueue(4, after=[doubled])
            echoed = await echo.delay("hi")
            aborted = await double.enqueue(5, delay=60)
            await aborted.abort("not needed")
            running = await double.enqueue(99, job_id="long")
            assert await doubled.result(timeout=30) == 42
            assert await later.result(timeout=30) == 6
            assert await after.result(timeout=30) == 8
            assert await echoed.result(timeout=30) == "hi"
            with pytest.raises(JobFailed, match="negative"):
                await failing.result(timeout=30)
            await wait_until(lambda: _started(app, "long"), what="the long job running", within=30)
            await running.abort("stop")
            await (await double.delay(1)).result(timeout=30)
            await doubled.status()
            await doubled.info()
            # Limits (jobs held back and let out), workflows across queues (links and
            # deliveries), failure callbacks.
            limited, render, total = (app.jobs[n] for n in ("limited", "render", "total"))
            held = await limited.enqueue_many([(f"a{i % 2}",) for i in range(6)])
            assert [await h.result(timeout=30) for h in held] == ["a0", "a1"] * 3
            queue = app.job_queue
            flow = chord([render.step(n) for n in range(3)], total.step("frames: "))
            assert await (await queue.enqueue_workflow(flow)).result(timeout=30) == (
                "frames: frame 0, frame 1, frame 2"
            )
            broken = chain(render.step(-1), total.step()).on_failure(echo.step())
            failed = await queue.enqueue_workflow(broken)
            with pytest.raises(JobFailed, match="cannot render"):
                await failed.result(timeout=30)
            await failed.jobs[-1].result(timeout=30)
    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log()
    assert "NOPERM" not in worker.log()
    assert await refusals(admin) == []


async def _started(app: App, job_id: str) -> bool:
    return (await app.job_queue.handle(job_id).status()).value == "executing"


@pytest.mark.timeout(180)
async def test_the_admin_tools_run_under_their_user(
    server: RedisServer, admin: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # Something to administer: events, a dead letter, a halt, jobs (one dead).
    app, stream = make_streams_app(redis_url=server.url)
    async with app:
        await stream.send_many([Order(key=f"k{i}", n=i, fail=i == 3) for i in range(20)])
    worker = start_worker(server.url, tmp_path, app=STREAMS_APP)
    workers.append(worker)
    handle = ProcessorKeys(app="shop", stream="orders", processor="handle")

    async def dead_lettered_and_halted() -> bool:
        return await admin.xlen(handle.dead_letter_key) == 1 and bool(
            await admin.keys("__halt:{shop.orders.*}.strict")
        )

    await wait_until(dead_lettered_and_halted, what="a dead letter and a halt", within=60)
    worker.send_signal(signal.SIGTERM)
    await worker.wait_exit()
    jobs, double, _ = make_jobs_app(redis_url=server.url)
    async with jobs:
        job = await double.delay(-5)
        kept = await double.enqueue(7, delay=300, job_id="kept")
    jobs_worker = start_worker(server.url, tmp_path, app=JOBS_APP)
    workers.append(jobs_worker)

    async def job_dead() -> bool:
        return bool(await admin.xlen("__jobs:{shop.0}:dead"))

    await wait_until(job_dead, what="a dead job", within=60)
    jobs_worker.send_signal(signal.SIGTERM)
    await jobs_worker.wait_exit()
    await refusals(admin)

    url = url_of(server, "shop-admin")
    halted = sorted(await admin.keys("__halt:{shop.orders.*}.strict"))[0].decode()
    partition = halted.split(".")[2].rstrip("}")
    commands = [
        ("status", STREAMS_APP),
        ("deadletters", "list", STREAMS_APP, "handle"),
        ("deadletters", "replay", STREAMS_APP, "handle", "--yes"),
        ("deadletters", "purge", STREAMS_APP, "handle", "--yes"),
        ("resume", STREAMS_APP, "strict", "--partition", partition, "--skip"),
        ("reset", STREAMS_APP, "strict", "--to", "end", "--yes"),
        ("jobs", "info", JOBS_APP),
        ("jobs", "show", JOBS_APP, job.id),
        ("jobs", "dlq", "list", JOBS_APP),
        ("jobs", "dlq", "replay", JOBS_APP, "--yes"),
        ("jobs", "dlq", "purge", JOBS_APP, "--yes"),
        ("jobs", "abort", JOBS_APP, kept.id),
        ("jobs", "pause", JOBS_APP, "--job", "double"),
        ("jobs", "pause", JOBS_APP),
        ("jobs", "resume", JOBS_APP),
        ("jobs", "resume", JOBS_APP, "--job", "double"),
        ("jobs", "schedules", "set", JOBS_APP, "nightly", "double", "0 3 * * *", "--args", "[1]"),
        ("jobs", "schedules", "list", JOBS_APP),
        ("jobs", "schedules", "remove", JOBS_APP, "nightly"),
        ("delete-stream", "tests.apps.acl:orders", "--yes"),
    ]
    for command in commands:
        result = await streamkit(*command, redis_url=url)
        assert result.code == 0, (command, result.err)
        assert "NOPERM" not in result.err + result.out
    assert await dashboard_status(url) == 200
    assert await refusals(admin) == []


async def dashboard_status(url: str) -> int:
    """Serve ``streamkit dashboard`` under ``url``'s user; the status of ``/api/status``."""
    port = free_port()
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "streamkit", "dashboard", STREAMS_APP, "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "STREAMKIT_REDIS_URL": url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def get() -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5) as reply:
            return int(reply.status)

    async def answered() -> bool:
        try:
            return await trio.to_thread.run_sync(get) == 200
        except OSError:
            return False

    try:
        await wait_until(answered, what="the dashboard answering", within=30)
        return await trio.to_thread.run_sync(get)
    finally:
        process.kill()
        await process.wait()


# ------------------------------------------------------------------ Spark executors


def test_the_spark_reader_and_writer_run_under_their_users() -> None:
    pytest.importorskip("pyspark")
    from streamkit.spark._options import ReadOptions
    from streamkit.spark._reader import BatchReader, StreamReader
    from streamkit.spark._writer import WritePlan, write_rows

    with RedisServer() as spark_server:
        subprocess.run(
            ["redis-cli", "-p", str(spark_server.port)],
            input="\n".join(acl_lines().values()) + "\n",
            capture_output=True,
            text=True,
            check=True,
        )
        plan = WritePlan(
            url=url_of(spark_server, "shop-spark-writer"),
            app="shop",
            stream="orders",
            partition_count=4,
            record="tests.apps.acl:Order",
            compression="zstd",
            key="key",
            key_is_field=True,
            columns=("key", "n", "fail"),
            chunk_size=7,
            marker_ttl=60,
            partition_size=1000,
            max_len=None,
        )
        rows: Any = iter([(f"k{i}", i, False) for i in range(50)])
        result = write_rows(plan, rows, "w", "b")
        assert result.appended == 50
        options = ReadOptions.parse(
            {
                "url": url_of(spark_server, "shop-spark-reader"),
                "app": "shop",
                "stream": "orders",
                "record": "tests.apps.acl:Order",
                "pageSize": "10",
            }
        )
        reader = BatchReader(options, 4)
        read = [row for part in reader.partitions() for row in reader.read(part)]
        assert sorted((row[3], row[4]) for row in read) == sorted((f"k{i}", i) for i in range(50))
        streaming = StreamReader(options, 4)
        start = streaming.initialOffset()
        from pyspark.sql.streaming.datasource import ReadMaxRows

        end = streaming.latestOffset(start, ReadMaxRows(20))
        assert sum(len(list(streaming.read(p))) for p in streaming.partitions(start, end)) == 20
        log = subprocess.run(
            ["redis-cli", "-p", str(spark_server.port), "acl", "log"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert log.strip() == "", log


# ----------------------------------------------------------- a missing permission


async def test_a_forbidden_command_is_one_line_naming_it(server: RedisServer, admin: Redis) -> None:
    # A producer's user running a worker's command.
    async with open_redis(url_of(server, "shop-producer")) as producer:
        with pytest.raises(NotPermitted) as info, redis_errors():
            await producer.xreadgroup("shop.orders.handle", "me", streams={orders.key(0): ">"})
    assert info.value.command == "xreadgroup"
    assert str(info.value) == (
        f"Redis at redis://shop-producer:***@127.0.0.1:{server.port} refused the command: "
        f"the user of this connection may not run 'xreadgroup' (NOPERM); grant it with "
        f"ACL SETUSER <user> +xreadgroup (docs/security.md lists what each role needs)"
    )


async def test_a_command_refused_inside_a_script_is_named(
    server: RedisServer, admin: Redis
) -> None:
    # Without +xtrim, the append script fails at its trimming: Redis names only the
    # script and its line; the error names the command.
    await admin.acl_setuser("shop-producer", "-xtrim")
    for partition in range(4):
        await admin.xgroup_create(orders.key(partition), "shop.orders.x", "$", mkstream=True)
    app, stream = make_streams_app(redis_url=url_of(server, "shop-producer"), partition_size=1)
    async with app:
        await stream.send(Order(key="a", n=0))
        with pytest.raises(NotPermitted) as info:
            await stream.send(Order(key="a", n=1))
    assert info.value.command == "xtrim"
    assert "may not run 'xtrim' in a streamkit script (NOPERM)" in str(info.value)
    assert "\n" not in str(info.value)


async def test_a_key_of_another_app_is_refused_in_one_line(server: RedisServer) -> None:
    async with App("other", redis_url=url_of(server, "shop-producer")) as app:
        stream = app.stream("orders", record=Order, partition_by="key")
        with pytest.raises(NotPermitted) as info:
            await stream.send(Order(key="a", n=0))
    assert info.value.kind == "key"
    assert "may not access a key" in str(info.value)
    assert "the user's key patterns must cover the app's keys" in str(info.value)


async def test_a_worker_under_the_wrong_user_exits_with_one_line(
    server: RedisServer, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = start_worker(url_of(server, "shop-producer"), tmp_path, app=STREAMS_APP)
    workers.append(worker)
    code = await worker.wait_exit(within=60)
    log = worker.log()
    assert code != 0, log
    assert "Traceback" not in log
    assert "(NOPERM); grant it with ACL SETUSER <user> +" in log


async def test_the_send_command_under_the_wrong_user_says_so_in_one_line(
    server: RedisServer,
) -> None:
    result = await streamkit(
        "send",
        "tests.apps.acl:orders",
        '{"key": "z", "n": 1}',
        redis_url=url_of(server, "shop-jobs-worker"),
    )
    assert result.code != 0
    assert "Traceback" not in result.err
    assert "(NOPERM)" in result.err.splitlines()[0], result.err
