"""Versioned tables: a key's value as of a time, written exactly once, kept for a
retention, against a model of the lookups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio
from hypothesis import given, strategies as st

from streamkit import App, ConfigError, Events, Record
from streamkit._tables_versioned import insert_version, prune_versions
from streamkit._worker import run_worker
from streamkit.testing import wait_until
from tests.test_cli import streamkit

if TYPE_CHECKING:
    from streamkit import Redis
    from streamkit.lowlevel import VersionedTable

FAST: dict[str, Any] = {
    "lease_ttl": 1.0,
    "heartbeat_interval": 0.1,
    "session_timeout": 1.0,
    "grace_period": 1.0,
}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Rate(Record):
    currency: str
    rate: float | None  # None: the currency is withdrawn from that time
    at: datetime


class Payment(Record):
    payment: int
    currency: str
    amount: float
    at: datetime


class Priced(Record):
    payment: int
    rate: float | None


def rates_app(redis_url: str | None) -> tuple[App, Any, Any, VersionedTable[float], Any]:
    app = App("fx", redis_url=redis_url, **FAST)
    updates = app.stream("updates", record=Rate, partition_by="currency", partition_count=4)
    payments = app.stream("payments", record=Payment, partition_by="currency", partition_count=4)
    priced = app.stream("priced", record=Priced, partition_by="payment", partition_count=2)
    rates: VersionedTable[float] = app.versioned_table(
        "rates", value=float, retention=timedelta(hours=2)
    )

    @app.processor(updates, tables=[rates])
    async def keep_rates(events: Events[Rate]) -> None:
        async for update in events.records():
            if update.rate is None:
                await rates.delete(update.currency, at=update.at)
            else:
                await rates.put(update.currency, update.rate, at=update.at)

    @app.processor(payments, outputs=[priced])
    async def price(events: Events[Payment]) -> None:
        async for payment in events.records():
            rate = await rates.get(payment.currency, as_of=payment.at)
            events.emit(priced, Priced(payment=payment.payment, rate=rate))

    return app, updates, payments, rates, priced


#: For ``streamkit table`` (the CLI loads it with the test's Redis URL).
app = rates_app(None)[0]
APP = "tests.test_tables_versioned:app"


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


#: Rate updates, out of order by time within and across currencies.
UPDATES = [
    Rate(currency="EUR", rate=1.10, at=minutes(0)),
    Rate(currency="EUR", rate=1.30, at=minutes(60)),
    Rate(currency="EUR", rate=1.20, at=minutes(30)),  # late: history only
    Rate(currency="GBP", rate=0.80, at=minutes(10)),
    Rate(currency="GBP", rate=None, at=minutes(50)),  # withdrawn
    Rate(currency="GBP", rate=0.85, at=minutes(90)),
    Rate(currency="JPY", rate=150.0, at=minutes(5)),
    Rate(currency="JPY", rate=151.0, at=minutes(300)),
    Rate(currency="JPY", rate=152.0, at=minutes(500)),  # the 5-minute one now past retention
]


def model(currency: str, at: datetime) -> float | None:
    """The rate in force at ``at``, from every update (none pruned)."""
    best: Rate | None = None
    for update in UPDATES:
        newer = best is None or update.at >= best.at
        if update.currency == currency and update.at <= at and newer:
            best = update
    return None if best is None else best.rate


PAYMENTS = [
    (1, "EUR", minutes(-5)),  # before the first rate
    (2, "EUR", minutes(0)),
    (3, "EUR", minutes(29)),
    (4, "EUR", minutes(45)),  # the late 1.20
    (5, "EUR", minutes(61)),
    (6, "GBP", minutes(20)),
    (7, "GBP", minutes(55)),  # withdrawn
    (8, "GBP", minutes(100)),
    (9, "JPY", minutes(450)),
    (10, "USD", minutes(10)),  # never rated
]


async def wait_applied(rates: VersionedTable[float]) -> None:
    """Wait until every one of UPDATES is in the rates' versions (the last of each
    currency's updates applied)."""

    async def applied() -> bool:
        return await rates.read("JPY") == 152.0 and [
            len(await rates.history(c)) for c in ("EUR", "GBP")
        ] == [3, 3]

    await wait_until(applied, what="the rates' versions", within=30)


