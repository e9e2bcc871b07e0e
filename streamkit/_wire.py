"""The wire-level facts shared by every side that touches Redis: pure, no I/O.

The async side (producer, fetcher) and the synchronous Spark side read and write the
same entries with the same scripts and the same metadata. Everything they must agree
on lives here, with no import of trio or of a Redis client, so that Spark's Python
workers can import it cheaply:

* the trimming steps of the scripts that append and acknowledge (the scripts
  themselves are files of :mod:`streamkit._lua`: ``streams/``, ``commit/``);
* the stream metadata schema (:data:`METADATA_VERSION`, :func:`compare_metadata`);
* the entry layout (:func:`flatten_fields`, :func:`field_pairs`) and :func:`text`;
* the size limits of entries and of script calls, and :func:`chunk_bounds`, which
  splits appends into calls by count and by bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._defaults import (
    DEFAULT_MAX_DECODED_SIZE,
    DEFAULT_MAX_RECORD_SIZE,
    DEFAULT_PARTITION_SIZE,
    DEFAULT_SEND_CHUNK_SIZE,
)
from ._lua import CONSTANTS

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

__all__ = [
    "COMPARED_METADATA",
    "DEFAULT_MAX_DECODED_SIZE",
    "DEFAULT_MAX_RECORD_SIZE",
    "DEFAULT_PARTITION_SIZE",
    "DEFAULT_SEND_CHUNK_BYTES",
    "DEFAULT_SEND_CHUNK_SIZE",
    "METADATA_VERSION",
    "REDIS_MAX_BULK",
    "TRIM_PROCESSED_STEP",
    "TRIM_STEP",
    "chunk_bounds",
    "compare_metadata",
    "compare_schemas",
    "field_pairs",
    "flatten_fields",
    "format_size",
    "metadata_pairs",
    "text",
]

#: Version 2 added ``schema``: the record's field names and types. Streams recorded
#: by version 1 (no ``schema``) are still checked, by the record's name alone.
METADATA_VERSION = "2"

#: Bytes of entries appended per script call, at most (an entry larger than this goes
#: in a call of its own): Redis holds a whole call in memory, and runs it without a
#: pause, so a call of many large entries would hold up every other client.
DEFAULT_SEND_CHUNK_BYTES = 2**20

#: Redis's default ``proto-max-bulk-len``: the longest string (each field name and
#: value) it accepts in a command, when the server's own setting cannot be read.
REDIS_MAX_BULK = 512 * 2**20

#: Entries one script call removes under the hard cap, beyond as many as it appended:
#: a partition far over its cap (a cap just set or lowered) comes down over several
#: calls, each of bounded work, instead of one call holding Redis up for seconds. The
#: cap reads each entry it removes (to count the unprocessed ones), about a microsecond
#: each. See docs/streams.md, "Trimming".
#: (Set in :data:`streamkit._lua.CONSTANTS`, where the scripts read it too.)
TRIM_STEP = int(CONSTANTS["TRIM_STEP"])
#: Entries one script call removes when it trims processed entries (``partition_size``),
#: beyond as many as it appended or acknowledged: approximate trimming frees whole
#: nodes of about 100 entries, about 10 ns an entry.
TRIM_PROCESSED_STEP = int(CONSTANTS["TRIM_PROCESSED_STEP"])

#: The metadata fields compared between a stream's record and a producer or consumer.
#: An empty ``partition_by`` means "a callable", which cannot be compared.
COMPARED_METADATA = ("partition_count", "format", "record", "partition_by")

#: In a ``schema``: fields are separated by this, each ``name:type``; a leading
#: :data:`OPTIONAL_MARK` says the field has a default.
SCHEMA_SEPARATOR = ";"
OPTIONAL_MARK = "?"


def text(value: object) -> str:
    """``value`` as text: bytes decoded as UTF-8, anything else through ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def field_pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    """An entry's flat field list ``[name, value, name, value, ...]`` as a dict."""
    it = iter(flat)
    return dict(zip(it, it, strict=True))


def flatten_fields(fields: Mapping[bytes, bytes], into: list[bytes | int]) -> int:
    """Append one entry to a script's arguments: its field count, then names and values.

    Returns:
        the entry's size: the bytes of its field names and values.
    """
    into.append(len(fields))
    size = 0
    for name, value in fields.items():
        into.append(name)
        into.append(value)
        size += len(name) + len(value)
    return size


