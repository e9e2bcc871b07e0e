"""The CLI tests' fork server (tests/cli_forkserver.py) gives what a cold
``python -m streamkit`` gives: output, exit code, stdin, environment, working directory
and PYTHONPATH."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import trio

from tests import cli_forkserver

if TYPE_CHECKING:
    from pathlib import Path

MODULE = """\
import os

from streamkit import App, Record


class Item(Record):
    key: str


app = App("forked", redis_url=os.environ["FORKED_URL"])
items = app.stream("items", record=Item, partition_by="key", partition_count=2)
"""


async def test_forked_commands_say_what_cold_ones_say(redis_url: str, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "forkedapp.py").write_text(MODULE)
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "elsewhere"),
        "FORKED_URL": redis_url,
        "STREAMKIT_CONNECT_GIVE_UP_AFTER": "0",
    }
    cases: list[tuple[list[str], bytes]] = [
        (["--help"], b""),
        (["send", "forkedapp:items"], b""),  # a usage error: exit code 2
        (["nonesuch"], b""),
        (["table", "forkedapp:nonesuch"], b""),  # imported from PYTHONPATH
        (["sendmany", "forkedapp:items", "-"], b'{"key": "a"}\n{"key": "b"}\n'),
        (["send", "forkedapp:items", '{"key": 1}'], b""),  # refused: not a str
        (["read", "forkedapp:items", "--json"], b""),
        (["status", "missing:app"], b""),  # not importable from the working directory
    ]
    for args, stdin in cases:
        with trio.fail_after(60):
            forked = await cli_forkserver.run(args, cwd=tmp_path, env=env, stdin=stdin)
            expected = await cli_forkserver.cold(args, cwd=tmp_path, env=env, stdin=stdin)
        assert forked[0] == expected[0], (args, forked, expected)
        assert forked[1] == expected[1], args
        assert forked[2] == expected[2], args
    assert cli_forkserver.forked_once(), "the commands above ran cold: the fork server failed"
