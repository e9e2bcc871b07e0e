"""Codecs: the documented wire format, round trips, and errors for bad records and bytes."""

from __future__ import annotations

import enum
import math
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import attrs
import lz4.frame
import orjson
import pytest
import zstandard
from hypothesis import example, given, strategies as st

from streamkit._codec import Codec, Compression, codec_for
from streamkit._errors import ConfigError, DecodeError, EncodeError
from streamkit._json_converter import converter
from streamkit._records import Record

COMPRESSIONS: list[Compression | None] = [None, "lz4", "zstd"]


class Status(enum.Enum):
    NEW = "new"
    DONE = 2


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 3


class Order(Record):
    order_id: int
    amount: float
    created_at: datetime


class Line(Record):
    sku: str
    quantity: int
    price: Decimal


class Customer(Record):
    customer_id: UUID
    name: str
    since: date
    avatar: bytes | None = None


class Basket(Record):
    basket_id: int
    customer: Customer
    lines: list[Line]
    status: Status
    size: Size
    placed_at: datetime
    delivered_at: datetime | None
    tags: set[str]
    counts: dict[str, int]
    by_status: dict[Status, list[int]]
    by_number: dict[int, Line]
    by_customer: dict[UUID, date]
    position: tuple[float, float]
    history: tuple[int, ...]
    gift_for: Customer | None = None


class Sample(Record, primitive=True):
    count: int
    ratio: float
    label: str
    flag: bool
    payload: bytes
    taken_at: datetime
    day: date
    price: Decimal
    sample_id: UUID
    status: Status
    size: Size
    note: str | None = None
    weight: float | None = None
    version: int = 1


@attrs.frozen
class PlainEvent:
    """Not a Record: any attrs class can be stored as JSON."""

    name: str
    at: datetime


PARIS_SUMMER = timezone(timedelta(hours=2))
CUSTOMER_ID = UUID("12345678-1234-5678-1234-567812345678")


def make_basket() -> Basket:
    customer = Customer(
        customer_id=CUSTOMER_ID, name="Ada", since=date(2020, 2, 29), avatar=b"\x00\xff"
    )
    return Basket(
        basket_id=7,
        customer=customer,
        lines=[Line(sku="tea", quantity=2, price=Decimal("3.50"))],
        status=Status.DONE,
        size=Size.LARGE,
        placed_at=datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=PARIS_SUMMER),
        delivered_at=None,
        tags={"gift"},
        counts={"tea": 2},
        by_status={Status.NEW: [1], Status.DONE: [2, 3]},
        by_number={-5: Line(sku="cup", quantity=1, price=Decimal("1E+1"))},
        by_customer={CUSTOMER_ID: date(2024, 1, 1)},
        position=(1.5, -0.25),
        history=(1, 2, 3),
    )


def make_sample(**changes: Any) -> Sample:
    sample = Sample(
        count=-42,
        ratio=0.1,
        label="café ☕",
        flag=True,
        payload=b"\x00\xff",
        taken_at=datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        day=date(2024, 5, 1),
        price=Decimal("9.99"),
        sample_id=CUSTOMER_ID,
        status=Status.DONE,
        size=Size.SMALL,
        weight=None,
        note="",
    )
    return attrs.evolve(sample, **changes)


# --- the wire format, pinned --------------------------------------------------------------


def test_json_wire_format_of_a_small_record() -> None:
    order = Order(
        order_id=1, amount=2.5, created_at=datetime(2024, 5, 1, 12, 0, tzinfo=PARIS_SUMMER)
    )
    assert codec_for(Order).encode(order) == {
        b"data": b'{"order_id":1,"amount":2.5,"created_at":"2024-05-01T12:00:00+02:00"}'
    }


def test_json_wire_format_of_every_supported_type() -> None:
    fields = codec_for(Basket).encode(make_basket())
    assert list(fields) == [b"data"]
    assert orjson.loads(fields[b"data"]) == {
        "basket_id": 7,
        "customer": {
            "customer_id": "12345678-1234-5678-1234-567812345678",
            "name": "Ada",
            "since": "2020-02-29",
            "avatar": "AP8=",
        },
        "lines": [{"sku": "tea", "quantity": 2, "price": "3.50"}],
        "status": 2,
        "size": 3,
        "placed_at": "2024-05-01T12:00:00.250000+02:00",
        "delivered_at": None,
        "tags": ["gift"],
        "counts": {"tea": 2},
        "by_status": {"new": [1], "2": [2, 3]},
        "by_number": {"-5": {"sku": "cup", "quantity": 1, "price": "1E+1"}},
        "by_customer": {"12345678-1234-5678-1234-567812345678": "2024-01-01"},
        "position": [1.5, -0.25],
        "history": [1, 2, 3],
        "gift_for": None,
    }


