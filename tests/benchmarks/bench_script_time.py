"""The hot scripts' Redis time per call: the working tree's script texts against a git ref's.

Run with ``python tests/benchmarks/bench_script_time.py --baseline REF`` inside .venv.
The ref's scripts are read from a temporary detached git worktree (removed afterwards):
each a file of ``streamkit/_lua`` there, or, for a ref from before the scripts moved
there (commit 749721a), the Python strings they were. Both versions' texts then run on
one private redis-server, the same calls with the same data, the versions alternating
round by round; each figure is Redis's own time per call (``INFO commandstats``,
``usec_per_call`` of ``EVALSHA``): server time, no network and no Python, so what the
scripts' text costs and nothing else. Each round runs every workload for both
versions back to back (which goes first alternates); the table gives each version's
best round (the least disturbed by other work on the machine), the ratio of the bests,
and the median of the per-round ratios current / baseline.

The scripts: the idempotent append (``streams/append``, 100 records a call, trimming
on), the fenced read (``commit/read``, 100 entries a call, acknowledging the 100
before) and commit (``commit/ack``, 100 ids), the job enqueue (250 jobs a call), claim
and finish (32 jobs a call). Then Redis's script cache with every script of each
version loaded (``INFO memory``, ``used_memory_scripts``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from streamkit import _lua
from streamkit.jobs._layout import ShardKeys
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[2]

# The scripts' texts at a ref: printed as JSON by a Python run in its worktree.
_DUMP = """
import json, sys
try:
    from streamkit import _lua
    texts = {name: _lua.script(name).text for name in _lua.names()}
except ImportError:  # before the scripts moved to streamkit/_lua
    from streamkit import _locks, _membership, _produce, _wire
    from streamkit._cli import _admin
    from streamkit.jobs import _scripts
    from streamkit.spark import _reader, _writer
    texts = {
        "streams/append": _produce.append_once_source(_wire.APPEND_AND_TRIM_LUA),
        "streams/metadata": _wire.METADATA_LUA,
        "streams/relay": _wire.RELAY_LUA,
        "streams/outbox_read": _wire.OUTBOX_READ_LUA,
        "streams/outbox_delete": _wire.OUTBOX_DELETE_LUA,
        "commit/read": _wire.READ_LUA,
        "commit/woken_read": _wire.WOKEN_READ_LUA,
        "commit/ack": _wire.ACK_LUA,
        "locks/acquire": _locks._ACQUIRE.source,
        "locks/extend": _locks._EXTEND.source,
        "locks/release": _locks._RELEASE.source,
        "locks/inspect": _locks._INSPECT.source,
        "membership/heartbeat": _membership._HEARTBEAT.source,
        "admin/reset": _admin._RESET_LUA,
        "spark/write": _writer._WRITE_SCRIPT,
        "spark/ids": _reader._IDS_SCRIPT,
    }
    for name in _scripts.__all__:
        if name.endswith("_LUA"):
            texts["jobs/" + name[:-4].lower()] = getattr(_scripts, name)
json.dump(texts, sys.stdout)
"""

SCRIPTS = [
    "streams/append",
    "commit/read",
    "commit/ack",
    "jobs/enqueue",
    "jobs/claim",
    "jobs/finish",
]
BATCH = 100
JOB_BATCH = 32


def baseline_texts(ref: str) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), ref],
            check=True,
            capture_output=True,
        )
        try:
            out = subprocess.run(
                [sys.executable, "-c", _DUMP],
                cwd=worktree,
                env={"PYTHONPATH": str(worktree), "PATH": "/usr/bin:/bin"},
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                check=False,
                capture_output=True,
            )
    texts: dict[str, str] = json.loads(out)
    return texts


def per_call(client: redis.Redis) -> float:
    """Redis's microseconds per ``EVALSHA`` since its statistics were reset."""
    stats: Any = client.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec"]) / float(stats["calls"])


