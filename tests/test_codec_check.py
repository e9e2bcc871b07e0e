"""One definition of a valid record: what producers refuse is exactly what the decoder
(and ``streamkit send``) would refuse, said as one line naming field, expected, given."""

from __future__ import annotations

import enum
import math
import re
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import attrs
import orjson
import pytest
from hypothesis import given, settings, strategies as st

from streamkit import EncodeError, Record
from streamkit._json_converter import converter
from streamkit.lowlevel import codec_for


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Line(Record):
    sku: str
    quantity: int


class Order(Record):
    order_id: int
    customer: str
    amount: float
    paid: bool


class Placed(Record):
    order_id: int
    amount: float
    created_at: datetime
    lines: list[Line] = attrs.field(factory=list)
    note: str | None = None


class Reading(Record, primitive=True):
    sensor: str
    count: int
    value: float
    payload: bytes = b""
    day: date | None = None
    level: Level = Level.LOW


NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            Order(order_id="x", customer="ada", amount=1.0, paid=False),  # type: ignore[arg-type]
            "Order.order_id: expected int, got str 'x'",
        ),
        (
            Order(order_id=1, customer="ada", amount="1.5", paid=False),  # type: ignore[arg-type]
            "Order.amount: expected float, got str '1.5'",
        ),
        (
            Order(order_id=True, customer=7, amount=1.0, paid=False),  # type: ignore[arg-type]
            "Order.order_id: expected int, got bool True; Order.customer: expected str, got int 7",
        ),
        (
            Order(order_id=1, customer="ada", amount=1.0, paid=1),  # type: ignore[arg-type]
            "Order.paid: expected bool, got int 1",
        ),
        (
            Order(order_id=2**64, customer="ada", amount=1.0, paid=False),
            "Order.order_id: Integer exceeds 64-bit range",
        ),
        (
            Placed(order_id=1, amount=1.0, created_at="2026-01-01"),  # type: ignore[arg-type]
            "Placed.created_at: expected datetime, got str '2026-01-01'",
        ),
        (
            Placed(order_id=1, amount=1.0, created_at=NOW, lines=[Line(sku=5, quantity=1)]),  # type: ignore[arg-type]
            "Placed.lines[0].sku: expected str, got int 5",
        ),
        (
            Placed(order_id=1, amount=1.0, created_at=NOW, note=3),  # type: ignore[arg-type]
            "Placed.note: expected str | None, got int 3",
        ),
    ],
)
def test_a_json_record_of_the_wrong_types_is_refused_naming_each_field(
    record: Any, message: str
) -> None:
    codec = codec_for(type(record))
    with pytest.raises(EncodeError) as caught:
        codec.encode(record)
    assert str(caught.value) == message
    # The producers' own paths say the same: the entry encoder, the batch encoder.
    with pytest.raises(EncodeError, match=f"^{re.escape(message)}$"):
        codec.entry_encoder()(record)
    assert codec.payloads_encoder()[0]([record]) == [None]


class Counts(Record):
    by_id: dict[int, int]
    by_name: dict[str, list[int]] = attrs.field(factory=dict)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (Counts(by_id={"x": 2}), "Counts.by_id key 'x': expected int, got str 'x'"),  # type: ignore[dict-item]
        (Counts(by_id={1: "two"}), "Counts.by_id[1]: expected int, got str 'two'"),  # type: ignore[dict-item]
        (
            Counts(by_id={}, by_name={"a": ["b"]}),  # type: ignore[list-item]
            "Counts.by_name['a'][0]: expected int, got str 'b'",
        ),
    ],
)
def test_a_dict_field_names_its_key_or_its_value_as_the_one_wrong(
    record: Any, message: str
) -> None:
    with pytest.raises(EncodeError) as caught:
        codec_for(Counts).encode(record)
    assert str(caught.value).startswith(message), str(caught.value)


def test_int_keyed_dict_fields_go_and_come_back_as_ints() -> None:
    codec = codec_for(Counts)
    for sent in ({1: 2, -3: 4}, {"1": 2}):
        decoded = codec.decode(codec.encode(Counts(by_id=sent)), stream="s")  # type: ignore[arg-type]
        assert decoded.by_id == {int(k): v for k, v in sent.items()}


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"count": True}, "Reading.count=True cannot be stored as a int (got a bool)"),
        ({"count": 3.7}, "Reading.count=3.7 cannot be stored as a int (got a float)"),
        ({"value": "1.5"}, "Reading.value='1.5' cannot be stored as a float (got a str)"),
        ({"payload": 5}, "Reading.payload=5 cannot be stored as a bytes (got a int)"),
        ({"level": 2}, "Reading.level=2 cannot be stored as a Level (got a int)"),
    ],
)
def test_a_primitive_record_of_the_wrong_types_is_refused(
    changes: dict[str, Any], words: str
) -> None:
    """Primitive mode used to store these as something else (3.7 as 3, 5 as five zero
    bytes, a bool as 1)."""
    record = attrs.evolve(Reading(sensor="s", count=1, value=0.5), **changes)
    with pytest.raises(EncodeError) as caught:
        codec_for(Reading).encode(record)
    assert words in str(caught.value)


