"""Fixtures of the reliability suite: every test is marked ``reliability``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.workers import WorkerProcess


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/reliability/" in item.nodeid:
            item.add_marker(pytest.mark.reliability)


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """Worker processes started by the test; killed (if still alive) at its end."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.close()
