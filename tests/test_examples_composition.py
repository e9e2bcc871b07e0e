"""docs/composition.md says, per example, what it needs of Redis: each says the truth.

The page's table has a "Redis" column; each example's own ``--help`` shows what it
really does: no Redis at all, a private server unless ``--redis-url`` is given, or a
URL it always needs (its first argument).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "composition.md"
ROW = re.compile(r"^\|.*\|\s*`(?P<example>examples/\w+\.py)`\s*\|\s*(?P<redis>[^|]+?)\s*\|$")


def table() -> dict[str, str]:
    """Example path -> what the page says it needs of Redis."""
    rows = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match is not None:
            rows[match["example"]] = match["redis"]
    return rows


async def help_of(example: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = await trio.run_process(
        [sys.executable, str(ROOT / example), "--help"], capture_stdout=True, env=env
    )
    return result.stdout.decode()


async def test_each_example_needs_what_the_page_says() -> None:
    rows = table()
    assert len(rows) == 5, rows
    helps: dict[str, str] = {}

    async def read(example: str) -> None:
        helps[example] = await help_of(example)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for example in rows:
                nursery.start_soon(read, example)

    for example, says in rows.items():
        shown = helps[example]
        if says == "none":
            assert "redis" not in shown.lower(), example
        elif "--redis-url" in says:
            assert "private" in says, example
            assert "--redis-url" in shown, example
            assert "default: start a private one" in shown, example
        else:
            assert "first argument" in says, example
            usage = shown.split("\n\n", 1)[0]
            assert re.search(r"\bredis_url\s*$", usage), example
            assert "--redis-url" not in shown, example