def test_primitive_wire_format() -> None:
    assert codec_for(Sample).encode(make_sample()) == {
        b"count": b"-42",
        b"ratio": b"0.1",
        b"label": "café ☕".encode(),
        b"flag": b"true",
        b"payload": b"\x00\xff",
        b"taken_at": b"2024-05-01T12:00:00+00:00",
        b"day": b"2024-05-01",
        b"price": b"9.99",
        b"sample_id": b"12345678-1234-5678-1234-567812345678",
        b"status": b"2",
        b"size": b"1",
        b"note": b"",
        # weight is None: the field is left out
        b"version": b"1",
    }


@pytest.mark.parametrize(
    ("compression", "field"), [(None, b"data"), ("lz4", b"data:lz4"), ("zstd", b"data:zstd")]
)
def test_compressed_entries_name_their_compression(
    compression: Compression | None, field: bytes
) -> None:
    order = Order(order_id=1, amount=2.5, created_at=datetime(2024, 5, 1))
    assert list(codec_for(Order, compression=compression).encode(order)) == [field]


@pytest.mark.parametrize(
    ("record", "compression", "name"),
    [
        (Order, None, "json"),
        (Order, "lz4", "json+lz4"),
        (Order, "zstd", "json+zstd"),
        (Sample, None, "primitive"),
        (dict, None, "json"),
    ],
)
def test_codec_names(record: type[Any], compression: str | None, name: str) -> None:
    assert codec_for(record, compression=compression).name == name


# --- round trips --------------------------------------------------------------------------

int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
fixed_offsets = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
datetimes = st.datetimes(timezones=st.none() | st.just(UTC) | fixed_offsets)
decimals = st.decimals(allow_nan=False)

customers = st.builds(
    Customer,
    customer_id=st.uuids(),
    name=st.text(),
    since=st.dates(),
    avatar=st.none() | st.binary(),
)
lines = st.builds(Line, sku=st.text(), quantity=int64s, price=decimals)
baskets = st.builds(
    Basket,
    basket_id=int64s,
    customer=customers,
    lines=st.lists(lines, max_size=3),
    status=st.sampled_from(Status),
    size=st.sampled_from(Size),
    placed_at=datetimes,
    delivered_at=st.none() | datetimes,
    tags=st.sets(st.text(), max_size=3),
    counts=st.dictionaries(st.text(), int64s, max_size=3),
    by_status=st.dictionaries(st.sampled_from(Status), st.lists(int64s, max_size=2)),
    by_number=st.dictionaries(int64s, lines, max_size=2),
    by_customer=st.dictionaries(st.uuids(), st.dates(), max_size=2),
    position=st.tuples(finite_floats, finite_floats),
    history=st.lists(int64s, max_size=3).map(tuple),
    gift_for=st.none() | customers,
)
samples = st.builds(
    Sample,
    count=st.integers(),
    ratio=st.floats(allow_nan=False),
    label=st.text(),
    flag=st.booleans(),
    payload=st.binary(),
    taken_at=datetimes,
    day=st.dates(),
    price=decimals,
    sample_id=st.uuids(),
    status=st.sampled_from(Status),
    size=st.sampled_from(Size),
    note=st.none() | st.text(),
    weight=st.none() | st.floats(allow_nan=False),
    version=st.integers(),
)

CODECS = {compression: codec_for(Basket, compression=compression) for compression in COMPRESSIONS}
SAMPLE_CODEC = codec_for(Sample)
ORDER_CODEC = codec_for(Order)


@pytest.mark.parametrize("compression", COMPRESSIONS)
@given(basket=baskets)
def test_json_round_trip(compression: Compression | None, basket: Basket) -> None:
    codec = CODECS[compression]
    assert codec.decode(codec.encode(basket), stream="baskets") == basket


@given(sample=samples)
def test_primitive_round_trip(sample: Sample) -> None:
    fields = SAMPLE_CODEC.encode(sample)
    assert all(type(key) is bytes and type(value) is bytes for key, value in fields.items())
    assert SAMPLE_CODEC.decode(fields, stream="samples") == sample


MOMENTS = [datetime(2024, 5, 1, 12, 0, tzinfo=PARIS_SUMMER), datetime(2024, 5, 1, 12, 0)]


