"""Tables made of other tables' changes: table-table joins and global tables.

Both are built of the commit and of processors, like a stream-stream join
(:mod:`streamkit._joins`): a table that feeds them sends each of its writes on, as a
change, in the very commit that writes it (an output of its processor, so exactly once,
through the outbox on Redis Cluster), and a processor of the app applies the changes to
a table of its own, committed with their acknowledgements:

* :meth:`streamkit.App.join_tables`: two co-partitioned tables' changes meet in partition
  N of ``JOIN__changes``; the ``JOIN`` processor keeps both sides of each key
  (``JOIN__sides``) and writes the joined value to the derived table ``JOIN``, once per
  change of either side. The derived table is a :class:`~streamkit.Table`: read it as
  any other.
* :meth:`streamkit.App.global_table`: any partition of its writer writes any key; the
  changes go to the one partition of ``NAME__global``, whose processor ``NAME__apply``
  writes them to one hash, in the slot of that partition. Readers anywhere read that
  hash (a committed value, not part of their commit).

A change is one entry of one field: the JSON array ``[tag, key, value]``: the side it
comes from (``L``, ``R``; ``G`` for a global table), the key (canonical bytes as latin-1
text) and the value as the feeding table stores it (``null``: deleted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import orjson

from ._errors import ConfigError
from ._json_converter import converter
from ._partitioner import key_text
from ._state import CHANGE_FIELD
from ._tables import Table

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._events import Events
    from ._joins import JoinHow

__all__ = ["GlobalTable", "TableJoin", "apply_global", "default_table_result", "run_table_join"]

V = TypeVar("V")

#: Changes a table join's or a global table's processor takes at a time.
BATCH = 500


def default_table_result(key: str, left: Any, right: Any) -> dict[str, Any]:
    """A derived table's default value: ``{"left": ..., "right": ...}``, each side's
    value as JSON (``None`` where that side has no value)."""
    return {
        "left": None if left is None else converter.unstructure(left),
        "right": None if right is None else converter.unstructure(right),
    }


@attrs.define(eq=False)
class TableJoin:
    """What :meth:`streamkit.App.join_tables` declared: the parts of one table join.

    Attributes:
        name: the join's name (and its derived table's).
        left, right: the joined tables.
        how: ``"inner"`` (a key has a value when both sides have one), ``"left"``
            (when the left side has one) or ``"outer"`` (when either has).
        result: the derived value of ``(key, left value or None, right value or None)``.
        sides: the join's own copy of both sides of each key (a list of two JSON values).
        table: the derived table.
    """

    name: str
    left: Table[Any]
    right: Table[Any]
    how: JoinHow
    result: Callable[[str, Any, Any], Any]
    sides: Table[Any]
    table: Table[Any]

    def derive(self, field: bytes, sides: list[Any]) -> Any:
        """The derived value of a key whose sides are ``sides`` (JSON), or ``None`` if
        the key has none (it is deleted)."""
        left_json, right_json = sides
        has_left, has_right = left_json is not None, right_json is not None
        if self.how == "inner":
            present = has_left and has_right
        elif self.how == "left":
            present = has_left
        else:
            present = has_left or has_right
        if not present:
            return None
        left = None if left_json is None else converter.structure(left_json, self.left.value)
        right = None if right_json is None else converter.structure(right_json, self.right.value)
        return self.result(key_text(field), left, right)


async def run_table_join(events: Events[Any], join: TableJoin) -> None:
    """The body of a table join's processor: each change of either side updates the
    key's sides and its derived value, committed with the change's acknowledgement."""
    sides, derived = join.sides, join.table
    async for batch in events.take_raw(BATCH, within=0.002):
        changes = [orjson.loads(event.fields[CHANGE_FIELD]) for event in batch]
        fields = [key.encode("latin-1") for _, key, _ in changes]
        await sides.get_many(dict.fromkeys(fields))  # one round trip for the batch
        for (tag, _, value), field in zip(changes, fields, strict=True):
            known = await sides.get(field)
            both = [None, None] if known is None else list(known)
            both[0 if tag == "L" else 1] = value
            if both == [None, None]:
                sides.delete(field)
            else:
                sides.set(field, both)
            joined = join.derive(field, both)
            if joined is None:
                derived.delete(field)
            else:
                derived.set(field, joined)


async def apply_global(events: Events[Any], table: GlobalTable[Any]) -> None:
    """The body of a global table's processor: apply each change to the table's hash,
    committed with the change's acknowledgement."""
    applied = table.applied
    async for batch in events.take_raw(BATCH, within=0.002):
        for event in batch:
            _, key, value = orjson.loads(event.fields[CHANGE_FIELD])
            field = key.encode("latin-1")
            if value is None:
                applied.delete(field)
            else:
                applied.set(field, converter.structure(value, table.value))


@attrs.define(eq=False, repr=False)
class GlobalTable(Table[V]):
    """A table every processor can read, whatever its key; declared with
    :meth:`streamkit.App.global_table`.

    One processor writes it (it names the table in ``tables=[...]``); any of its
    partitions may write any key. Each write lands, exactly once, in one hash of its
    own slot, shortly after the writer's commit (it travels as a change to the table's
    processor ``NAME__apply``). Everywhere else, :meth:`get` and :meth:`read` read that
    hash: the value last applied, at the moment of the read.

    Attributes:
        applied: the table the changes are applied to (the one hash), written by the
            table's own processor.
    """

    applied: Table[V] = attrs.field(init=False)

    #: Tells the state commit to give the writer a view of any key.
    is_global = True
    kind_name = "global table"

    def key(self, partition: int) -> str:
        """The Redis hash holding the whole table (whatever ``partition``)."""
        return self.applied.key(0)

    def expiry_key(self, partition: int) -> str:  # pragma: no cover - no ttl
        raise ConfigError("ttl", f"global table {self.name!r} has no ttl")

    def partition_of(self, key: object) -> int:
        """``0``: a global table is one hash."""
        return 0

    def partition_total(self) -> int:
        """``1``: a global table is one hash."""
        return 1

    def __repr__(self) -> str:
        where = f" by {self.processor!r}" if self.processor is not None else ""
        kind = getattr(self.value, "__name__", self.value)
        return f"<GlobalTable {self.name!r}{where} value={kind}>"
