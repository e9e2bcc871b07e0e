"""``streamkit worker --processes N``: the supervisor and its worker processes.

The decisions (restart, back off, give up) are pure and tested exactly. The supervisor
itself runs real subprocesses: tiny Python scripts that behave like a worker (ready,
graceful on the first signal, at once on the second) for the in-process tests, and
real ``streamkit worker`` processes against a real Redis for the command's tests.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from streamkit import ConfigError, open_redis
from streamkit._backoff import Backoff
from streamkit._cli._supervisor import (
    DEFAULT_CONFIG_ERROR_CODE,
    Step,
    Supervisor,
    SupervisorExit,
    after_exit,
    check_member_ids,
    describe_exit,
    exit_status,
    run_supervisor,
    worker_environment,
)
from streamkit.lowlevel import read_membership
from streamkit.testing import RedisServer, free_port, wait_until
from tests.apps.scenario import TAKEN, Numbered, make_app
from tests.scenarios import numbered_events, seen, tally
from tests.workers import FAST_ENV, ROOT, SCENARIO_GROUP, WorkerProcess, start_worker

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from streamkit import Redis

# --------------------------------------------------------------------------- decisions


def test_a_stopping_supervisor_restarts_nothing() -> None:
    for code in (0, 1, 2, -9):
        step = after_exit(code, stopping=True, ran_for=0.1, early_deaths=3, config_error_code=2)
        assert step == Step(action="stop")


def test_a_configuration_error_is_given_up_on() -> None:
    step = after_exit(2, stopping=False, ran_for=0.1, early_deaths=0, config_error_code=2)
    assert step == Step(action="give up")


def test_a_worker_that_ran_a_while_is_restarted_at_once() -> None:
    step = after_exit(-9, stopping=False, ran_for=5.0, early_deaths=4, config_error_code=2)
    assert step == Step(action="restart", delay=0.0, early_deaths=0)


def test_a_worker_dying_at_start_is_restarted_later_and_later() -> None:
    delays = []
    early = 0
    for _ in range(8):
        step = after_exit(1, stopping=False, ran_for=0.5, early_deaths=early, config_error_code=2)
        assert step.action == "restart"
        delays.append(step.delay)
        early = step.early_deaths
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert early == 8


def test_exits_are_described_as_a_shell_would() -> None:
    assert describe_exit(1) == "exited with code 1"
    assert describe_exit(-9) == "died with signal 9"
    assert (exit_status(0), exit_status(143), exit_status(-9)) == (0, 143, 137)


def test_each_worker_gets_its_index_and_its_own_member_id() -> None:
    env = worker_environment(2, {"PATH": "/bin", "STREAMKIT_MEMBER_ID": "host-shop"})
    assert env == {
        "PATH": "/bin",
        "STREAMKIT_WORKER_INDEX": "2",
        "STREAMKIT_MEMBER_ID": "host-shop-2",
    }
    # An unset member id stays unset, as it was.
    for unset in ({}, {"STREAMKIT_MEMBER_ID": ""}, {"STREAMKIT_MEMBER_ID": "none"}):
        env = worker_environment(0, unset)
        assert env.get("STREAMKIT_MEMBER_ID") == unset.get("STREAMKIT_MEMBER_ID")


def test_a_member_id_fixed_in_code_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMKIT_MEMBER_ID", raising=False)
    app, _ = make_app(member_id="fixed")
    with pytest.raises(ConfigError, match=r"member_id: processor 'record' has the member id"):
        check_member_ids(list(app.processors.values()), {}, processes=2)
    # From the environment, each worker gets its own: fine.
    monkeypatch.setenv("STREAMKIT_MEMBER_ID", "host-1")
    app, _ = make_app()
    check_member_ids(list(app.processors.values()), os.environ, processes=2)


# --------------------------------------------------------------------------- in process

# Behaves like a worker: marks itself ready once its handlers are in place, stops
# "gracefully" on the first SIGINT / SIGTERM (here: never finishes draining unless
# argv[2] says so) and exits at once, 128 + N, on the second.
WORKER_LIKE = """
import os, signal, sys
directory, drain = sys.argv[1], sys.argv[2] == "drain"
index = os.environ["STREAMKIT_WORKER_INDEX"]
received = []
def handle(signum, frame):
    if received or drain:
        os._exit(0 if drain else 128 + signum)
    received.append(signum)
    open(os.path.join(directory, "draining-" + index), "w").close()
