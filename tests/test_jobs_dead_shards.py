"""The dead jobs of a sharded queue: listed oldest first across the shards; replaying
and purging *all* of them reaches every shard."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from streamkit.jobs import JobStatus, open_job_queue
from streamkit.testing import wait_until

if TYPE_CHECKING:
    from streamkit import Redis
    from streamkit.jobs import JobHandle


async def test_replay_and_purge_all_cover_every_shard(redis: Redis) -> None:
    with trio.fail_after(20):
        async with open_job_queue(redis, "sharded", shards=4) as queue:

            @queue.job(retries=0)
            async def boom(n: int) -> None:
                raise ValueError(f"boom {n}")

            # Eight jobs spread over the four shards by their ids.
            await boom.enqueue_many((n,) for n in range(8))

            async def all_dead() -> bool:
                return (await queue.counts()).dead == 8

            async with trio.open_nursery() as nursery:
                await nursery.start(queue.serve)
                await wait_until(all_dead, what="8 dead jobs", within=10)
                steps: list[tuple[int, int]] = []
                replayed = await queue.replay(on_progress=lambda *step: steps.append(step))
                assert len(replayed) == 8
                assert sum(went for went, _ in steps) == sum(did for _, did in steps) == 8
                await wait_until(all_dead, what="8 dead jobs again", within=10)
                nursery.cancel_scope.cancel()
            assert len(await queue.purge()) == 8
            counts = await queue.counts()
            assert counts.dead == 0
            assert counts.pending == 0


async def test_dead_letters_are_oldest_first_across_shards(redis: Redis) -> None:
    with trio.fail_after(20):
        async with open_job_queue(redis, "sharded", shards=4) as queue:

            @queue.job(retries=0)
            async def boom(n: int) -> None:
                raise ValueError(f"boom {n}")

            handles: list[JobHandle[Any]] = []
            async with trio.open_nursery() as nursery:
                await nursery.start(queue.serve)
                n = 0
                # one after the other, until every shard has some
                while len(handles) < 8 or len({h.shard for h in handles}) < 4:
                    n += 1
                    handle = await boom.delay(n)
                    handles.append(handle)

                    async def dead(handle: JobHandle[Any] = handle) -> bool:
                        return await handle.status() is JobStatus.DEAD

                    await wait_until(dead, what=f"job {n} dead", within=10)
                nursery.cancel_scope.cancel()
            assert len({h.shard for h in handles}) == 4
            in_order = [h.id for h in handles]
            assert [i.id for i in await queue.dead_letters()] == in_order
            assert [i.id for i in await queue.dead_letters(limit=3)] == in_order[:3]
