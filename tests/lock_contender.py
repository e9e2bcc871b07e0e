"""One of several OS processes contending for one lock (see ``test_locks.py``).

Usage: ``python tests/lock_contender.py REDIS_URL ROUNDS``

Each round holds the lock ``contended`` and, while holding it, appends
``enter <owner> <token>`` and ``exit <owner> <token>`` to the list ``{contended}:log``
through a fenced write: a Lua script that appends only if the lock still holds this
lease's value. The test reads the list back and checks that holders never overlap.
Exits with status 3 if a fenced write was refused.
"""

from __future__ import annotations

import sys

import trio

from streamkit import open_lock_manager, open_redis
from streamkit.lowlevel import redis_errors

LOCK = "contended"
LOG = "{contended}:log"  # same hash slot as the lock, so one script can touch both

FENCED_APPEND = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
"""


async def main(url: str, rounds: int) -> int:
    async with open_redis(url) as redis, open_lock_manager(redis) as locks:
        append = redis.register_script(FENCED_APPEND)
        for _ in range(rounds):
            async with locks.hold(LOCK, ttl=2.0, wait=30) as held:
                for what in ("enter", "exit"):
                    with redis_errors():
                        done: object = await append(
                            [held.lease.key, LOG],
                            [held.lease.value, f"{what} {locks.owner} {held.token}"],
                        )
                    if done != 1:
                        return 3
                    # Stay inside long enough that the others really contend.
                    await trio.sleep(0.02)
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main, sys.argv[1], int(sys.argv[2])))
