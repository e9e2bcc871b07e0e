"""Where a worker's time goes, per event: a py-spy profile of bench_consume.py, by kind.

Run ``py-spy record -r 2000 -f raw -o records.txt -- python
tests/benchmarks/bench_consume.py --only records --events 400000`` (py-spy from PyPI),
then ``python tests/benchmarks/where_time_goes.py records.txt CPU_US``, where CPU_US is
the microseconds of CPU per event the run printed; several ``PROFILE CPU_US`` pairs
make several columns. Each sample of the consuming (not the filling, not the start-up)
goes to the first kind whose names its innermost frames hold; the kinds' shares of the
samples times the CPU per event give microseconds per event. A sampling profiler adds
nothing per call, unlike cProfile, but the kinds are approximate: a frame's name says
what it is for, mostly.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

KINDS: list[tuple[str, list[str]]] = [
    ("reply parsing", ["_data_received", "Parser.parse", "parse (coredis"]),
    (
        "request: building, packing, writing",
        [
            "pack (",
            "pack_command",
            "_writer_task",
            "SocketStream.send",
            "CommandRequest",
            "create_request",
            "Packer",
        ],
    ),
    ("socket receive", ["SocketStream.receive", "_reader_task"]),
    (
        "decoding",
        [
            "decode_payloads",
            "decode_batch",
            "decode_payload",
            "decode_flat",
            "entry_decoder",
            "build (<streamkit flat",
            "Codec._json_functions.<locals>.decode",
            "orjson",
            "generated methods bench_consume.Tick",
            "Event.record",
        ],
    ),
    (
        "events: batch loading, Event objects",
        [
            "_load",
            "Ledger.load",
            "Batch.payloads",
            "Batch.from_flat",
            "_unflatten",
            "Event.__init__",
            "_make_events",
            "_read_carrying.<locals>.<listcomp>",
        ],
    ),
    (
        "iteration: __anext__, cancel check, clock, lease",
        [
            "__anext__",
            "checkpoint_if_cancelled",
            "current_time",
            "current_task",
            "is_draining",
            "_check_lease",
            "check_lease",
            "AsyncValue.value",
            "Ledger.take_ready",
            "Ledger.move_past",
            "Ledger.next_record",
            "Ledger.start_run",
            "Ledger._settle",
            "OneByOne._next",
            "_gather",
            "bench_worker.<locals>.process",
        ],
    ),
    (
        "fenced read call: script, pool, timeouts",
        [
            "Fetcher._read",
            "LuaScript.__call__",
            "evalsha",
            "get_connection",
            "_slot",
            "fail_after",
            "redis_errors",
            "Request",
            "execute_command",
            "retry",
        ],
    ),
    (
        "Trio scheduler, epoll",
        [
            "unrolled_run",
            "epoll",
            "reschedule",
            "EpollIOManager",
            "wait_task_rescheduled",
            "CancelScope",
            "cancel_shielded",
        ],
    ),
]
OTHER = "other (task switches, worker machinery)"
# Samples of filling the stream and of starting the worker, not of consuming.
NOT_CONSUMING = (
    "send_many", "_send_window", "send_partition", "fill (", "_find_and_load",
    "check_metadata", "App.__aenter__", "RedisServer", "bench_worker (",
)  # fmt: skip


def split(path: Path, cpu_us: float) -> dict[str, float]:
    """Microseconds per event by kind, from a py-spy ``raw`` profile."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rstrip().rpartition(" ")
        if "unrolled_run" not in stack:
            continue
        if any(x in stack for x in NOT_CONSUMING) and "run_processor" not in stack:
            continue
        frames = stack.split(";")[-4:]
        total += int(n)
        kind = next(
            (k for k, names in KINDS if any(name in f for f in frames for name in names)), OTHER
        )
        counts[kind] += int(n)
    return {kind: counts[kind] / total * cpu_us for kind in [*(k for k, _ in KINDS), OTHER]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pairs", nargs="+", metavar="PROFILE CPU_US")
    args = parser.parse_args()
    if len(args.pairs) % 2:
        parser.error("give a CPU per event (us) after each profile")
    columns = {
        Path(path).stem: split(Path(path), float(cpu))
        for path, cpu in zip(args.pairs[::2], args.pairs[1::2], strict=True)
    }
    print(f"{'us per event':<50}" + "".join(f"{name:>16}" for name in columns))
    for kind in next(iter(columns.values())):
        print(f"{kind:<50}" + "".join(f"{col[kind]:>16.2f}" for col in columns.values()))
    totals = "".join(f"{sum(col.values()):>16.2f}" for col in columns.values())
    print(f"{'total: the worker CPU per event':<50}{totals}")


if __name__ == "__main__":
    main()
