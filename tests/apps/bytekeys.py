"""An app keyed by ``bytes`` that are not UTF-8 (``b"\\xff"`` and a number): a join, a
windowed table and tables (one joined with another, one global) of those keys.

Each event of ``lefts`` and ``rights`` has a number ``k``, its key ``bytes([0xFF,
k])``, and an event time ``t`` (seconds). ``jb`` joins the two streams within 10 s
(outer: the events of a side that match none come out alone) into ``joined``, and
``jr`` (left, by a result function of the key and the two ``k``) into ``keyed``; the
processors count each side's events per key (``lefts_seen``, ``rights_seen``, joined
into ``both``, an outer table join), keep each left's ``k`` in the global table
``ks``, and sum the lefts' ``k`` per key in 10-second windows (``sums``, results to
``sums_out``).

``make_app()`` builds it for in-process use; the module-level ``app`` is for the
command line (``tests.apps.bytekeys:app``).
"""

from __future__ import annotations

from typing import Any

from streamkit import App, Events, Record, Stream, Table, WindowedTable, tumbling


class Ev(Record):
    k: int
    t: float


def key(event: Ev) -> bytes:
    return bytes([0xFF, event.k])


def keyed(key: str, left: Ev | None, right: Ev | None) -> dict[str, Any]:
    return {"key": key, "left": left and left.k, "right": right and right.k}


class ByteKeys:
    """The app and its pieces."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.app = app = App("bytekeys", **settings)
        self.lefts: Stream[Ev] = app.stream("lefts", record=Ev, partition_by=key, partition_count=2)
        self.rights: Stream[Ev] = app.stream(
            "rights", record=Ev, partition_by=key, partition_count=2
        )
        self.joined = app.stream(
            "joined", record=dict, partition_by=lambda r: r["key"], partition_count=1
        )
        self.keyed = app.stream(
            "keyed", record=dict, partition_by=lambda r: r["key"], partition_count=1
        )
        self.sums_out = app.stream(
            "sums_out", record=dict, partition_by=lambda r: r["key"], partition_count=1
        )
        app.join(
            "jb", self.lefts, self.rights, within=10, how="outer", output=self.joined,
            left_time="t", right_time="t", idle=False,
        )  # fmt: skip
        app.join(
            "jr", self.lefts, self.rights, within=10, how="left", output=self.keyed,
            left_time="t", right_time="t", idle=False, result=keyed,
        )  # fmt: skip
        self.lefts_seen: Table[int] = app.table("lefts_seen", value=int, default=0)
        self.rights_seen: Table[int] = app.table("rights_seen", value=int, default=0)
        self.ks: Table[int] = app.global_table("ks", value=int)
        self.sums: WindowedTable[int] = app.window(
            "sums", tumbling(10), value=int, initial=0, time="t", output=self.sums_out,
            idle=False,
        )  # fmt: skip

        @app.processor(self.lefts, tables=[self.lefts_seen, self.ks, self.sums])
        async def count_lefts(events: Events[Ev]) -> None:
            async for event in events.records():
                self.lefts_seen.set(key(event), await self.lefts_seen.get(key(event)) + 1)
                self.ks.set(key(event), event.k)
                await self.sums.update(key(event), event, lambda total, k: total + k, event.k)

        @app.processor(self.rights, tables=[self.rights_seen])
        async def count_rights(events: Events[Ev]) -> None:
            async for event in events.records():
                self.rights_seen.set(key(event), await self.rights_seen.get(key(event)) + 1)

        self.both: Table[Any] = app.join_tables(
            "both", self.lefts_seen, self.rights_seen, how="outer"
        )


def make_app(**settings: Any) -> ByteKeys:
    return ByteKeys(settings)


app = make_app().app
