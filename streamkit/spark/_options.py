"""Parsing and checking the options of the ``streamkit`` Spark data source.

Options arrive as strings (Spark's ``.option(name, value)``, names case-insensitive);
they are parsed once, on the driver, into frozen attrs objects that are plain data and
pickle cheaply to the executors.
"""

from __future__ import annotations

import importlib
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypedDict, overload

import attrs

from .. import _keys
from .._compression import valid_compression
from .._errors import ConfigError, MetadataMismatch
from .._spec import record_metadata
from .._urls import masked_repr
from .._wire import (
    DEFAULT_MAX_DECODED_SIZE,
    DEFAULT_MAX_RECORD_SIZE,
    DEFAULT_PARTITION_SIZE,
    DEFAULT_SEND_CHUNK_SIZE,
    compare_metadata,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "ReadOptions",
    "WriteOptions",
    "check_record_metadata",
    "load_record",
    "parse_position",
    "predecessor",
]

#: Entry ids are written ``<ms>-<seq>``; positions compare as such tuples.
Position = tuple[int, int]

DEFAULT_PAGE_SIZE = 5_000
DEFAULT_MARKER_TTL = 7 * 24 * 3600
_MAX_SEQ = 2**64 - 1
_ENTRY_ID = re.compile(r"(\d+)-(\d+)\Z")
_MILLIS = re.compile(r"\d+\Z")


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(name).lower(): str(value) for name, value in options.items()}


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name.lower())
    if not value:
        raise ConfigError(name, f"this option is required, e.g. .option({name!r}, ...)")
    return value


class _StreamOptions(TypedDict):
    url: str
    app: str
    stream: str
    record: str | None


def _stream_of(options: Mapping[str, str]) -> _StreamOptions:
    """The options naming the stream, read and written alike: url, app, stream, record."""
    return _StreamOptions(
        url=_required(options, "url"),
        app=_keys.validate_name("app", _required(options, "app")),
        stream=_keys.validate_name("stream", _required(options, "stream")),
        record=options.get("record") or None,
    )


