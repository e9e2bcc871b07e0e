"""Fixtures of the reliability suite: every test is marked ``reliability``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/reliability/" in item.nodeid:
            item.add_marker(pytest.mark.reliability)
