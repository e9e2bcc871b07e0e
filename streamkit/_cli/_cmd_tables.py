"""``streamkit table get`` and ``table list``: reading a table's committed state."""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncclick as click
import orjson

from .._errors import StreamkitError
from .._json_converter import converter
from .._literal import printable
from .._tables_versioned import VersionedTable
from ._exits import fail
from ._loading import load_app
from ._options import key_argument, limit_option, redis_url_option

if TYPE_CHECKING:
    from .._app import App
    from .._tables import Table
    from .._tables_windowed import WindowedTable

__all__ = ["table"]


@click.group()
def table() -> None:
    """Read a table's committed state: one key, or all of them."""


def _table(app: App, name: str) -> Table[Any] | WindowedTable[Any]:
    found = app.tables.get(name)
    if found is None:
        known = ", ".join(sorted(app.tables)) or "none"
        fail(f"app {app.name} has no table {name!r} (its tables: {known})", exit_code=2)
    if found.stream is None:
        fail(f"table {name!r} is written by no processor, so it holds nothing", exit_code=2)
    return found


def _json(value: Any) -> str:
    return orjson.dumps(converter.unstructure(value)).decode()


def _windows(windows: list[Any]) -> str:
    return _json(
        [
            {"start": w.start.isoformat(), "end": w.end.isoformat(), "value": value}
            for w, value in windows
        ]
    )


def _time(text: str) -> datetime | float:
    """A ``--as-of`` time: ISO 8601 (``2026-01-01T10:00:00Z``; naive is UTC) or
    seconds since the epoch."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds) and abs(seconds) < 1e11:  # (year 5138 and before)
            return seconds
        fail(f"--as-of: {text!r} is not a time (seconds since the epoch)", exit_code=2)
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        fail(
            f"--as-of: {text!r} is not a time (ISO 8601, e.g. 2026-01-01T10:00:00Z, or "
            "seconds since the epoch)",
            exit_code=2,
        )


@table.command("get")
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("name", metavar="TABLE")
@click.argument("key", metavar="KEY")
@click.option(
    "--as-of",
    "as_of",
    metavar="TIME",
    default=None,
    help="A versioned table: the value in force at TIME (ISO 8601, or epoch seconds).",
)
@click.option(
    "--history", is_flag=True, help="A versioned table: every version kept, oldest first."
)
@redis_url_option
async def table_get(
    app_path: str, name: str, key: str, as_of: str | None, history: bool, redis_url: str | None
) -> None:
    """Print KEY's committed value as JSON (the table's default when missing; a
    windowed table's windows as a list; a versioned table's value as of a time, or its
    versions)."""
    app = load_app(app_path, redis_url)
    found = _table(app, name)
    if (as_of is not None or history) and not isinstance(found, VersionedTable):
        option = "--history" if history else "--as-of"
        fail(f"{option}: table {name!r} is not a versioned table: it keeps no history", exit_code=2)
    if as_of is not None and history:
        fail("--as-of and --history: give one of them", exit_code=2)
    moment = None if as_of is None else _time(as_of)
    typed = key_argument(key)
    try:
        async with app:
            if isinstance(found, VersionedTable) and history:
                versions = await found.history(typed)
                text = _json([{"at": at.isoformat(), "value": value} for at, value in versions])
            elif isinstance(found, VersionedTable) and moment is not None:
                text = _json(await found.read(typed, as_of=moment))
            elif hasattr(found, "kind"):
                text = _windows(await found.read(typed))
            else:
                text = _json(await found.read(typed))
    except StreamkitError as exc:
        fail(str(exc))
    click.echo(printable(text))


@table.command("list")
@click.argument("app_path", metavar="MODULE:APP")
@click.argument("name", metavar="TABLE")
@click.option("--partition", type=click.IntRange(min=0), default=None, help="Only this partition.")
@limit_option(default=None, show_default=False, help="Print at most this many keys.")
@redis_url_option
async def table_list(
    app_path: str, name: str, partition: int | None, limit: int | None, redis_url: str | None
) -> None:
    """Print every committed key and value, one ``KEY<TAB>JSON`` line each, partition
    by partition (scanned incrementally: a table changing meanwhile may show a key
    twice or miss one written during the scan)."""
    app = load_app(app_path, redis_url)
    found = _table(app, name)
    if partition is not None and not 0 <= partition < found.partition_total():
        fail(f"--partition must be 0..{found.partition_total() - 1}", exit_code=2)
    shown = 0
    try:
        async with app:
            async for key, value in found.items(partition=partition):
                text = _windows(value) if hasattr(found, "kind") else _json(value)
                click.echo(f"{printable(key)}\t{printable(text)}")
                shown += 1
                if limit is not None and shown >= limit:
                    break
    except StreamkitError as exc:
        fail(str(exc))