@overload
def _positive(options: Mapping[str, str], name: str, default: int) -> int: ...
@overload
def _positive(options: Mapping[str, str], name: str, default: None) -> int | None: ...
def _positive(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = options.get(name.lower())
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(name, f"expected a positive integer, got {text!r}")
    return value


def parse_position(name: str, text: str) -> Position:
    """Parse an entry id (``1714564800000-3``), epoch milliseconds or an ISO-8601 time.

    A time without a time zone is taken as UTC. A time or a bare millisecond count
    means the first entry id of that millisecond.

    Raises:
        ConfigError: ``text`` is none of these.
    """
    text = text.strip()
    if match := _ENTRY_ID.match(text):
        return int(match[1]), int(match[2])
    if _MILLIS.match(text):
        return int(text), 0
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            name,
            f"expected an entry id like 1714564800000-0, epoch milliseconds or an "
            f"ISO-8601 time, got {text!r}",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    millis = int(moment.timestamp() * 1000)
    if millis < 0:
        raise ConfigError(name, f"{text!r} is before 1970")
    return millis, 0


def format_position(position: Position) -> str:
    """The entry id text of a position."""
    return f"{position[0]}-{position[1]}"


def predecessor(position: Position) -> Position:
    """The greatest entry id strictly less than ``position`` (``0-0`` stays ``0-0``)."""
    millis, seq = position
    if seq > 0:
        return millis, seq - 1
    if millis > 0:
        return millis - 1, _MAX_SEQ
    return 0, 0


def load_record(path: str) -> type[Any]:
    """Import a record class given as ``module:Class`` (or ``module:Outer.Inner``).

    Raises:
        ConfigError: the text is malformed, the module or class cannot be imported, or
            the class is not an attrs class (a :class:`~streamkit.Record`).
    """
    module_name, colon, qualname = path.partition(":")
    if not colon or not module_name or not qualname:
        raise ConfigError("record", f"expected 'module:Class', got {path!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("record", f"cannot import module {module_name!r}: {exc}") from exc
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError("record", f"module {module_name!r} has no {qualname!r}") from None
    if not (isinstance(target, type) and attrs.has(target)):
        raise ConfigError(
            "record", f"{path} is not a Record subclass or attrs class, it is {target!r}"
        )
    return target


def check_record_metadata(stream: str, metadata: Mapping[str, str], record: type[Any]) -> None:
    """Check a record class against a stream's recorded metadata, as producers do.

    Raises:
        MetadataMismatch: the stream was created with another record type or format.
    """
    mismatch = compare_metadata(metadata, record_metadata(record), ("record", "format"))
    if mismatch is not None:
        raise MetadataMismatch(stream, *mismatch)


@attrs.frozen(kw_only=True)
class ReadOptions:
    """The options of a read (batch or streaming).

    Attributes:
        url: the Redis URL.
        app: the app name.
        stream: the stream name.
        record: ``module:Class`` of the record type, or ``None`` for raw fields.
        start: the first position to read (inclusive), ``None`` for the beginning.
        start_latest: streaming only: start after what is in the stream now.
        end: the position to stop before (exclusive), ``None`` for no bound.
        max_events_per_trigger: streaming: at most this many events per micro-batch.
        page_size: entries per XRANGE call.
        skip_undecodable: drop entries that do not decode instead of failing.
        table: read this table (written by a processor of ``stream``) instead of the
            stream: a batch snapshot of its keys and values.
        max_decoded_size: the most bytes a JSON payload may take once decompressed
            (``maxDecodedSize``, as the ``max_decoded_size`` setting); a larger one
            is undecodable.
    """

    url: str = attrs.field(repr=masked_repr)
    app: str
    stream: str
    record: str | None
    start: Position | None
    start_latest: bool
    end: Position | None
    max_events_per_trigger: int | None
    page_size: int
    skip_undecodable: bool
    table: str | None = None
    max_decoded_size: int = DEFAULT_MAX_DECODED_SIZE

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> ReadOptions:
        """Parse Spark's options; raise :class:`~streamkit.ConfigError` on a bad one."""
        options = _lower(raw)
        start_text = options.get("start", "earliest").strip()
        start: Position | None = None
        start_latest = False
        if start_text.lower() == "latest":
            start_latest = True
        elif start_text.lower() != "earliest":
            start = parse_position("start", start_text)
        end_text = options.get("end")
        end = parse_position("end", end_text) if end_text else None
        on_error = options.get("ondecodeerror", "fail").lower()
        if on_error not in ("fail", "skip"):
            raise ConfigError("onDecodeError", f"expected 'fail' or 'skip', got {on_error!r}")
        page_size = _positive(options, "pageSize", DEFAULT_PAGE_SIZE)
        max_decoded_size = _positive(options, "maxDecodedSize", DEFAULT_MAX_DECODED_SIZE)
        return cls(
            **_stream_of(options),
            start=start,
            start_latest=start_latest,
            end=end,
            max_events_per_trigger=_positive(options, "maxEventsPerTrigger", None),
            page_size=page_size,
            skip_undecodable=on_error == "skip",
            table=(
                _keys.validate_name("table", options["table"]) if options.get("table") else None
            ),
            max_decoded_size=max_decoded_size,
        )


@attrs.frozen(kw_only=True)
class WriteOptions:
    """The options of a write (batch or streaming).

    Attributes:
        url, app, stream, record: as for reads; ``record`` may be ``None`` to write a
            ``fields`` map column as is (raw mode).
        key: the column (or record field) to partition by; defaults to the stream's
            recorded ``partition_by``.
        partition_count: the partition count for a stream that does not exist yet.
        compression: ``lz4``, ``zstd`` or ``None``, as the ``compression`` setting.
        write_id: a fixed identity for idempotent re-runs of a batch write.
        chunk_size: entries appended per Lua call (and per idempotency marker).
        marker_ttl: seconds the idempotency markers live.
        partition_size: soft trimming bound, as the ``partition_size`` setting.
        max_len: hard cap, as the ``max_len`` setting, or ``None``.
        max_record_size: the most bytes an encoded row may take (``maxRecordSize``,
            as the ``max_record_size`` setting).
    """

    url: str = attrs.field(repr=masked_repr)
    app: str
    stream: str
    record: str | None
    key: str | None
    partition_count: int | None
    compression: str | None
    write_id: str | None
    chunk_size: int
    marker_ttl: int
    partition_size: int
    max_len: int | None
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> WriteOptions:
        """Parse Spark's options; raise :class:`~streamkit.ConfigError` on a bad one."""
        options = _lower(raw)
        compression = options.get("compression") or None
        valid_compression.check("compression", compression)
        write_id = options.get("writeid") or None
        if write_id is not None and not re.fullmatch(r"[A-Za-z0-9_.\-]+", write_id):
            raise ConfigError(
                "writeId", f"must be letters, digits, '_', '.' or '-', got {write_id!r}"
            )
        chunk_size = _positive(options, "chunkSize", DEFAULT_SEND_CHUNK_SIZE)
        marker_ttl = _positive(options, "markerTtl", DEFAULT_MARKER_TTL)
        partition_size = _positive(options, "partitionSize", DEFAULT_PARTITION_SIZE)
        max_record_size = _positive(options, "maxRecordSize", DEFAULT_MAX_RECORD_SIZE)
        return cls(
            **_stream_of(options),
            key=options.get("key") or None,
            partition_count=_positive(options, "partitionCount", None),
            compression=compression,
            write_id=write_id,
            chunk_size=chunk_size,
            marker_ttl=marker_ttl,
            partition_size=partition_size,
            max_len=_positive(options, "maxLen", None),
            max_record_size=max_record_size,
        )
