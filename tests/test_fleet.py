"""The fleet snapshot's pure parts: rates between two snapshots, the view fitting a
terminal, the JSON form; and one snapshot of a real app on a real Redis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import attrs
import pytest
from rich.console import Console

from streamkit._cli._admin import MemberStatus, PartitionStatus
from streamkit._cli._fleet import (
    FleetRates,
    FleetSample,
    FleetSnapshot,
    ProcessorSnapshot,
    QueueSnapshot,
    fleet_json,
    fleet_rates,
    job_history,
    take_snapshot,
)
from streamkit._cli._fleet_view import compact, fit_rows, fleet_view, pick_rows
from streamkit._halts import HaltRecord
from streamkit.jobs import JobErrorInfo, JobInfo, JobStatus, JobTry, QueueCounts
from streamkit.jobs._handle import decode_history
from tests.apps import fleet

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


def partition(n: int, *, read: int | None, lag: int = 0, halted: bool = False) -> PartitionStatus:
    return PartitionStatus(
        partition=n,
        assigned_to="m1",
        owner="web-1:4242:abcd",
        length=(read or 0) + lag,
        lag=lag,
        pending=0,
        last_event_at=NOW - timedelta(seconds=3),
        halted=HaltRecord(
            partition=n,
            error_type="ValueError",
            error="bad",
            entry_ids=("1-0",),
            since=NOW,
            worker="web-1:4242",
        )
        if halted
        else None,
        entries_read=read,
    )


MEMBER = MemberStatus(
    id="m1",
    name="web-1:4242",
    host="web-1",
    pid=4242,
    static=False,
    alive=True,
    joined_at=NOW,
    heartbeat_ttl=5.0,
)


def counts(*, succeeded: int = 0, by_name: dict[str, dict[str, int]] | None = None) -> QueueCounts:
    return QueueCounts(
        queued={"high": 1, "normal": 7, "low": 0},
        scheduled=2,
        waiting=0,
        running=3,
        retrying=1,
        dead=4,
        succeeded=succeeded,
        aborted=0,
        expired=0,
        pending=14,
        by_name=by_name if by_name is not None else {"tally": {"sent": 7, "success": succeeded}},
    )


def snapshot(
    clock: float,
    reads: list[int | None],
    *,
    succeeded: int = 0,
    lags: list[int] | None = None,
    jobs: QueueCounts | None = None,
) -> FleetSnapshot:
    lags = lags or [0] * len(reads)
    return FleetSnapshot(
        app="fleet",
        redis_url="redis://127.0.0.1:6379",
        taken_at=NOW,
        clock=clock,
        processors=(
            ProcessorSnapshot(
                name="count",
                stream="clicks",
                members=(MEMBER,),
                partitions=tuple(
                    partition(n, read=r, lag=lag)
                    for n, (r, lag) in enumerate(zip(reads, lags, strict=True))
                ),
            ),
        ),
        jobs=QueueSnapshot(
            name="fleet",
            shards=1,
            declared=("tally",),
            counts=jobs or counts(succeeded=succeeded),
        ),
    )


def test_rates_are_entries_read_over_the_time_between() -> None:
    before = snapshot(100.0, [1_000, 50, None, 7], succeeded=10)
    after = snapshot(102.5, [3_500, 50, 20, 3], succeeded=35)
    rates = fleet_rates(before, after)
    assert rates.seconds == 2.5
    # 2500 events in 2.5 s; none; unknown before; went back (a reset): no rate.
    assert rates.partitions == {("count", 0): 1000.0, ("count", 1): 0.0}
    assert rates.processors == {"count": 1000.0}
    assert rates.jobs == 10.0  # 25 jobs succeeded in 2.5 s


def test_no_rates_without_a_previous_snapshot_or_time() -> None:
    first = snapshot(5.0, [10])
    assert fleet_rates(None, first) == FleetRates()
    assert fleet_rates(first, attrs.evolve(first, clock=5.0)) == FleetRates()


def test_the_job_rate_is_unknown_when_the_total_went_back() -> None:
    rates = fleet_rates(snapshot(0.0, [0], succeeded=9), snapshot(1.0, [0], succeeded=2))
    assert rates.jobs is None


def test_fit_rows_shares_the_lines_round_the_tables() -> None:
    assert fit_rows([4, 2], 100) == [4, 2]  # all fit
    assert fit_rows([10, 10, 1], 7) == [3, 3, 1]  # one each, then round the others
    assert fit_rows([10, 2], 8) == [6, 2]
    assert fit_rows([3, 3], 1) == [1, 0]
    assert fit_rows([3], -4) == [0]


def test_pick_rows_keeps_the_halted_and_the_most_lag() -> None:
    rows = [
        partition(0, read=0, lag=5),
        partition(1, read=0, lag=50),
        partition(2, read=0, lag=0, halted=True),
        partition(3, read=0, lag=500),
        partition(4, read=0, lag=1),
    ]
    assert pick_rows(rows, 5) == (rows, 0)
    shown, more = pick_rows(rows, 4)  # 3 rows and the "… 2 more" line
    assert [r.partition for r in shown] == [1, 2, 3]
    assert more == 2


def test_compact_numbers() -> None:
    assert [compact(n) for n in (0, 7, 9_876, 99_999, 123_456, 9_870_000)] == [
        "0",
        "7",
        "9,876",
        "99,999",
        "123k",
        "9.87M",
    ]
    assert compact(2.25) == "2.2"  # a rate below 100
    assert compact(None) == "?"


def render(sample: FleetSample, width: int, height: int | None) -> list[str]:
    console = Console(width=width, force_terminal=False, color_system=None)
    view = fleet_view(sample, width=width, height=height, now=NOW)
    with console.capture() as capture:
        console.print(view)
    return capture.get().rstrip("\n").split("\n")


def test_the_view_fits_the_terminal_and_says_what_it_left_out() -> None:
    reads: list[int | None] = [100] * 32
    lags = [0] * 32
    lags[17] = 9_999  # the partition that must stay in view
    by_name = {f"job{n}": {"sent": n} for n in range(12)}
    before = snapshot(0.0, reads, lags=lags, jobs=counts(by_name=by_name))
    after = snapshot(1.0, [200] * 32, lags=lags, jobs=counts(by_name=by_name))
    sample = FleetSample(snapshot=after, rates=fleet_rates(before, after))
    lines = render(sample, 80, 24)
    assert len(lines) <= 24
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "more partitions" in text
    assert "more jobs" in text
    assert any(line.split()[:1] == ["17"] and "9,999" in line for line in lines), text
    assert "3,200 events/s" in text  # 32 partitions x 100 events in 1 s
    assert "all jobs" in text

    everything = render(sample, 120, None)
    assert "more" not in "\n".join(everything)
    assert sum(1 for line in everything if "web-1:4242" in line) >= 32


def test_a_long_job_name_keeps_its_room_and_titles_say_less_rather_than_wrap() -> None:
    name = "recompute_customer_statistics"
    after = snapshot(1.0, [200] * 4, jobs=counts(by_name={name: {"sent": 3}}))
    lines = render(FleetSample(snapshot=after, rates=FleetRates()), 80, None)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 80, text
    assert "…" not in text, text
    # The job's whole name, with the counts' shorter headers.
    assert any(line.split()[:2] == [name, "3"] for line in lines), text
    header = next(line for line in lines if line.startswith("job "))
    assert header.split() == ["job", "queued", "delayed", "waits", "runs", "retry", "dead", "done"]
    # The processor's title, whole on one line, with the workers' names as they fit.
    [title] = [line for line in lines if line.startswith("processor count")]
    assert title == "processor count (stream clicks): lag 0 · pending 0 · 1 worker (web-1:4242)"


def test_a_failed_reading_keeps_the_last_one_and_says_so() -> None:
    last = snapshot(0.0, [1])
    sample = FleetSample(snapshot=last, rates=FleetRates(), error="Redis is unreachable")
    text = "\n".join(render(sample, 80, 24))
    assert "reading failed: Redis is unreachable" in text
    assert "processor count" in text


def test_json_has_rates_and_job_depths() -> None:
    before = snapshot(0.0, [0, 0], succeeded=0)
    after = snapshot(2.0, [10, 4], succeeded=6)
    doc = fleet_json(after, fleet_rates(before, after))
    [processor] = doc["processors"]
    assert processor["rate"] == 7.0
    assert [p["rate"] for p in processor["partitions"]] == [5.0, 2.0]
    assert processor["partitions"][0]["worker"] == "web-1:4242"
    assert doc["jobs"]["counts"]["queued"] == {"high": 1, "normal": 7, "low": 0}
    assert doc["jobs"]["rate"] == 3.0
    assert doc["interval"] == 2.0


@pytest.mark.cluster
async def test_a_snapshot_of_a_real_app(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    app = fleet.app
    monkeypatch.setattr(app, "settings", attrs.evolve(app.settings, redis_url=redis_url))
    async with app:
        await fleet.clicks.send_many(fleet.Click(user=f"u{n}", n=n) for n in range(40))
        await fleet.tally.enqueue(1)
        await fleet.tally.enqueue(2, delay=60)  # scheduled, not queued
        await fleet.tally.enqueue(3, priority="high")
        await fleet.hold.enqueue(1)
        taken = await take_snapshot(app)
    [processor] = taken.processors
    assert [p.partition for p in processor.partitions] == [0, 1, 2, 3]
    assert sum(p.length for p in processor.partitions) == 40
    assert processor.lag == 40  # no worker yet: everything is lag
    assert taken.jobs is not None
    assert taken.jobs.counts.queued == {"high": 1, "normal": 2, "low": 0}
    assert taken.jobs.counts.scheduled == 1
    assert taken.jobs.declared == ("hold", "tally", "fail")


def job(**changes: object) -> JobInfo:
    fields: dict[str, object] = {
        "id": "j1",
        "queue": "fleet",
        "name": "tally",
        "status": JobStatus.DEAD,
        "args": (1,),
        "kwargs": {},
        "priority": "normal",
        "tries": 2,
        "max_tries": 2,
        "enqueued_at": NOW,
        "due_at": None,
        "started_at": NOW + timedelta(seconds=5),
        "finished_at": NOW + timedelta(seconds=6),
        "expires_at": None,
        "worker": "web-1-4242",
        "error": JobErrorInfo("ValueError", "bad"),
        "progress": None,
        "progress_message": None,
        "lost": 0,
    }
    return JobInfo(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_jobs_history_from_its_record() -> None:
    # A record without kept tries (written before they were kept): its last try.
    assert job_history(job()) == [
        (NOW, "enqueued (normal priority)"),
        (NOW + timedelta(seconds=5), "try 2 of 2 started on web-1-4242"),
        (NOW + timedelta(seconds=6), "ended dead: ValueError: bad"),
    ]
    retrying = job(status=JobStatus.RETRY, tries=1, finished_at=None, due_at=NOW)
    assert job_history(retrying) == [
        (NOW, "enqueued (normal priority)"),
        (NOW, "due (delayed until then)"),
        (NOW + timedelta(seconds=5), "try 1 of 2 started on web-1-4242"),
        (None, "try 1 failed: ValueError: bad; waiting for the next try"),
    ]
    done = job(status=JobStatus.SUCCESS, error=None)
    assert job_history(done)[-1] == (NOW + timedelta(seconds=6), "ended success")
    queued = job(status=JobStatus.SENT, tries=0, started_at=None, finished_at=None, error=None)
    assert job_history(queued) == [(NOW, "enqueued (normal priority)")]


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def test_a_jobs_history_from_its_kept_tries() -> None:
    ms = int(NOW.timestamp() * 1000)
    hist = (
        f"s,1,{ms + 1000},web-1\n"
        f"e,1,{ms + 1500},lost\n"
        f"s,2,{ms + 7000},web-2\n"
        f"e,2,{ms + 7200},released\n"
        f"s,2,{ms + 8000},web-2\n"
        f"e,2,{ms + 8100},retry,ValueError\n"
        f"s,3,{ms + 9000},web-3\n"
        f"e,3,{ms + 9100},dead,KeyError\n"
    ).encode()
    tries = decode_history(hist)
    assert tries == (
        JobTry(number=1, started_at=at(1), worker="web-1", ended_at=at(1.5), outcome="lost"),
        JobTry(number=2, started_at=at(7), worker="web-2", ended_at=at(7.2), outcome="released"),
        JobTry(
            number=2,
            started_at=at(8),
            worker="web-2",
            ended_at=at(8.1),
            outcome="retry",
            error_type="ValueError",
        ),
        JobTry(
            number=3,
            started_at=at(9),
            worker="web-3",
            ended_at=at(9.1),
            outcome="dead",
            error_type="KeyError",
        ),
    )
    # Cut by the size limit: an end whose start is gone; a running try.
    assert decode_history(f"e,4,{ms},retry,X\ns,5,{ms},w\n".encode()) == (
        JobTry(
            number=4, started_at=None, worker=None, ended_at=NOW, outcome="retry", error_type="X"
        ),
        JobTry(number=5, started_at=NOW, worker="w"),
    )
    info = job(tries=3, max_tries=3, finished_at=at(9.1), history=tries, error=None)
    assert [what for _, what in job_history(info)] == [
        "enqueued (normal priority)",
        "try 1 of 3 started on web-1",
        "try 1 of 3 lost: its worker died",
        "try 2 of 3 started on web-2",
        "try 2 of 3 put back when its worker stopped (not spent)",
        "try 2 of 3 started on web-2",
        "try 2 of 3 failed; tried again (ValueError)",
        "try 3 of 3 started on web-3",
        "try 3 of 3 failed; no try left (KeyError)",
        "ended dead",
    ]
