"""Project sessions. ``./dev`` prepares .venv and runs them inside it.

Sessions run in the current environment (no per-session virtualenvs), so that
``./dev`` installs dependencies once.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "typecheck", "docs", "tests"]

#: Test processes the whole suite runs in (see the ``tests`` session).
TEST_PROCESSES = 3

SOURCES = ["streamkit", "tests", "examples", "noxfile.py"]
BENCHMARKS = [
    "bench_send.py",
    "bench_consume.py",
    "bench_latency.py",
    "bench_memory.py",
    "bench_rebalance.py",
    "bench_fleet.py",
    "bench_spark.py",
    "bench_jobs.py",
    "bench_state.py",
    "bench_joins.py",
    "bench_versioned.py",
    "bench_jobs_commit.py",
    "bench_expiry.py",
    "bench_clients.py",
    "bench_cluster.py",
    "bench_versions.py",
]
BENCHMARK_TITLES = {
    "bench_send.py": "Sending",
    "bench_consume.py": "Consuming",
    "bench_latency.py": "End-to-end latency",
    "bench_memory.py": "Memory",
    "bench_rebalance.py": "Rebalancing",
    "bench_fleet.py": "Scale",
    "bench_spark.py": "Spark",
    "bench_jobs.py": "Job queues",
    "bench_state.py": "State",
    "bench_joins.py": "Joins",
    "bench_versioned.py": "Versioned tables",
    "bench_jobs_commit.py": "Jobs in the commit",
    "bench_expiry.py": "Expiry over time",
    "bench_clients.py": "Blocking and asyncio clients",
    "bench_cluster.py": "Redis Cluster",
    "bench_versions.py": "Before and after",
}
BENCHMARK_NOTES = {
    "bench_send.py": (
        "`send_many` against the limit of one Python process: the same records, encoded "
        "beforehand by the stream's own codec, appended with one `XADD` each, packed by "
        "`hiredis` and pipelined 1,000 per round trip on a Trio socket; and the bare "
        "coredis pipeline of the same `XADD`s, for reference. **Target: `send_many` at "
        "least 75% of the limit.** `send_many` does more than the limit loop: it "
        "encodes, routes, and appends exactly once (an idempotent script call per "
        "partition and chunk, which trims too). For reference, runnel sends about 30k "
        "events/s on this kind of machine."
    ),
    "bench_consume.py": (
        "One worker (`run_worker`), one processor with a trivial body, timed from its "
        "first event to its last, against the limit of one Python process over the "
        "same backlog in the same process: `XREADGROUP COUNT 500` + `XACK` written by "
        "hand in RESP on a Trio socket, replies parsed by `hiredis`, all partitions in "
        "one round trip, and the same loop decoding every event into the record "
        "`records()` hands out (`orjson` and a generated constructor call, no checks): "
        "the yardstick. The coredis loop streamkit's Trio side is built on is there for "
        "reference. **Targets: `records()` at least 60% and `take(500)` at least 75% of "
        "the decoding limit loop.** streamkit does more per event than the limit loop: "
        "every read is a fenced Lua script (about twice the Redis time of a bare "
        "`XREADGROUP`, see below), every record is checked field by field, every event "
        "against the lease. For reference, runnel processes about 3.9k events/s with "
        "`records()` and 6k with `take(500)` on this kind of machine. Where the time "
        "goes: `python tests/benchmarks/bench_consume.py --profile` (cProfile, top 25 by "
        "own time) and the hand-written section below. Each round also runs both "
        "processors with metrics on: the worker serving its Prometheus metrics "
        "(`metrics_port`, as `streamkit worker --metrics-port` does) to a scraper that "
        "reads them every second, side by side with the runs without. **Target: metrics "
        "on at least 95% of metrics off.**"
    ),
    "bench_state.py": (
        "One worker, 200,000 events over 8 partitions and 1,000 keys: a stateless "
        "`records()` processor, the same count kept by hand with an `HINCRBY` per event "
        "(at-least-once), the count in a table (exactly once), and a tumbling-window sum "
        "with emitted results. **Targets: the table count at least 50% of stateless, and "
        "faster than HINCRBY by hand; the window sum at least 40% of stateless.** Then an "
        "update's cost against the windows a key has open: the same 100,000 values as "
        "1,000 windows of 100 keys and as 1 window of 100,000 keys (**target: within "
        "1.5x**). Then the age of committed state while a producer "
        "sends 1,000 events/s, and the time from kill -9 of a table's owner to the new "
        "owner's first commit with an empty table and with 1,000,000 keys (recovery "
        "reads no changelog, so it does not grow with the table)."
    ),
    "bench_joins.py": (
        "One worker, a stream-stream join of 200,000 orders and 200,000 payments (each "
        "order paid once, a second after it) over 8 partitions, joined within 10 minutes "
        "of event time, against a stateless `records()` processor and a count in a table "
        "(exactly once, one key per event) over the same 400,000 events; the join timed "
        "from the first event forwarded to the last pair emitted (by their entry ids, the "
        "worker's start left out as the others leave it out), in input events per second "
        "(`./dev bench --quick`: 50,000 of each, one round). **Target: the join at least "
        "25% of stateless.** Then the memory of the join's buffers (`MEMORY USAGE` of its "
        "hashes and index) per buffered event, for records of an int and a time. One run "
        "alone: `python tests/benchmarks/bench_joins.py` inside `.venv`."
    ),
    "bench_versioned.py": (
        "One worker writes a backlog of 100,000 updates of 1,000 keys over 8 partitions "
        "(each key's updates an hour apart by event time) to a versioned table with a "
        "day of retention (`await table.put(key, value, at=...)`, about 24 versions a "
        "key kept), against the same updates written to a plain table (`table.set`), "
        "rounds alternating in one run, timed from the worker's start until every update "
        "is acknowledged. No target: what a version costs beside a plain write. One run "
        "alone: `python tests/benchmarks/bench_versioned.py` inside `.venv`."
    ),
    "bench_expiry.py": (
        "A producer sends 1,000 events/s, each of a key never seen before (a session id), "
        "to a processor counting them in a table with a 30 s ttl, for 10 minutes; every "
        "30 s the table's keys, its expiry index and Redis's `used_memory`. **Target: "
        "flat after the first ttl** (about rate x ttl keys), where without expiry the "
        "table would grow by 30,000 keys a line."
    ),
    "bench_latency.py": (
        "A producer process sends small records at a fixed rate, paced drift-free (a "
        "group every millisecond), each stamped with its send time; the latency is from "
        "the send to the processing code. One worker with a `records()` processor against "
        "a bare blocking `XREADGROUP` loop on one coredis connection, with the same "
        "producer and partition count, three rounds each, alternating (a moment of load "
        "on the machine falls on one round of one loop). **Target: streamkit's p50 and "
        "p99 within 1.5x of the bare loop's, as the median of the per-round ratios.** "
        "The second table shows that the producer held its rate and "
        "how much CPU the consumer and redis-server used; `--by-partition 0.25` prints "
        "each partition's worst latency over time, telling a pause of the process from "
        "some partitions waiting."
    ),
    "bench_memory.py": (
        "The resident size of a worker process owning 64 partitions whose processor holds "
        "on to its first record, so that the fetcher fills every partition's buffer to the "
        "settings' bound (`prefetch` batches of `batch_size` entries) and stops reading, "
        "however large the backlog: connected, owning the partitions with nothing to "
        "read, and with every buffer full, for small and for 1 KiB records. **The bound: "
        "a worker buffers at most partitions x `prefetch` x `batch_size` entries; each "
        "costs its payload and a few hundred bytes more (its id, field names, list "
        "slots, and the decoded record while its batch is handed out).**"
    ),
    "bench_rebalance.py": (
        "Membership, locks and rebalancer with 16 partitions whose work ticks every 5 ms: "
        "how soon moved partitions resume on their new owner, and the longest pause of "
        "the partitions that do not move."
    ),
    "bench_fleet.py": (
        "Idle fleets: W `streamkit worker` processes over one stream of P partitions with "
        "nothing in it, started together on one private redis-server, so that what Redis "
        "does is the fleet's background work alone (leases, the blocking waits and the "
        "reads behind them, heartbeats, membership). Per fleet: seconds until every "
        "partition is held by the member it is assigned to; Redis's commands per second "
        "over 10 s after that, the commands inside scripts included (`INFO commandstats`), "
        "in all and per partition, and redis-server's CPU as a share of one core; seconds "
        "until every partition is held by its member again after one more worker joins, "
        "and after it leaves (SIGTERM); the leases the workers' logs say were lost, by "
        "phase; the median worker's RSS. The workers share the 2 cores with Redis, hence "
        "Redis's own counters, not throughput; big fleets (`--fleets 128x4096 "
        "--per-process 8`) run several worker instances a process, by option. "
        "**Targets (issue 38): the idle cost grows with the workers, not the partitions; "
        "128 x 4,096 within 2% of a Redis core; no lease lost at start-up or in a "
        "rebalance; a join or leave at 128 x 4,096 settled within 2 s.**"
    ),
    "bench_spark.py": (
        "Spark batch write and read (local[2]) against a pipelined redis-py `XADD` loop "
        "and a redis-py `XRANGE` paging loop."
    ),
    "bench_jobs.py": (
        "streamkit.jobs against four asyncio job queues from PyPI, streaq, saq, arq and "
        "taskiq (+ taskiq-redis's `RedisStreamBroker`), in one run on one private "
        "redis-server, each queue in processes of its own: the peers run from "
        "virtualenvs of their own in `.venv-peers` (`./dev bench` makes them from the "
        "pinned lists in `tests/benchmarks/jobs_peers/`; their redis clients clash with "
        "ours and with each other), with their own API, their defaults but the "
        "concurrency (32 per worker process) and asyncio's event loop. Completion is "
        "told the same way for every queue, by markers the jobs write to Redis, not by "
        "any result API. Enqueue: 20,000 jobs by one producer process, with the batch "
        "API where there is one (streamkit and streaq `enqueue_many`; saq, arq and taskiq "
        "have none: `asyncio.gather` over their one-job enqueue, 50 in flight). Then 1 "
        "or 2 worker processes, timed from the first job's start to the last job's end. "
        "The bare `XREADGROUP`/`XACK` loop is the Redis work of taking and letting go a "
        "job with no job at all. Crash recovery: 32 jobs of a 5 s sleep running on "
        "worker A, worker B idle, A killed with SIGKILL: seconds until all 32 started "
        "again on B and until all 32 completed, each queue with its defaults (what "
        "those are, from each queue's source, is on the right). The peers' recovery runs "
        "wait out their timeouts at "
        "the same time, each in a Redis database of its own, for at most 400 s "
        "(`./dev bench --quick` skips them). **Targets: streamkit "
        "at least 25,000 no-op jobs/s per worker process and faster than every peer in "
        "both configurations; its "
        "enqueue at least 3x the fastest peer's; a killed worker's jobs taken over within "
        "the lease TTL + 1 s.** Then streamkit alone (no peer has them): the no-op run with "
        "1 worker process, its jobs declared with a rate limit that never binds and a "
        "concurrency key (1 running per key, 100 keys), alternated with the plain run, best "
        "of each, with the Redis script time per job of both; and a chain of 3 and a chord "
        "of 100 no-op jobs, timed from the enqueue to the final result. **Target: with "
        "limits at least 80% of plain.**"
    ),
    "bench_clients.py": (
        "The blocking and asyncio clients (`app.blocking()`, `app.asyncio()`, on redis-py "
        "with hiredis) against the Trio producer and queue (coredis) and against bare "
        "pipelined redis-py loops, in one run on one private redis-server: `send_many` of "
        "20,000 small records (8 partitions), `enqueue_many` of 20,000 jobs, and one "
        "blocking `send` at a time against a bare redis-py `XADD` of a pre-encoded record, "
        "the two alternating. The bare loops do no encoding and no idempotency: a send is "
        "an idempotent append script (its marker checked, set and cleaned up in the same "
        "call, about 10 µs of server time) where the bare loop is one `XADD`. **Targets: "
        "bulk within 80% of the Trio producer's and queue's; a single blocking send within "
        "1.5x of the bare `XADD`.**"
    ),
    "bench_cluster.py": (
        "Send and consume throughput on a local Redis Cluster of 3 masters with a replica "
        "each (6 redis-server processes) against one redis-server, in one run: "
        "`send_many`, one awaited `send` of one record at a time (the round trip, median), "
        "and a backlog consumed by two `streamkit worker` processes (`take(500)`, one "
        "`INCRBY` per batch). On 2 cores the cluster cannot be faster: the figures show "
        "that it works and what the cluster client costs per operation (see "
        "{doc}`cluster`)."
    ),
    "bench_versions.py": (
        "The working tree's streamkit against the one at a git ref, measured in one run: "
        "`./dev bench --baseline REF` (or `python tests/benchmarks/bench_versions.py "
        "--baseline REF`). The ref is checked out into a temporary git worktree, and each "
        "version runs in its own processes, each with its own private redis-server, the "
        "versions alternating round by round so that load from other work on the machine "
        "hits both alike: `send_many`, and one worker's `records()` and `take(500)` on a "
        "backlog, with the bare coredis `XREADGROUP COUNT 500` + `XACK` loop as the "
        "yardstick. The yardstick does not depend on streamkit: its ratio shows the "
        "noise. Ratios are current / baseline."
    ),
}
# bench_jobs.py's peers: asyncio job queues from PyPI, each in its own virtualenv under
# .venv-peers (they pin redis clients that clash with each other: arq wants redis < 6,
# taskiq-redis redis >= 8), installed from the pinned lists in tests/benchmarks/jobs_peers.
PEERS_DIR = Path("tests/benchmarks/jobs_peers")
PEERS_VENVS = Path(".venv-peers")
PEERS = ["streaq", "saq", "arq", "taskiq"]

PERFORMANCE_INTRO = """
# Performance

