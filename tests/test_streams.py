"""Producing to partitioned streams: routing, order, metadata checks and trimming."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import attrs
import orjson
import pytest

from streamkit import App, ConfigError, EncodeError, MetadataMismatch, Record, ServerRefused
from streamkit._app import NotConnected
from streamkit._codec import codec_for
from streamkit._partitioner import partition_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from streamkit._redis import Redis


class Order(Record):
    order_id: int
    customer: str
    amount: float
    created_at: datetime


def make_orders(n: int, customers: int = 7) -> list[Order]:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        Order(order_id=i, customer=f"c{i % customers}", amount=i / 10, created_at=now)
        for i in range(n)
    ]


@pytest.fixture
async def app(redis_url: str) -> AsyncIterator[App]:
    app = App("shop", redis_url=redis_url)
    async with app:
        yield app


async def read_partition(redis: Redis, key: str) -> list[tuple[str, dict[bytes, bytes]]]:
    entries = await redis.xrange(key)
    return [
        (cast("bytes", e.identifier).decode(), cast("dict[bytes, bytes]", e.field_values))
        for e in entries
    ]


@pytest.mark.cluster
async def test_send_routes_each_record_to_its_partition_in_order(app: App, redis: Redis) -> None:
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=4)
    sent = make_orders(200)
    ids = await orders.send_many(sent, chunk_size=16)

    assert len(ids) == len(sent)
    by_partition: dict[int, list[Order]] = defaultdict(list)
    for order in sent:
        by_partition[partition_for(order.customer, 4)].append(order)
    for partition in range(4):
        stored = await read_partition(redis, orders.key(partition))
        decoded = [
            orders.codec.decode(fields, stream="orders", partition=partition, entry_id=entry_id)
            for entry_id, fields in stored
        ]
        assert decoded == by_partition[partition]
    # Ids come back in the order the records were given.
    for order, entry_id in zip(sent, ids, strict=True):
        stored_ids = [
            e for e, _ in await read_partition(redis, orders.key(orders.partition_of(order)))
        ]
        assert entry_id in stored_ids


@pytest.mark.cluster
async def test_send_returns_one_id_per_record(app: App, redis: Redis) -> None:
    orders = app.stream("orders", record=Order, partition_by="order_id", partition_count=2)
    first, second = make_orders(2)
    ids = await orders.send(first, second)
    assert len(ids) == 2
    total = sum([await redis.xlen(key) for key in orders.partition_keys()])
    assert total == 2


async def test_callable_partition_key(app: App, redis: Redis) -> None:
    orders = app.stream(
        "orders", record=Order, partition_by=lambda o: o.customer.upper(), partition_count=3
    )
    order = make_orders(1)[0]
    await orders.send(order)
    assert await redis.xlen(orders.key(partition_for("C0", 3))) == 1


async def test_other_partition_count_is_refused(redis_url: str) -> None:
    async with App("shop", redis_url=redis_url) as first:
        await first.stream("orders", record=Order, partition_by="order_id", partition_count=4).send(
            *make_orders(1)
        )
    async with App("shop", redis_url=redis_url) as second:
        orders = second.stream("orders", record=Order, partition_by="order_id", partition_count=8)
        with pytest.raises(MetadataMismatch) as info:
            await orders.send(*make_orders(1))
    assert info.value.field == "partition_count"
    assert (info.value.recorded, info.value.given) == ("4", "8")
    assert "partition_count=4" in str(info.value)


async def test_other_partition_key_is_refused(redis_url: str) -> None:
    async with App("shop", redis_url=redis_url) as first:
        await first.stream("orders", record=Order, partition_by="order_id").send(*make_orders(1))
    async with App("shop", redis_url=redis_url) as second:
        orders = second.stream("orders", record=Order, partition_by="customer")
        with pytest.raises(MetadataMismatch, match="partition_by"):
            await orders.send(*make_orders(1))


async def test_apps_do_not_share_streams(redis_url: str, redis: Redis) -> None:
    async with App("one", redis_url=redis_url) as one, App("two", redis_url=redis_url) as two:
        await one.stream("orders", record=Order, partition_by="order_id", partition_count=1).send(
            *make_orders(3)
        )
        other = two.stream("orders", record=Order, partition_by="order_id", partition_count=5)
        await other.send(*make_orders(1))  # a different app: no mismatch
    assert await redis.xlen("__strm:{one.orders.0}") == 3


async def test_sending_without_connecting_says_how_to_connect(redis_url: str) -> None:
    app = App("shop", redis_url=redis_url)
    orders = app.stream("orders", record=Order, partition_by="order_id")
    with pytest.raises(NotConnected, match="async with app"):
        await orders.send(*make_orders(1))


def test_declaring_a_stream_twice_is_an_error() -> None:
    app = App("shop")
    app.stream("orders", record=Order, partition_by="order_id")
    with pytest.raises(ConfigError, match="already declared"):
        app.stream("orders", record=Order, partition_by="order_id")


@pytest.mark.parametrize("name", ["my.stream", "a{b}", "", "spaces here"])
def test_bad_stream_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="stream"):
        App("shop").stream(name, record=Order, partition_by="order_id")


async def consume(redis: Redis, key: str, group: str, count: int) -> list[bytes]:
    """Read ``count`` entries for ``group`` without acknowledging them."""
    reply = await redis.xreadgroup(group, "consumer", streams={key: ">"}, count=count)
    assert reply is not None
    return [cast("bytes", entry.identifier) for entry in reply[key.encode()]]


@pytest.fixture
async def small_nodes(redis: Redis) -> AsyncIterator[None]:
    # Trimming removes whole internal nodes of a stream; small nodes make it exact
    # enough to observe with a few hundred entries.
    await redis.config_set({"stream-node-max-entries": 10})
    yield
    await redis.config_set({"stream-node-max-entries": 100})


@pytest.mark.cluster
async def test_trimming_never_removes_unacknowledged_entries(
    app: App, redis: Redis, small_nodes: None
) -> None:
    orders = app.stream(
        "orders", record=Order, partition_by="order_id", partition_count=1, partition_size=50
    )
    key = orders.key(0)
    first = await orders.send_many(make_orders(100))
    await redis.xgroup_create(key, "slow", "0")
    await redis.xgroup_create(key, "fast", "0")
    delivered = await consume(redis, key, "slow", 30)  # pending, unacknowledged
    fast = await consume(redis, key, "fast", 100)
    await redis.xack(key, "fast", fast)

    await orders.send_many(make_orders(300))
    remaining = {cast("bytes", e.identifier).decode() for e in await redis.xrange(key)}
    assert set(first) <= remaining, "entries the slow group has not acknowledged were trimmed"
    assert delivered[0].decode() in remaining

    # Once both groups catch up, the partition shrinks back towards its size.
    await redis.xack(key, "slow", delivered)
    for group in ("slow", "fast"):
        rest = await consume(redis, key, group, 1000)
        await redis.xack(key, group, rest)
    await orders.send_many(make_orders(10))
    assert 50 <= await redis.xlen(key) < 80


@pytest.mark.cluster
async def test_streams_without_consumer_groups_are_not_trimmed(
    app: App, redis: Redis, small_nodes: None
) -> None:
    orders = app.stream(
        "orders", record=Order, partition_by="order_id", partition_count=1, partition_size=20
    )
    await orders.send_many(make_orders(200))
    assert await redis.xlen(orders.key(0)) == 200


@pytest.mark.cluster
async def test_hard_cap_drops_and_warns_with_a_count(
    app: App, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    orders = app.stream(
        "orders", record=Order, partition_by="order_id", partition_count=1, max_len=100
    )
    key = orders.key(0)
    await orders.send_many(make_orders(100))
    await redis.xgroup_create(key, "group", "0")
    acked = await consume(redis, key, "group", 40)
    await redis.xack(key, "group", acked)

    with caplog.at_level(logging.WARNING, logger="streamkit.streams"):
        await orders.send_many(make_orders(50), chunk_size=50)
    assert await redis.xlen(key) == 100
    # 50 oldest dropped: 40 were acknowledged, 10 were not.
    assert any("dropped 10 unprocessed" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------ record schema metadata


def order_classes() -> dict[str, type[Any]]:
    """Versions of a record, each a class called ``Order``, as separate deployments have."""

    class Order(Record):
        order_id: int
        customer: str

    original = Order

    class Order(Record):  # type: ignore[no-redef]
        order_id: int
        customer: str
        note: str = ""

    with_optional = Order

    class Order(Record):  # type: ignore[no-redef]
        order_id: int
        customer: str
        note: str

    with_required = Order

    class Order(Record):  # type: ignore[no-redef]
        order_id: str
        customer: str

    retyped = Order

    class Order(Record):  # type: ignore[no-redef]
        customer: str
        sku: str
        quantity: int

    unrelated = Order

    class Purchase(Record):
        order_id: int
        customer: str

    return {
        "original": original,
        "with_optional": with_optional,
        "with_required": with_required,
        "retyped": retyped,
        "unrelated": unrelated,
        "renamed": Purchase,
    }


async def send_one(redis_url: str, record: type[Any], **fields: object) -> None:
    async with App("shop", redis_url=redis_url) as app:
        stream = app.stream("orders", record=record, partition_by="customer", partition_count=2)
        await stream.send(record(customer="c", **fields))


async def test_an_unrelated_record_of_the_same_name_is_refused(redis_url: str) -> None:
    classes = order_classes()
    await send_one(redis_url, classes["original"], order_id=1)
    with pytest.raises(MetadataMismatch) as info:
        await send_one(redis_url, classes["unrelated"], sku="x", quantity=1)
    message = str(info.value)
    assert info.value.field == "record"
    for named in ("order_id: int, required", "no sku", "sku: str, required", "quantity"):
        assert named in message
    assert "customer" not in message  # only the differing fields are named


@pytest.mark.parametrize(
    ("recorded", "mine", "says"),
    [
        ("original", "retyped", "order_id: int"),
        ("original", "with_required", "note: str, required"),
        ("with_required", "original", "note: str, required"),
    ],
)
async def test_incompatible_records_are_refused_naming_the_fields(
    redis_url: str, recorded: str, mine: str, says: str
) -> None:
    classes = order_classes()
    sample: dict[str, dict[str, object]] = {
        "original": {"order_id": 1},
        "with_required": {"order_id": 1, "note": "n"},
    }
    await send_one(redis_url, classes[recorded], **sample[recorded])
    fields: dict[str, object] = {"order_id": "1"} if mine == "retyped" else {"order_id": 1}
    if mine == "with_required":
        fields["note"] = "n"
    with pytest.raises(MetadataMismatch, match=says):
        await send_one(redis_url, classes[mine], **fields)


@pytest.mark.parametrize(
    ("recorded", "mine"),
    [("original", "with_optional"), ("with_optional", "original"), ("original", "renamed")],
)
async def test_compatible_evolution_is_accepted(redis_url: str, recorded: str, mine: str) -> None:
    classes = order_classes()
    await send_one(redis_url, classes[recorded], order_id=1)
    await send_one(redis_url, classes[mine], order_id=2)
    # Each side decodes what the other wrote: a missing optional field gets its
    # default, an unknown one is ignored.
    old, new = classes[recorded], classes[mine]
    assert old is not new or recorded == mine
    decoded_by_new = codec_for(new).decode(
        codec_for(old).encode(old(order_id=3, customer="c")), stream="orders"
    )
    assert decoded_by_new == new(order_id=3, customer="c")
    decoded_by_old = codec_for(old).decode(
        codec_for(new).encode(new(order_id=4, customer="c")), stream="orders"
    )
    assert decoded_by_old == old(order_id=4, customer="c")


async def test_streams_recorded_without_a_schema_are_checked_by_name(
    redis_url: str, redis: Redis
) -> None:
    classes = order_classes()
    # What version 1 recorded: no schema.
    await redis.hset(
        "__meta:{shop.orders}",
        {"version": "1", "partition_count": "2", "record": classes["original"].__qualname__,
         "format": "json", "partition_by": "customer"},
    )  # fmt: skip
    await send_one(redis_url, classes["unrelated"], sku="x", quantity=1)  # same name
    with pytest.raises(
        MetadataMismatch, match=r"record=order_classes.<locals>.Order but .*Purchase"
    ):
        await send_one(redis_url, classes["renamed"], order_id=1)


@pytest.mark.cluster
async def test_dict_records_are_partitioned_by_a_key_field(app: App, redis: Redis) -> None:
    events = app.stream("events", record=dict, partition_by="user", partition_count=4)
    await events.send({"user": "ann", "n": 1}, {"user": 7, "n": 2})
    for user in ("ann", 7):
        entries = await read_partition(redis, events.spec.key(partition_for(user, 4)))
        assert any(f'"user":{user!r}'.replace("'", '"') in str(e[1]) for e in entries)
    with pytest.raises(
        EncodeError, match=r"^events: partition key \(field 'user'\): the record has no 'user'"
    ):
        await events.send({"name": "bob"})


async def test_a_record_of_another_type_is_named_as_such(app: App, redis: Redis) -> None:
    # Not "no key field to partition by": the record is not an Order at all.
    orders = app.stream("typed", record=Order, partition_by="customer", partition_count=4)
    not_orders: list[Any] = [{"customer": "ann"}, ("ann",), None]
    for sent in not_orders:
        with pytest.raises(EncodeError, match=r"^typed: expected a Order, got "):
            await orders.send_many([make_orders(1)[0], sent])
    assert await redis.exists(orders.spec.partition_keys()) == 0


async def test_a_record_of_the_wrong_field_types_is_refused_before_anything_is_sent(
    app: App, redis: Redis
) -> None:
    """``Order(order_id="x")`` is an Order to Python, not to the worker that would
    decode it: send and send_many refuse it, naming the stream, the field, the type
    declared and the type given, and send nothing of the call."""
    orders = app.stream("orders", record=Order, partition_by="customer", partition_count=4)
    good = make_orders(3)
    bad = attrs.evolve(good[1], order_id="x")  # type: ignore[arg-type]
    with pytest.raises(EncodeError) as caught:
        await orders.send(bad)
    assert str(caught.value) == "orders: Order.order_id: expected int, got str 'x'"
    with pytest.raises(EncodeError, match=r"^orders: Order\.amount: expected float, got str"):
        await orders.send_many([good[0], attrs.evolve(good[2], amount="9.5"), good[1]])  # type: ignore[arg-type]
    assert await redis.exists(orders.spec.partition_keys()) == 0


@pytest.mark.cluster
async def test_a_failure_across_partitions_is_one_error_not_a_group(app: App, redis: Redis) -> None:
    """send_many over several partitions raises the failure itself, as for one."""
    stream = app.stream("wide", record=Order, partition_by="customer", partition_count=4)
    await stream.send_many(make_orders(1))
    await redis.config_set({"maxmemory-policy": "noeviction", "maxmemory": 1})
    try:
        with pytest.raises(ServerRefused):
            await stream.send_many(make_orders(40, customers=40))
    finally:
        await redis.config_set({"maxmemory": 0})


@pytest.mark.parametrize("failure", ["encode", "iterable"])
async def test_a_window_that_fails_before_sending_is_raised_after_the_one_before_is_sent(
    app: App, redis: Redis, failure: str
) -> None:
    """send_many reads and encodes the next window while the current one is appended:
    a record that cannot be encoded, or an iterable that raises, in the next window
    fails send_many only once the current window is in Redis, and sends nothing of
    the failing window."""
    stream = app.stream("windows", record=Order, partition_by="customer", partition_count=2)
    # chunk_size 2: a first window of one chunk per partition (4 records), then windows
    # of 2 x 4 x 2 = 16; the failure is in the third window.
    first, window = 4, 16
    sent: list[int] = []

    def records() -> Iterator[Order]:
        for order in make_orders(first + window + 5):
            if order.order_id == first + window + 2:
                if failure == "iterable":
                    raise ValueError("the source failed")
                order = attrs.evolve(order, amount=float("nan"))
            yield order

    error = EncodeError if failure == "encode" else ValueError
    with pytest.raises(error):
        await stream.send_many(records(), chunk_size=2, on_sent=sent.append)
    assert sent == [first, window]
    stored = [
        orjson.loads(fields[b"data"])["order_id"]
        for key in stream.partition_keys()
        for _, fields in await read_partition(redis, key)
    ]
    assert sorted(stored) == list(range(first + window))
