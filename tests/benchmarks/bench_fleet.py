"""The cost of an idle fleet: Redis's commands and CPU for W workers over P partitions.

Run with ``./dev bench`` (or ``python tests/benchmarks/bench_fleet.py`` inside .venv).
For each ``--fleets`` entry ``WxP``, one private redis-server and W worker processes
(``streamkit worker tests.benchmarks.fleet_app:app``, each a real worker process, as a
deployment runs them), started together, over one stream of P partitions with nothing
in it, so what Redis does is the fleet's background work alone: leases, the blocking
waits and the reads behind them, heartbeats and membership. Printed per fleet:

* **start-up**: seconds from starting the workers until every partition is held by
  the member the group assigned it to (each lock's owner is that member's process);
* **idle**: over ``--seconds`` seconds after that (and a pause), Redis's commands per
  second, the commands its scripts ran included (``INFO commandstats``; Redis 7
  counts those in ``total_commands_processed`` too), in all, per worker and per
  partition, and redis-server's CPU (``INFO cpu``, user + system) as a share of one
  core;
* **join**: one more worker started: seconds until every partition is held by its
  member again (moved partitions drained, released and taken);
* **leases lost**: the leases the workers' logs say were lost, through all of it.

Targets (issue 38): idle cost grows with the number of workers, not of partitions,
and no lease is lost at start-up or in the join. (What still grows with P: each
lease's renewal, a ``GET`` and a ``PEXPIRE`` inside one script call for all of a
worker's leases, every ``lease_ttl / 3``: 0.6 commands per partition per second.)
Workers share this machine's 2 cores with Redis: figures are Redis's own counters,
not wall-clock throughput.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, cast

import redis as redis_py

from streamkit import _keys
from streamkit._membership_state import GroupState
from streamkit.testing import RedisServer

APP, STREAM, PROCESSOR = "fleet", "ticks", "idle"
ROOT = Path(__file__).resolve().parents[2]
#: A lease lost, as a worker's log says it (the rebalancer's line).
LOST = re.compile(r"lease on partition \d+ lost")


def start_worker(url: str, partitions: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    env = dict(os.environ, FLEET_REDIS_URL=url, FLEET_PARTITIONS=str(partitions))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "streamkit", "worker", "tests.benchmarks.fleet_app:app"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def settled(plain: redis_py.Redis, partitions: int, members: int) -> bool:
    """Whether ``members`` members share the partitions and each partition's lock is
    held by the process of the member it is assigned to."""
    group = _keys.processor_group(APP, STREAM, PROCESSOR)
    state = GroupState.decode(cast("bytes | None", plain.get(_keys.membership_key(group))))
    if state is None or len(state.members) != members:
        return False
    pid_of = {m: info.pid for m, info in state.members.items()}
    owner_pid: dict[int, int] = {}
    for member, owned in state.assignment.members.items():
        for p in owned:
            owner_pid[p] = pid_of[member]
    keys = [
        _keys.lock_key(_keys.partition_lock_name(APP, STREAM, PROCESSOR, p))
        for p in range(partitions)
    ]
    for p, value in enumerate(cast("list[bytes | None]", plain.mget(keys))):
        # A lease's value is "<host>:<pid>:<random>:<token>".
        if value is None or int(value.split(b":")[-3]) != owner_pid.get(p):
            return False
    return True


def wait_settled(plain: redis_py.Redis, partitions: int, members: int, within: float) -> float:
    began = time.perf_counter()
    while not settled(plain, partitions, members):
        if time.perf_counter() - began > within:
            raise TimeoutError(f"{members} workers over {partitions} partitions never settled")
        time.sleep(0.05)
    return time.perf_counter() - began


def counters(plain: redis_py.Redis) -> tuple[float, int]:
    """redis-server's CPU seconds, and the commands it ran (scripts' included)."""
    cpu: Any = plain.info("cpu")
    commands: Any = plain.info("commandstats")
    ran = sum(int(c["calls"]) for c in commands.values())
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), ran


def run_fleet(
    workers: int, partitions: int, seconds: float, logs: Path, pause: float
) -> dict[str, float]:
    with RedisServer() as server:
        plain = redis_py.Redis.from_url(server.url)
        files = [(logs / f"{workers}x{partitions}-{i}.log").open("wb") for i in range(workers + 1)]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            began = time.perf_counter()
            procs = [start_worker(server.url, partitions, files[i]) for i in range(workers)]
            wait_settled(plain, partitions, workers, within=300)
            startup = time.perf_counter() - began
            time.sleep(pause)  # the start-up's own traffic over
            cpu0, ran0 = counters(plain)
            t0 = time.perf_counter()
            time.sleep(seconds)
            cpu1, ran1 = counters(plain)
            elapsed = time.perf_counter() - t0
            began = time.perf_counter()
            procs.append(start_worker(server.url, partitions, files[workers]))
            join = wait_settled(plain, partitions, workers + 1, within=300)
            time.sleep(1)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for file in files:
                file.close()
        lost = sum(
            len(LOST.findall(path.read_text(errors="replace")))
            for path in logs.glob(f"{workers}x{partitions}-*.log")
        )
    # The bench's own INFO calls (two before, two after) are not the fleet's.
    ran = (ran1 - ran0 - 2) / elapsed
    return {
        "startup": startup,
        "ran": ran,
        "cpu": (cpu1 - cpu0) / elapsed,
        "join": join,
        "lost": lost,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fleets", default="4x1024,8x4096", help="WORKERSxPARTITIONS, comma-separated"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="idle measurement window")
    parser.add_argument(
        "--pause", type=float, default=3.0, help="seconds between settling and measuring"
    )
    parser.add_argument("--keep-logs", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    fleets = [tuple(int(x) for x in f.split("x")) for f in args.fleets.split(",")]
    print(
        f"idle fleets: W worker processes over P partitions with nothing to process, one "
        f"private redis-server, {args.seconds:g} s measured after settling; 2 cores shared"
    )
    print(
        f"  {'fleet':<14}{'start s':>9}{'cmds/s':>10}{'/worker':>9}{'/part.':>8}"
        f"{'CPU %':>8}{'join s':>8}{'lost':>6}"
    )
    print(
        "  (cmds/s: Redis's commands while idle, those inside scripts included; CPU %: of one core)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        logs = args.keep_logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        for workers, partitions in fleets:
            r = run_fleet(workers, partitions, args.seconds, logs, args.pause)
            print(
                f"  {f'{workers} x {partitions:,}':<14}{r['startup']:>9.1f}{r['ran']:>10,.0f}"
                f"{r['ran'] / workers:>9.1f}{r['ran'] / partitions:>8.2f}"
                f"{r['cpu'] * 100:>8.2f}{r['join']:>8.2f}{r['lost']:>6.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
