"""Record: attrs classes without a decorator, and the primitive mode's field checks."""

from __future__ import annotations

import enum
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import attrs
import pytest

from streamkit._records import PrimitiveField, Record, is_primitive, primitive_fields


class Order(Record):
    order_id: int
    amount: float
    created_at: datetime


class PriorityOrder(Order):
    priority: int = 0


class Unit(enum.Enum):
    CELSIUS = "C"
    KELVIN = 2


class Reading(Record, primitive=True):
    sensor: str
    value: float
    unit: Unit = Unit.CELSIUS
    note: str | None = None


class CalibratedReading(Reading):
    offset: float = 0.0


class AnnotatedReading(Reading, primitive=False):
    tags: list[str] = attrs.field(factory=list)


NOW = datetime(2024, 5, 1, 12, 0)


def test_a_subclass_is_an_attrs_class_in_place() -> None:
    assert attrs.has(Order)
    # slots=False keeps the class object: the decorator-less class is the attrs class.
    assert "__attrs_attrs__" in Order.__dict__
    assert [field.name for field in attrs.fields(Order)] == ["order_id", "amount", "created_at"]


def test_records_take_keyword_arguments_only() -> None:
    with pytest.raises(TypeError):
        Order(1, 2.0, NOW)  # type: ignore[call-arg]


def test_records_compare_print_and_evolve_like_attrs_classes() -> None:
    order = Order(order_id=1, amount=2.5, created_at=NOW)
    assert order == Order(order_id=1, amount=2.5, created_at=NOW)
    assert order != Order(order_id=2, amount=2.5, created_at=NOW)
    assert repr(order) == (
        "Order(order_id=1, amount=2.5, created_at=datetime.datetime(2024, 5, 1, 12, 0))"
    )
    changed = attrs.evolve(order, amount=3.0)
    assert changed.amount == 3.0
    assert order.amount == 2.5


def test_records_run_attrs_validators() -> None:
    class Positive(Record):
        amount: int = attrs.field(validator=attrs.validators.gt(0))

    with pytest.raises(ValueError, match="amount"):
        Positive(amount=0)


def test_subclasses_inherit_fields() -> None:
    order = PriorityOrder(order_id=1, amount=2.5, created_at=NOW, priority=3)
    assert [field.name for field in attrs.fields(PriorityOrder)] == [
        "order_id",
        "amount",
        "created_at",
        "priority",
    ]
    assert order.priority == 3
    assert isinstance(order, Order)


def test_the_mode_is_known_from_the_class() -> None:
    assert not Order.__streamkit_primitive__
    assert not is_primitive(Order)
    assert Reading.__streamkit_primitive__
    assert is_primitive(Reading)


def test_subclasses_inherit_the_mode_unless_told_otherwise() -> None:
    assert is_primitive(CalibratedReading)
    assert not is_primitive(AnnotatedReading)
    assert not is_primitive(PriorityOrder)


@pytest.mark.parametrize("cls", [dict, int, attrs.make_class("Plain", ["x"])])
def test_only_records_can_be_primitive(cls: type) -> None:
    assert not is_primitive(cls)


def test_primitive_fields_describe_each_field() -> None:
    assert primitive_fields(Reading) == [
        PrimitiveField(name="sensor", alias="sensor", scalar=str, optional=False, required=True),
        PrimitiveField(name="value", alias="value", scalar=float, optional=False, required=True),
        PrimitiveField(name="unit", alias="unit", scalar=Unit, optional=False, required=False),
        PrimitiveField(name="note", alias="note", scalar=str, optional=True, required=False),
    ]


def test_every_scalar_type_is_allowed_in_primitive_mode() -> None:
    class Everything(Record, primitive=True):
        a: int
        b: float
        c: str
        d: bool
        e: bytes
        f: datetime
        g: date
        h: Decimal
        i: UUID
        j: Unit
        k: int | None
        m: None | datetime = None  # noqa: RUF036 -- None first must work too

    scalars = [(field.scalar, field.optional) for field in primitive_fields(Everything)]
    assert scalars == [
        (int, False),
        (float, False),
        (str, False),
        (bool, False),
        (bytes, False),
        (datetime, False),
        (date, False),
        (Decimal, False),
        (UUID, False),
        (Unit, False),
        (int, True),
        (datetime, True),
    ]


class Point(enum.Enum):
    ORIGIN = (0, 0)


@pytest.mark.parametrize(
    ("annotation", "shown"),
    [
        (list[int], "list[int]"),
        (dict[str, int], "dict[str, int]"),
        (Order, "Order"),
        (int | str, "int | str"),
        (tuple[int, int], "tuple[int, int]"),
        (Any, "Any"),
        (Point, "Point"),
    ],
)
def test_primitive_mode_refuses_non_scalar_fields(annotation: object, shown: str) -> None:
    namespace = {"__annotations__": {"ok": int, "bad": annotation}}
    with pytest.raises(TypeError, match="field 'bad' of primitive record Bad") as info:
        type("Bad", (Record,), namespace, primitive=True)
    assert shown in str(info.value)


def test_a_primitive_subclass_of_a_json_record_is_checked() -> None:
    with pytest.raises(TypeError, match="field 'tags'"):

        class StrictReading(AnnotatedReading, primitive=True):
            pass


def test_primitive_mode_refuses_annotations_it_cannot_resolve() -> None:
    with pytest.raises(TypeError, match="cannot resolve the field types of primitive record"):

        class Broken(Record, primitive=True):
            when: Missing  # type: ignore[name-defined]  # noqa: F821
