"""Table-table joins and global tables: derived values follow both sides' changes,
a global table is read from any processor and any process, on a server and a cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio

from streamkit import App, ConfigError, Events, Record, tumbling
from streamkit._cli._fleet import take_snapshot
from streamkit._worker import run_worker
from streamkit.testing import wait_until
from tests.test_cli import streamkit

if TYPE_CHECKING:
    from streamkit import Redis, Table
    from streamkit.lowlevel import GlobalTable

FAST: dict[str, Any] = {
    "lease_ttl": 1.0,
    "heartbeat_interval": 0.1,
    "session_timeout": 1.0,
    "grace_period": 1.0,
}


class Profile(Record):
    user: str
    city: str


class Status(Record):
    user: str
    status: str  # "closed" deletes the user's status


class Account(Record):
    city: str
    status: str | None


def accounts_app(redis_url: str | None) -> tuple[App, Any, Any, dict[str, Table[Any]]]:
    app = App("accounts", redis_url=redis_url, **FAST)
    users = app.stream("users", record=Profile, partition_by="user", partition_count=4)
    statuses = app.stream("statuses", record=Status, partition_by="user", partition_count=4)
    profiles: Table[Profile] = app.table("profiles", value=Profile)
    states: Table[str] = app.table("states", value=str)

    @app.processor(users, tables=[profiles])
    async def keep_profiles(events: Events[Profile]) -> None:
        async for profile in events.records():
            profiles.set(profile.user, profile)

    @app.processor(statuses, tables=[states])
    async def keep_states(events: Events[Status]) -> None:
        async for status in events.records():
            if status.status == "closed":
                states.delete(status.user)
            else:
                states.set(status.user, status.status)

    def account(key: str, profile: Profile | None, status: str | None) -> Account:
        assert profile is not None
        return Account(city=profile.city, status=status)

    tables: dict[str, Table[Any]] = {
        "inner": app.join_tables("both", profiles, states),
        "left": app.join_tables(
            "accounts", profiles, states, how="left", result=account, value=Account
        ),
        "outer": app.join_tables("either", profiles, states, how="outer"),
    }
    return app, users, statuses, tables


#: For ``streamkit table`` (the CLI loads it with the test's Redis URL).
app = accounts_app(None)[0]
APP = "tests.test_table_joins:app"


@pytest.mark.cluster
async def test_a_derived_table_follows_both_sides(redis_url: str, redis: Redis) -> None:
    app, users, statuses, joined = accounts_app(redis_url)
    inner, left, outer = joined["inner"], joined["left"], joined["outer"]
    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await users.send_many([Profile(user=f"u{n}", city="Oslo") for n in range(20)])
        await statuses.send_many([Status(user=f"u{n}", status="active") for n in range(10)])
        await statuses.send(Status(user="nobody", status="active"))  # a right side alone
        # Later changes of either side: the derived value is the latest of both.
        await users.send(Profile(user="u3", city="Rome"))
        await statuses.send(Status(user="u4", status="closed"))

        async def settled() -> bool:
            account = await left.read("u3")
            return (
                await left.sizes() != [0] * 4
                and sum(await left.sizes()) == 20
                and account is not None
                and account.city == "Rome"
                and await inner.read("u4") is None
                and sum(await inner.sizes()) == 9
                and sum(await outer.sizes()) == 21
            )

        await wait_until(settled, what="the derived tables", within=30)
        await worker.stop()
    await check_accounts(app, inner, left, outer)
    # And the CLI, as any table.
    got = await streamkit("table", "get", APP, "accounts", "u3", redis_url=redis_url)
    assert got.code == 0, got.err
    assert orjson.loads(got.out) == {"city": "Rome", "status": "active"}
    listed = await streamkit("table", "list", APP, "either", redis_url=redis_url)
    assert listed.code == 0, listed.err
    assert len(listed.out.splitlines()) == 21


async def check_accounts(app: App, inner: Table[Any], left: Table[Any], outer: Table[Any]) -> None:
    async with app:
        await check_accounts_connected(inner, left, outer)
    with app.blocking() as client:  # the clients read a derived table as any other
        assert client.read(left, "u3") == Account(city="Rome", status="active")
        assert sum(client.sizes(left)) == 20


async def check_accounts_connected(inner: Table[Any], left: Table[Any], outer: Table[Any]) -> None:
    assert await left.read("u3") == Account(city="Rome", status="active")
    assert await left.read("u4") == Account(city="Oslo", status=None)
    assert await left.read("u15") == Account(city="Oslo", status=None)
    assert await left.read("nobody") is None  # no left side: not in a left join
    both = {key: value async for key, value in inner.items()}
    assert set(both) == {f"u{n}" for n in range(10)} - {"u4"}
    assert both["u3"] == {"left": {"user": "u3", "city": "Rome"}, "right": "active"}
    assert await outer.read("nobody") == {"left": None, "right": "active"}


@pytest.mark.cluster
async def test_a_global_table_is_read_from_any_partition_by_any_key(
    redis_url: str, redis: Redis
) -> None:
    class Product(Record):
        sku: str
        price: float

    class Order(Record):
        customer: str
        sku: str

    app = App("catalog", redis_url=redis_url, **FAST)
    updates = app.stream("product_updates", record=Product, partition_by="sku", partition_count=3)
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=4)
    priced = app.stream("priced", record=dict, partition_by=lambda r: r["customer"])
    products: GlobalTable[Product] = app.global_table("products", value=Product)

    @app.processor(updates, tables=[products])
    async def keep_products(events: Events[Product]) -> None:
        async for product in events.records():
            if product.price < 0:
                products.delete(product.sku)
            else:
                products.set(product.sku, product)

    @app.processor(orders, outputs=[priced])
    async def price(events: Events[Order]) -> None:
        async for order in events.records():
            product = await products.get(order.sku)  # any sku, from any partition
            events.emit(
                priced,
                {"customer": order.customer, "price": None if product is None else product.price},
            )

    async with trio.open_nursery() as nursery:
        worker = await nursery.start(run_worker, app)
        await updates.send_many([Product(sku=f"s{n}", price=float(n)) for n in range(30)])
        await updates.send_many([Product(sku="s7", price=70.0), Product(sku="s8", price=-1)])

        async def applied() -> bool:
            seven = await products.read("s7")
            return (
                seven is not None
                and seven.price == 70.0
                and await products.read("s8") is None
                and await products.sizes() == [29]
            )

        await wait_until(applied, what="the global table", within=30)
        await orders.send_many([Order(customer=f"c{n}", sku=f"s{n}") for n in range(10)])

        async def all_priced() -> bool:
            total = 0
            for p in range(priced.partition_count):
                total += await redis.xlen(priced.key(p))
            return total == 10

        await wait_until(all_priced, what="the priced orders", within=30)
        await worker.stop()
    async with app:
        keys = {key async for key, _ in products.items()}
        snapshot = await take_snapshot(app)
    # One hash, whatever the partition: its keys counted once, on the first line.
    (writer,) = [p for p in snapshot.processors if p.name == "keep_products"]
    assert [row.tables.get("products") for row in writer.partitions] == [29, None, None]

    got: dict[str, Any] = {}
    for p in range(priced.partition_count):
        entries: Any = await redis.xrange(priced.key(p))
        for entry in entries:
            record = priced.codec.decode(entry.field_values, stream=priced.name)
            got[record["customer"]] = record["price"]
    expected: dict[str, Any] = {f"c{n}": float(n) for n in range(10)}
    expected["c7"], expected["c8"] = 70.0, None
    assert got == expected
    assert len(keys) == 29
    assert "s8" not in keys
    with app.blocking() as client:
        assert client.read(products, "s7") == Product(sku="s7", price=70.0)
        assert client.sizes(products) == [29]


def test_a_table_join_is_refused_clearly() -> None:
    app = App("refusals")
    four = app.stream("four", record=Profile, partition_by="user", partition_count=4)
    two = app.stream("two", record=Profile, partition_by="user", partition_count=2)
    a: Table[str] = app.table("a", value=str)
    b: Table[str] = app.table("b", value=str)
    c: Table[str] = app.table("c", value=str)
    with pytest.raises(ConfigError, match="written by no processor yet"):
        app.join_tables("ab", a, b)

    @app.processor(four, tables=[a])
    async def write_a(events: Events[Profile]) -> None:
        pass

    @app.processor(two, tables=[b])
    async def write_b(events: Events[Profile]) -> None:
        pass

    @app.processor(four, tables=[c])
    async def write_c(events: Events[Profile]) -> None:
        pass

    with pytest.raises(ConfigError, match="co-partitioned"):
        app.join_tables("ab", a, b)
    with pytest.raises(ConfigError, match="how"):
        app.join_tables("ac", a, c, how="sideways")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="already declared"):
        app.join_tables("a", a, c)
    rates: GlobalTable[float] = app.global_table("rates", value=float)
    windows = app.window("w", tumbling(1), value=int, initial=0)
    with pytest.raises(ConfigError, match="windowed"):
        app.join_tables("aw", a, windows)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="global"):
        app.join_tables("ar", a, rates)
    with pytest.raises(ConfigError, match="already declared"):
        app.global_table("rates", value=float)
    # Refused before anything is declared: the corrected call can be made again.
    streams, processors, tables = dict(app.streams), dict(app.processors), dict(app.tables)
    with pytest.raises(ConfigError, match=r"^result: must be a function of \(key, left value"):
        app.join_tables("ac", a, c, result="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^batch_size: must be a positive integer, got 0"):
        app.join_tables("ac", a, c, batch_size=0)
    with pytest.raises(ConfigError, match=r"^batch_size: must be a positive integer, got 0"):
        app.global_table("fx", value=float, batch_size=0)
    assert (app.streams, app.processors, app.tables) == (streams, processors, tables)
    app.join_tables("ac", a, c)
    app.global_table("fx", value=float)


@pytest.mark.cluster
async def test_a_global_tables_writer_is_rebuilt(redis_url: str) -> None:
    """A rebuild of its writer leaves the global table (shared by every partition) in
    place, and the replay's writes land on it again: the same values."""

    class Rate(Record):
        currency: str
        rate: float

    app = App("rebuilt", redis_url=redis_url, **FAST)
    updates = app.stream("rate_updates", record=Rate, partition_by="currency", partition_count=3)
    rates: GlobalTable[float] = app.global_table("rates", value=float)

    @app.processor(updates, tables=[rates])
    async def keep_rates(events: Events[Rate]) -> None:
        async for rate in events.records():
            rates.set(rate.currency, rate.rate)

    currencies = [f"C{n}" for n in range(12)]

    async def applied() -> bool:
        return await rates.read_many(currencies) == [float(n) for n in range(12)]

    async with app:
        await updates.send_many([Rate(currency=c, rate=-1.0) for c in currencies])
        await updates.send_many([Rate(currency=c, rate=float(n)) for n, c in enumerate(currencies)])
        for _ in range(2):  # the first run, then after the rebuild
            async with trio.open_nursery() as nursery:
                worker = await nursery.start(run_worker, app)
                await wait_until(applied, what="the rates applied", within=30)
                await worker.stop()
            await app.reset("keep_rates", to="start", state="clear")
            assert await applied()  # the table stays while the writer is rebuilt