This page is written by `./dev bench` (the nox `bench` session) from the output of
the benchmark scripts in `tests/benchmarks/`: the figures come from a run, not from a
hand. Each script measures streamkit side by side with a yardstick in the same run: the
limit of one Python process doing the same work (a hand-written loop on a Trio socket
with `hiredis`), the bare Redis loop streamkit is built on, and the peers, so the
ratios hold even where the absolute numbers depend on the machine (a busy machine
moves both). Run `./dev bench` to reproduce the page, or one script alone for a quick
before/after, e.g. `python tests/benchmarks/bench_consume.py` inside `.venv` (`--help`
lists the sizes, rounds and rates for bigger runs). Where the time goes, what was
tried and what it gave (and what was tried and dropped): the hand-written sections at
the end, [where the time goes](#where-the-time-goes).
"""


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint rules and formatting; luacheck over every Redis script, assembled."""
    session.run("ruff", "check", *SOURCES)
    session.run("ruff", "format", "--check", *SOURCES)
    session.run("python", "tests/luacheck.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, tests and examples."""
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation; any warning fails the build."""
    session.run(
        "sphinx-build", "-W", "--keep-going", "-q", "-b", "html", "docs", "docs/_build/html"
    )


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite, against private redis-server processes (and a private
    Redis Cluster for the tests marked ``cluster``).

    The whole suite runs its files in :data:`TEST_PROCESSES` processes at once
    (pytest-xdist): most of its time is spent waiting (on workers, servers, Spark),
    not computing, so files run side by side even on two cores. Each process has its
    own servers, cluster and Spark session. Given arguments (a file, ``-k``), pytest
    runs them as it is told. The tests marked ``alone`` (a load of their own, which the
    others running beside them would make fail) run after the others, by themselves.
    """
    # The project's own modules compiled first (a second when up to date): the tests
    # start hundreds of Python processes, which would each compile them again where
    # PYTHONDONTWRITEBYTECODE keeps .pyc files from being written (see ./dev).
    session.run("python", "-m", "compileall", "-q", "-j", "0", "streamkit", "tests", silent=True)
    if session.posargs:
        session.run("pytest", *session.posargs)
    else:
        session.run("pytest", "-n", str(TEST_PROCESSES), "--dist", "loadfile", "-m", "not alone")
        session.run("pytest", "-m", "alone")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: print figures and ratios measured side by side, and write
    docs/performance.md from this run's output."""
    baseline, quick = _bench_options(session)
    load = _load()
    outputs = {}
    for script in BENCHMARKS:
        args: list[str] = []
        if script == "bench_jobs.py":
            _peers_venvs(session)
            args = ["--peers-venvs", str(PEERS_VENVS), *(["--quick"] if quick else [])]
        if script == "bench_expiry.py" and quick:
            args = ["--minutes", "2", "--every", "15", "--ttl", "15"]
        if script == "bench_joins.py" and quick:
            args = ["--events", "50000", "--rounds", "1"]
        if script == "bench_versions.py":
            if baseline is None:
                print(
                    "bench_versions.py skipped: `./dev bench --baseline REF` compares "
                    "the working tree's streamkit with the one at git ref REF"
                )
                continue
            args = ["--baseline", baseline]
        # bench_jobs.py reports its progress on stderr, left on the terminal (it runs
        # for minutes); its figures, on stdout, go to the page.
        stderr = None if script == "bench_jobs.py" else subprocess.STDOUT
        output = session.run(
            "python", f"tests/benchmarks/{script}", *args, silent=True, stderr=stderr
        )
        assert isinstance(output, str)
        print(output)
        outputs[script] = output
    page = Path("docs/performance.md")
    kept = hand_written(page.read_text()) if page.exists() else ""
    page.write_text(performance_page(outputs, load, kept))
    session.log("wrote docs/performance.md")


@nox.session
def peers(session: nox.Session) -> None:
    """Create or update .venv-peers: the job queues bench_jobs.py compares with, one
    virtualenv each, at the versions pinned in tests/benchmarks/jobs_peers/*.txt.
    ``./dev bench`` does this itself; this session is for running bench_jobs.py alone."""
    _peers_venvs(session)


def _peers_venvs(session: nox.Session) -> None:
    """Install each peer's pinned requirements into .venv-peers/NAME, unless that
    virtualenv already holds exactly them (a stamp keeps the lock file's hash)."""
    uv = shutil.which("uv")
    for peer in PEERS:
        lock = PEERS_DIR / f"{peer}.txt"
        venv = PEERS_VENVS / peer
        python = venv / "bin" / "python"
        stamp = venv / ".bench-installed"
        wanted = hashlib.sha256(lock.read_bytes()).hexdigest()
        if python.exists() and stamp.exists() and stamp.read_text().strip() == wanted:
            continue
        session.log(f"installing {peer} into {venv} ({lock})")
        if uv is not None:
            session.run(uv, "venv", "-q", "--allow-existing", "--python", sys.executable, str(venv))
            session.run(uv, "pip", "install", "-q", "--python", str(python), "-r", str(lock))
        else:
            session.run(sys.executable, "-m", "venv", str(venv))
            session.run(str(python), "-m", "pip", "install", "-q", "-r", str(lock), external=True)
        stamp.write_text(wanted + "\n")


def _bench_options(session: nox.Session) -> tuple[str | None, bool]:
    """The bench session's arguments, given after ``--``: ``--baseline REF`` (or
    ``--baseline=REF``) for bench_versions.py, and ``--quick``, which skips
    bench_jobs.py's crash-recovery runs of the peers (they wait out timeouts for about
    7 minutes) and shortens bench_expiry.py's and bench_joins.py's runs."""
    # `./dev bench --baseline REF` and `nox -s bench -- --baseline REF` both land here.
    args = [arg for arg in session.posargs if arg != "--"]
    baseline = None
    quick = False
    while args:
        arg = args.pop(0)
        if arg == "--baseline" and args:
            baseline = args.pop(0)
        elif arg.startswith("--baseline="):
            baseline = arg.split("=", 1)[1]
        elif arg == "--quick":
            quick = True
        else:
            session.error(
                f"bench: unexpected argument {arg!r}; the arguments are --baseline REF and --quick"
            )
    return baseline, quick


#: Where the hand-written part of docs/performance.md begins: `./dev bench` rewrites
#: the figures above it and keeps everything from this line on as it is.
HAND_WRITTEN = "<!-- Written by hand: ./dev bench keeps this line and what follows. -->"


def hand_written(page: str) -> str:
    """The hand-written part of a performance page (from :data:`HAND_WRITTEN` on)."""
    at = page.find(HAND_WRITTEN)
    return page[at:] if at >= 0 else ""


def performance_page(outputs: dict[str, str], load: str = "unknown", kept: str = "") -> str:
    """The performance docs page: the benchmarks' own output from this run, then the
    hand-written part ``kept`` from the page before (see :data:`HAND_WRITTEN`)."""
    lines = [PERFORMANCE_INTRO.strip(), ""]
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines.append(
        f"Run on {now}: {_cpu_model()}, {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {platform.system()}, {_redis_version()}; "
        f"load average {load} when the run began, as other work shares the machine."
    )
    for script, output in outputs.items():
        lines += ["", f"## {BENCHMARK_TITLES[script]}", "", BENCHMARK_NOTES[script], ""]
        figures = [line for line in output.splitlines() if not _noise(line)]
        lines += ["```text", *figures, "```"]
    page = "\n".join(lines) + "\n"
    if kept:
        page += "\n" + kept.rstrip("\n") + "\n"
    return page


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _redis_version() -> str:
    try:
        out = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "redis-server (version unknown)"
    version = next((p for p in out.split() if p.startswith("v=")), "v=?")[2:]
    return f"redis-server {version}"


def _load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _noise(line: str) -> bool:
    # Spark's own start-up chatter and progress bars are not figures.
    return (
        not line.strip()
        or line.startswith(("Using Spark", "Setting default log", "To adjust logging", "WARNING:"))
        or " WARN " in line
        or "[Stage" in line
    )


@nox.session
def reliability(session: nox.Session) -> None:
    """Fault-injection suite; writes docs/reliability.md from this run's figures."""
    report = Path(session.create_tmp()) / "reliability.jsonl"
    report.unlink(missing_ok=True)
    session.run(
        "pytest",
        "tests/reliability",
        "-p",
        "no:randomly",
        *session.posargs,
        env={"STREAMKIT_RELIABILITY_REPORT": str(report), "STREAMKIT_CHURN_SOAK": "60"},
    )
    session.run("python", "tests/reliability/write_report.py", str(report))


#: The compatibility set: what runs again on Python 3.12 and 3.13 and on Valkey 8
#: (the whole suite runs on Python 3.11 and Redis). One file per layer a version could
#: break (the pure pieces, the Redis layer and its scripts, leases, membership,
#: rebalancing, fetching, state, jobs, the clients, an example, the network faults'
#: short forms: the blackholes and the clients), kept small so that ./dev test stays
#: within its time.
COMPAT_SET = [
    "tests/test_partitioner.py",
    "tests/test_records.py",
    "tests/test_codec.py",
    "tests/test_testing.py",
    "tests/test_lua.py",
    "tests/test_locks.py",
    "tests/test_membership.py",
    "tests/test_rebalancer.py",
    "tests/test_fetcher.py",
    "tests/test_state.py",
    "tests/test_jobs.py",
    "tests/test_clients.py",
    "tests/test_examples_state.py",
    "tests/test_cut_links.py",
    "tests/reliability/test_network.py::test_blackholed_worker_hands_over_and_rejoins[replies]",
    "tests/reliability/test_network.py::test_clients_through_blackholes_and_resets",
]
#: What the compatibility set leaves out of its files: the start of 4,096 partitions
#: (a test of the event loop's load, not of a version; the suite runs it on 3.11).
COMPAT_DESELECTED = [
    "tests/test_rebalancer.py::test_thousands_of_partitions_start_at_once_without_a_lost_lease",
]
#: The Pythons of the compatibility set, beside the suite's own.
COMPAT_PYTHONS = ("3.12", "3.13")


def _interpreter(version: str) -> str | None:
    """An interpreter of Python ``version``: pyenv's newest, else ``pythonX.Y``."""
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    if shutil.which("pyenv"):
        found = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False)
        root = found.stdout.strip() or root
    candidates = sorted(
        Path(root).glob(f"versions/{version}.*/bin/python"),
        key=lambda p: tuple(int(x) for x in p.parent.parent.name.split(".") if x.isdigit()),
    )
    if candidates:
        return str(candidates[-1])
    return shutil.which(f"python{version}")


def _compat_env(session: nox.Session, version: str, python: str) -> str:
    """A virtual environment of ``python`` with streamkit and its test dependencies,
    made (with uv) once per change of pyproject.toml; its interpreter."""
    venv = Path(".nox") / f"compat-{version}"
    stamp = venv / ".streamkit-installed"
    wanted = hashlib.sha256(Path("pyproject.toml").read_bytes()).hexdigest()
    interpreter = str(venv / "bin" / "python")
    if not (stamp.exists() and stamp.read_text() == wanted):
        session.run("uv", "venv", "-q", "--allow-existing", "--python", python, str(venv))
        session.run(
            "uv", "pip", "install", "-q", "--compile-bytecode", "--python", interpreter,
            "-e", ".[test]",
        )  # fmt: skip
        stamp.write_text(wanted)
    return interpreter


@nox.session
def compat(session: nox.Session) -> None:
    """The compatibility set (:data:`COMPAT_SET`) on Python 3.12 and 3.13 and on
    Valkey 8, the three runs side by side (each waits on servers and workers more than
    it computes); each run's wall and CPU time are printed. A Python the machine lacks
    is said and skipped."""
    runs: dict[str, list[str]] = {}
    for version in COMPAT_PYTHONS:
        python = _interpreter(version)
        if python is None:
            session.warn(f"Python {version} not found (pyenv or python{version}): skipped")
            continue
        runs[f"Python {version}"] = [_compat_env(session, version, python), "-m", "pytest"]
    runs["Valkey 8"] = [sys.executable, "-m", "pytest", "--server", "valkey"]
    session.run("python", "-m", "compileall", "-q", "-j", "0", "streamkit", "tests", silent=True)
    logs = Path(session.create_tmp())
    started = {}
    for name, command in runs.items():
        log = (logs / f"compat-{name.replace(' ', '-')}.log").open("wb")
        chosen = session.posargs or [
            *COMPAT_SET,
            *(f"--deselect={test}" for test in COMPAT_DESELECTED),
        ]
        args = [*command, "-q", "-n", "2", *chosen]
        began = datetime.now(UTC).timestamp()
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        started[name] = (process, log, began)
    failed = []
    for name, (process, log, began) in started.items():
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        log.close()
        wall = datetime.now(UTC).timestamp() - began
        tail = Path(log.name).read_text(errors="replace").strip().splitlines()[-1:]
        cpu = usage.ru_utime + usage.ru_stime
        session.log(f"{name}: {' '.join(tail)} (wall {wall:.0f}s, CPU {cpu:.0f}s, its servers too)")
        if process.returncode != 0:
            failed.append(f"{name} (see {log.name})")
    if failed:
        session.error(f"the compatibility set failed on {', '.join(failed)}")


@nox.session
def netsoak(session: nox.Session) -> None:
    """The network fault scenarios as a soak (``tests/reliability/test_network.py``
    with ``STREAMKIT_NET_SOAK=60``: latency (with jobs enqueued throughout) and random
    resets for a minute each, the clients' faults for 30 rounds); prints their reports
    as the reliability page would show them, job runs and reruns included."""
    tmp = Path(session.create_tmp())
    report, page = tmp / "netsoak.jsonl", tmp / "netsoak.md"
    report.unlink(missing_ok=True)
    session.run(
        "pytest",
        "tests/reliability/test_network.py",
        "-p",
        "no:randomly",
        *session.posargs,
        env={"STREAMKIT_NET_SOAK": "60", "STREAMKIT_RELIABILITY_REPORT": str(report)},
    )
    session.run("python", "tests/reliability/write_report.py", str(report), str(page))
    session.log(page.read_text(encoding="utf-8").split("## The last run", 1)[1])


@nox.session
def demo(session: nox.Session) -> None:
    """The orders demo on a private, throwaway Redis server (``./dev demo state``: the
    state demo, exactly-once counts and windows through a kill -9; ``./dev demo joins``:
    the joins demo, orders joined with their payments within a window, each result
    once through a kill -9; ``./dev demo receipts``: one receipt job and one
    receipts_sent record per order through a kill -9)."""
    args = list(session.posargs)
    demos = {
        "state": "examples.state_shop.demo",
        "joins": "examples.joins_shop.demo",
        "receipts": "examples.receipts.demo",
    }
    if args[:1] and args[0] in demos:
        session.run("python", "-m", demos[args[0]], *args[1:])
    else:
        session.run("python", "-m", "examples.orders.demo", *args)
