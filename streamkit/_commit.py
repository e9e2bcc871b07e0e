"""Changes: what a partition's commit writes beside its acknowledgements (pure).

A processor's table writes, window index updates and emitted records are collected
as :class:`Changes` and applied by the partition's fenced commit, the same script
call that acknowledges the events behind them (the fenced read and acknowledgement
scripts of :mod:`streamkit._wire`): all of it lands, or none of it, and only while
the lease is ours.

Each change is one Redis write on one key of the partition's hash slot (or, on a
single server, an output stream's partition). :func:`change_arguments` lays a list of
changes out as the scripts take them: the keys to declare, then an op count and the
ops, each ``code, key index, count, values...``:

* ``h``: ``HSET key field value ...`` (``count`` pairs);
* ``d``: ``HDEL key field ...`` (``count`` fields);
* ``x``: ``XADD key * name value ...`` (``count`` pairs: one entry);
* ``z``: ``ZADD key score member ...`` (``count`` pairs);
* ``r``: ``ZREM key member ...`` (``count`` members);
* ``X``: ``count`` entries of one field appended to the stream ``key``: the field's
  name, then each entry's value (``XADD key * name value`` each);
* ``k``: ``UNLINK key`` (``count`` 0);
* ``t``: trim the stream ``key`` that ``count`` entries were appended to, keeping
  the one value's number of entries (processed ones only, as every trim).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["MAX_VALUES_PER_OP", "Changes", "change_arguments"]

#: Values one op passes to one Redis command, at most (Lua's ``unpack`` has a limit).
MAX_VALUES_PER_OP = 2000

Value = bytes | str | int | float


class Changes:
    """The writes of one commit, in order.

    Attributes:
        ops: ``(code, key, values)`` per write (see the module docs).
        on_landed: called once the commit carrying these changes was applied.
    """

    __slots__ = ("on_landed", "ops")

    def __init__(self, on_landed: Callable[[], None] | None = None) -> None:
        self.ops: list[tuple[str, str, list[Value]]] = []
        self.on_landed = on_landed

    def __bool__(self) -> bool:
        return bool(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def hset(self, key: str, pairs: list[Value]) -> None:
        """Set hash fields: ``pairs`` is ``[field, value, field, value, ...]``."""
        if pairs:
            self.ops.append(("h", key, pairs))

    def hdel(self, key: str, fields: list[Value]) -> None:
        """Delete hash fields."""
        if fields:
            self.ops.append(("d", key, fields))

    def xadd(self, key: str, pairs: list[Value]) -> None:
        """Append one entry, ``pairs`` being its ``[name, value, ...]``."""
        self.ops.append(("x", key, pairs))

    def xadd_run(self, key: str, field: Value, values: list[Value]) -> None:
        """Append one entry per value, each with the one field ``field``."""
        if values:
            self.ops.append(("X", key, [field, *values]))

    def delete(self, key: str) -> None:
        """Delete ``key``."""
        self.ops.append(("k", key, []))

    def zadd(self, key: str, pairs: list[Value]) -> None:
        """Add sorted-set members: ``pairs`` is ``[score, member, ...]``."""
        if pairs:
            self.ops.append(("z", key, pairs))

    def zrem(self, key: str, members: list[Value]) -> None:
        """Remove sorted-set members."""
        if members:
            self.ops.append(("r", key, members))

    def trim(self, key: str, appended: int, keep: int) -> None:
        """Trim the output stream ``key`` after ``appended`` entries, to ``keep``."""
        self.ops.append(("t", key, [appended, keep]))

    def landed(self) -> None:
        """The commit carrying these changes was applied."""
        if self.on_landed is not None:
            self.on_landed()

    def __repr__(self) -> str:
        return f"<Changes {len(self.ops)} ops>"


_PAIRED = frozenset("hxz")


def change_arguments(changes: Sequence[Changes], first_key: int) -> tuple[list[str], list[Value]]:
    """Lay ``changes`` out for a commit script.

    Args:
        changes: the changes, applied in order.
        first_key: the ``KEYS`` index (1-based) the first declared key gets.

    Returns:
        ``(keys, arguments)``: the keys to declare after the script's own, each once,
        and the op count followed by the ops. Long ops are split so that no Redis
        command gets more than :data:`MAX_VALUES_PER_OP` values (an entry is never
        split).
    """
    keys: list[str] = []
    index: dict[str, int] = {}
    ops: list[Value] = []
    count = 0
    for change in changes:
        for code, key, values in change.ops:
            position = index.get(key)
            if position is None:
                position = index[key] = first_key + len(keys)
                keys.append(key)
            if code == "t":
                ops.extend((code, position, values[0], values[1]))
                count += 1
                continue
            if code == "k":
                ops.extend((code, position, 0))
                count += 1
                continue
            if code == "X":
                field = values[0]
                step = MAX_VALUES_PER_OP - 1
                for start in range(1, len(values), step):
                    part = values[start : start + step]
                    ops.append(code)
                    ops.append(position)
                    ops.append(len(part))
                    ops.append(field)
                    ops.extend(part)
                    count += 1
                continue
            if code == "x":  # one entry, never split
                ops.append(code)
                ops.append(position)
                ops.append(len(values) // 2)
                ops.extend(values)
                count += 1
                continue
            width = 2 if code in _PAIRED else 1
            step = MAX_VALUES_PER_OP - MAX_VALUES_PER_OP % width
            for start in range(0, len(values), step):
                part = values[start : start + step]
                ops.append(code)
                ops.append(position)
                ops.append(len(part) // width)
                ops.extend(part)
                count += 1
    return keys, [count, *ops]
