"""Job queues: streamkit.jobs against streaq, saq, arq and taskiq, side by side in one run.

Run with ``./dev bench`` (it makes the peers' virtualenvs; ``./dev bench --quick``
skips the peers' crash-recovery runs, about 7 of this script's 13 minutes), or alone
inside .venv after ``./dev nox -s peers``: ``python tests/benchmarks/bench_jobs.py``
(``--quick`` likewise, ``--help`` lists the sizes).

Every queue runs in its own processes against one private redis-server started here:
streamkit's with this interpreter, each peer's with the python of its own virtualenv,
``.venv-peers/NAME`` (made by the nox ``peers`` session from the pinned lists in
``jobs_peers/``; each peer has its own, as their redis clients clash: arq wants
redis-py < 6, taskiq-redis >= 8). The peers' side is ``jobs_peers/harness.py`` and one
``jobs_peers/peer_NAME.py`` each, written with each library's own API, its defaults
kept but the concurrency (32 per worker process), asyncio's event loop, and logging
left unconfigured (nothing below WARNING is printed, for every queue).

Completion is told the same way for every queue, by markers in Redis, not by any
library's result API: a throughput job counts itself in its process and takes the
time, and a flusher adds the count to a Redis key every 10 ms, after the process's
first job start and last job end (so a marker costs no queue a round trip); a
crash-recovery job writes its start and its end to Redis at once. FLUSHALL between
runs.

Workloads, each for every queue:

* **no-op**: ``--jobs`` (20,000) jobs that do nothing, enqueued by one producer process
  with the queue's batch API where it has one (streamkit and streaq ``enqueue_many``;
  saq, arq and taskiq have none: ``asyncio.gather`` over their one-job enqueue, at most
  50 in flight), timed; then 1 worker process, or 2, started and timed from the first
  job's start to the last job's end (start-up not counted, shown apart).
* **sleep**: ``--sleep-jobs`` (2,000) jobs of ``sleep(0.05)`` (``trio.sleep`` for
  streamkit, ``asyncio.sleep`` for the peers; streaq's ``anyio.sleep``), the same way.
  At concurrency 32 the ideal is 640 jobs/s per worker process.
* **bare loop**: ``XREADGROUP COUNT 32`` + ``XACK`` over ``--jobs`` stream entries on
  one coredis connection in this process: no job at all, the floor of the Redis work of
  taking one job and letting it go, for one process.
* **bare claim loop**: streamkit's own claim and finish scripts called back to back, 32
  jobs per claim, over ``--jobs`` enqueued no-op jobs, with no worker around them: what
  the scripts cost, in jobs/s and in Redis's time per job (from ``INFO commandstats``:
  the scripts' calls, and the commands they run inside; the rest is Lua).
* **by hand**: the same commands the scripts run for a no-op job, sent from Python with
  hiredis on a Trio socket, pipelined (5 round trips per 32 jobs, no Lua, not atomic):
  the limit of one Python process doing the scripts' work. It follows the scripts' usual
  path as of this writing; a change to the scripts is to be followed here.
* **authors' configuration**: streaq and taskiq again, as their authors would run them
  (``jobs_peers/peer_*.py``, ``AUTHORS``): both on uvloop, taskiq with taskiq-redis's
  result backend. arq's figures are bounded by its polling, which the report says.
* **crash recovery**, each queue with its default settings: 32 jobs of a 5 s sleep,
  worker A (concurrency 32) runs all of them, worker B (already imported and
  connected) starts and idles for a second, A is killed with SIGKILL; timed from the
  kill until each job has started again on B ("taken over") and until all 32 have
  completed ("all done": the 5 s job runs again). A peer not done after
  ``--recovery-cap`` seconds (400) shows ``> cap``. streamkit runs alone; the peers'
  runs, which mostly wait out their timeouts, run at the same time, each in its own
  Redis database (else they would take about 20 minutes); ``--quick`` skips them.

streamkit alone, beside the peers' table (no peer has them):

* **limits**: the no-op run again with 1 worker process, the jobs declared with a rate
  limit (100,000/s, which never binds here) and a concurrency key (1 running per key,
  100 keys, round robin): what the claim script's limit checks cost per job, against
  the plain no-op run. Target: at least 80% of it.
* **workflows**: one worker process; a chain of 3 no-op jobs (each given the previous
  result) and a chord of 100 no-op jobs whose callback gets the 100 results, timed from
  the enqueue to the final result in the enqueuing process (median of ``--chains``
  chains and ``--chords`` chords, one at a time).

Targets (the lead's): streamkit at least 25,000 no-op jobs/s per worker process and
faster than every peer, in both configurations; its enqueue of 20,000 at least 3x the fastest
peer's; a killed worker's jobs taken over within the lease TTL + 1 s.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import inspect
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from streamkit import open_redis
from streamkit.jobs import open_job_queue
from streamkit.testing import RedisServer, wait_until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from streamkit.jobs import Job, JobQueue

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PEERS_DIR = HERE / "jobs_peers"
PEERS = ("streaq", "saq", "arq", "taskiq")
# What each queue does, with its defaults, when a worker dies (read in its source).
RECOVERY_HOW = {
    "streamkit": "lease_ttl 5 s, renewed every 1 s, reclaimed within 0.5 s; retries=3",
    "streaq": "idle_timeout 60 s: XAUTOCLAIM after an idle worker's 60 s blocking read",
    "saq": "job timeout 10 s, swept every 60 s; retries=1 is one try: swept jobs abort",
    "arq": "in-progress key lives job_timeout 300 s + 10 s; then the job runs again",
    "taskiq": "stream idle_timeout 600 s; autoclaims only after a read that got jobs",
}
CONCURRENCY = 32
#: No-op jobs per second one streamkit worker process is to reach.
JOBS_TARGET = 25_000
SLEEP = 0.05
SLOW = 5.0
RECOVERY_JOBS = 32
FLUSH_EVERY = 0.01
QUEUE_NAME = "bench"
#: The limits of the limited no-op run: a rate that never binds here, and 1 running per
#: key over LIMIT_KEYS keys, round robin.
LIMITED_RATE = "100000/s"
LIMIT_KEYS = 100
#: Issue 38's targets: Redis time per no-op job, plain and limited (us), and limited jobs'
#: throughput at least this share of plain ones in every round.
PLAIN_US_TARGET, LIMITED_US_TARGET, RATIO_TARGET = 12.0, 16.0, 0.85
LEASE_TTL: float = inspect.signature(open_job_queue).parameters["lease_ttl"].default


# === streamkit's side: the producer and worker processes ==========================


@dataclasses.dataclass
class _Marks:
    done: int = 0
    first_start: float | None = None
    last_end: float = 0.0
    redis: Any = None


_marks = _Marks()


def _declare(queue: JobQueue) -> dict[str, Job[Any, Any]]:
    """The three jobs, declared on ``queue`` with its defaults."""

    async def noop() -> None:
        if _marks.first_start is None:
            _marks.first_start = time.time()
        _marks.done += 1
        _marks.last_end = time.time()

    async def sleep() -> None:
        if _marks.first_start is None:
            _marks.first_start = time.time()
        await trio.sleep(SLEEP)
        _marks.done += 1
        _marks.last_end = time.time()

    async def slow(i: int) -> None:
        await _marks.redis.hset("bench:started", {f"{i}:{os.getpid()}": repr(time.time())})
        await trio.sleep(SLOW)
        await _marks.redis.hset("bench:finished", {str(i): repr(time.time())})

    async def limited(key: int) -> None:
        await noop()

    async def step(value: int) -> int:
        return value

    async def count(values: list[int]) -> int:
        return len(values)

    jobs = {fn.__name__: queue.job(fn) for fn in (noop, sleep, slow, step, count)}
    jobs["limited"] = queue.job(
        limited, rate_limit=LIMITED_RATE, limit_key="key", key_concurrency=1
    )
    return jobs


async def _flush_forever(redis: Any) -> None:
    pid = os.getpid()
    flushed = 0
    while True:
        await trio.sleep(FLUSH_EVERY)
        done = _marks.done
        if done == flushed or _marks.first_start is None:
            continue
        # The times first, then the count: a reader that sees the count sees the times.
        await redis.hset(
            "bench:times",
            {f"first:{pid}": repr(_marks.first_start), f"last:{pid}": repr(_marks.last_end)},
        )
        await redis.incrby("bench:done", done - flushed)
        flushed = done


async def streamkit_produce(url: str, kind: str, n: int) -> None:
    if kind == "slow":
        calls: list[tuple[int, ...]] = [(i,) for i in range(n)]
    elif kind == "limited":
        calls = [(i % LIMIT_KEYS,) for i in range(n)]
    else:
        calls = [() for _ in range(n)]
    async with open_redis(url) as redis, open_job_queue(redis, QUEUE_NAME) as queue:
        jobs = _declare(queue)
        began = time.perf_counter()
        await jobs[kind].enqueue_many(calls)
        seconds = time.perf_counter() - began
    print(json.dumps({"enqueue_s": seconds}), flush=True)


async def streamkit_work(url: str, concurrency: int, wait_go: bool) -> None:
    async with (
        open_redis(url) as markers,
        open_redis(url) as redis,
        open_job_queue(redis, QUEUE_NAME) as queue,
    ):
        _marks.redis = markers
        _declare(queue)
        if wait_go:
            await trio.to_thread.run_sync(sys.stdin.readline)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_flush_forever, markers)
            await markers.sadd("bench:ready", [str(os.getpid())])
            await queue.serve(concurrency=concurrency)


# === the run: contestants, processes, markers =====================================


@dataclasses.dataclass
class Contestant:
    name: str
    label: str
    command: list[str]  # python and script; the role's arguments follow
    env: dict[str, str]
    #: Arguments after the role's (the authors' configuration of a peer).
    extra: list[str] = dataclasses.field(default_factory=list)


#: The peers run a second time as their authors recommend (see jobs_peers/peer_*.py).
AUTHORS = {"streaq": "uvloop", "taskiq": "uvloop, RedisAsyncResultBackend"}
#: Why arq's throughput is what it is, with its defaults (from its source).
ARQ_POLL = (
    "arq: bounded by its polling: a worker reads at most queue_read_limit = 5 x max_jobs = "
    "160 jobs per poll and polls every poll_delay = 0.5 s when idle"
)


def _authors(peer: Contestant) -> Contestant:
    return dataclasses.replace(
        peer,
        name=f"{peer.name}*",
        label=f"{peer.label} ({AUTHORS[peer.name]})",
        extra=["--config", "authors"],
    )


def _streamkit() -> Contestant:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        rev = "working tree"
    return Contestant("streamkit", f"streamkit ({rev})", [sys.executable, __file__], env)


def _peer(name: str, venvs: Path) -> Contestant | str:
    """The peer ``name`` from its virtualenv, or why it cannot run."""
    python = venvs / name / "bin" / "python"
    if not python.exists():
        return f"{name}: no {python}; make it with `./dev nox -s peers` (./dev bench does)"
    dists = {"taskiq": ["taskiq", "taskiq-redis"]}.get(name, [name])
    probe = (
        "import sys, importlib.metadata as m; print(' '.join(m.version(d) for d in sys.argv[1:]))"
    )
    try:
        versions = subprocess.run(
            [str(python), "-c", probe, *dists], capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"{name}: its virtualenv does not work ({exc})"
    label = " + ".join(f"{d} {v}" for d, v in zip(dists, versions, strict=True))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return Contestant(name, label, [str(python), str(PEERS_DIR / f"peer_{name}.py")], env)


class Failed(Exception):
    """A run that could not be measured (its message says why)."""


@dataclasses.dataclass
class Procs:
    logs: Path
    running: list[tuple[trio.Process, Path]] = dataclasses.field(default_factory=list)

    async def spawn(
        self, who: Contestant, args: Sequence[str], *, stdin: bool = False
    ) -> trio.Process:
        log = self.logs / f"{who.name}-{len(self.running)}-{args[0]}.log"
        with log.open("wb") as out:
            proc = await trio.lowlevel.open_process(
                [*who.command, *args, *who.extra],
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=who.env,
                cwd=ROOT,
            )
        self.running.append((proc, log))
        return proc

    def check(self, procs: Sequence[trio.Process]) -> None:
        for proc in procs:
            if proc.returncode is not None or proc.poll() is not None:
                raise Failed(f"a worker exited with code {proc.returncode}: {self.tail(proc)}")

    def tail(self, proc: trio.Process) -> str:
        for p, log in self.running:
            if p is proc:
                lines = log.read_text(errors="replace").strip().splitlines()
                return " | ".join(lines[-6:]) or "(no output)"
        return "(no log)"

    async def kill_all(self) -> None:
        for proc, _ in self.running:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
        with trio.CancelScope(shield=True):
            for proc, _ in self.running:
                await proc.wait()
        self.running.clear()


async def produce(procs: Procs, who: Contestant, url: str, kind: str, n: int) -> float:
    """Run the contestant's producer; the seconds its enqueueing took."""
    proc = await procs.spawn(who, ["produce", "--url", url, "--kind", kind, "--jobs", str(n)])
    with trio.move_on_after(600):
        await proc.wait()
    if proc.returncode != 0:
        raise Failed(f"the producer failed ({proc.returncode}): {procs.tail(proc)}")
    log = next(log for p, log in procs.running if p is proc)
    last = log.read_text().strip().splitlines()[-1]
    return float(json.loads(last)["enqueue_s"])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def wait_for(
    what: str, check: Callable[[], Awaitable[bool]], within: float, interval: float = 0.02
) -> None:
    try:
        await wait_until(check, what=what, within=within, interval=interval)
    except trio.TooSlowError:
        raise Failed(f"timed out after {within:g}s waiting for {what}") from None


