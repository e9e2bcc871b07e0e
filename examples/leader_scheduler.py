"""Run a periodic job on exactly one of several nodes, with failover.

Every node campaigns for leadership of ``scheduler``; only the leader runs the job.
Each run is recorded with a *fenced* write: a Lua script appends to the job log only
if the leader lease is still this node's, so a deposed leader can never write. Half
way through, the leader node is stopped and another one takes over.

Run it on its own (it starts a private ``redis-server``)::

    python examples/leader_scheduler.py

or against a server of yours::

    python examples/leader_scheduler.py --redis-url redis://localhost:6379 --duration 10
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

import trio

from streamkit import LeaderElection, Redis, open_leader_election, open_lock_manager, open_redis
from streamkit.lowlevel import redis_errors
from streamkit.testing import RedisServer

if TYPE_CHECKING:
    from collections.abc import Iterator

ELECTION = "scheduler"
JOB_LOG = "{scheduler}:jobs"  # same hash tag as the leader lock, so one script sees both
LEADER_TTL = 1.0
JOB_INTERVAL = 0.2

# docs: start leader
# KEYS: leader lock, job log. ARGV: the lease's value, the log entry.
FENCED_APPEND = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
"""


async def run_jobs(redis: Redis, election: LeaderElection, node: str) -> None:
    """The leader-only work: run the job every JOB_INTERVAL seconds, fenced."""
    append = redis.register_script(FENCED_APPEND)
    lease = await election.wait_leader()
    print(f"{node}: became leader (token {lease.token})", flush=True)
    try:
        for run in range(1, sys.maxsize):
            with redis_errors():
                written: object = await append(
                    [lease.key, JOB_LOG], [lease.value, f"{node} {lease.token} {run}"]
                )
            if written != 1:
                print(f"{node}: fenced write refused; no longer leader", flush=True)
                return
            print(f"{node}: ran job {run}", flush=True)
            await trio.sleep(JOB_INTERVAL)
    finally:
        print(f"{node}: stopped leading", flush=True)


async def node_main(
    redis: Redis, node: str, *, task_status: trio.TaskStatus[trio.CancelScope]
) -> None:
    """One node: a lock manager, a campaign, and the job while leading."""
    with trio.CancelScope() as scope:
        async with (
            open_lock_manager(redis, owner=node) as locks,
            open_leader_election(locks, ELECTION, ttl=LEADER_TTL) as election,
        ):
            task_status.started(scope)
            await election.run_while_leader(run_jobs, redis, election, node)


# docs: end leader


async def demo(url: str, nodes: int, duration: float) -> int:
    async with open_redis(url) as redis:
        with redis_errors():
            await redis.delete([JOB_LOG])
        async with trio.open_nursery() as nursery:
            scopes = {}
            for i in range(1, nodes + 1):
                node = f"node-{i}"
                scopes[node] = await nursery.start(node_main, redis, node)
            await trio.sleep(duration / 2)
            async with open_lock_manager(redis) as locks:
                leader = await locks.holder(ELECTION)
            if leader is not None:
                print(f"stopping {leader.owner}, the current leader", flush=True)
                scopes[leader.owner].cancel()
            await trio.sleep(duration / 2)
            nursery.cancel_scope.cancel()

        with redis_errors():
            log = [entry.decode().split() for entry in await redis.lrange(JOB_LOG, 0, -1)]
    return check(log)


def check(log: list[list[str]]) -> int:
    """Verify the job log: one leader at a time, terms in token order."""
    terms = [(node, int(token)) for node, token, _ in log]
    switches = [term for i, term in enumerate(terms) if i == 0 or term != terms[i - 1]]
    tokens = [token for _, token in switches]
    print(f"{len(log)} jobs ran, in {len(switches)} term(s): {switches}")
    if tokens != sorted(set(tokens)):
        print("FAILED: two leaders' jobs interleaved")
        return 1
    print("ok: at most one leader at any time")
    return 0


@contextlib.contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    if given:
        yield given
    else:
        with RedisServer() as server:
            yield server.url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="Redis to use (default: start a private one)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--duration", type=float, default=6.0, help="seconds to run")
    args = parser.parse_args()
    with redis_url(args.redis_url) as url:
        return trio.run(demo, url, args.nodes, args.duration)


if __name__ == "__main__":
    sys.exit(main())
