"""The leader election example runs on its own and fails over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

EXAMPLE = Path(__file__).parent.parent / "examples" / "leader_scheduler.py"


@pytest.mark.timeout(60)
async def test_leader_scheduler_example_fails_over() -> None:
    with trio.fail_after(50):
        result = await trio.run_process(
            [sys.executable, str(EXAMPLE), "--nodes", "3", "--duration", "3"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    leaders = [line.split(":")[0] for line in out.splitlines() if "became leader" in line]
    assert len(leaders) >= 2
    assert len(set(leaders)) == len(leaders)  # the stopped leader never came back
    assert "current leader" in out
    assert "ok: at most one leader at any time" in out


def test_example_help() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--help"], capture_output=True, check=True
    )
    assert b"--redis-url" in result.stdout