# === throughput ==================================================================


@dataclasses.dataclass
class Throughput:
    enqueue: float  # jobs/s
    rate: float  # jobs/s, first job start to last job end
    startup: float  # s, workers spawned to first job start
    extra: int  # completions beyond n (a job run twice)
    script_us: float = 0.0  # Redis server time in scripts per job while the workers ran


async def _script_usec(redis: Any) -> int:
    """Microseconds the server spent in scripts (EVALSHA and EVAL) so far."""
    stats = await redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "eval"))


async def throughput(
    redis: Any, url: str, who: Contestant, kind: str, n: int, workers: int, limit: float
) -> Throughput:
    await redis.flushall()
    with tempfile.TemporaryDirectory(prefix="bench-jobs-") as logs:
        procs = Procs(Path(logs))
        try:
            enqueue_s = await produce(procs, who, url, kind, n)
            usec_before = await _script_usec(redis)
            spawned = time.time()
            started = [
                await procs.spawn(who, ["work", "--url", url, "--concurrency", str(CONCURRENCY)])
                for _ in range(workers)
            ]

            async def all_done() -> bool:
                procs.check(started)
                return int(await redis.get("bench:done") or 0) >= n

            await wait_for(f"{n:,} {kind} jobs", all_done, limit)
            times = {_text(k): float(v) for k, v in (await redis.hgetall("bench:times")).items()}
            await trio.sleep(0.1)  # a second run of some job would show by now
            done = int(await redis.get("bench:done") or 0)
            script_us = (await _script_usec(redis) - usec_before) / n
        finally:
            await procs.kill_all()
    first = min(v for k, v in times.items() if k.startswith("first:"))
    last = max(v for k, v in times.items() if k.startswith("last:"))
    return Throughput(n / enqueue_s, n / (last - first), first - spawned, done - n, script_us)