@pytest.mark.parametrize("moment", MOMENTS, ids=["aware", "naive"])
def test_datetimes_keep_their_offset_or_lack_of_one(moment: datetime) -> None:
    # Equality of aware datetimes ignores the offset, so compare offset and wall time.
    order = Order(order_id=1, amount=1.0, created_at=moment)
    decoded = ORDER_CODEC.decode(ORDER_CODEC.encode(order), stream="s").created_at
    sample = SAMPLE_CODEC.decode(SAMPLE_CODEC.encode(make_sample(taken_at=moment)), stream="s")
    for value in (decoded, sample.taken_at):
        assert value.utcoffset() == moment.utcoffset()
        assert value.replace(tzinfo=None) == moment.replace(tzinfo=None)


def test_primitive_floats_keep_nan_and_infinities() -> None:
    for ratio in (math.inf, -math.inf):
        assert (
            SAMPLE_CODEC.decode(SAMPLE_CODEC.encode(make_sample(ratio=ratio)), stream="s").ratio
            == ratio
        )
    decoded = SAMPLE_CODEC.decode(SAMPLE_CODEC.encode(make_sample(ratio=math.nan)), stream="s")
    assert math.isnan(decoded.ratio)


def test_any_attrs_class_is_stored_as_json() -> None:
    codec = codec_for(PlainEvent)
    event = PlainEvent(name="boot", at=datetime(2024, 5, 1))
    assert codec.encode(event) == {b"data": b'{"name":"boot","at":"2024-05-01T00:00:00"}'}
    assert codec.decode(codec.encode(event), stream="events") == event


def test_plain_dicts_round_trip_as_json_values() -> None:
    codec = codec_for(dict)
    fields = codec.encode({"user": "ada", "at": datetime(2024, 5, 1), "n": [1, 2]})
    assert fields == {b"data": b'{"user":"ada","at":"2024-05-01T00:00:00","n":[1,2]}'}
    # Without a schema, datetimes and the like come back as their JSON form.
    assert codec.decode(fields, stream="raw") == {
        "user": "ada",
        "at": "2024-05-01T00:00:00",
        "n": [1, 2],
    }


@pytest.mark.parametrize("producer", COMPRESSIONS)
@pytest.mark.parametrize("consumer", COMPRESSIONS)
def test_consumers_decode_whatever_compression_producers_chose(
    producer: Compression | None, consumer: Compression | None
) -> None:
    basket = make_basket()
    fields = codec_for(Basket, compression=producer).encode(basket)
    assert codec_for(Basket, compression=consumer).decode(fields, stream="baskets") == basket


def test_zstd_frames_without_a_content_size_decode() -> None:
    # Streaming zstd encoders (in other languages too) do not record the content size.
    payload = orjson.dumps({"order_id": 1, "amount": 2.5, "created_at": "2024-05-01T00:00:00"})
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(payload)
    decoded = codec_for(Order).decode({b"data:zstd": frame}, stream="orders")
    assert decoded == Order(order_id=1, amount=2.5, created_at=datetime(2024, 5, 1))


def test_unknown_fields_are_ignored_and_missing_defaults_filled() -> None:
    json_fields = {
        b"data": b'{"count":1,"name":"x","note":"new","customer_id":"'
        + str(CUSTOMER_ID).encode()
        + b'","since":"2024-01-01","name2":1}'
    }
    decoded = codec_for(Customer).decode(json_fields, stream="customers")
    assert decoded == Customer(customer_id=CUSTOMER_ID, name="x", since=date(2024, 1, 1))

    primitive_fields = SAMPLE_CODEC.encode(make_sample())
    del primitive_fields[b"version"]
    primitive_fields[b"added_later"] = b"1"
    assert SAMPLE_CODEC.decode(primitive_fields, stream="samples") == make_sample(version=1)


# --- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["gzip", "LZ4", ""])
def test_unknown_compressions_are_refused(compression: str) -> None:
    with pytest.raises(ConfigError, match="lz4, zstd") as info:
        codec_for(Order, compression=compression)
    assert info.value.setting == "compression"
    with pytest.raises(ConfigError):
        Codec(record=Order, compression=compression)  # type: ignore[arg-type]


def test_primitive_records_are_not_compressed() -> None:
    with pytest.raises(ConfigError, match="primitive") as info:
        codec_for(Sample, compression="zstd")
    assert info.value.setting == "compression"


@pytest.mark.parametrize("record", [int, list, object])
def test_unsupported_record_types_are_refused(record: type[Any]) -> None:
    with pytest.raises(ConfigError) as info:
        codec_for(record)
    assert info.value.setting == "record"


