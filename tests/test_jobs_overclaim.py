"""A claim starts at most the jobs the worker has room for, however many a read delivered.

The claimer's blocking read covers the three ready streams at once with ``COUNT
free``, and ``COUNT`` is per stream: when jobs of several priorities are ready
together (one ``enqueue_many`` with mixed priorities, arriving between the claim
script and the read), the read delivers up to three times the free slots. A claim
that started all of them would leave the excess waiting for an executor with nobody
renewing their leases: after ``lease_ttl`` another worker takes them over as if this
worker had died (a lost try, ``WorkerLost`` on the last one) while this one still runs
them later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from streamkit._lua import script
from streamkit._redis import LuaScript, call_once
from streamkit.jobs import JobCall, open_job_queue
from streamkit.jobs._scripts import GROUP

if TYPE_CHECKING:
    from streamkit import Redis
    from streamkit.jobs import JobQueue

CLAIM = LuaScript(script("jobs/claim"))
LEASE_MS = 5000
MAX_DELIVERIES = 3


async def claim(
    queue: JobQueue, consumer: str, want: int, *, reclaim: bool, delivered: list[Any]
) -> list[Any]:
    keys = queue.shard_keys[0]
    reply: list[Any] = await call_once(
        CLAIM,
        queue.redis,
        keys.keys,
        (
            keys.base,
            consumer,
            want,
            LEASE_MS,
            "1" if reclaim else "0",
            MAX_DELIVERIES,
            "{}",  # the tries this consumer runs: none
            *delivered,
        ),
        what="claiming jobs",
    )
    return list(reply[0])


async def test_a_claim_starts_no_more_jobs_than_it_has_room_for(redis: Redis) -> None:
    with trio.fail_after(10):
        async with open_job_queue(redis, "overclaim") as queue:

            @queue.job
            async def step(label: str) -> str:
                return label

            handles = await step.enqueue_many(
                [
                    JobCall(args=("low",), priority="low"),
                    JobCall(args=("normal",), priority="normal"),
                    JobCall(args=("high",), priority="high"),
                ]
            )
            keys = queue.shard_keys[0]
            for priority in range(3):
                await redis.xgroup_create(keys.ready(priority), GROUP, "0")
            # What the claimer's blocking read does, for a worker with one free slot.
            read = await redis.xreadgroup(
                GROUP, "worker-a", {keys.ready(p): ">" for p in range(3)}, count=1
            )
            assert read is not None
            delivered: list[Any] = []
            for stream, entries in read.items():
                priority = int(stream.decode()[-1])
                for entry in entries:
                    delivered.extend((priority, entry.identifier, entry.field_values[b"id"]))
            assert len(delivered) == 3 * 3  # one entry of each priority

            started = await claim(queue, "worker-a", 1, reclaim=False, delivered=delivered)
            assert [job[1] for job in started] == [b"step"]
            assert started[0][0].decode() == handles[2].id  # the high one
            statuses = [await handle.status() for handle in handles]
            assert statuses == ["sent", "sent", "executing"]

            # The entries it had no room for are anybody's at once, as never started:
            # no lost worker is counted for them.
            taken = await claim(queue, "worker-b", 10, reclaim=True, delivered=[])
            assert sorted(job[0].decode() for job in taken) == sorted(
                [handles[0].id, handles[1].id]
            )
            for handle in handles[:2]:
                info = await handle.info()
                assert (info.status, info.tries, info.lost) == ("executing", 1, 0)
                assert info.worker == "worker-b"
