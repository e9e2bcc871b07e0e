"""An app whose partition key may be missing or a float in the input of ``sendmany``."""

from __future__ import annotations

from typing import Any

from streamkit import App, Record

app = App("keys")


class Item(Record):
    n: int
    key: Any = None


items = app.stream("items", record=Item, partition_by="key", partition_count=2)