async def bare_loop(redis: Any, n: int) -> float:
    """XREADGROUP COUNT 32 + XACK over n entries on one connection: entries/s."""
    await redis.flushall()
    key = "bench:bare"
    for start in range(0, n, 1000):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(start + 1000, n)):
                pipe.xadd(key, {"id": str(i)})
    await redis.xgroup_create(key, "g", "0")
    done = 0
    began = time.perf_counter()
    while True:
        reply = await redis.xreadgroup("g", "c", streams={key: ">"}, count=CONCURRENCY)
        if not reply:
            break
        entries = next(iter(reply.values()))
        await redis.xack(key, "g", [e.identifier for e in entries])
        done += len(entries)
    seconds = time.perf_counter() - began
    assert done == n, done
    return n / seconds


# === streamkit's limits and workflows ============================================


@dataclasses.dataclass
class Workflows:
    chain_ms: float  # median, enqueue to final result
    chord_ms: float
    chains: int
    chords: int


async def workflows(url: str, who: Contestant, chains: int, chords: int) -> Workflows:
    """One worker process; chains of 3 and chords of 100 no-op jobs, one at a time,
    timed from the enqueue to the final result here."""
    from streamkit.jobs import chain, chord

    async with open_redis(url) as redis, open_job_queue(redis, QUEUE_NAME) as queue:
        await redis.flushall()
        jobs = _declare(queue)
        step, count = jobs["step"], jobs["count"]
        with tempfile.TemporaryDirectory(prefix="bench-jobs-") as logs:
            procs = Procs(Path(logs))
            try:
                work = ["work", "--url", url, "--concurrency", str(CONCURRENCY)]
                worker = await procs.spawn(who, work)

                async def ready() -> bool:
                    procs.check([worker])
                    return bool(await redis.scard("bench:ready"))

                await wait_for("the worker to start", ready, 30)
                # a first one each, not timed: the scripts' first load
                flow = chain(step.step(1), step.step(), step.step())
                await (await queue.enqueue_workflow(flow)).result(timeout=30)
                chain_ms = []
                for i in range(chains):
                    began = time.perf_counter()
                    handle = await queue.enqueue_workflow(
                        chain(step.step(i), step.step(), step.step())
                    )
                    assert await handle.result(timeout=30) == i
                    chain_ms.append((time.perf_counter() - began) * 1000)
                chord_ms = []
                for _ in range(chords):
                    began = time.perf_counter()
                    handle = await queue.enqueue_workflow(
                        chord([step.step(i) for i in range(100)], count.step())
                    )
                    assert await handle.result(timeout=60) == 100
                    chord_ms.append((time.perf_counter() - began) * 1000)
            finally:
                await procs.kill_all()
    return Workflows(statistics.median(chain_ms), statistics.median(chord_ms), chains, chords)