@pytest.mark.cluster
async def test_each_event_reads_the_value_in_force_at_its_time(
    redis_url: str, redis: Redis
) -> None:
    app, updates, payments, rates, priced = rates_app(redis_url)
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await updates.send_many(UPDATES)

        await wait_applied(rates)
        await payments.send_many(
            [Payment(payment=n, currency=c, amount=1.0, at=at) for n, c, at in PAYMENTS]
        )
        got: dict[int, float | None] = {}

        async def all_priced() -> bool:
            for partition in range(2):
                entries: Any = await redis.xrange(priced.key(partition))
                for entry in entries:
                    record = priced.codec.decode(entry.field_values, stream="priced")
                    got[record.payment] = record.rate
            return len(got) == len(PAYMENTS)

        await wait_until(all_priced, what="every payment priced", within=30)
        await worker.stop()
    assert got == {n: model(c, at) for n, c, at in PAYMENTS}
    async with app:
        # The latest value is the newest by time, not by arrival.
        assert await rates.read("EUR") == 1.30
        assert await rates.read("GBP") == 0.85
        assert await rates.read("EUR", as_of=minutes(45)) == 1.20
        assert await rates.read("EUR", as_of=minutes(45).timestamp()) == 1.20
        assert await rates.read("GBP", as_of=minutes(60)) is None
        assert await rates.read("GBP", as_of=minutes(60), default=-1.0) == -1.0
        assert await rates.read("USD", as_of=minutes(60)) is None
        # JPY's 5-minute rate is past the retention of the 500-minute one: pruned; the
        # 300-minute one, in force at the retention's bound (380), is kept.
        assert [v for _, v in await rates.history("JPY")] == [151.0, 152.0]
        assert await rates.read("JPY", as_of=minutes(100)) is None
        assert await rates.history("EUR") == [
            (minutes(0), 1.10),
            (minutes(30), 1.20),
            (minutes(60), 1.30),
        ]
        assert [v for _, v in await rates.history("GBP")] == [0.80, None, 0.85]
        assert sorted([k async for k, _ in rates.items()]) == ["EUR", "GBP", "JPY"]
    with app.blocking() as client:  # the clients read as of a time too
        assert client.read(rates, "EUR", as_of=minutes(45)) == 1.20
        assert client.read(rates, "EUR") == 1.30
        assert client.read(rates, "USD", 0.0, as_of=minutes(45)) == 0.0
        # no value then (never written, deleted, before the first): the default, as
        # the Trio side reads it (the clients once handed out their own placeholder)
        assert client.read(rates, "USD", as_of=minutes(45)) is None
        assert client.read(rates, "GBP", as_of=minutes(60)) is None
        assert client.read(rates, "EUR", as_of=minutes(-10)) is None
        with pytest.raises(ConfigError, match="not a versioned table"):
            client.read(rates.versions, "EUR", as_of=minutes(45))
    got_cli = await streamkit("table", "get", APP, "rates", "EUR", redis_url=redis_url)
    assert (got_cli.code, got_cli.out.strip()) == (0, "1.3"), got_cli.err
    then = await streamkit(
        "table", "get", APP, "rates", "EUR", "--as-of", "2026-01-01T00:45:00Z",
        redis_url=redis_url,
    )  # fmt: skip
    assert (then.code, then.out.strip()) == (0, "1.2"), then.err
    kept = await streamkit("table", "get", APP, "rates", "GBP", "--history", redis_url=redis_url)
    assert kept.code == 0, kept.err
    assert orjson.loads(kept.out) == [
        {"at": "2026-01-01T00:10:00+00:00", "value": 0.8},
        {"at": "2026-01-01T00:50:00+00:00", "value": None},
        {"at": "2026-01-01T01:30:00+00:00", "value": 0.85},
    ]
    for args, says in [
        (["rates", "EUR", "--as-of", "teatime"], "is not a time"),
        (["rates", "EUR", "--as-of", "nan"], "is not a time"),
        (["rates", "EUR", "--as-of", "1e400"], "is not a time"),
        (["rates", "EUR", "--as-of", "0", "--history"], "give one of them"),
    ]:
        refused = await streamkit("table", "get", APP, *args, redis_url=redis_url)
        assert (refused.code, says in refused.err) == (2, True), refused.err
        assert "Traceback" not in refused.err
    plain = "tests.test_table_joins:app"
    refused = await streamkit(
        "table", "get", plain, "profiles", "u1", "--as-of", "0", redis_url=redis_url
    )
    assert (refused.code, "not a versioned table" in refused.err) == (2, True), refused.err


