"""Record classes for the Spark tests; importable by Spark's Python workers."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from enum import Enum

import attrs

from streamkit import Record


class Status(Enum):
    NEW = "new"
    PAID = "paid"


class Line(Record):
    sku: str
    quantity: int


class Order(Record):
    order_id: int
    customer: str
    amount: float
    created_at: datetime
    status: Status = Status.NEW
    day: date | None = None
    price: Decimal | None = None
    lines: list[Line] = attrs.field(factory=list)
    tags: dict[str, int] = attrs.field(factory=dict)
    note: str | None = None


class Reading(Record, primitive=True):
    sensor: str
    value: float
    at: datetime
    ok: bool = True


class Other(Record):
    order_id: int
