"""Schedules: cron ticks in a named timezone across daylight-saving changes (pure, then
the scheduling loop on Trio's mock clock), and schedules added, changed, listed and
removed at runtime, run once per tick by several workers."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import pytest
import trio
import trio.testing

from streamkit import App, ConfigError
from streamkit.jobs import JobQueue, ScheduleInfo, current_job, open_job_queue
from streamkit.jobs._cron import Ticking, run_ticks
from streamkit.jobs._crontime import fixed_time, next_tick, ticks_between
from streamkit.testing import wait_until
from tests.jobs_serving import start_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamkit import Redis

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")
# 2026: Europe springs forward on March 29 at 01:00 UTC (02:00 CET -> 03:00 CEST) and
# falls back on October 25 at 01:00 UTC (03:00 CEST -> 02:00 CET).
SPRING = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
AUTUMN = datetime(2026, 10, 25, 1, 0, tzinfo=UTC)


def local(ticks: list[datetime], tz: ZoneInfo = PARIS) -> list[str]:
    return [t.astimezone(tz).strftime("%m-%d %H:%M %Z") for t in ticks]


# ---------------------------------------------------------------------- the rule, pure


def test_fixed_time_expressions_are_those_without_a_star_in_minute_or_hour() -> None:
    assert fixed_time("30 2 * * *")
    assert fixed_time("0,30 2 * * 1-5")
    assert fixed_time("@daily")
    assert not fixed_time("*/15 * * * *")
    assert not fixed_time("15 * * * *")
    assert not fixed_time("* 2 * * *")
    assert not fixed_time("@hourly")


def test_a_fixed_time_skipped_in_spring_runs_when_the_clocks_jump() -> None:
    ticks = ticks_between(
        "30 2 * * *", PARIS, SPRING - timedelta(days=2), SPRING + timedelta(days=2)
    )
    assert local(ticks) == [
        "03-27 02:30 CET",
        "03-28 02:30 CET",
        "03-29 03:00 CEST",  # 02:30 never showed: run at the jump, once
        "03-30 02:30 CEST",
        "03-31 02:30 CEST",
    ]
    # several fixed times inside the skipped hour still run once
    two = ticks_between(
        "0,30 2 * * *", PARIS, SPRING - timedelta(hours=3), SPRING + timedelta(hours=3)
    )
    assert local(two) == ["03-29 03:00 CEST"]


def test_a_fixed_time_repeated_in_autumn_runs_once() -> None:
    ticks = ticks_between(
        "30 2 * * *", PARIS, AUTUMN - timedelta(days=2), AUTUMN + timedelta(days=2)
    )
    assert local(ticks) == [
        "10-24 02:30 CEST",
        "10-25 02:30 CEST",  # the first 02:30 only
        "10-26 02:30 CET",
    ]


def test_a_wildcard_expression_follows_the_clock_through_both_changes() -> None:
    spring = ticks_between(
        "*/30 * * * *", PARIS, SPRING - timedelta(hours=1), SPRING + timedelta(hours=1)
    )
    assert local(spring) == [
        "03-29 01:30 CET",
        "03-29 03:00 CEST",
        "03-29 03:30 CEST",
        "03-29 04:00 CEST",
    ]
    autumn = ticks_between(
        "*/30 * * * *", PARIS, AUTUMN - timedelta(hours=1), AUTUMN + timedelta(hours=1)
    )
    assert local(autumn) == [
        "10-25 02:30 CEST",
        "10-25 02:00 CET",
        "10-25 02:30 CET",
        "10-25 03:00 CET",
    ]
    # every tick 30 real minutes after the one before
    for ticks in (spring, autumn):
        assert {b - a for a, b in itertools.pairwise(ticks)} == {timedelta(minutes=30)}


def test_ticks_in_utc_and_other_zones() -> None:
    after = datetime(2026, 3, 7, 12, tzinfo=UTC)
    assert next_tick("0 9 * * *", None, after) == datetime(2026, 3, 8, 9, tzinfo=UTC)
    # New York springs forward on March 8, 2026: 9:00 EDT is 13:00 UTC
    ny = ticks_between("0 9 * * *", NEW_YORK, after, after + timedelta(days=2))
    assert ny == [datetime(2026, 3, 7, 14, tzinfo=UTC), datetime(2026, 3, 8, 13, tzinfo=UTC)]
    yearly = ticks_between(
        "0 0 1 1 *", PARIS, datetime(2026, 1, 2, tzinfo=UTC), datetime(2028, 1, 2, tzinfo=UTC)
    )
    assert local(yearly) == ["01-01 00:00 CET", "01-01 00:00 CET"]


# ---------------------------------------------------------------------- the loop, mock clock


async def ticks_on_mock_clock(
    ticking: Ticking, start: datetime, run_for: timedelta
) -> list[datetime]:
    """The ticks :func:`run_ticks` fires over ``run_for`` of virtual time from ``start``
    (a wall clock that follows Trio's clock)."""
    began = trio.current_time()

    def clock() -> datetime:
        return start + timedelta(seconds=trio.current_time() - began)

    fired: list[datetime] = []

    async def fire(tick: datetime) -> None:
        assert clock() >= tick  # never early
        assert tick < start or clock() - tick < timedelta(seconds=1)  # and on time
        fired.append(tick)

    with trio.move_on_after(run_for.total_seconds()):
        await run_ticks(ticking, fire, clock=clock)
    return fired


@pytest.mark.parametrize(
    ("expression", "moment", "span", "expected"),
    [
        (
            "30 2 * * *",
            SPRING,
            timedelta(days=3),
            ["03-28 02:30 CET", "03-29 03:00 CEST", "03-30 02:30 CEST"],
        ),
        (
            "30 2 * * *",
            AUTUMN,
            timedelta(days=3),
            ["10-24 02:30 CEST", "10-25 02:30 CEST", "10-26 02:30 CET"],
        ),
        (
            "0 * * * *",
            AUTUMN,
            timedelta(hours=2, minutes=30),
            ["10-25 02:00 CEST", "10-25 02:00 CET", "10-25 03:00 CET"],
        ),
        (
            "0 * * * *",
            SPRING,
            timedelta(hours=2, minutes=30),
            ["03-29 01:00 CET", "03-29 03:00 CEST", "03-29 04:00 CEST"],
        ),
    ],
)
async def test_the_scheduling_loop_across_a_daylight_saving_change(
    expression: str,
    moment: datetime,
    span: timedelta,
    expected: list[str],
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = moment - span / 2 - timedelta(minutes=7)
    ticking = Ticking(name="t", expression=expression, tz=PARIS, misfire_grace=60)
    assert local(await ticks_on_mock_clock(ticking, start, span)) == expected


async def test_the_loop_runs_the_tick_missed_within_its_grace_then_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = datetime(2026, 5, 1, 10, 0, 40, tzinfo=UTC)
    late = Ticking(name="t", expression="* * * * *", tz=None, misfire_grace=60)
    fired = await ticks_on_mock_clock(late, start, timedelta(minutes=2))
    assert [t.strftime("%H:%M") for t in fired] == ["10:00", "10:01", "10:02"]
    too_late = Ticking(name="t", expression="0 * * * *", tz=None, misfire_grace=60)
    later = start + timedelta(minutes=1)  # 100 s after 10:00
    assert await ticks_on_mock_clock(too_late, later, timedelta(minutes=2)) == []


def test_bad_schedules_are_refused_when_declared() -> None:
    app = App("crons")
    with pytest.raises(ConfigError, match="unknown timezone 'Mars/Olympus'"):
        app.cron("0 9 * * *", tz="Mars/Olympus")
    with pytest.raises(ConfigError, match="not a valid crontab"):
        app.cron("every day")


# ---------------------------------------------------------------------- runtime schedules


@pytest.fixture
async def queue(redis: Redis) -> AsyncIterator[JobQueue]:
    async with open_job_queue(redis, "sched", lease_ttl=1.0) as queue:
        yield queue


async def test_schedules_are_added_listed_changed_and_removed_at_runtime(
    redis: Redis, queue: JobQueue
) -> None:
    runs: Counter[str] = Counter()

    @queue.job
    async def report(kind: str) -> None:
        runs[current_job().id] += 1
        runs[kind] += 0

    @queue.cron("0 3 * * *", tz="Europe/Paris")
    async def nightly() -> None: ...

    async with trio.open_nursery() as nursery:
        for _ in range(3):  # three workers: each tick still runs once
            await start_worker(nursery, queue)
        info = await queue.set_schedule("every-second", report, "* * * * * *", args=("fast",))
        assert info.next_at is not None
        await wait_until(lambda: len(runs) >= 4, what="three ticks run", within=10)
        listed = await queue.schedules()
        assert [(s.name, s.declared, s.tz) for s in listed] == [
            ("nightly", True, "Europe/Paris"),
            ("every-second", False, None),
        ]
        assert listed[1] == ScheduleInfo(
            name="every-second",
            job="report",
            expression="* * * * * *",
            tz=None,
            args=("fast",),
            misfire_grace=60.0,
            next_at=listed[1].next_at,
        )
        # changed: every 2 seconds, other arguments
        await queue.set_schedule("every-second", report, "* * * * * */2", args=("slow",))
        await wait_until(lambda: "slow" in runs, what="a tick of the changed schedule", within=10)
        assert await queue.remove_schedule("every-second")
        assert not await queue.remove_schedule("every-second")
        await trio.sleep(1.2)  # the workers notice within a second
        settled = len(runs)
        await trio.sleep(1.2)
        assert len(runs) == settled, "removed: no more ticks"
        nursery.cancel_scope.cancel()
    ticks = [key for key in runs if key.startswith("sched:")]
    assert all(runs[key] == 1 for key in ticks), "each tick ran once across three workers"
    stamps = sorted(int(key.rsplit(":", 1)[1]) for key in ticks)
    assert len(stamps) == len(set(stamps))
    assert [s.name for s in await queue.schedules()] == ["nightly"]


async def test_a_schedule_of_an_unknown_job_or_with_bad_arguments_is_refused(
    queue: JobQueue,
) -> None:
    @queue.job
    async def report(kind: str) -> None: ...

    with pytest.raises(ConfigError, match="no job 'missing'"):
        await queue.set_schedule("x", "missing", "* * * * *")
    with pytest.raises(TypeError, match="report"):
        await queue.set_schedule("x", report, "* * * * *", args=(1, 2))
    with pytest.raises(ConfigError, match="unknown timezone"):
        await queue.set_schedule("x", report, "* * * * *", tz="Nowhere/Else", args=("a",))
    assert await queue.schedules() == []


async def test_a_schedule_that_can_never_enqueue_its_job_is_refused(queue: JobQueue) -> None:
    @queue.job(debounce=5, key="user")
    async def reindex(user: str, n: int) -> None: ...

    @queue.job(throttle=60, key="user")
    async def notify(user: str) -> None: ...

    def account_of(user: str) -> str:
        raise LookupError(f"no account for {user}")

    @queue.job(limit_key=account_of, key_concurrency=1)
    async def bill(user: str) -> None: ...

    with pytest.raises(ConfigError, match=r"^debounce: schedule r: job reindex is debounced"):
        await queue.set_schedule("r", reindex, "* * * * * */5", args=("u", 1))
    with pytest.raises(ConfigError, match=r"^throttle: schedule n: job notify is throttled"):
        await queue.set_schedule("n", "notify", "* * * * *", args=("u",))
    with pytest.raises(
        ConfigError,
        match=r"^limit_key: schedule b: the limit_key of job bill fails on its arguments: "
        r"LookupError: no account for u$",
    ):
        await queue.set_schedule("b", bill, "* * * * *", args=("u",))
    assert await queue.schedules() == []
    # Declared: a cron job's ticks have no arguments.
    with pytest.raises(ConfigError, match=r"^throttle: cron job"):

        @queue.cron("* * * * *", throttle=60)
        async def throttled() -> None: ...

    with pytest.raises(ConfigError, match=r"^limit_key: cron job per_key: the limit_key"):

        @queue.cron("* * * * *", limit_key=lambda: 1 / 0, key_concurrency=1)
        async def per_key() -> None: ...


@pytest.mark.timeout(30)
async def test_a_bad_schedule_is_said_once_and_never_stops_a_worker(
    redis: Redis, queue: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    runs: Counter[str] = Counter()
    keys: list[int] = []
    failing = False

    @queue.job(debounce=5, key="user")
    async def reindex(user: str, n: int) -> None: ...

    @queue.job
    async def report(kind: str) -> None:
        runs[kind] += 1

    def key_of() -> str:
        keys.append(1)
        if failing:
            raise LookupError("the accounts service is down")
        return "k"

    @queue.cron("* * * * * *", limit_key=key_of, key_concurrency=1)
    async def sweep() -> None:
        runs["sweep"] += 1

    async with (
        open_job_queue(redis, queue.name, lease_ttl=1.0) as by_name,
        trio.open_nursery() as nursery,
    ):
        # Set by a producer that cannot check it (a queue by name alone knows no jobs).
        await by_name.set_schedule("r", "reindex", "* * * * * *", args=["u", 1])
        await start_worker(nursery, queue)
        await wait_until(lambda: runs["sweep"] >= 1, what="a tick of sweep", within=10)
        failing = True
        ticks = len(keys)
        await by_name.set_schedule("ok", "report", "* * * * * *", args=["ok"])
        await wait_until(lambda: runs["ok"] >= 2, what="ticks of the good schedule", within=10)
        await wait_until(lambda: len(keys) >= ticks + 2, what="ticks of sweep failing", within=10)
        nursery.cancel_scope.cancel()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        (
            "schedule r: not run: debounce: schedule r: job reindex is debounced by its "
            "key, and a schedule enqueues each tick with an id of its own; schedule a job "
            "without debounce= (change or remove it)"
        ),
        (
            "cron job sweep: its ticks cannot be enqueued (LookupError: the accounts "
            "service is down); skipped (said once) until it is changed or removed"
        ),
    ]