# === the job lifecycle's Redis work, without a worker =============================


@dataclasses.dataclass
class Lifecycle:
    rate: float  # jobs/s
    server_us: float  # Redis's time per job, all commands (scripts included)
    commands_us: float  # of which the commands (those the scripts call, or sent by hand)


async def _command_usec(redis: Any) -> dict[str, float]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): float(values["usec"]) for name, values in stats.items()}


async def _enqueued(redis: Any, n: int) -> JobQueue:
    await redis.flushall()
    async with open_job_queue(redis, "bare") as queue:

        async def noop() -> None:
            pass

        await queue.job(noop).enqueue_many([() for _ in range(n)])
        return queue


async def bare_claim_loop(redis: Any, n: int) -> Lifecycle:
    """The queue's own claim and finish scripts (jobs/claim, jobs/finish) called back to
    back, 32 jobs per claim, with no worker around them: what taking a job and letting
    it go costs in Redis, and the most one process gets from the scripts."""
    from streamkit._lua import script
    from streamkit._redis import LuaScript
    from streamkit.jobs._claim import ensure_groups

    claim, finish = LuaScript(script("jobs/claim")), LuaScript(script("jobs/finish"))
    queue = await _enqueued(redis, n)
    lease_ms = math.ceil(queue.lease_ttl * 1000)
    for shard in range(len(queue.shard_keys)):
        await ensure_groups(queue, shard)
    await redis.config_resetstat()
    done = 0
    began = time.perf_counter()
    for keys in queue.shard_keys:
        while True:
            args = (keys.base, "bare", CONCURRENCY, lease_ms, "0", queue.max_deliveries, b"{}")
            jobs = (await claim(redis, keys.keys, args))[0]
            if not jobs:
                break
            outcomes: list[Any] = [keys.base, lease_ms]
            for job in jobs:
                outcomes += [job[0], job[4], "ok", b"null", 0]
            await finish(redis, keys.keys, outcomes)
            done += len(jobs)
    seconds = time.perf_counter() - began
    assert done == n, done
    usec = await _command_usec(redis)
    scripts = usec.get("evalsha", 0.0) + usec.get("eval", 0.0)
    inner = sum(v for k, v in usec.items() if k not in ("evalsha", "eval", "config|resetstat"))
    return Lifecycle(n / seconds, scripts / n, inner / n)