def test_valid_values_of_other_types_than_the_annotation_still_pass() -> None:
    """An int where a float is declared, an int enum where an int is, a primitive float
    that JSON could not hold: valid, as the decoder takes them."""
    order = Order(order_id=Level.HIGH, customer="ada", amount=2, paid=True)
    fields = codec_for(Order).encode(order)
    assert codec_for(Order).decode(fields, stream="s") == Order(
        order_id=2, customer="ada", amount=2.0, paid=True
    )
    # A datetime is a date: a date field stores its date, as JSON's does (primitive
    # mode used to store the datetime, which no consumer decoded).
    reading = Reading(sensor="s", count=Level.HIGH, value=math.inf, level=Level.HIGH, day=NOW)
    decoded = codec_for(Reading).decode(codec_for(Reading).encode(reading), stream="s")
    assert (decoded.count, decoded.value, decoded.level) == (2, math.inf, Level.HIGH)
    assert decoded.day == date(2026, 1, 1)


def test_the_command_line_says_it_as_the_producer_does() -> None:
    """``streamkit send`` builds the record from JSON by the decoder's rule, and names
    the field the same way (a float field given a string included)."""
    codec = codec_for(Placed)
    good = {"order_id": 1, "amount": 1.0, "created_at": "2026-01-01T00:00:00"}
    with pytest.raises(EncodeError) as caught:
        codec.from_dict({**good, "amount": "9.5"})
    assert str(caught.value) == "Placed.amount: expected float, got str '9.5'"
    with pytest.raises(EncodeError) as caught:
        codec.from_dict({**good, "lines": [{"sku": "a"}]})
    assert str(caught.value) == "Placed.lines[0].quantity: missing (a required field)"


# Values of every kind, for fields of every flat kind.
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=5),
    st.sampled_from([Level.HIGH, b"x", NOW, date(2026, 1, 1), Decimal("1.5"), UUID(int=1)]),
)


@settings(max_examples=400, deadline=None)
@given(ANY_VALUE, ANY_VALUE, ANY_VALUE, ANY_VALUE)
def test_a_record_is_sent_exactly_when_every_consumer_takes_it(
    order_id: Any, customer: Any, amount: Any, paid: Any
) -> None:
    """One rule: the producer encodes a record exactly when the worker's decoder, and
    ``streamkit send`` given the same values as JSON, accept them; what it refuses, the
    decoder would have dead-lettered."""
    record = Order(order_id=order_id, customer=customer, amount=amount, paid=paid)
    codec = codec_for(Order)
    decoded = sent_exactly_when_decoded(codec, record)
    if decoded is not None:
        # ``streamkit send`` takes the record's JSON as the decoder does.
        as_json = orjson.loads(orjson.dumps(converter.unstructure(record)))
        assert codec.from_dict(as_json) == decoded
        fields = codec.encode(record)
        entry, _ = codec.entry_encoder()(record)
        assert list(entry) == [1, b"data", fields[b"data"]]


def sent_exactly_when_decoded(codec: Any, record: Any) -> Any:
    """Check that ``codec`` encodes ``record`` exactly when the decoder takes its JSON
    (and then gives the same record back); the decoded record, or ``None``."""
    try:
        decoded = codec.decode({b"data": orjson.dumps(converter.unstructure(record))}, stream="s")
    except Exception:
        decoded = None
    try:
        fields = codec.encode(record)
    except EncodeError:
        assert decoded is None
        return None
    assert decoded is not None
    assert codec.decode(fields, stream="s") == decoded
    return decoded


class Stamped(Record):
    order_id: int
    at: datetime
    note: str | None = None
    level: Level = Level.LOW


@settings(max_examples=400, deadline=None)
@given(ANY_VALUE, ANY_VALUE, ANY_VALUE, st.sampled_from([Level.LOW, Level.HIGH, 1, "LOW"]))
def test_records_of_other_scalars_take_the_same_rule(
    order_id: Any, at: Any, note: Any, level: Any
) -> None:
    """Records of scalars other than the plain four (a datetime, an optional field, an
    enum) skip the round trip when each field holds exactly its type: what they accept
    and refuse is still the decoder's rule."""
    record = Stamped(order_id=order_id, at=at, note=note, level=level)
    sent_exactly_when_decoded(codec_for(Stamped), record)