def test_codecs_are_values() -> None:
    assert codec_for(Order) == codec_for(Order)
    assert hash(codec_for(Order, compression="lz4")) == hash(Codec(record=Order, compression="lz4"))
    assert codec_for(Order) != codec_for(Order, compression="lz4")


# --- encoding errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("codec", "value", "words"),
    [
        (
            codec_for(Order),
            Line(sku="x", quantity=1, price=Decimal(1)),
            "expected a Order, got Line",
        ),
        (
            codec_for(Order),
            Order(order_id=1, amount=math.nan, created_at=datetime(2024, 5, 1)),
            "nan",
        ),
        (
            codec_for(Order),
            Order(order_id=2**64, amount=1.0, created_at=datetime(2024, 5, 1)),
            "64-bit",
        ),
        (codec_for(dict), {"when": object()}, "cannot encode dict as JSON"),
        (codec_for(dict), [1, 2], "expected a dict"),
        (SAMPLE_CODEC, make_sample(count="5"), "Sample.count='5' cannot be stored as a int"),
        (SAMPLE_CODEC, make_sample(flag=1), "Sample.flag=1 cannot be stored as a bool"),
        (
            SAMPLE_CODEC,
            make_sample(status="new"),
            "Sample.status='new' cannot be stored as a Status",
        ),
        (SAMPLE_CODEC, make_sample(label=None), "Sample.label is None but not optional"),
        (SAMPLE_CODEC, make_sample(taken_at=None), "Sample.taken_at is None"),
    ],
)
def test_encode_errors(codec: Codec[Any], value: Any, words: str) -> None:
    with pytest.raises(EncodeError, match=words):
        codec.encode(value)


# --- decoding errors ----------------------------------------------------------------------

BASKET_JSON = orjson.loads(codec_for(Basket).encode(make_basket())[b"data"])


def basket_with(**changes: Any) -> dict[bytes, bytes]:
    return {b"data": orjson.dumps({**BASKET_JSON, **changes})}


def sample_with(**changes: bytes) -> dict[bytes, bytes]:
    fields = SAMPLE_CODEC.encode(make_sample())
    fields.update((name.encode(), value) for name, value in changes.items())
    return fields


GOOD_ORDER = {"order_id": 1, "amount": 2.5, "created_at": "2024-05-01T00:00:00"}


def order_with(**changes: Any) -> dict[bytes, bytes]:
    return {b"data": orjson.dumps({**GOOD_ORDER, **changes})}


@pytest.mark.parametrize(
    ("codec", "fields", "reason"),
    [
        (ORDER_CODEC, {b"data": b"{"}, "invalid JSON"),
        (ORDER_CODEC, {b"data": b"[1, 2]"}, "the JSON payload is a list, not an object"),
        (ORDER_CODEC, {b"order_id": b"1"}, "no b'data', b'data:lz4' or b'data:zstd' field"),
        (ORDER_CODEC, {b"data:lz4": b"garbage"}, "corrupt lz4 payload"),
        (ORDER_CODEC, {b"data:zstd": b"garbage"}, "corrupt zstd payload"),
        (
            ORDER_CODEC,
            {b"data": b'{"order_id": 1, "amount": 2.5}'},
            "required field missing @ $.created_at",
        ),
        (ORDER_CODEC, order_with(order_id="1"), "expected int @ $.order_id"),
        (ORDER_CODEC, order_with(order_id=True), "expected int @ $.order_id"),
        (ORDER_CODEC, order_with(order_id=1.0), "expected int @ $.order_id"),
        (ORDER_CODEC, order_with(amount="2.5"), "expected float @ $.amount"),
        (ORDER_CODEC, order_with(created_at="yesterday"), "expected datetime @ $.created_at"),
        (ORDER_CODEC, order_with(created_at=1714521600), "expected datetime @ $.created_at"),
        (CODECS[None], basket_with(status="lost"), "expected Status @ $.status"),
        (CODECS[None], basket_with(size=2), "expected Size @ $.size"),
        (CODECS[None], basket_with(tags="gift"), "expected set @ $.tags"),
        (
            CODECS[None],
            basket_with(by_number={"05": BASKET_JSON["lines"][0]}),
            "expected int @ $.by_number['05']",
        ),
        (CODECS[None], basket_with(by_status={"NEW": []}), "$.by_status['NEW']"),
        (CODECS[None], basket_with(position=[1.0]), "expected tuple @ $.position"),
        (CODECS[None], basket_with(history=["x"]), "expected int @ $.history[0]"),
        (CODECS[None], basket_with(customer={"name": "x"}), "required field missing @ $.customer"),
        (CODECS[None], basket_with(lines=[{"sku": 1}]), "expected str @ $.lines[0].sku"),
        (CODECS[None], basket_with(counts=[]), "$.counts"),
        (SAMPLE_CODEC, {}, "missing field 'count'"),
        (SAMPLE_CODEC, {b"data": b"{}"}, "missing field 'count'"),
        (SAMPLE_CODEC, sample_with(count=b"12abc"), "field 'count' is not a valid int: b'12abc'"),
        (SAMPLE_CODEC, sample_with(ratio=b""), "field 'ratio' is not a valid float"),
        (SAMPLE_CODEC, sample_with(flag=b"1"), "field 'flag' is not a valid bool"),
        (SAMPLE_CODEC, sample_with(label=b"\xff"), "field 'label' is not a valid str"),
        (SAMPLE_CODEC, sample_with(taken_at=b"now"), "field 'taken_at' is not a valid datetime"),
        (SAMPLE_CODEC, sample_with(day=b"2024-13-01"), "field 'day' is not a valid date"),
        (SAMPLE_CODEC, sample_with(price=b"cheap"), "field 'price' is not a valid Decimal"),
        (SAMPLE_CODEC, sample_with(sample_id=b"42"), "field 'sample_id' is not a valid UUID"),
        (SAMPLE_CODEC, sample_with(status=b"NEW"), "field 'status' is not a valid Status"),
    ],
)
def test_bad_entries_raise_decode_error_with_where_and_why(
    codec: Codec[Any], fields: dict[bytes, bytes], reason: str
) -> None:
    with pytest.raises(DecodeError) as info:
        codec.decode(fields, stream="orders", partition=3, entry_id=b"1714521600000-7")
    error = info.value
    assert (error.stream, error.partition, error.entry_id) == ("orders", 3, "1714521600000-7")
    assert reason in error.reason
    assert str(error).startswith("cannot decode orders partition 3 entry 1714521600000-7: ")
    # The cause is kept for debugging, but never escapes as a bare or grouped error.
    assert error.__cause__ is not None
    assert not isinstance(error, BaseExceptionGroup)