class Run:
    """One version's calls of one script, on a flushed server."""

    def __init__(self, client: redis.Redis, texts: dict[str, str], calls: int) -> None:
        self.client = client
        self.texts = texts
        self.calls = calls
        self.sha = {name: client.script_load(text) for name, text in texts.items()}

    def run(self, name: str, keys: list[Any], args: list[Any]) -> Any:
        return self.client.evalsha(self.sha[name], len(keys), *keys, *args)

    def timed(self, name: str, each: Callable[[int], tuple[list[Any], list[Any]]]) -> float:
        """Redis's microseconds per call of ``name`` over ``self.calls`` calls."""
        self.client.config_resetstat()
        for i in range(self.calls):
            self.run(name, *each(i))
        return per_call(self.client)


def append(run: Run) -> float:
    stream = "__strm:{b.s.0}"
    run.client.xgroup_create(stream, "g", "$", mkstream=True)
    values = [b"x" * 60] * BATCH
    return run.timed(
        "streams/append",
        lambda i: ([stream, f"__once:{{b.s.0}}:{i}"], [5000, 0, 300, 0, -BATCH, b"data", *values]),
    )


def _filled(run: Run, entries: int) -> tuple[str, str]:
    stream, lock = "__strm:{b.s.0}", "__lock:{b.s.0}.p"
    run.client.xgroup_create(stream, "g", "0", mkstream=True)
    run.client.set(lock, "me:1")
    pipe = run.client.pipeline(transaction=False)
    for _ in range(entries):
        pipe.xadd(stream, {"data": b"x" * 60})
    pipe.execute()
    return stream, lock


def read(run: Run) -> float:
    stream, lock = _filled(run, BATCH * (run.calls + 1))
    state: dict[str, Any] = {"seen": "0-0", "acks": []}
    reply_of: list[Any] = []

    def each(_: int) -> tuple[list[Any], list[Any]]:
        if reply_of:
            ids = reply_of.pop()[0]
            state["acks"] = ids
            state["seen"] = ids[-1].decode() if ids else state["seen"]
        acks = state["acks"]
        return [stream, lock], ["me:1", "g", "c", BATCH, ">" + state["seen"], 0, len(acks), *acks]

    run.client.config_resetstat()
    for i in range(run.calls):
        reply_of.append(run.run("commit/read", *each(i)))  # noqa: PERF401 (each reads it)
    return per_call(run.client)


def ack(run: Run) -> float:
    stream, lock = _filled(run, BATCH * run.calls)
    client: Any = run.client
    entries = client.xreadgroup("g", "c", {stream: ">"}, count=BATCH * run.calls)[0][1]
    ids = [entry_id for entry_id, _ in entries]
    return run.timed(
        "commit/ack",
        lambda i: (
            [stream, lock],
            ["me:1", "g", 0, BATCH, *ids[i * BATCH : (i + 1) * BATCH]],
        ),
    )


def _shard(run: Run) -> ShardKeys:
    keys = ShardKeys("b", 0)
    for priority in range(3):
        run.client.xgroup_create(keys.ready(priority), "workers", "0", mkstream=True)
    return keys


def _enqueue_args(keys: ShardKeys, first: int, count: int) -> list[Any]:
    jobs: list[Any] = []
    for n in range(first, first + count):
        jobs += [f"j{n}", "[[1],{}]", "" if n % 2 else '{"p":0}']
    return [keys.base, "noop", 1, 0, 1, 60, 60, 0, "", *jobs]


def enqueue(run: Run) -> float:
    keys = _shard(run)
    return run.timed("jobs/enqueue", lambda i: (list(keys.keys), _enqueue_args(keys, i * 250, 250)))


