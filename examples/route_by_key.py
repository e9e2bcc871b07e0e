"""Route jobs by key to a fixed set of Trio tasks, in order per key: the partitioner alone.

No Redis: a service receives jobs for many accounts and works on them with N tasks at
once, while the jobs of one account must run one at a time, in the order received.
The partitioner picks each job's task from its account, through a bounded channel
per task (backpressure: a slow task slows down the router, nothing piles up). The
mapping from key to task is the same in every process and on every machine, so
several routers agree on it without talking to each other.

Run it::

    python examples/route_by_key.py --tasks 4 --jobs 40
"""

from __future__ import annotations

import argparse
import random
import sys

import trio

from streamkit import Partitioner, Record


class Job(Record):
    account: str
    seq: int  # the job's number among its account's jobs


# docs: start route
async def work(task: int, receive: trio.MemoryReceiveChannel[Job]) -> None:
    """One task: the jobs of the accounts routed to it, one at a time, in order."""
    async with receive:
        async for job in receive:
            await trio.sleep(random.uniform(0, 0.002))  # the real work
            print(f"task {task}: {job.account} job {job.seq}", flush=True)


async def route(jobs: list[Job], tasks: int) -> None:
    partitioner = Partitioner(partition_by="account", partition_count=tasks, record=Job)
    async with trio.open_nursery() as nursery:
        senders = []
        for task in range(tasks):
            send, receive = trio.open_memory_channel[Job](10)
            senders.append(send)
            nursery.start_soon(work, task, receive)
        for job in jobs:
            await senders[partitioner.partition_of(job)].send(job)
        for send in senders:
            await send.aclose()  # each task ends once it has worked off its jobs


# docs: end route


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=4, help="tasks working at once")
    parser.add_argument("--jobs", type=int, default=40, help="jobs to route")
    parser.add_argument("--accounts", type=int, default=7, help="distinct accounts")
    args = parser.parse_args()
    rng = random.Random(3)
    counts: dict[str, int] = {}
    jobs = []
    for _ in range(args.jobs):
        account = f"account-{rng.randrange(args.accounts)}"
        counts[account] = counts.get(account, 0) + 1
        jobs.append(Job(account=account, seq=counts[account]))
    trio.run(route, jobs, args.tasks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
