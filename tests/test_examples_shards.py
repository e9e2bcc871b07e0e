"""examples/shards.py as real processes: every shard is worked by exactly one of them.

Three processes share 6 shards; then one is killed with SIGKILL (reaped after its
session times out) and one is stopped with SIGINT (leaves at once). After each
change, every shard must be worked by exactly one process, the one the group
assigned it to.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import trio
import trio_util

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "shards.py"
SHARDS = 6
WAIT = 20.0


@attrs.define(eq=False)
class Proc:
    """One running copy of the example and the JSON lines it printed."""

    member_id: str
    process: trio.Process
    lines: list[dict[str, Any]] = attrs.field(factory=list)

    def last_owns(self) -> tuple[int, dict[str, Any]] | None:
        for index in range(len(self.lines) - 1, -1, -1):
            if self.lines[index]["event"] == "owns":
                return index, self.lines[index]
        return None

    def work_since_last_owns(self) -> dict[int, int]:
        """Shard -> how often this process worked it after its latest "owns" line."""
        found = self.last_owns()
        start = found[0] if found else 0
        counts: dict[int, int] = {}
        for line in self.lines[start:]:
            if line["event"] == "work":
                counts[line["shard"]] = counts.get(line["shard"], 0) + 1
        return counts


async def read_lines(proc: Proc, changed: Any) -> None:
    assert proc.process.stdout is not None
    buffer = b""
    async for chunk in proc.process.stdout:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for raw in complete:
            proc.lines.append(json.loads(raw))
        changed.value += 1


def settled(procs: list[Proc]) -> bool:
    """All live processes agree on one generation that covers every shard exactly once,
    and each has worked each of its shards at least twice since."""
    owns = [p.last_owns() for p in procs]
    if any(o is None for o in owns):
        return False
    latest = [o[1] for o in owns if o is not None]
    if len({o["generation"] for o in latest}) != 1 or latest[0]["members"] != len(procs):
        return False
    if sorted(s for o in latest for s in o["shards"]) != list(range(SHARDS)):
        return False
    return all(
        all(p.work_since_last_owns().get(s, 0) >= 2 for s in o["shards"])
        for p, o in zip(procs, latest, strict=True)
    )


def assert_exclusive(procs: list[Proc]) -> None:
    """Each shard was worked, since the latest change, by exactly its owner."""
    for shard in range(SHARDS):
        workers = [p.member_id for p in procs if shard in p.work_since_last_owns()]
        owners = [p.member_id for p in procs if shard in p.last_owns()[1]["shards"]]  # type: ignore[index]
        assert workers == owners, f"shard {shard}: worked by {workers}, owned by {owners}"
        assert len(owners) == 1


async def test_each_shard_is_worked_by_exactly_one_process(redis_url: str) -> None:
    changed = trio_util.AsyncValue(0)
    procs: list[Proc] = []

    async def wait_settled(live: list[Proc]) -> None:
        with trio.fail_after(WAIT):
            await changed.wait_value(lambda _: settled(live))

    async with trio.open_nursery() as nursery:
        for member_id in ("p1", "p2", "p3"):
            command = [
                sys.executable, str(EXAMPLE), redis_url,
                "--group", "shards-test", "--shards", str(SHARDS), "--member-id", member_id,
                "--period", "0.05", "--heartbeat", "0.1", "--session", "1.0",
            ]  # fmt: skip
            process: trio.Process = await nursery.start(
                functools.partial(trio.run_process, command, stdout=subprocess.PIPE, check=False)
            )
            proc = Proc(member_id, process)
            procs.append(proc)
            nursery.start_soon(read_lines, proc, changed)

        await wait_settled(procs)
        assert_exclusive(procs)
        generation = procs[0].last_owns()[1]["generation"]  # type: ignore[index]

        # A crash: nobody is told, the group reaps p2 once its heartbeat expires.
        p1, p2, p3 = procs
        p2.process.kill()
        await wait_settled([p1, p3])
        assert_exclusive([p1, p3])
        assert p1.last_owns()[1]["generation"] > generation  # type: ignore[index]
        assert not any(line["event"] == "left" for line in p2.lines)

        # A graceful stop: p3 leaves, p1 takes everything.
        p3.process.send_signal(signal.SIGINT)
        with trio.fail_after(WAIT):
            assert await p3.process.wait() == 0
        assert [line["event"] for line in p3.lines[-2:]] == ["stopping", "left"]
        await wait_settled([p1])
        assert p1.last_owns()[1]["shards"] == list(range(SHARDS))  # type: ignore[index]

        p1.process.send_signal(signal.SIGTERM)
        with trio.fail_after(WAIT):
            assert await p1.process.wait() == 0