def chunk_bounds(sizes: Sequence[int], count: int, size: int) -> Iterator[tuple[int, int]]:
    """Split entries into consecutive chunks of at most ``count`` entries and ``size`` bytes.

    An entry larger than ``size`` makes a chunk of its own. Yields ``(start, end)``
    slice bounds of ``sizes``, in order, covering every entry once.
    """
    start = 0
    total = 0
    for index, entry_size in enumerate(sizes):
        if index > start and (index - start >= count or total + entry_size > size):
            yield start, index
            start, total = index, 0
        total += entry_size
    if start < len(sizes):
        yield start, len(sizes)


def format_size(size: int) -> str:
    """A byte count for people: ``512 bytes``, ``64 KiB``, ``16 MiB``, ``2.5 MiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} bytes"


def metadata_pairs(reply: object) -> dict[str, str]:
    """An ``HGETALL`` reply (a flat list or a dict, bytes or text) as a text dict."""
    if isinstance(reply, dict):
        items: Iterable[tuple[object, object]] = reply.items()
    else:
        flat = list(reply)  # type: ignore[call-overload]
        items = zip(flat[::2], flat[1::2], strict=True)
    return {text(k): text(v) for k, v in items}


def compare_metadata(
    recorded: Mapping[str, str], mine: Mapping[str, str], fields: Iterable[str] = COMPARED_METADATA
) -> tuple[str, str, str] | None:
    """The first of ``fields`` on which ``recorded`` and ``mine`` disagree, or ``None``.

    ``record`` is compared by ``schema`` (field names and types, see
    :func:`compare_schemas`) when both sides recorded one: a renamed class with
    compatible fields agrees, an unrelated class of the same name does not. Against
    metadata without a schema (version 1) or a ``dict`` record, by name.

    Returns:
        ``(field, recorded value, my value)``. A field absent on either side, and an
        empty ``partition_by`` (a callable) on either side, never disagree. For a
        schema difference, the values name the record and only the differing fields:
        ``("record", "Order(amount: int)", "Order(amount: float)")``.
    """
    for field in fields:
        theirs = recorded.get(field)
        ours = mine.get(field)
        if theirs is None or ours is None:
            continue
        if field == "partition_by" and "" in (theirs, ours):
            continue
        if field == "record" and "dict" not in (theirs, ours):
            their_schema = recorded.get("schema")
            our_schema = mine.get("schema")
            if their_schema is not None and our_schema is not None:
                differences = compare_schemas(their_schema, our_schema)
                if differences:
                    return (
                        field,
                        f"{theirs}({'; '.join(d[1] for d in differences)})",
                        f"{ours}({'; '.join(d[2] for d in differences)})",
                    )
                continue
        if theirs != ours:
            return field, theirs, ours
    return None


def _parse_schema(schema: str) -> dict[str, tuple[str, bool]]:
    fields: dict[str, tuple[str, bool]] = {}
    for item in schema.split(SCHEMA_SEPARATOR):
        if not item:
            continue
        optional = item.startswith(OPTIONAL_MARK)
        name, _, kind = item.removeprefix(OPTIONAL_MARK).partition(":")
        fields[name] = (kind, optional)
    return fields


def compare_schemas(recorded: str, mine: str) -> list[tuple[str, str, str]]:
    """The fields on which two record schemas are incompatible, in field order.

    Compatible: the same fields with the same types, plus any field that only one
    side has *with a default* (an added optional field: entries without it decode
    with the default, entries with it decode on a side that ignores it). Incompatible:
    a field whose type differs, or that only one side has and requires.

    Returns:
        ``(name, how it is recorded, how it is here)`` per incompatible field,
        e.g. ``("amount", "amount: int", "amount: float")`` or
        ``("note", "no note", "note: str, required")``.
    """
    theirs = _parse_schema(recorded)
    ours = _parse_schema(mine)
    differences = []
    for name in [*theirs, *(n for n in ours if n not in theirs)]:
        their_field = theirs.get(name)
        our_field = ours.get(name)
        if their_field is not None and our_field is not None:
            if their_field[0] != our_field[0]:
                differences.append((name, f"{name}: {their_field[0]}", f"{name}: {our_field[0]}"))
        elif their_field is not None and not their_field[1]:
            differences.append((name, f"{name}: {their_field[0]}, required", f"no {name}"))
        elif our_field is not None and not our_field[1]:
            differences.append((name, f"no {name}", f"{name}: {our_field[0]}, required"))
    return differences