def test_decode_error_without_partition_or_entry_id() -> None:
    with pytest.raises(DecodeError) as info:
        ORDER_CODEC.decode({}, stream="orders")
    assert (info.value.partition, info.value.entry_id) == (None, None)
    with pytest.raises(DecodeError) as info:
        ORDER_CODEC.decode({}, stream="orders", entry_id="1-0")
    assert info.value.entry_id == "1-0"


def test_a_record_validator_failing_on_decode_is_a_decode_error() -> None:
    class Positive(Record, primitive=True):
        amount: int = attrs.field(validator=attrs.validators.gt(0))

    with pytest.raises(DecodeError, match="amount"):
        codec_for(Positive).decode({b"amount": b"-1"}, stream="amounts")


def test_lz4_frames_are_real_lz4() -> None:
    order = Order(order_id=1, amount=2.5, created_at=datetime(2024, 5, 1))
    fields = codec_for(Order, compression="lz4").encode(order)
    assert orjson.loads(lz4.frame.decompress(fields[b"data:lz4"]))["order_id"] == 1


def test_codecs_can_be_shared_between_threads() -> None:
    # zstd contexts are per thread; each new thread must get its own working pair.
    codec = codec_for(Basket, compression="zstd")
    basket = make_basket()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(
            pool.map(lambda _: codec.decode(codec.encode(basket), stream="b"), range(64))
        )
    assert results == [basket] * 64


_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=5)
    | st.binary(max_size=5)
    | st.datetimes(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=3)
    ),
    max_leaves=8,
)


_SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text()


@given(
    st.dictionaries(st.text(max_size=4), _SCALARS, max_size=5)
    | st.dictionaries(st.text(max_size=4) | st.integers(), _JSONISH, max_size=5)
)
@example({"finite": 1.5, "not": math.nan})
@example({"big": 2**64})
def test_a_dict_is_written_as_the_converter_writes_it(value: dict[Any, Any]) -> None:
    # Dicts of text keys and JSON scalars skip the converter: the bytes, and the
    # refusals (a NaN, an int beyond 64 bits), must be those of the converter's path.
    codec = codec_for(dict)
    try:
        expected: bytes | str = orjson.dumps(converter.unstructure(value))
    except Exception as exc:
        expected = f"refused: {exc}"
    try:
        written: bytes | str = codec.encode(value)[b"data"]
    except EncodeError as exc:
        written = f"refused: {str(exc).removeprefix('cannot encode dict as JSON: ')}"
    assert written == expected
