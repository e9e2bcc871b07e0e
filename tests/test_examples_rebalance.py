"""examples/rebalance_any_work.py runs on its own: workers join and leave, no overlap."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio

EXAMPLE = Path(__file__).parent.parent / "examples" / "rebalance_any_work.py"
PARTITIONS = 6


@pytest.mark.timeout(60)
@pytest.mark.cluster
async def test_rebalance_example_hands_partitions_over(redis_url: str) -> None:
    with trio.fail_after(50):
        result = await trio.run_process(
            [sys.executable, str(EXAMPLE), "--redis-url", redis_url,
             "--partitions", str(PARTITIONS), "--duration", "1.5"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )  # fmt: skip
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    assert "ok: every partition was worked by one worker at a time" in out
    owners = {
        int(p): names for p, names in re.findall(r"partition (\d+): \d+ units by (\[.*\])", out)
    }
    assert sorted(owners) == list(range(PARTITIONS))
    # Partitions moved when w2 and w3 joined, and again when w2 left.
    assert any("w2" in names for names in owners.values())
    assert any("w3" in names for names in owners.values())
    assert "stopping w2 gracefully" in out
    assert "w2: drained" in out
    assert "lost" not in out.replace("0 lost", "")


def test_example_help() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--help"], capture_output=True, check=True
    )
    assert b"--partitions" in result.stdout