signal.signal(signal.SIGTERM, handle)
signal.signal(signal.SIGINT, handle)
open(os.path.join(directory, "ready-" + index), "w").close()
while True:
    signal.pause()
"""

# Exits with code 1 at once the first argv[2] times it starts, then behaves as a
# worker that drains at once.
FLAKY = """
import os, signal, sys
counter, failures = sys.argv[1], int(sys.argv[2])
count = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(count + 1))
if count < failures:
    sys.exit(1)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
open(counter + ".ready", "w").close()
while True:
    signal.pause()
"""

# Worker 1 refuses its configuration (exit code 2); the others drain at once.
PICKY = """
import os, signal, sys
if os.environ["STREAMKIT_WORKER_INDEX"] == "1":
    sys.exit(2)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    signal.pause()
"""


async def supervise(
    nursery: trio.Nursery,
    outcomes: list[SupervisorExit],
    script: str,
    *args: str,
    processes: int,
    backoff: Backoff | None = None,
) -> Supervisor:
    """Start a supervisor of ``processes`` copies of ``python -c script args...``;
    its outcome is appended to ``outcomes`` when it ends."""

    async def run(*, task_status: trio.TaskStatus[Supervisor]) -> None:
        outcome = await run_supervisor(
            [sys.executable, "-c", script, *args],
            processes=processes,
            backoff=backoff or Backoff(initial=1, maximum=30, jitter=0),
            task_status=task_status,
        )
        outcomes.append(outcome)

    supervisor: Supervisor = await nursery.start(run)
    return supervisor


def files_exist(*paths: Path) -> bool:
    return all(path.exists() for path in paths)


async def test_the_first_stop_is_graceful_the_second_at_once(tmp_path: Path) -> None:
    outcomes: list[SupervisorExit] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            supervisor = await supervise(
                nursery, outcomes, WORKER_LIKE, str(tmp_path), "hang", processes=2
            )
            assert [slot.index for slot in supervisor.slots] == [0, 1]
            ready = [tmp_path / f"ready-{i}" for i in range(2)]
            await wait_until(lambda: files_exist(*ready), what="2 workers ready", within=5)
            supervisor.stop(signal.SIGTERM)
            draining = [tmp_path / f"draining-{i}" for i in range(2)]
            await wait_until(lambda: files_exist(*draining), what="2 workers draining", within=5)
            assert supervisor.statistics().running == 2  # still draining
            supervisor.stop(signal.SIGTERM)
    [outcome] = outcomes
    assert outcome.code == 143
    assert "worker 0 (pid" in outcome.reason
    assert "exited with code 143" in outcome.reason
    assert supervisor.statistics().restarts == 0


async def test_a_clean_stop_ends_with_code_0(tmp_path: Path) -> None:
    outcomes: list[SupervisorExit] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            supervisor = await supervise(
                nursery, outcomes, WORKER_LIKE, str(tmp_path), "drain", processes=3
            )
            ready = [tmp_path / f"ready-{i}" for i in range(3)]
            await wait_until(lambda: files_exist(*ready), what="3 workers ready", within=5)
            assert repr(supervisor) == "<Supervisor running 3/3 workers restarts=0>"
            supervisor.stop(signal.SIGINT)
    assert outcomes == [SupervisorExit(code=0, reason="all 3 workers stopped")]


async def test_a_worker_dying_at_start_is_restarted_with_a_backoff(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    counter = tmp_path / "starts"
    outcomes: list[SupervisorExit] = []
    backoff = Backoff(initial=0.05, maximum=0.1, jitter=0)
    caplog.set_level(logging.INFO, logger="streamkit.supervisor")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            began = trio.current_time()
            supervisor = await supervise(
                nursery, outcomes, FLAKY, str(counter), "3", processes=1, backoff=backoff
            )
            ready = tmp_path / "starts.ready"
            await wait_until(ready.exists, what="the fourth start", within=5)
            # Three deaths, waits of 0.05, 0.1 and 0.1 s.
            assert trio.current_time() - began >= 0.25
            assert supervisor.statistics().restarts == 3
            supervisor.stop()
    assert outcomes == [SupervisorExit(code=0, reason="all 1 workers stopped")]
    messages = [r.getMessage() for r in caplog.records]
    pids = [int(m) for m in re.findall(r"started worker 0 \(pid (\d+)\)", "\n".join(messages))]
    assert len(pids) == 4
    restarts = [m for m in messages if "restarting" in m]
    assert restarts == [
        f"worker 0 (pid {pid}) exited with code 1; restarting in {delay} s (it died "
        f"{n} time(s) in a row within 5 s of its start)"
        for n, (pid, delay) in enumerate(zip(pids[:3], ("0.05", "0.1", "0.1"), strict=True), 1)
    ]


async def test_a_configuration_error_is_not_restarted(tmp_path: Path) -> None:
    outcomes: list[SupervisorExit] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            supervisor = await supervise(nursery, outcomes, PICKY, processes=2)
    [outcome] = outcomes
    assert outcome.code == DEFAULT_CONFIG_ERROR_CODE
    assert outcome.reason.startswith("worker 1 (pid ")
    assert "exited with code 2, a configuration error" in outcome.reason
    assert [slot.restarts for slot in supervisor.slots] == [0, 0]
    # Worker 0 was stopped.
    assert supervisor.slots[0].final in (0, -signal.SIGTERM)


async def test_a_worker_that_cannot_be_started_is_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "no-such-program")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                await run_supervisor(
                    [missing], processes=1, backoff=Backoff(initial=0.01, maximum=0.01, jitter=0)
                )

            nursery.start_soon(run)
            await wait_until(
                lambda: sum("cannot start worker 0" in r.getMessage() for r in caplog.records) >= 3,
                what="three attempts",
                within=5,
            )
            nursery.cancel_scope.cancel()
    first = next(r for r in caplog.records if "cannot start worker 0" in r.getMessage())
    assert first.levelno == logging.ERROR
    assert "No such file or directory" in first.getMessage()
    assert first.getMessage().endswith("; trying again in 0.01 s")


async def test_cancelling_the_supervisor_stops_its_workers(tmp_path: Path) -> None:
    outcomes: list[SupervisorExit] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            supervisor = await supervise(
                nursery, outcomes, WORKER_LIKE, str(tmp_path), "drain", processes=2
            )
            ready = [tmp_path / f"ready-{i}" for i in range(2)]
            await wait_until(lambda: files_exist(*ready), what="2 workers ready", within=5)
            nursery.cancel_scope.cancel()
    assert outcomes == []
    for slot in supervisor.slots:
        assert slot.process is not None
        assert slot.process.returncode == 0  # SIGTERM: they drained
    assert supervisor.statistics().running == 0


# --------------------------------------------------------------------------- the command

STARTED = re.compile(r"started worker (\d+) \(pid (\d+)\)")


def started_workers(log: str) -> list[tuple[int, int]]:
    """(index, pid) of every worker process the supervisor started, in order."""
    return [(int(index), int(pid)) for index, pid in STARTED.findall(log)]


def current_pids(log: str) -> dict[int, int]:
    """Each worker index's latest process."""
    return dict(started_workers(log))