async def by_hand_loop(redis: Any, url: str, n: int) -> Lifecycle:
    """The Redis commands the claim and finish scripts run for a no-op job (their
    usual path, as of this writing), sent by hand from Python with hiredis on a Trio
    socket, pipelined: per 32 jobs, one round trip reads them (XREADGROUP), one reads
    their hashes, one starts them, one reads them again and one ends them; no Lua, no
    atomicity. The counters move once per status and name per batch, and the batch's
    entries are acknowledged and deleted at once, as the scripts do. The limit of one
    Python process doing the scripts' work."""
    import hiredis

    from streamkit.jobs._claim import ensure_groups

    queue = await _enqueued(redis, n)
    for shard in range(len(queue.shard_keys)):
        await ensure_groups(queue, shard)
    parts = urllib.parse.urlsplit(url)
    sock = await trio.open_tcp_stream(parts.hostname or "127.0.0.1", parts.port or 6379)
    reader = hiredis.Reader()
    pack = hiredis.pack_command

    async def pipeline(commands: list[tuple[Any, ...]]) -> list[Any]:
        await sock.send_all(b"".join(pack(c) for c in commands))
        replies: list[Any] = []
        while len(replies) < len(commands):
            reply = reader.gets()
            if reply is False:
                reader.feed(await sock.receive_some(1 << 20))
            elif isinstance(reply, hiredis.ReplyError):
                raise reply
            else:
                replies.append(reply)
        return replies

    await redis.config_resetstat()
    done = 0
    began = time.perf_counter()
    async with sock:
        for keys in queue.shard_keys:
            q = [keys.ready(p) for p in range(3)]
            sched, counts = keys.keys[3], keys.keys[6]
            settle = f"{keys.base}:settle"
            while True:
                now, *_, read = await pipeline(
                    [
                        ("TIME",),
                        ("ZRANGEBYSCORE", sched, "-inf", "+inf", "LIMIT", 0, 100),
                        *[("EXISTS", stream) for stream in q],
                        ("XREADGROUP", "GROUP", "workers", "bare", "COUNT", CONCURRENCY,
                         "STREAMS", q[1], ">"),
                    ]
                )  # fmt: skip
                if not read:
                    break
                ms = b"%d" % (int(now[0]) * 1000 + int(now[1]) // 1000)
                entries = read[0][1]
                jobs = [(entry[0], entry[1][1]) for entry in entries]
                keyed = [(e, f"{keys.base}:job:".encode() + i) for e, i in jobs]
                fields = await pipeline(
                    [
                        ("HMGET", k, "status", "name", "args", "tries", "max_tries", "expires",
                         "owner", "abort", "started", "hist")
                        for _, k in keyed
                    ]
                )  # fmt: skip
                start: list[tuple[Any, ...]] = []
                for (e, k), f in zip(keyed, fields, strict=True):
                    tries = b"%d" % (int(f[3] or 0) + 1)
                    start.append(
                        ("HSET", k, "status", "executing", "owner", b"bare:" + tries,
                         "worker", "bare", "started", ms, "tries", tries, "entry", e,
                         "hist", (f[9] or b"") + b"s," + tries + b"," + ms + b",bare\n")
                    )  # fmt: skip
                # the counters: one move per status and name for the whole batch
                names = collections.Counter(f[1] for f in fields)
                for name, moved in names.items():
                    start += [
                        ("HINCRBY", counts, b"sent|" + name, -moved),
                        ("HINCRBY", counts, b"executing|" + name, moved),
                    ]
                start += [("ZRANGE", sched, 0, 0, "WITHSCORES"), ("LINDEX", settle, 0)]
                await pipeline(start)
                # (the job runs here)
                fields = await pipeline(
                    [("TIME",)]
                    + [
                        ("HMGET", k, "owner", "name", "prio", "entry", "status", "w", "ttl",
                         "dependents", "worker", "tries", "abort", "hist")
                        for _, k in keyed
                    ]
                )  # fmt: skip
                now, fields = fields[0], fields[1:]
                ms = b"%d" % (int(now[0]) * 1000 + int(now[1]) // 1000)
                # the batch's entries acknowledged and deleted at once, as the script does
                ids = [e for e, _ in keyed]
                end: list[tuple[Any, ...]] = [
                    ("XACK", q[1], "workers", *ids),
                    ("XDEL", q[1], *ids),
                ]
                for (_, k), f in zip(keyed, fields, strict=True):
                    end += [
                        ("HDEL", k, "entry"),
                        ("HSET", k, "status", "success", "finished", ms, "owner", "",
                         "hist", (f[11] or b"") + b"e," + f[9] + b"," + ms + b",success\n"),
                    ]  # fmt: skip
                    if int(f[6] or 0) > 0:
                        end.append(("EXPIRE", k, f[6]))  # the result's time to live
                for name, moved in collections.Counter(f[1] for f in fields).items():
                    end += [
                        ("HINCRBY", counts, b"executing|" + name, -moved),
                        ("HINCRBY", counts, b"success|" + name, moved),
                    ]
                end.append(("LINDEX", settle, 0))
                await pipeline(end)
                done += len(jobs)
    seconds = time.perf_counter() - began
    assert done == n, done
    usec = await _command_usec(redis)
    total = sum(v for k, v in usec.items() if k != "config|resetstat")
    return Lifecycle(n / seconds, total / n, total / n)


# === crash recovery ==============================================================


@dataclasses.dataclass
class Recovery:
    taken_over: float | None  # s from the kill until all 32 started again on B
    done: float | None  # s from the kill until all 32 completed
    finished: int  # jobs completed when the wait ended
    restarted: int  # jobs started again when the wait ended
    dead: float | None = None  # s from the kill until all 32 were dead (streamkit only)


async def recovery(url: str, who: Contestant, cap: float) -> Recovery:
    dead_at: float | None = None
    async with open_redis(url) as redis, open_job_queue(redis, QUEUE_NAME) as queue:
        await redis.flushdb()
        with tempfile.TemporaryDirectory(prefix="bench-jobs-") as logs:
            procs = Procs(Path(logs))
            try:
                await produce(procs, who, url, "slow", RECOVERY_JOBS)
                work = ["work", "--url", url, "--concurrency", str(CONCURRENCY)]
                a = await procs.spawn(who, work)
                b = await procs.spawn(who, [*work, "--wait-go"], stdin=True)

                async def a_runs_all() -> bool:
                    procs.check([a, b])
                    return int(await redis.hlen("bench:started")) >= RECOVERY_JOBS

                await wait_for("worker A to run all 32 jobs", a_runs_all, 60)
                assert b.stdin is not None
                await b.stdin.send_all(b"go\n")

                async def b_ready() -> bool:
                    procs.check([a, b])
                    return str(b.pid) in {_text(m) for m in await redis.smembers("bench:ready")}

                await wait_for("worker B to start", b_ready, 30)
                await trio.sleep(1.0)  # B idles: connected, reading
                if await redis.hlen("bench:finished"):
                    raise Failed("jobs finished on A before it was killed: B was too slow to start")
                killed = time.time()
                a.send_signal(signal.SIGKILL)

                async def all_finished() -> bool:
                    nonlocal dead_at
                    procs.check([b])
                    if who.name.startswith("streamkit") and (
                        (await queue.counts()).dead >= RECOVERY_JOBS
                    ):
                        # Ended dead (WorkerLost), not to be run again: no use waiting.
                        dead_at = time.time()
                        return True
                    return int(await redis.hlen("bench:finished")) >= RECOVERY_JOBS

                with contextlib.suppress(Failed):
                    await wait_for("all jobs to finish", all_finished, cap, interval=0.05)
                starts = {
                    _text(k): float(v) for k, v in (await redis.hgetall("bench:started")).items()
                }
                ends = [float(v) for v in (await redis.hgetall("bench:finished")).values()]
            finally:
                await procs.kill_all()
    again: dict[str, float] = {}
    for member, at in starts.items():
        i, pid = member.split(":")
        if int(pid) != a.pid:
            again[i] = min(at, again.get(i, at))
    taken_over = max(again.values()) - killed if len(again) == RECOVERY_JOBS else None
    done = max(ends) - killed if len(ends) == RECOVERY_JOBS else None
    dead = dead_at - killed if dead_at is not None else None
    return Recovery(taken_over, done, len(ends), len(again), dead)


# === the report ==================================================================


COLUMNS = [("noop", 1), ("noop", 2), ("sleep", 1), ("sleep", 2)]


def _head(kind: str, workers: int) -> str:
    return f"{'no-op' if kind == 'noop' else 'sleep'} x{workers}"


def _cell(value: float | str | None, width: int = 11) -> str:
    if value is None:
        return f"{'-':>{width}}"
    if isinstance(value, str):
        return f"{value:>{width}}"
    return f"{value:>{width},.0f}"


def _ratio(ours: float | str | None, theirs: float | str | None, width: int = 11) -> str:
    if isinstance(ours, float) and isinstance(theirs, float) and theirs > 0:
        return f"{ours / theirs:>{width - 1}.2f}x"
    return f"{'-':>{width}}"


def report_streamkit(
    plain: Throughput | str,
    limited: Throughput | str,
    flows: Workflows | str,
    rounds: int,
    by_round: list[dict[str, Throughput]],
) -> None:
    """streamkit's limits and workflows (no peer has them)."""
    print("streamkit alone: limits and workflows (1 worker process, concurrency 32)")
    if isinstance(limited, str) or isinstance(plain, str):
        failure = limited if isinstance(limited, str) else plain
        print(f"  no-op with and without limits: failed: {failure}")
    else:
        ratio = limited.rate / plain.rate
        print(
            f"  no-op x1, plain: {plain.rate:,.0f} jobs/s, {plain.script_us:.1f} us of Redis "
            f"script time per job (enqueue not counted)"
        )
        print(
            f"  no-op x1 with a rate limit ({LIMITED_RATE}) and a concurrency key (1 running "
            f"per key, {LIMIT_KEYS} keys): {limited.rate:,.0f} jobs/s, {limited.script_us:.1f} "
            f"us of script time per job"
        )
        print(
            f"  with limits / plain: {ratio:.2f} (best of {rounds} alternated runs each; "
            f"target >= 0.80: {'met' if ratio >= 0.8 else 'NOT met'}); the limits cost "
            f"{limited.script_us - plain.script_us:.1f} us of server time per job"
        )
        paired = [r for r in by_round if "noop" in r and "limited" in r]
        if paired:
            ratios = [r["limited"].rate / r["noop"].rate for r in paired]
            plain_us = statistics.median(r["noop"].script_us for r in paired)
            limited_us = statistics.median(r["limited"].script_us for r in paired)
            print(
                f"  targets (issue 38, Redis time per job, median of {len(paired)} rounds): "
                f"plain {plain_us:.1f} us <= {PLAIN_US_TARGET:g} us "
                f"({'met' if plain_us <= PLAIN_US_TARGET else 'NOT met'}), limited "
                f"{limited_us:.1f} us <= {LIMITED_US_TARGET:g} us "
                f"({'met' if limited_us <= LIMITED_US_TARGET else 'NOT met'}); limited / plain "
                f"by round {', '.join(f'{x:.2f}' for x in ratios)} >= {RATIO_TARGET:g} in every "
                f"round ({'met' if min(ratios) >= RATIO_TARGET else 'NOT met'})"
            )
    if isinstance(flows, str):
        print(f"  workflows failed: {flows}")
    else:
        print(
            f"  chain of 3 no-op jobs, enqueue to final result: {flows.chain_ms:.1f} ms "
            f"(median of {flows.chains})"
        )
        print(
            f"  chord of 100 no-op jobs + callback, enqueue to final result: "
            f"{flows.chord_ms:.1f} ms (median of {flows.chords})"
        )


def report(
    args: argparse.Namespace,
    contestants: list[Contestant],
    runs: dict[str, dict[tuple[str, int], Throughput | str]],
    bare: float,
    recoveries: dict[str, Recovery | str],
    recovering: list[Contestant],
    skipped: list[str],
    *,
    authors: list[Contestant],
    lifecycle: dict[str, Lifecycle],
    redis_version: str,
) -> None:
    names = [c.name for c in contestants]
    labels = {c.name: c.label for c in [*contestants, *recovering, *authors]}
    width = max(len(label) for label in labels.values()) + 2

    def enqueue(name: str) -> float | str | None:
        rates = [
            r.enqueue for k, r in runs[name].items() if k[0] == "noop" and not isinstance(r, str)
        ]
        return max(rates) if rates else None

    def rate(name: str, column: tuple[str, int]) -> float | str | None:
        run = runs[name].get(column)
        if isinstance(run, str):
            return "failed"
        return None if run is None else run.rate

    print(
        f"job queues: {args.jobs:,} no-op jobs and {args.sleep_jobs:,} jobs of sleep({SLEEP:g}), "
        f"worker processes (x1, x2) at concurrency {CONCURRENCY} each, one private "
        f"redis-server; jobs/s"
    )
    print(
        f"  Python {platform.python_version()}, redis-server {redis_version}, "
        f"{_cpu_model()} x {os.cpu_count()}; versions in the labels"
    )
    heads = "".join(f"{h:>11}" for h in ["enqueue", *(_head(*c) for c in COLUMNS)])
    print(f"  defaults{'':<{width - 8}}{heads}")
    for name in names:
        cells = _cell(enqueue(name)) + "".join(_cell(rate(name, c)) for c in COLUMNS)
        print(f"  {labels[name]:<{width}}{cells}")
    if authors:
        print(f"  authors' configuration{'':<{width - 22}}{heads}")
        for who in authors:
            cells = _cell(enqueue(who.name)) + "".join(_cell(rate(who.name, c)) for c in COLUMNS)
            print(f"  {labels[who.name]:<{width}}{cells}")
    if "arq" in names:
        print(f"  {ARQ_POLL}")
    ideal = CONCURRENCY / SLEEP
    print(
        f"  sleep({SLEEP:g}) at concurrency {CONCURRENCY}: at most {ideal:,.0f} jobs/s per worker "
        f"process; enqueue: best of the two no-op runs"
    )
    print(
        f"  bare XREADGROUP COUNT {CONCURRENCY} + XACK loop (coredis, one process, no job): "
        f"{bare:,.0f} entries/s"
    )
    print(
        f"  the job lifecycle's Redis work, {CONCURRENCY} jobs at a time, no worker, one "
        f"process: jobs/s, Redis's time per job (us)"
    )
    scripts, by_hand = lifecycle["scripts"], lifecycle["by hand"]
    print(
        f"    bare claim loop (claim + finish scripts)        {scripts.rate:>9,.0f}"
        f"{scripts.server_us:>9.1f} us, of which the commands they call "
        f"{scripts.commands_us:.1f} us, Lua {scripts.server_us - scripts.commands_us:.1f} us"
    )
    print(
        f"    the same commands by hand (hiredis, pipelined)  {by_hand.rate:>9,.0f}"
        f"{by_hand.server_us:>9.1f} us, 5 round trips per {CONCURRENCY} jobs, not atomic"
    )
    print("  worker start-up, spawn to first job start (s, no-op x1 run, not timed above):")
    print(
        "   "
        + ", ".join(
            f"{n} {r.startup:.2f}"
            for n in names
            if isinstance(r := runs[n].get(("noop", 1)), Throughput)
        )
    )
    extra = [
        f"{n} {_head(*c)}: {r.extra} completions more than jobs"
        for n in names
        for c, r in runs[n].items()
        if isinstance(r, Throughput) and r.extra
    ]
    for line in extra:
        print(f"  {line}")
    for name in names:
        for column, run in runs[name].items():
            if isinstance(run, str):
                print(f"  {name} {_head(*column)} failed: {run}")
    if "streamkit" in runs and len(names) > 1:
        print("streamkit / peer (above 1.00x: streamkit is faster)")
        print(f"  {'':<{width}}{heads}")
        for name in [*names[1:], *(a.name for a in authors)]:
            cells = _ratio(enqueue("streamkit"), enqueue(name)) + "".join(
                _ratio(rate("streamkit", c), rate(name, c)) for c in COLUMNS
            )
            label = "vs " + labels[name].split(" ")[0] + ("*" if name.endswith("*") else "")
            print(f"  {label:<{width}}{cells}")
        if authors:
            print("  (*: the authors' configuration)")
    print(
        f"crash recovery: {RECOVERY_JOBS} jobs of sleep({SLOW:g}) running on worker A, worker B "
        "idle, A killed (SIGKILL); each queue's defaults; s from the kill"
    )
    print(f"  {'':<{width}}{'taken over':>11}{'all done':>11}  how (defaults, from the source)")
    for name in [c.name for c in recovering]:
        rec = recoveries.get(name)
        how = RECOVERY_HOW.get(name, "")
        if rec is None:
            print(f"  {labels[name]:<{width}}{'skipped':>11}{'':>11}  {how}")
        elif isinstance(rec, str):
            print(f"  {labels[name]:<{width}}{'failed':>11}{'':>11}  {rec}")
        elif rec.dead is not None:
            print(f"  {labels[name]:<{width}}{'never':>11}{'never':>11}  {how}")
            print(
                f"  {'':<{width}}{'':>22}  all {RECOVERY_JOBS} ended dead (WorkerLost) "
                f"{rec.dead:.2f} s after the kill: the lost try was their last"
            )
        else:
            cap = f"> {args.recovery_cap:g}"
            over = f"{rec.taken_over:.2f}" if rec.taken_over is not None else cap
            done = f"{rec.done:.2f}" if rec.done is not None else cap
            print(f"  {labels[name]:<{width}}{over:>11}{done:>11}  {how}")
            if rec.done is None:
                print(
                    f"  {'':<{width}}{'':>22}  after {args.recovery_cap:g} s: "
                    f"{rec.restarted} started again, {rec.finished} done"
                )
    if args.quick:
        print("  (--quick: the peers' recovery runs were skipped)")
    targets(args, [*names, *(a.name for a in authors)], enqueue, rate, recoveries)
    for line in skipped:
        print(f"  skipped {line}")


def targets(
    args: argparse.Namespace,
    names: list[str],
    enqueue: Callable[[str], float | str | None],
    rate: Callable[[str, tuple[str, int]], float | str | None],
    recoveries: dict[str, Recovery | str],
) -> None:
    if "streamkit" not in names:
        return
    print("targets")

    def mark(ok: bool) -> str:
        return "met" if ok else "NOT met"

    peers = names[1:]
    one, two = rate("streamkit", ("noop", 1)), rate("streamkit", ("noop", 2))
    if isinstance(one, float):
        print(
            f"  no-op, 1 worker process >= {JOBS_TARGET:,} jobs/s: {one:,.0f} "
            f"({mark(one >= JOBS_TARGET)})"
        )
    if isinstance(two, float):
        print(
            f"  no-op, 2 worker processes >= {JOBS_TARGET:,} jobs/s each: {two / 2:,.0f} each "
            f"({mark(two / 2 >= JOBS_TARGET)}; 2 cores, shared with redis-server and each other)"
        )
    for column in COLUMNS:
        ours = rate("streamkit", column)
        theirs = {p: rate(p, column) for p in peers}
        numbers = {p: v for p, v in theirs.items() if isinstance(v, float)}
        if isinstance(ours, float) and numbers:
            best = max(numbers, key=lambda p: numbers[p])
            print(
                f"  {_head(*column)} faster than every peer: best peer {best} "
                f"{numbers[best]:,.0f}, streamkit {ours:,.0f} ({mark(ours > numbers[best])})"
            )
    ours_enqueue = enqueue("streamkit")
    peer_enqueues = {p: v for p in peers if isinstance(v := enqueue(p), float)}
    if isinstance(ours_enqueue, float) and peer_enqueues:
        best = max(peer_enqueues, key=lambda p: peer_enqueues[p])
        factor = ours_enqueue / peer_enqueues[best]
        print(
            f"  enqueue of {args.jobs:,} >= 3x the fastest peer ({best}): {factor:.2f}x "
            f"({mark(factor >= 3)})"
        )
    rec = recoveries.get("streamkit")
    if isinstance(rec, Recovery):
        limit = LEASE_TTL + 1
        over = rec.taken_over
        print(
            f"  killed worker's jobs taken over <= lease_ttl + 1 s = {limit:g} s: "
            + (f"{over:.2f} s ({mark(over <= limit)})" if over is not None else "never")
            + (
                f"; all done {rec.done:.2f} s, the {SLOW:g} s job run again"
                if rec.done is not None
                else ""
            )
        )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# === the driver ==================================================================


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> None:
    contestants = [_streamkit()]
    skipped: list[str] = []
    for name in args.peers:
        peer = _peer(name, args.peers_venvs)
        if isinstance(peer, str):
            skipped.append(peer)
            progress(f"skipped {peer}")
        else:
            contestants.append(peer)
    authors = [_authors(c) for c in contestants if c.name in AUTHORS]
    runs: dict[str, dict[tuple[str, int], Throughput | str]] = {
        c.name: {} for c in [*contestants, *authors]
    }
    recoveries: dict[str, Recovery | str] = {}
    async with trio.open_nursery() as nursery:
        server: RedisServer = await nursery.start(RedisServer().run)
        url = server.url
        async with open_redis(url) as redis:
            for kind, workers in COLUMNS:
                n = args.jobs if kind == "noop" else args.sleep_jobs
                for who in [*contestants, *authors]:
                    try:
                        result = await throughput(redis, url, who, kind, n, workers, args.timeout)
                    except Failed as exc:
                        runs[who.name][kind, workers] = str(exc)
                        progress(f"  {who.name} {_head(kind, workers)}: failed: {exc}")
                    else:
                        runs[who.name][kind, workers] = result
                        progress(
                            f"  {who.name} {_head(kind, workers)}: enqueue "
                            f"{result.enqueue:,.0f}/s, run {result.rate:,.0f}/s "
                            f"(start-up {result.startup:.2f} s)"
                        )
            bare = await bare_loop(redis, args.jobs)
            progress(f"  bare XREADGROUP/XACK loop: {bare:,.0f}/s")
            lifecycle = {
                "scripts": await bare_claim_loop(redis, args.jobs),
                "by hand": await by_hand_loop(redis, url, args.jobs),
            }
            progress(
                "  claim and finish scripts: "
                + ", ".join(f"{k} {v.rate:,.0f}/s" for k, v in lifecycle.items())
            )
            redis_version = _text((await redis.info("server")).get("redis_version", "?"))
            # The plain and the limited no-op runs, alternated, best of each: the ratio of
            # two runs made side by side.
            ours = contestants[0]
            plain: Throughput | str = "not run"
            limited: Throughput | str = "not run"
            by_round: list[dict[str, Throughput]] = []
            for _ in range(args.limit_rounds):
                by_round.append({})
                for kind in ("noop", "limited"):
                    try:
                        got = await throughput(redis, url, ours, kind, args.jobs, 1, args.timeout)
                    except Failed as exc:
                        progress(f"  streamkit {kind} x1: failed: {exc}")
                        continue
                    progress(
                        f"  streamkit {kind} x1: {got.rate:,.0f}/s, "
                        f"{got.script_us:.1f} us of scripts per job"
                    )
                    by_round[-1][kind] = got
                    best = plain if kind == "noop" else limited
                    if not isinstance(best, Throughput) or got.rate > best.rate:
                        if kind == "noop":
                            plain = got
                        else:
                            limited = got
            flows: Workflows | str
            try:
                flows = await workflows(url, ours, args.chains, args.chords)
                progress(
                    f"  streamkit workflows: chain {flows.chain_ms:.1f} ms,"
                    f" chord {flows.chord_ms:.1f} ms"
                )
            except Failed as exc:
                flows = str(exc)
            await redis.flushall()

        async def recover(who: Contestant, db: int) -> None:
            try:
                recoveries[who.name] = rec = await recovery(f"{url}/{db}", who, args.recovery_cap)
            except Failed as exc:
                recoveries[who.name] = str(exc)
                progress(f"  {who.name} recovery: failed: {exc}")
            else:
                progress(f"  {who.name} recovery: taken over {rec.taken_over}, done {rec.done}")

        recovering = [contestants[0]]
        await recover(contestants[0], 0)
        if not args.quick:
            recovering += contestants[1:]
            progress(f"  the peers' recovery runs, at once (up to {args.recovery_cap:g} s)")
            async with trio.open_nursery() as peers:
                for db, who in enumerate(contestants[1:], start=1):
                    peers.start_soon(recover, who, db)
        nursery.cancel_scope.cancel()
    report(
        args,
        contestants,
        runs,
        bare,
        recoveries,
        recovering,
        skipped,
        authors=authors,
        lifecycle=lifecycle,
        redis_version=redis_version,
    )
    report_streamkit(plain, limited, flows, args.limit_rounds, by_round)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="no-op jobs (and bare entries)")
    parser.add_argument("--sleep-jobs", type=int, default=2_000, help="jobs of sleep(0.05)")
    parser.add_argument(
        "--peers",
        type=lambda s: [p for p in s.split(",") if p],
        default=list(PEERS),
        help="comma-separated peers to run (default: %(default)s; empty: none)",
    )
    parser.add_argument(
        "--peers-venvs",
        type=Path,
        default=ROOT / ".venv-peers",
        help="the peers' virtualenvs, one per peer (default: .venv-peers)",
    )
    parser.add_argument(
        "--recovery-cap",
        type=float,
        default=400.0,
        help="seconds a peer's crash recovery is waited for (default: %(default)s)",
    )
    parser.add_argument(
        "--limit-rounds", type=int, default=2, help="plain and limited no-op runs, alternated"
    )
    parser.add_argument("--chains", type=int, default=20, help="chains of 3 timed")
    parser.add_argument("--chords", type=int, default=5, help="chords of 100 timed")
    parser.add_argument("--quick", action="store_true", help="skip the peers' crash-recovery runs")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a throughput run may take"
    )
    # streamkit's own producer and worker processes
    parser.add_argument("role", nargs="?", choices=["produce", "work"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="noop", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help=argparse.SUPPRESS)
    parser.add_argument("--wait-go", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "produce":
        trio.run(streamkit_produce, args.url, args.kind, args.jobs)
    elif args.role == "work":
        trio.run(streamkit_work, args.url, args.concurrency, args.wait_go)
    else:
        trio.run(run, args)


if __name__ == "__main__":
    main()
