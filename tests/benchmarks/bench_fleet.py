"""The cost of a fleet: Redis's commands and CPU for W workers over P partitions.

Run with ``./dev bench`` (or ``python tests/benchmarks/bench_fleet.py`` inside .venv).
For each ``--fleets`` entry ``WxP``, one private redis-server and W workers started
together over one stream of P partitions with nothing in it, so what Redis does is the
fleet's background work alone: leases, the blocking waits and the reads behind them,
heartbeats and membership.

The workers are ``streamkit worker tests.benchmarks.fleet_app:app`` processes, as a
deployment runs them; with ``--per-process K``, W / K processes of ``fleet_host.py``,
each running K worker instances in one event loop. Each instance is a whole worker (its
own app, Redis connections, lock manager and lease owner id, membership member and
heartbeat, rebalancer and fetcher), so Redis is sent what W worker processes send it;
what the instances share is a process's CPU and event loop, which makes keeping leases
harder for them, not easier. (128 worker processes on 2 cores spend minutes starting
and starve each other's event loops: ``--per-process`` is for the big fleets.) The
worker that joins and leaves in a rebalance is always a ``streamkit worker`` process.

Printed per fleet:

* **start s**: seconds from starting the workers until *settled*: the group has the
  expected members and every partition's lease is held by the member the group
  assigned it to (a member's leases all carry one owner id, that of its lock manager,
  and no two members' do);
* **idle**: over ``--seconds`` seconds after that (and ``--pause``), Redis's commands
  per second, those its scripts ran included (``INFO commandstats``; Redis 7 counts
  those in ``total_commands_processed`` too), in all, per worker and per partition,
  and redis-server's CPU (``INFO cpu``, user + system) as a share of one core;
  ``--profile`` also prints the idle window's commands by Redis time, and then, over
  another ``--seconds``, the calls the clients sent by kind (each script by name);
* **join s / leave s**: ``--rounds`` times, one more worker process started (seconds
  from its joining the group until settled with W + 1 members: moved partitions
  drained, released and taken), then the same process sent SIGTERM (seconds from the
  signal until settled with W members again: its partitions drained, released and
  taken by the others); the median of the rounds, each round's figures after it;
* **lost**: leases the workers' logs say were lost (the rebalancer's "lease on partition
  N lost" line), at start-up, then in all the joins and all the leaves;
* **load**: the machine's 1-minute load average at the end of the idle window;
* **RSS**: the workers' resident memory (``VmRSS``) at the end of the idle window, the
  median worker process and the partitions its members own; with worker processes
  and fleets whose workers own different numbers of partitions (``--fleets
  8x256,1x4096,2x4096,4x4096``: 32 to 4,096 each), the memory per owned partition: the
  slope of a least-squares line through the fleets' (partitions owned, RSS), and its
  intercept, a worker owning none.

Targets (issue 38): idle cost grows with the number of workers, not of partitions;
128 workers over 4,096 partitions cost at most 2% of one Redis core while idle; no
lease lost at start-up or in a rebalance; every partition owned and running again
within 2 s of a join or a leave of 128 workers over 4,096 partitions. (What still grows
with P: each lease's renewal, a ``GET`` and a ``PEXPIRE`` inside one script call for all
of a worker's leases, every ``lease_ttl / 3``: 0.6 commands per partition per second.)
Workers share this machine's 2 cores with Redis: figures are Redis's own counters, not
wall-clock throughput.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, cast

import redis as redis_py

from streamkit import _keys, _lua
from streamkit._membership_state import GroupState
from streamkit.testing import RedisServer

APP, STREAM, PROCESSOR = "fleet", "ticks", "idle"
ROOT = Path(__file__).resolve().parents[2]
#: A lease lost, as a worker's log says it (the rebalancer's line).
LOST = re.compile(rb"lease on partition \d+ lost")


def start_worker(
    url: str, partitions: int, log: IO[bytes], instances: int = 0
) -> subprocess.Popen[bytes]:
    """A ``streamkit worker`` process, or (``instances`` > 0) a ``fleet_host.py``
    process running that many worker instances."""
    env = dict(os.environ, FLEET_REDIS_URL=url, FLEET_PARTITIONS=str(partitions))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = (
        [sys.executable, "-m", "tests.benchmarks.fleet_host", str(instances)]
        if instances
        else [sys.executable, "-m", "streamkit", "worker", "tests.benchmarks.fleet_app:app"]
    )
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def group_state(plain: redis_py.Redis) -> GroupState | None:
    group = _keys.processor_group(APP, STREAM, PROCESSOR)
    return GroupState.decode(cast("bytes | None", plain.get(_keys.membership_key(group))))


def settled(plain: redis_py.Redis, partitions: int, members: int) -> bool:
    """Whether ``members`` members share the partitions and each partition's lease is
    held by the member it is assigned to.

    A lease's value is ``"<owner>:<token>"``, the owner id that of the lock manager of
    the worker holding it (``host:pid:random``, one per worker instance). Settled: every
    partition assigned and leased, each member's leases all of one owner, and no owner
    shared by two members (so no lease is still held by a member that lost the
    partition, even where several members run in one process)."""
    state = group_state(plain)
    if state is None or len(state.members) != members:
        return False
    member_of: dict[int, str] = {}
    for member, owned in state.assignment.members.items():
        for p in owned:
            member_of[p] = member
    if len(member_of) != partitions:
        return False
    keys = [
        _keys.lock_key(_keys.partition_lock_name(APP, STREAM, PROCESSOR, p))
        for p in range(partitions)
    ]
    owner_of: dict[str, bytes] = {}
    for p, value in enumerate(cast("list[bytes | None]", plain.mget(keys))):
        if value is None:
            return False
        owner = value.rpartition(b":")[0]
        if owner_of.setdefault(member_of[p], owner) != owner:
            return False
    return len(set(owner_of.values())) == len(owner_of)


def wait_members(plain: redis_py.Redis, members: int, within: float) -> None:
    began = time.perf_counter()
    while (state := group_state(plain)) is None or len(state.members) != members:
        if time.perf_counter() - began > within:
            raise TimeoutError(f"the group never had {members} members")
        time.sleep(0.01)


def wait_settled(plain: redis_py.Redis, partitions: int, members: int, within: float) -> float:
    began = time.perf_counter()
    while not settled(plain, partitions, members):
        if time.perf_counter() - began > within:
            raise TimeoutError(f"{members} workers over {partitions} partitions never settled")
        time.sleep(0.05)
    return time.perf_counter() - began


def counters(plain: redis_py.Redis) -> tuple[float, int, dict[str, Any]]:
    """redis-server's CPU seconds, the commands it ran (scripts' included), and its
    command statistics."""
    cpu: Any = plain.info("cpu")
    commands: Any = plain.info("commandstats")
    ran = sum(int(c["calls"]) for c in commands.values())
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), ran, commands


def calls_by_kind(plain: redis_py.Redis, seconds: float) -> dict[str, tuple[float, float]]:
    """Over ``seconds``, the calls clients sent by kind (a script by its name, an
    ``XREAD`` by whether it blocks and what it reads) with their count and Redis time
    per second: every call is logged (``SLOWLOG`` with no threshold), so the window
    costs Redis more than the idle one measured before it. A blocking ``XREAD`` that
    times out is not logged (Redis logs a blocked command only when it is served)."""
    names = {_lua.script(name).sha: name for name in _lua.names()}
    plain.config_set("slowlog-max-len", 1_000_000)
    plain.config_set("slowlog-log-slower-than", 0)
    plain.slowlog_reset()
    time.sleep(seconds)
    plain.config_set("slowlog-log-slower-than", 10_000)
    entries: Any = cast("Any", plain).execute_command("SLOWLOG", "GET", -1)
    plain.slowlog_reset()
    found: dict[str, tuple[float, float]] = {}
    for entry in entries:
        if entry[4] == b"?:0":
            continue  # a command a script ran: counted in the script's time
        argv = [a.decode(errors="replace") if isinstance(a, bytes) else str(a) for a in entry[3]]
        command = argv[0].upper()
        if command == "EVALSHA":
            kind = names.get(argv[1], argv[1][:8])
        elif command == "XREAD":
            upper = [a.upper() for a in argv]
            stream = argv[upper.index("STREAMS") + 1]
            kind = f"XREAD {'BLOCK ' if 'BLOCK' in upper else ''}{stream.split(':')[0]}"
        else:
            kind = command
        if kind.startswith(("SLOWLOG", "CONFIG")):
            continue
        calls, usec = found.get(kind, (0.0, 0.0))
        found[kind] = (calls + 1 / seconds, usec + int(entry[2]) / seconds)
    return found


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def owned_by_pid(plain: redis_py.Redis) -> dict[int, int]:
    """Partitions assigned to the members of each process."""
    state = group_state(plain)
    found: dict[int, int] = {}
    if state is not None:
        for member, owned in state.assignment.members.items():
            pid = state.members[member].pid
            found[pid] = found.get(pid, 0) + len(owned)
    return found


def lost_so_far(logs: list[Path]) -> int:
    return sum(len(LOST.findall(path.read_bytes())) for path in logs if path.exists())


def run_fleet(
    workers: int, partitions: int, args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    per = args.per_process
    hosts = [per] * (workers // per) + ([workers % per] if workers % per else [])
    name = f"{workers}x{partitions}"
    with RedisServer() as server:
        plain = redis_py.Redis.from_url(server.url)
        paths = [logs / f"{name}-{i}.log" for i in range(len(hosts))]
        files = [path.open("wb") for path in paths]
        procs: list[subprocess.Popen[bytes]] = []
        joiner: subprocess.Popen[bytes] | None = None
        result: dict[str, Any] = {"joins": [], "leaves": [], "lost_join": 0, "lost_leave": 0}
        try:
            began = time.perf_counter()
            procs = [
                start_worker(server.url, partitions, files[i], 0 if per == 1 else n)
                for i, n in enumerate(hosts)
            ]
            wait_settled(plain, partitions, workers, within=args.within)
            result["startup"] = time.perf_counter() - began
            result["lost_startup"] = lost_so_far(paths)
            time.sleep(args.pause)  # the start-up's own traffic over
            cpu0, ran0, stats0 = counters(plain)
            t0 = time.perf_counter()
            time.sleep(args.seconds)
            cpu1, ran1, stats1 = counters(plain)
            elapsed = time.perf_counter() - t0
            result["load"] = os.getloadavg()[0]
            owned = owned_by_pid(plain)
            result["rss"] = [(rss_kib(p.pid), owned.get(p.pid, 0)) for p in procs]
            # The bench's own INFO calls (two before, two after) are not the fleet's.
            result["ran"] = (ran1 - ran0 - 2) / elapsed
            result["cpu"] = (cpu1 - cpu0) / elapsed
            result["profile"] = {
                command: (
                    (int(stats1[command]["calls"]) - int(stats0.get(command, {}).get("calls", 0)))
                    / elapsed,
                    (int(stats1[command]["usec"]) - int(stats0.get(command, {}).get("usec", 0)))
                    / elapsed,
                )
                for command in stats1
            }
            if args.profile:
                result["by_kind"] = calls_by_kind(plain, args.seconds)
            result["lost_idle"] = lost_so_far(paths) - result["lost_startup"]
            for i in range(args.rounds):
                path = logs / f"{name}-join{i}.log"
                paths.append(path)
                files.append(path.open("wb"))
                lost = lost_so_far(paths)
                joiner = start_worker(server.url, partitions, files[-1])
                # From the moment the new member is in the group: the rebalance, not
                # the new process's interpreter start-up.
                wait_members(plain, workers + 1, within=args.within)
                result["joins"].append(
                    wait_settled(plain, partitions, workers + 1, within=args.within)
                )
                time.sleep(1)
                result["lost_join"] += lost_so_far(paths) - lost
                lost = lost_so_far(paths)
                joiner.send_signal(signal.SIGTERM)
                result["leaves"].append(
                    wait_settled(plain, partitions, workers, within=args.within)
                )
                joiner.wait(30)
                joiner = None
                time.sleep(1)
                result["lost_leave"] += lost_so_far(paths) - lost
        finally:
            for proc in [*procs, *([joiner] if joiner else [])]:
                proc.terminate()
            for proc in [*procs, *([joiner] if joiner else [])]:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for file in files:
                file.close()
    return result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


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
    parser.add_argument(
        "--per-process",
        type=int,
        default=1,
        metavar="K",
        help="worker instances per process (1: streamkit worker processes; more: "
        "fleet_host.py processes of K instances each)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="joins and leaves of one more worker")
    parser.add_argument(
        "--within", type=float, default=300.0, help="seconds allowed to settle, each time"
    )
    parser.add_argument(
        "--profile", action="store_true", help="print the idle window's commands by Redis time"
    )
    parser.add_argument("--keep-logs", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    fleets = [tuple(int(x) for x in f.split("x")) for f in args.fleets.split(",")]
    how = (
        "worker processes" if args.per_process == 1 else f"workers, {args.per_process} per process"
    )
    print(
        f"fleets: W {how} over P partitions with nothing to process, one private "
        f"redis-server, {args.seconds:g} s measured after settling; 2 cores shared"
    )
    print(
        f"  {'fleet':<14}{'start s':>9}{'cmds/s':>10}{'/worker':>9}{'/part.':>8}"
        f"{'CPU %':>8}{'join s':>8}{'leave s':>9}{'lost':>12}{'RSS MiB':>9}{'owns':>6}"
        f"{'load':>6}"
    )
    print(
        "  (cmds/s: Redis's commands while idle, those inside scripts included; CPU %: of "
        "one core; join and leave: medians of the rounds; lost: at start-up/in the "
        "joins/in the leaves; RSS: the median worker process; load: the 1-minute load "
        "average at the end of the idle window)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        logs = args.keep_logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        points: list[tuple[int, int]] = []
        for workers, partitions in fleets:
            r = run_fleet(workers, partitions, args, logs)
            rss, owns = sorted(r["rss"])[len(r["rss"]) // 2]
            points.append((owns, rss))
            lost = f"{r['lost_startup'] + r['lost_idle']}/{r['lost_join']}/{r['lost_leave']}"
            print(
                f"  {f'{workers} x {partitions:,}':<14}{r['startup']:>9.1f}{r['ran']:>10,.0f}"
                f"{r['ran'] / workers:>9.1f}{r['ran'] / partitions:>8.2f}"
                f"{r['cpu'] * 100:>8.2f}{median(r['joins']):>8.2f}{median(r['leaves']):>9.2f}"
                f"{lost:>12}{rss / 1024:>9.1f}{owns:>6}{r['load']:>6.1f}",
                flush=True,
            )
            if args.rounds > 1:
                print(
                    "    joins s: "
                    + ", ".join(f"{s:.2f}" for s in r["joins"])
                    + "; leaves s: "
                    + ", ".join(f"{s:.2f}" for s in r["leaves"])
                )
            if args.profile:
                top = sorted(r["profile"].items(), key=lambda kv: -kv[1][1])[:10]
                print(
                    "    idle, by Redis time: "
                    + "; ".join(
                        f"{c.removeprefix('cmdstat_')} {calls:,.0f}/s {usec / 1000:.2f} ms/s"
                        for c, (calls, usec) in top
                    )
                )
                kinds = sorted(r["by_kind"].items(), key=lambda kv: -kv[1][1])[:10]
                print(
                    "    then the calls clients sent, by Redis time (every call logged): "
                    + "; ".join(
                        f"{k} {calls:,.1f}/s {usec / 1000:.2f} ms/s" for k, (calls, usec) in kinds
                    )
                )

    if args.per_process == 1 and len({owns for owns, _ in points}) > 1:
        slope, intercept = fit(points)
        print(
            f"memory: {slope:.1f} KiB per owned partition, {intercept / 1024:.1f} MiB for a "
            "worker owning none (a least-squares line through the fleets' median worker RSS "
            "against the partitions it owns)"
        )


def fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """The slope and intercept of the least-squares line through ``points``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return slope, my - slope * mx


if __name__ == "__main__":
    main()
