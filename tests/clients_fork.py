"""Run as a program: one blocking and one asyncio client used in a parent and, after
``os.fork()``, in its child at the same time; prints what each saw as JSON.

The parent uses its clients before forking (their connections are open), then parent
and child send records and enqueue jobs through the same client objects at once. A
socket shared across the fork would mix their replies up; fork-safe clients connect
anew in the child and leave the parent's connections alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import TYPE_CHECKING

from streamkit import App, Record

if TYPE_CHECKING:
    from streamkit.clients import AsyncioClient, BlockingClient


class Tick(Record):
    who: str
    n: int


app = App("forked", redis_url=sys.argv[1] if len(sys.argv) > 1 else "redis://localhost")
ticks = app.stream("ticks", record=Tick, partition_by="who", partition_count=2)
SENDS = 200
JOBS = 50


@app.job
async def noop(n: int) -> None:
    """Never run: the test counts the jobs queued."""


def connection(client: BlockingClient) -> int:
    """The id Redis gave the connection the client uses now (one thread: one connection)."""
    return int(client._client().client_id())


def use(client: BlockingClient, aio: AsyncioClient, who: str) -> dict[str, object]:
    for n in range(SENDS):
        client.send(ticks, Tick(who=who, n=n))
    jobs = [client.delay(noop, n).id for n in range(JOBS)]

    async def use_asyncio() -> int:
        return len(await aio.send_many(ticks, [Tick(who=f"{who}-aio", n=n) for n in range(SENDS)]))

    return {"connection": connection(client), "jobs": jobs, "asyncio": asyncio.run(use_asyncio())}


def main() -> None:
    client = app.blocking()
    aio = app.asyncio()
    client.send(ticks, Tick(who="before", n=0))
    asyncio.run(aio.send(ticks, Tick(who="before-aio", n=0)))
    before = connection(client)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            report = use(client, aio, "child")
            client.close()  # the child's own connections; the parent's stay open
        except BaseException as exc:
            report = {"error": repr(exc)}
        os.write(write, json.dumps(report).encode())
        os._exit(0)
    os.close(write)
    parent = use(client, aio, "parent")
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as pipe:
        child = json.loads(pipe.read())
    # The parent's connection works on after the child closed its client and exited.
    client.send(ticks, Tick(who="after", n=0))
    parent["after"] = connection(client)
    parent["before"] = before
    client.close()
    print(json.dumps({"parent": parent, "child": child, "status": status}))


if __name__ == "__main__":
    main()