def proc_words(pid: int, name: str) -> list[str]:
    """``/proc/PID/cmdline`` or ``environ``: its NUL-separated words."""
    return Path(f"/proc/{pid}/{name}").read_bytes().decode().split("\0")


def start_in_new_session(redis_url: str, tmp_path: Path) -> WorkerProcess:
    """``streamkit worker --processes 2`` in a session (and process group) of its own,
    as a shell starts a foreground job."""
    log_path = tmp_path / "supervisor.log"
    log = log_path.open("wb")
    command = ["-m", "streamkit", "worker", "tests.apps.scenario:app", "--processes", "2"]
    process = subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        env={**os.environ, **FAST_ENV, "STREAMKIT_REDIS_URL": redis_url},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return WorkerProcess(process, log_path, log)


def parent_of(pid: int) -> int | None:
    """The parent of process ``pid``, or ``None`` if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.fixture
def supervisors() -> Iterator[list[WorkerProcess]]:
    """Supervisor processes started by the test; they and their workers (in sessions
    of their own) are killed at its end, if still alive."""
    started: list[WorkerProcess] = []
    yield started
    for supervisor in started:
        for _, pid in started_workers(supervisor.log()):
            if parent_of(pid) == supervisor.pid:
                os.killpg(pid, signal.SIGKILL)
        supervisor.close()


def start_supervisor(
    redis_url: str,
    tmp_path: Path,
    supervisors: list[WorkerProcess],
    *,
    processes: int = 2,
    app: str = "tests.apps.scenario:app",
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> WorkerProcess:
    supervisor = start_worker(
        redis_url, tmp_path, app=app, args=("--processes", str(processes), *args), env=env
    )
    supervisors.append(supervisor)
    return supervisor


async def wait_started(supervisor: WorkerProcess, count: int) -> dict[int, int]:
    await wait_until(
        lambda: len(started_workers(supervisor.log())) >= count,
        what=f"{count} worker starts\n{supervisor.log()}",
        within=15,
    )
    return current_pids(supervisor.log())


async def member_pids(redis: Redis) -> set[int]:
    snapshot = await read_membership(redis, SCENARIO_GROUP)
    return set() if snapshot is None else {member.pid for member in snapshot.members}


async def wait_member_pids(redis: Redis, pids: set[int]) -> None:
    async def exactly() -> bool:
        return await member_pids(redis) == pids

    await wait_until(exactly, what=f"members with pids {sorted(pids)}", within=15)


async def wait_all_processed(redis: Redis, sent: list[Numbered]) -> None:
    async def nothing_lost() -> bool:
        return tally(sent, await seen(redis)).lost == 0

    await wait_until(nothing_lost, what=f"all {len(sent)} events processed", within=20)


async def test_two_processes_share_the_partitions(
    redis_url: str, redis: Redis, tmp_path: Path, supervisors: list[WorkerProcess]
) -> None:
    supervisor = start_supervisor(
        redis_url,
        tmp_path,
        supervisors,
        args=("--processors", "record", "--log-level", "INFO", "--redis-url", redis_url),
    )
    pids = await wait_started(supervisor, 2)
    assert sorted(pids) == [0, 1]
    await wait_member_pids(redis, set(pids.values()))

    for index, pid in pids.items():
        assert parent_of(pid) == supervisor.pid
        environ = proc_words(pid, "environ")
        assert f"STREAMKIT_WORKER_INDEX={index}" in environ
        # --redis-url (which may hold a password) in the environment, not the arguments.
        assert f"STREAMKIT_WORKER_REDIS_URL={redis_url}" in environ
        assert proc_words(pid, "cmdline")[1:] == [
            "-m",
            "streamkit",
            "worker",
            "tests.apps.scenario:app",
            "--processors",
            "record",
            "--log-level",
            "info",
            "",
        ]

    app, stream = make_app(redis_url=redis_url)
    sent = numbered_events(keys=16, per_key=20)
    async with app:
        await stream.send_many(sent)
    await wait_all_processed(redis, sent)
    result = tally(sent, await seen(redis))
    assert (result.lost, result.order_violations) == (0, 0)
    # Both processes took part.
    assert {int(worker.rsplit(":", 1)[1]) for worker in result.workers} == set(pids.values())
    log = supervisor.log()
    assert "[worker 0] streamkit.worker: worker of scenario running record" in log
    assert "[worker 1] streamkit.worker: worker of scenario running record" in log
    assert "Traceback" not in log


async def test_a_password_in_the_url_stays_off_the_command_lines(
    private_redis: RedisServer, tmp_path: Path, supervisors: list[WorkerProcess]
) -> None:
    password = "pw-of-the-test-4f1c"
    async with open_redis(private_redis.url) as admin:
        await admin.config_set({"requirepass": password})
    url = private_redis.url.replace("redis://", f"redis://:{password}@")
    elsewhere = f"redis://127.0.0.1:{free_port()}"  # the flag must win over it
    token = "metrics-token-of-the-test-9d2e"
    supervisor = start_supervisor(
        elsewhere, tmp_path, supervisors, args=("--redis-url", url, "--metrics-token", token)
    )
    pids = await wait_started(supervisor, 2)
    async with open_redis(url) as redis:
        # The workers reached Redis with the password: they got the URL.
        await wait_member_pids(redis, set(pids.values()))
    for pid in pids.values():
        assert parent_of(pid) == supervisor.pid
        assert not any(password in word for word in proc_words(pid, "cmdline"))
        assert not any(token in word for word in proc_words(pid, "cmdline"))
        assert f"STREAMKIT_WORKER_METRICS_TOKEN={token}" in proc_words(pid, "environ")
    assert password not in supervisor.log()


async def test_a_killed_worker_is_restarted(
    redis_url: str, redis: Redis, tmp_path: Path, supervisors: list[WorkerProcess]
) -> None:
    supervisor = start_supervisor(redis_url, tmp_path, supervisors)
    pids = await wait_started(supervisor, 2)
    await wait_member_pids(redis, set(pids.values()))
    app, stream = make_app(redis_url=redis_url)
    before = numbered_events(keys=16, per_key=10)
    async with app:
        await stream.send_many(before)
    await wait_all_processed(redis, before)

    os.kill(pids[0], signal.SIGKILL)
    now = await wait_started(supervisor, 3)
    assert now[1] == pids[1]
    assert now[0] != pids[0]
    log = supervisor.log()
    assert f"worker 0 (pid {pids[0]}) died with signal 9; restarting" in log
    # The dead one is reaped and the new one joins.
    await wait_member_pids(redis, set(now.values()))

    after = numbered_events(keys=16, per_key=10, start=10)
    async with app:
        await stream.send_many(after)
    await wait_all_processed(redis, before + after)
    result = tally(before + after, await seen(redis))
    assert (result.lost, result.order_violations) == (0, 0)
    assert f":{now[0]}" in " ".join(result.workers)  # the new process works
    assert supervisor.process.poll() is None


async def test_sigterm_stops_every_worker_and_exits_0(
    redis_url: str, redis: Redis, tmp_path: Path, supervisors: list[WorkerProcess]
) -> None:
    supervisor = start_supervisor(redis_url, tmp_path, supervisors, processes=3)
    pids = await wait_started(supervisor, 3)
    await wait_member_pids(redis, set(pids.values()))

    supervisor.send_signal(signal.SIGTERM)
    assert await supervisor.wait_exit(within=15) == 0, supervisor.log()
    log = supervisor.log()
    assert "SIGTERM: stopping the workers gracefully" in log
    assert log.count("SIGTERM: stopping gracefully") == 3  # each worker's own message
    for index, pid in pids.items():
        assert f"worker {index} (pid {pid}) exited with code 0" in log
        assert parent_of(pid) is None  # gone
    assert "all 3 workers stopped" in log
    assert "; restarting" not in log
    assert "Traceback" not in log
    assert await member_pids(redis) == set()  # they left their group


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (exited, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


async def test_workers_of_a_killed_supervisor_stop_gracefully(
    redis_url: str, redis: Redis, tmp_path: Path, supervisors: list[WorkerProcess]
) -> None:
    """A supervisor killed with no chance to pass a signal on (kill -9, the OOM
    killer) leaves no worker running: each stops gracefully, leaving its group."""
    supervisor = start_supervisor(redis_url, tmp_path, supervisors, processes=2)
    pids = await wait_started(supervisor, 2)
    await wait_member_pids(redis, set(pids.values()))

    supervisor.kill()
    await supervisor.wait_exit()
    await wait_until(
        lambda: all(gone(pid) for pid in pids.values()),
        what=f"the workers {sorted(pids.values())} to end\n{supervisor.log()}",
        within=15,
    )
    log = supervisor.log()
    assert log.count(f"the supervisor (pid {supervisor.pid}) is gone") == 2, log
    assert log.count("SIGTERM: stopping gracefully") == 2, log
    assert "Traceback" not in log
    assert await member_pids(redis) == set()  # they left their group


async def test_ctrl_c_reaches_each_worker_once(
    redis_url: str, redis: Redis, tmp_path: Path, supervisors: list[WorkerProcess]
) -> None:
    # A terminal's Ctrl-C signals its whole foreground process group: here, the
    # supervisor's own session. The workers, in sessions of their own, get SIGINT from
    # the supervisor only, once, so they stop gracefully rather than at once.
    supervisor = start_in_new_session(redis_url, tmp_path)
    supervisors.append(supervisor)
    pids = await wait_started(supervisor, 2)
    await wait_member_pids(redis, set(pids.values()))

    os.killpg(supervisor.pid, signal.SIGINT)
    assert await supervisor.wait_exit(within=15) == 0, supervisor.log()
    text = supervisor.log()
    assert text.count("SIGINT: stopping gracefully") == 2
    assert "exiting at once" not in text


async def test_a_second_sigterm_stops_the_workers_at_once(
    redis_url: str, redis: Redis, tmp_path: Path, supervisors: list[WorkerProcess]
) -> None:
    # Every worker is in a batch far longer than the grace period: only a second
    # signal ends them.
    supervisor = start_supervisor(
        redis_url,
        tmp_path,
        supervisors,
        env={
            "SCENARIO_DELAY": "60",
            "STREAMKIT_GRACE_PERIOD": "60",
            "SCENARIO_BATCH": "1",
            "SCENARIO_MARK_TAKEN": "1",
        },
    )
    pids = await wait_started(supervisor, 2)
    await wait_member_pids(redis, set(pids.values()))
    app, stream = make_app(redis_url=redis_url)
    async with app:
        await stream.send_many(numbered_events(keys=16, per_key=1))

    async def both_busy() -> bool:
        taken = await redis.lrange(TAKEN, 0, -1)
        return {int(bytes(item).rsplit(b":", 1)[1]) for item in taken} == set(pids.values())

    await wait_until(both_busy, what="both workers in a batch", within=15)
    supervisor.send_signal(signal.SIGTERM)
    await wait_until(
        lambda: supervisor.log().count("SIGTERM: stopping gracefully") == 2,
        what="both workers stopping gracefully",
        within=10,
    )
    supervisor.send_signal(signal.SIGTERM)
    assert await supervisor.wait_exit(within=10) == 143, supervisor.log()
    log = supervisor.log()
    assert log.count("SIGTERM again: exiting at once") == 2
    assert "Error: not every worker stopped cleanly: worker 0" in log
    assert "Traceback" not in log


async def test_a_bad_app_path_is_one_line(
    redis_url: str, tmp_path: Path, supervisors: list[WorkerProcess]
) -> None:
    supervisor = start_supervisor(
        redis_url, tmp_path, supervisors, app="tests.apps.no_such_module:app"
    )
    assert await supervisor.wait_exit(within=15) == 2
    log = supervisor.log()
    [line] = log.strip().splitlines()
    assert line.startswith(
        "Error: cannot import 'tests.apps.no_such_module': no module named "
        "'tests.apps.no_such_module' in "
    )


async def test_processes_must_be_at_least_1(
    redis_url: str, tmp_path: Path, supervisors: list[WorkerProcess]
) -> None:
    supervisor = start_supervisor(redis_url, tmp_path, supervisors, processes=0)
    assert await supervisor.wait_exit(within=15) == 2
    assert "Invalid value for '--processes': 0 is not in the range x>=1." in supervisor.log()


async def test_a_worker_refusing_its_configuration_is_not_restarted(
    redis_url: str, tmp_path: Path, supervisors: list[WorkerProcess]
) -> None:
    supervisor = start_supervisor(redis_url, tmp_path, supervisors, app="tests.apps.picky:app")
    assert await supervisor.wait_exit(within=15) == 2, supervisor.log()
    log = supervisor.log()
    assert [index for index, _ in started_workers(log)] == [0, 1]  # no restart
    assert "worker 1 refuses this configuration" in log
    assert log.strip().splitlines()[-1].startswith("Error: worker 1 (pid ")
    assert "exited with code 2, a configuration error" in log
    assert "; restarting" not in log