def claim_and_finish(run: Run) -> tuple[float, float]:
    keys = _shard(run)
    total = JOB_BATCH * run.calls
    for first in range(0, total, 250):
        run.run(
            "jobs/enqueue", list(keys.keys), _enqueue_args(keys, first, min(250, total - first))
        )
    claimed = []
    run.client.config_resetstat()
    for _ in range(run.calls):
        reply = run.run(
            "jobs/claim", list(keys.keys), [keys.base, "w", JOB_BATCH, 30_000, 0, 5, "{}"]
        )
        claimed.append(reply[0])
    claim = per_call(run.client)

    def each(i: int) -> tuple[list[Any], list[Any]]:
        args: list[Any] = [keys.base, 30_000]
        for job in claimed[i]:
            args += [job[0], job[4], "ok", "null", 0]
        return list(keys.keys), args

    return claim, run.timed("jobs/finish", each)


def _claim(run: Run) -> dict[str, float]:
    claim, finish = claim_and_finish(run)
    return {"jobs/claim": claim, "jobs/finish": finish}


#: Each workload and the scripts it times.
WORK: list[Callable[[Run], dict[str, float]]] = [
    lambda run: {"streams/append": append(run)},
    lambda run: {"commit/read": read(run)},
    lambda run: {"commit/ack": ack(run)},
    lambda run: {"jobs/enqueue": enqueue(run)},
    _claim,
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--baseline", metavar="REF", required=True, help="git ref to compare against"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200, help="calls of each script per round")
    args = parser.parse_args()
    versions = {
        "baseline": baseline_texts(args.baseline),
        "current": {name: _lua.script(name).text for name in _lua.names()},
    }
    results: dict[str, dict[str, list[float]]] = {
        "baseline": {n: [] for n in SCRIPTS},
        "current": {n: [] for n in SCRIPTS},
    }
    with RedisServer() as server:
        client = redis.Redis(port=server.port)
        for round_ in range(args.rounds):
            # Each workload runs for both versions back to back, first one then the
            # other, in turn: load from other work hits both alike.
            order = list(versions) if round_ % 2 == 0 else list(reversed(versions))
            for work in WORK:
                for version in order:
                    client.flushall()
                    client.script_flush()
                    texts = versions[version]
                    for name, figure in work(Run(client, texts, args.calls)).items():
                        results[version][name].append(figure)
            shown = " | ".join(
                f"{n} {results['baseline'][n][-1]:.0f}/{results['current'][n][-1]:.0f}"
                for n in SCRIPTS
            )
            print(f"  round {round_ + 1} baseline/current: {shown}", file=sys.stderr)
        cache = {version: _cache(client, texts) for version, texts in versions.items()}
        client.close()
    print(
        f"Redis time per script call (us; best of {args.rounds} rounds of {args.calls} calls), "
        f"baseline {args.baseline} against the working tree"
    )
    print(
        f"  {'script':<16}{'baseline':>10}{'current':>10}{'best':>8}{'median':>8}"
        "  per-round ratios (current / baseline)"
    )
    for name in SCRIPTS:
        base, cur = results["baseline"][name], results["current"][name]
        ratios = [c / b for b, c in zip(base, cur, strict=True)]
        print(
            f"  {name:<16}{min(base):>10.1f}{min(cur):>10.1f}{min(cur) / min(base):>7.2f}x"
            f"{statistics.median(ratios):>7.2f}x  {' '.join(f'{r:.2f}' for r in ratios)}"
        )
    for version, (used, count, largest, lines) in cache.items():
        print(
            f"  script cache with every script loaded, {version}: used_memory_scripts "
            f"{used:,} bytes ({count} scripts; the largest, {largest}, {lines} lines)"
        )


def _cache(client: redis.Redis, texts: dict[str, str]) -> tuple[int, int, str, int]:
    """Redis's script cache with every script of a version loaded, on a flushed cache:
    ``used_memory_scripts``, the number of scripts, the largest and its lines."""
    client.script_flush()
    for text in texts.values():
        client.script_load(text)
    used = int(client.info("memory")["used_memory_scripts"])
    lines = {name: len(text.splitlines()) for name, text in texts.items()}
    largest = max(lines, key=lambda name: lines[name])
    return used, len(texts), largest, lines[largest]


if __name__ == "__main__":
    main()
