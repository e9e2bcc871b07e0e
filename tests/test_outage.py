"""The outage log on a mock clock: said once, summed up at a steady interval with what
waits, its end in one line; a flapping network said by its summaries only."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from streamkit import log_context
from streamkit._outage import OutageLog, duration

if TYPE_CHECKING:
    from collections.abc import Iterator

SUBJECT = "Redis at redis://example:6379"


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """The outage log's warnings, as they are logged."""
    caplog.set_level(logging.DEBUG, logger="streamkit.redis")
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                lines.append(record.getMessage())

    handler = Keep()
    logging.getLogger("streamkit.redis").addHandler(handler)
    yield lines
    logging.getLogger("streamkit.redis").removeHandler(handler)


async def test_an_outage_is_said_once_summed_up_and_its_end_said(
    autojump_clock: trio.testing.MockClock, said: list[str]
) -> None:
    outage = OutageLog(SUBJECT)
    with outage.waiting(lambda: (8, "partition")), outage.waiting(lambda: (1, "partition")):
        began = trio.current_time()
        # Every partition fails, many times a second, for 75 seconds.
        while trio.current_time() - began < 75:
            for _ in range(9):
                outage.failed("Connection refused", what="acquiring a lease")
            await trio.sleep(0.1)
        sent = trio.current_time()
        outage.answered(began - 1)  # a reply to a command sent before the outage: no end
        assert outage.down
        outage.answered(sent)
    assert said == [
        f"{SUBJECT} unreachable: Connection refused; retrying, with a summary every 30s",
        f"{SUBJECT} unreachable for 30s (Connection refused); 9 partitions waiting; retrying",
        f"{SUBJECT} unreachable for 60s (Connection refused); 9 partitions waiting; retrying",
        f"{SUBJECT} back after 75s",
    ]
    assert not outage.down


async def test_a_flapping_network_is_said_by_its_summaries(
    autojump_clock: trio.testing.MockClock, said: list[str]
) -> None:
    outage = OutageLog(SUBJECT, announce_gap=10.0)
    outage.failed("lost a connection (reset)")
    outage.answered()
    # Brief outages right after: counted, not said.
    for _ in range(3):
        await trio.sleep(1)
        outage.failed("lost a connection (reset)")
        outage.answered()
    await trio.sleep(1)
    # One that lasts: said by its first summary, its end said too.
    outage.failed("lost a connection (reset)")
    await trio.sleep(31)
    outage.failed("Connection refused")
    outage.answered()
    await trio.sleep(20)
    outage.failed("lost a connection (reset)", refused=False)
    assert said == [
        f"{SUBJECT} unreachable: lost a connection (reset); retrying, with a summary every 30s",
        f"{SUBJECT} back after 0.00s",
        f"{SUBJECT} unreachable for 31s (Connection refused); retrying",
        f"{SUBJECT} back after 31s",
        (
            f"{SUBJECT} unreachable: lost a connection (reset) (3 brief outage(s) since the "
            f"last report); retrying, with a summary every 30s"
        ),
    ]


async def test_refusals_are_said_as_refusals_without_the_task_context(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    outage = OutageLog(SUBJECT)
    caplog.set_level(logging.WARNING, logger="streamkit.redis")
    with log_context(processor="orders", partition=3):
        outage.failed("out of memory (OOM ...)", refused=True, retrying=" in 0.05s")
    [record] = caplog.records
    assert record.getMessage() == (
        f"{SUBJECT} refusing commands: out of memory (OOM ...); retrying in 0.05s, with a "
        f"summary every 30s"
    )
    # Said for the whole process, not for the partition whose task met it first.
    assert not hasattr(record, "partition")


def test_durations_read_well() -> None:
    assert [duration(s) for s in (0.021, 4.52, 31.2, 125.0)] == [
        "0.02s",
        "4.5s",
        "31s",
        "2 min 05s",
    ]
