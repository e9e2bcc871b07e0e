"""How fast moved partitions resume, and how long unmoved ones pause, during a rebalance.

Run with ``python tests/benchmarks/bench_rebalance.py`` inside .venv. Each round
starts member ``a`` owning every partition, then member ``b`` joins (moving half of
them), then ``b`` leaves again (moving them back). For each change it reports:

* **resume**: from just before the change (``b`` entering ``open_membership``, or
  ``b`` starting to drain) until every moved partition's ``run()`` has started on its
  new owner;
* **pause**: the longest gap between two ticks (every ``--tick`` seconds) of any
  partition that did not move, measured over the whole change.

``--work`` makes each ``run()`` take that long to finish its current unit of work
once it is told to drain, as a processor finishing and acknowledging a batch would.
Uses the default membership and lock settings apart from a short lease TTL.
"""

from __future__ import annotations

import argparse
import statistics
import uuid

import trio

from streamkit._locks import open_lock_manager
from streamkit._membership import open_membership
from streamkit._rebalancer import Claim, Rebalancer, open_rebalancer
from streamkit._redis import Redis, open_redis
from streamkit.testing import RedisServer


class Ticks:
    def __init__(self, tick: float, work: float) -> None:
        self.tick = tick
        self.work = work
        self.last: dict[tuple[str, int], float] = {}
        self.gap: dict[tuple[str, int], float] = {}
        self.started: dict[tuple[str, int], float] = {}

    def runner(self, member: str) -> object:
        async def run(claim: Claim) -> None:
            key = (member, claim.partition)
            self.started[key] = trio.current_time()
            self.last.pop(key, None)
            while not claim.draining.value:
                now = trio.current_time()
                if key in self.last:
                    self.gap[key] = max(self.gap.get(key, 0.0), now - self.last[key])
                self.last[key] = now
                with trio.move_on_after(self.tick):
                    await claim.wait_draining()
            await trio.sleep(self.work)  # finish the current unit, acknowledge

        return run


async def start(
    nursery: trio.Nursery, redis: Redis, group: str, member: str, ticks: Ticks, partitions: int
) -> tuple[Rebalancer, trio.Event, trio.Event]:
    stop, done = trio.Event(), trio.Event()

    async def main(*, task_status: trio.TaskStatus[Rebalancer]) -> None:
        try:
            async with (
                open_membership(redis, group, partitions=partitions, member_id=member) as m,
                open_lock_manager(redis, owner=member) as locks,
                open_rebalancer(
                    m.partitions,
                    locks,
                    lock_name=lambda p: f"{group}.{p}",
                    run=ticks.runner(member),  # type: ignore[arg-type]
                    lease_ttl=2.0,
                ) as rebalancer,
            ):
                task_status.started(rebalancer)
                await stop.wait()
                await rebalancer.drain()
        finally:
            done.set()

    rebalancer: Rebalancer = await nursery.start(main)
    return rebalancer, stop, done


async def one_round(
    redis: Redis, partitions: int, ticks: Ticks
) -> tuple[float, float, float, float]:
    group = f"bench-{uuid.uuid4().hex[:8]}"
    async with trio.open_nursery() as nursery:
        a, stop_a, _ = await start(nursery, redis, group, "a", ticks, partitions)
        await a.owned.wait_value(frozenset(range(partitions)))
        await trio.sleep(5 * ticks.tick)

        ticks.gap.clear()
        began = trio.current_time()
        b, stop_b, b_done = await start(nursery, redis, group, "b", ticks, partitions)
        # The assignment is balanced: a keeps half of the partitions.
        await a.owned.wait_value(lambda v: len(v) == partitions - partitions // 2)
        moved = frozenset(range(partitions)) - a.owned.value
        await b.owned.wait_value(moved)
        join_resume = max(ticks.started[("b", p)] for p in moved) - began
        kept = a.owned.value
        await trio.sleep(5 * ticks.tick)
        join_pause = max(ticks.gap[("a", p)] for p in kept)

        ticks.gap.clear()
        began = trio.current_time()
        stop_b.set()
        await b_done.wait()
        await a.owned.wait_value(frozenset(range(partitions)))
        leave_resume = max(ticks.started[("a", p)] for p in moved) - began
        await trio.sleep(5 * ticks.tick)
        leave_pause = max(ticks.gap[("a", p)] for p in kept)
        stop_a.set()
    return join_resume, join_pause, leave_resume, leave_pause


def summary(name: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"{name:<28} median {statistics.median(ms):7.1f} ms   max {ms[-1]:7.1f} ms"


async def main(args: argparse.Namespace) -> None:
    with RedisServer() as server:
        async with open_redis(server.url) as redis:
            results = []
            for _ in range(args.rounds):
                ticks = Ticks(args.tick, args.work)
                with trio.fail_after(30):
                    results.append(await one_round(redis, args.partitions, ticks))
    print(
        f"{args.rounds} rounds, {args.partitions} partitions, tick {args.tick * 1000:.0f} ms, "
        f"drain work {args.work * 1000:.0f} ms"
    )
    names = [
        "join: moved resumed after",
        "join: longest unmoved pause",
        "leave: moved resumed after",
    ]
    names.append("leave: longest unmoved pause")
    for index, name in enumerate(names):
        print(summary(name, [r[index] for r in results]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--tick", type=float, default=0.005)
    parser.add_argument("--work", type=float, default=0.0)
    trio.run(main, parser.parse_args())
