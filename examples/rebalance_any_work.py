"""Spread N partitions of any work over several workers: membership + locks + rebalancer.

No ``App`` and no streams: each worker joins a membership group, and a rebalancer
runs ``run(claim)`` (an ordinary ``async def``) for every partition the worker is
assigned, under that partition's lease. Here the work is appending a line to a
per-partition log in Redis every few milliseconds, *fenced*: a Lua script writes only
while the partition's lease is still this worker's, so even a worker that lost its
lease can never write.

The demo starts one worker, adds two more, then stops one gracefully (it drains and
leaves) while the others keep going, and finally checks the logs: each partition was
worked by one worker at a time, in lease (fencing token) order.

Run it on its own (it starts a private ``redis-server``)::

    python examples/rebalance_any_work.py

or against a server of yours::

    python examples/rebalance_any_work.py --redis-url redis://localhost:6379 --partitions 12
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

import trio
import trio_util

from streamkit import (
    Rebalancer,
    Redis,
    open_lock_manager,
    open_membership,
    open_rebalancer,
    open_redis,
)
from streamkit.lowlevel import Claim, redis_errors
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

GROUP = "any-work"
PERIOD = 0.02  # seconds between two units of work
LEASE_TTL = 1.0
GRACE = 0.5

# KEYS: the partition's lock, the partition's log. ARGV: the lease's value, the line.
FENCED_APPEND = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
"""


def lock_name(partition: int) -> str:
    """The partition's lock; its key is ``__lock:{any-work.3}``."""
    return f"{GROUP}.{partition}"


def log_key(partition: int) -> str:
    """Same hash tag as the partition's lock, so one script can check and write both."""
    return f"{{{GROUP}.{partition}}}:log"


def make_run(
    redis: Redis, worker: str, running: dict[int, str]
) -> Callable[[Claim], Awaitable[None]]:
    """The work of one partition, as any service would write it."""
    append = redis.register_script(FENCED_APPEND)

    async def run(claim: Claim) -> None:
        p, lease = claim.partition, claim.held.lease
        # ``running`` is shared by every worker of this demo: it proves, in-process,
        # that no partition is ever run by two workers at once.
        if p in running:
            raise AssertionError(f"partition {p}: {worker} started while {running[p]} runs")
        running[p] = worker
        print(f"{worker}: claimed partition {p} (token {lease.token})", flush=True)
        try:
            while not claim.draining.value:
                with redis_errors():
                    written: object = await append(
                        [lease.key, log_key(p)], [lease.value, f"{worker} {lease.token}"]
                    )
                if written != 1:
                    print(f"{worker}: fenced write to partition {p} refused", flush=True)
                    return  # the lease is gone; the rebalancer takes it from here
                with trio.move_on_after(PERIOD):
                    await claim.wait_draining()
            print(f"{worker}: handed back partition {p}", flush=True)
        finally:
            del running[p]

    return run


async def worker_main(
    redis: Redis,
    worker: str,
    partitions: int,
    running: dict[int, str],
    *,
    task_status: trio.TaskStatus[tuple[trio.Event, Rebalancer]],
) -> None:
    """One worker: join the group, run the assigned partitions until told to stop."""
    stop = trio.Event()
    async with (
        open_membership(
            redis, GROUP, partitions=partitions, member_id=worker, heartbeat_interval=0.2,
            session_timeout=1.0,
        ) as member,
        open_lock_manager(redis, owner=worker) as locks,
        open_rebalancer(
            member.partitions, locks, lock_name=lock_name, run=make_run(redis, worker, running),
            lease_ttl=LEASE_TTL, grace=GRACE,
        ) as rebalancer,
    ):  # fmt: skip
        task_status.started((stop, rebalancer))
        await stop.wait()
        # Hand everything back gracefully before leaving the group.
        await rebalancer.drain()
        print(f"{worker}: drained {rebalancer!r}", flush=True)


async def wait_spread(rebalancers: dict[str, Rebalancer], partitions: int) -> None:
    """Wait until every partition runs (under its lease) on one of ``rebalancers``,
    and each of them runs some."""
    everything = frozenset(range(partitions))
    with trio_util.compose_values(**{w: r.owned for w, r in rebalancers.items()}) as owned:
        await owned.wait_value(lambda each: all(each) and frozenset().union(*each) == everything)


async def demo(url: str, partitions: int, duration: float) -> int:
    running: dict[int, str] = {}
    step = duration / 3
    async with open_redis(url) as redis:
        with redis_errors():
            # One key per command: on a Redis Cluster each partition's log has a slot
            # of its own, and one DEL may name the keys of one slot only.
            for p in range(partitions):
                await redis.delete([log_key(p)])
        async with trio.open_nursery() as nursery:
            stops: dict[str, trio.Event] = {}
            rebalancers: dict[str, Rebalancer] = {}
            for worker in ("w1", "w2", "w3"):
                if worker == "w2":
                    await trio.sleep(step)
                stops[worker], rebalancers[worker] = await nursery.start(
                    worker_main, redis, worker, partitions, running
                )
            with trio.fail_after(10):
                await wait_spread(rebalancers, partitions)
            await trio.sleep(step)
            print("stopping w2 gracefully", flush=True)
            stops["w2"].set()
            del rebalancers["w2"]
            with trio.fail_after(10):
                await wait_spread(rebalancers, partitions)
            await trio.sleep(step)
            for stop in stops.values():
                stop.set()
        with redis_errors():
            logs = {
                p: [line.decode().split() for line in await redis.lrange(log_key(p), 0, -1)]
                for p in range(partitions)
            }
    return check(logs)


def check(logs: dict[int, list[list[str]]]) -> int:
    """Verify each partition's log: one worker at a time, in fencing-token order."""
    failed = False
    for p, log in sorted(logs.items()):
        terms = [(worker, int(token)) for worker, token in log]
        switches = [t for i, t in enumerate(terms) if i == 0 or t != terms[i - 1]]
        tokens = [token for _, token in switches]
        print(f"partition {p}: {len(log)} units by {[w for w, _ in switches]}")
        if not log or tokens != sorted(set(tokens)):
            print(f"FAILED: partition {p}'s owners interleaved or it was never worked")
            failed = True
    if failed:
        return 1
    print("ok: every partition was worked by one worker at a time, in token order")
    return 0


@contextlib.contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    if given:
        yield given
    else:
        with RedisServer() as server:
            yield server.url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="Redis to use (default: start a private one)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds to run")
    args = parser.parse_args()
    with redis_url(args.redis_url) as url:
        return trio.run(demo, url, args.partitions, args.duration)


if __name__ == "__main__":
    sys.exit(main())