async def test_a_replay_rebuilds_the_same_versions(redis_url: str, redis: Redis) -> None:
    app, updates, _, rates, _ = rates_app(redis_url)

    async def histories() -> dict[str, Any]:
        async with app:
            return {c: await rates.history(c) for c in ("EUR", "GBP", "JPY")}

    async def caught_up() -> bool:
        """Every update processed again since the reset (none pending, none unread)."""
        for partition in range(updates.partition_count):
            groups: Any = await redis.xinfo_groups(updates.key(partition))
            for group in groups:
                if int(group[b"pending"]) or int(group.get(b"lag") or 0):
                    return False
        return True

    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await updates.send_many(UPDATES)

        await wait_applied(rates)
        await worker.stop()
    before = await histories()
    for state in ("keep", "clear"):
        reset = await streamkit(
            "reset", APP, "keep_rates", "--to", "start", "--state", state, "--yes",
            redis_url=redis_url,
        )  # fmt: skip
        assert reset.code == 0, reset.err
        assert not await caught_up(), "the reset put the updates back"
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)
            await wait_until(caught_up, what=f"the replay with state {state}", within=30)
            await worker.stop()
        assert await histories() == before, f"the versions after a replay with state {state}"
        async with app:
            assert await rates.read("EUR") == 1.30


async def test_writes_outside_the_writer_and_bad_settings_are_refused(redis_url: str) -> None:
    app, _, _, rates, _ = rates_app(redis_url)
    with pytest.raises(ConfigError, match=r"await rates\.put"):
        rates.set("EUR", 1.0)
    with pytest.raises(ConfigError, match="processor that writes it"):
        await rates.put("EUR", 1.0)
    async with app:
        with pytest.raises(ConfigError, match="expected a datetime"):
            await rates.read("EUR", as_of="yesterday")
    with pytest.raises(ConfigError, match="retention"):
        app.versioned_table("bad", value=float, retention=0)
    duration = r"expected a duration \(a timedelta, or seconds\)"
    with pytest.raises(ConfigError, match=f"^retention: {duration}, got '1d'$"):
        app.versioned_table("bad", value=float, retention="1d")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"^ttl: {duration}, got nan$"):
        app.versioned_table("bad", value=float, retention=60, ttl=float("nan"))
    with pytest.raises(ConfigError, match="already declared"):
        app.versioned_table("rates", value=float, retention=60)


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.one_of(st.none(), st.integers(0, 9))), max_size=30),
    st.integers(1, 400),
    st.integers(-10, 1100),
)
def test_pruned_versions_answer_as_every_version_would(
    writes: list[tuple[int, int | None]], retention: int, probe: int
) -> None:
    versions: list[list[Any]] = []
    for at, value in writes:
        newest = not versions or at >= versions[-1][0]
        assert insert_version(versions, [at] if value is None else [at, value]) is newest
        versions = prune_versions(versions, retention)
    assert [v[0] for v in versions] == sorted({v[0] for v in versions})
    if not writes:
        return
    # The full history: the last write of each time wins.
    full = dict(writes)
    newest = max(full)
    before = [t for t in full if t <= probe]
    expected = full[max(before)] if before else None
    kept = [v for v in versions if v[0] <= probe]
    answer = (kept[-1][1] if len(kept[-1]) == 2 else None) if kept else None
    if probe >= newest - retention:
        assert answer == expected  # within the retention: answered as the full history
    else:
        assert answer in (expected, None)  # past it: the right value, or none
