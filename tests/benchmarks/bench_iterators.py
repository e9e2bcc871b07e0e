"""The event iterators alone: ``records()`` and ``take(500)`` over a canned feed, no Redis.

``python tests/benchmarks/bench_iterators.py ROOT [ROOT ...]`` measures each ROOT's
streamkit (a checkout: its ``streamkit/`` and ``tests/canned.py``), each in processes
of its own, the roots alternating round by round. A figure is events per second of
the process's CPU time (not the wall clock: on a machine shared with other work, the
CPU a process gets varies far more than what it spends), the best of a few runs in a
round; the table gives each root's best round and the median per-round ratio to the
first root. The iterators' per-event path is a few hundred nanoseconds, too little
for ``bench_versions.py``'s worker runs, whose wall-clock figures move with the load.
Compare against a ref with ``git worktree add --detach /tmp/base REF``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
BATCHES, SIZE = 1000, 500
RUNS = 5


async def _measure(take: bool) -> float:
    # Imported here: the parent process imports no streamkit.
    import trio_util
    from canned import CannedFeed, batches  # type: ignore[import-not-found]

    from streamkit import open_events

    total = BATCHES * SIZE
    feed = CannedFeed(batches([SIZE] * BATCHES), then="wait")
    n = 0
    async with open_events(feed, draining=trio_util.AsyncBool(False)) as events:
        began = time.process_time()
        if take:
            async for batch in events.take(SIZE):
                n += len(batch)
                if n == total:
                    break
        else:
            async for _ in events.records():
                n += 1
                if n == total:
                    break
        elapsed = time.process_time() - began
    return n / elapsed


def child(root: Path) -> None:
    sys.path[:0] = [str(root), str(root / "tests")]
    import trio

    import streamkit

    figures = {
        "records": max(trio.run(_measure, False) for _ in range(RUNS)),
        "take": max(trio.run(_measure, True) for _ in range(RUNS)),
        "streamkit": streamkit.__file__,
    }
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.roots[0])
        return
    roots: list[Path] = [root.resolve() for root in args.roots]
    results: dict[Path, list[dict[str, Any]]] = {root: [] for root in roots}
    for round_ in range(1, args.rounds + 1):
        for root in roots:
            done = subprocess.run(
                [sys.executable, str(SCRIPT), "--child", str(root)],
                capture_output=True,
                text=True,
                check=True,
                cwd="/",
            )
            figures = json.loads(done.stdout.splitlines()[-1])
            assert Path(figures["streamkit"]).resolve().is_relative_to(root), figures
            results[root].append(figures)
            print(
                f"  round {round_} {root}: records() {figures['records']:,.0f}/s, "
                f"take({SIZE}) {figures['take']:,.0f}/s",
                flush=True,
            )
    first = roots[0]
    for what in ("records", "take"):
        print(f"{what}: events per CPU second, best round; median ratio to {first}")
        for root in roots:
            ratios = [c[what] / b[what] for c, b in zip(results[root], results[first], strict=True)]
            best = max(r[what] for r in results[root])
            print(f"  {root!s:40} {best:12,.0f}  {statistics.median(ratios):.3f}x")


if __name__ == "__main__":
    main()
