"""Spread N shards of periodic work over M processes with the membership store alone.

Start as many copies as you like, on any machines that reach the same Redis::

    python examples/shards.py redis://127.0.0.1:6379 --shards 8
    python examples/shards.py redis://127.0.0.1:6379 --shards 8   # in another terminal

Each process joins the group ``shards``, works on the shards it is assigned (here:
"work" is printing a line every ``--period`` seconds), and follows the assignment as
processes come and go: a shard it loses is cancelled at once, a shard it gains starts
at once, and the shards it keeps never stop. Ctrl-C (or SIGTERM) leaves the group so
the others take over immediately; a process killed with ``-9`` is reaped after
``--session`` seconds.

Every line printed is JSON, so tests (and ``jq``) can check who works on what.

Note that without locks two processes may both be working on a moved shard for
the moment between the new owner seeing the change and the old owner seeing it.
Where that matters, hold a lease per shard (the lock manager; the rebalancer does
this for you).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import trio

from streamkit import Membership, open_membership, open_redis
from streamkit.lowlevel import Assignment, diff


def emit(**fields: object) -> None:
    """Print one JSON line, flushed, so a reader sees it at once."""
    print(json.dumps(fields, sort_keys=True), flush=True)


async def work_on(shard: int, member: Membership, period: float) -> None:
    """The periodic work of one shard (a stand-in for real work), forever."""
    count = 0
    while True:
        count += 1
        emit(event="work", member=member.id, shard=shard, n=count)
        await trio.sleep(period)


async def run_shards(member: Membership, period: float) -> None:
    """Run one cancel scope per owned shard, following the assignment."""
    scopes: dict[int, trio.CancelScope] = {}
    current: Assignment | None = None

    async def run_one(scope: trio.CancelScope, shard: int) -> None:
        with scope:
            await work_on(shard, member, period)

    async with trio.open_nursery() as nursery:
        async for assignment in member.assignment.eventual_values():
            change = diff(current, assignment, member.id)
            current = assignment
            # Stop lost shards before announcing, so nothing is worked by us after
            # the "owns" line that no longer lists it.
            for shard in change.release:
                scopes.pop(shard).cancel(f"shard {shard} moved")
            for shard in change.claim:
                scopes[shard] = scope = trio.CancelScope()
                nursery.start_soon(run_one, scope, shard)
            emit(
                event="owns",
                member=member.id,
                generation=assignment.generation,
                members=len(assignment.members),
                shards=sorted(scopes),
            )


async def main(args: argparse.Namespace) -> None:
    async with open_redis(args.redis_url, give_up_after=10) as redis:
        async with open_membership(
            redis,
            args.group,
            partitions=args.shards,
            member_id=args.member_id,
            heartbeat_interval=args.heartbeat,
            session_timeout=args.session,
            refresh_interval=args.session,
        ) as member:
            emit(event="joined", member=member.id, pid=os.getpid())
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_shards, member, args.period)
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        emit(event="stopping", member=member.id, signal=signum)
                        nursery.cancel_scope.cancel(f"signal {signum}")
                        break
        # Leaving the block above left the group: the others take our shards now.
        emit(event="left", member=member.id)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("redis_url", help="redis://host:port of the shared Redis")
    parser.add_argument("--group", default="shards", help="membership group name")
    parser.add_argument("--shards", type=int, default=8, help="number of shards")
    parser.add_argument("--member-id", default=None, help="this process's id (random)")
    parser.add_argument("--period", type=float, default=1.0, help="seconds between work")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="heartbeat interval")
    parser.add_argument("--session", type=float, default=5.0, help="session timeout")
    return parser.parse_args(argv)


if __name__ == "__main__":
    trio.run(main, parse_args(sys.argv[1:]))
