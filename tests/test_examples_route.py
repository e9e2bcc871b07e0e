"""examples/route_by_key.py: each account's jobs run on one task, in order."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from streamkit import partition_for

EXAMPLE = Path(__file__).parent.parent / "examples" / "route_by_key.py"
TASKS, JOBS = 3, 60


def test_route_example_keeps_each_key_on_one_task_in_order() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--tasks", str(TASKS), "--jobs", str(JOBS)],
        capture_output=True,
        check=True,
        timeout=30,
    )
    lines = re.findall(r"task (\d+): (\S+) job (\d+)", result.stdout.decode())
    assert len(lines) == JOBS
    done: dict[str, list[int]] = {}
    for task, account, seq in lines:
        assert int(task) == partition_for(account, TASKS)
        done.setdefault(account, []).append(int(seq))
    for account, seqs in done.items():
        assert seqs == list(range(1, len(seqs) + 1)), f"{account}: {seqs}"
