"""``streamkit read`` and ``tail``: a stream's entries, across its partitions, in id order.

Each partition is read in pages (``XRANGE``, pipelined over the partitions) and the
pages are merged by entry id, so the output is the stream's entries in the order
Redis added them, whatever their partition; ``tail`` takes the last entries of every
partition (``XREVRANGE``) and merges those. ``--follow`` then polls every partition
for entries after the last one seen (a pipeline per poll: on a Redis Cluster too,
where one ``XREAD`` cannot name keys of several slots). Entries are decoded as the
stream's records; one that does not decode is shown as such, with why. Everything
from Redis goes through :func:`streamkit._literal.printable`.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import asyncclick as click
import attrs
import orjson
import trio

from .._app import inner_stream_of
from .._backoff import Backoff, retry_unavailable
from .._errors import ConfigError, DecodeError, MetadataMismatch, StreamkitError
from .._joins import JSON_FORM, PACKED, unpack_forwarded
from .._json_converter import converter
from .._literal import printable
from .._partitioner import canonical_key_bytes, key_text, partition_for
from .._redis import health_of, redis_errors
from .._state import CHANGE_FIELD
from .._state_join_sides import HEARTBEAT, read_heartbeat
from .._wire import compare_metadata, metadata_pairs, text
from ._exits import fail
from ._loading import load_stream
from ._options import json_option, key_argument, redis_url_option
from ._watch import until_signal

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from .._app import App
    from .._redis import Redis
    from .._streams import Stream

__all__ = ["parse_position", "read", "tail"]

#: Entries read per partition and round trip.
PAGE = 500
#: Seconds between two looks for new entries, with --follow.
FOLLOW_EVERY = 0.5
#: Delays between looks while Redis is unreachable, with --follow.
FOLLOW_BACKOFF = Backoff(initial=0.1, maximum=2.0)

_ID = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_position(value: str, *, end: bool) -> str:
    """An entry id for ``--from`` (``end=False``) or ``--to`` (``end=True``): ``start``
    or ``end``, an entry id (``1767225600000-0``, or its milliseconds alone), or a time
    in ISO 8601 (``2026-01-01T10:00:00Z``; UTC without a zone).

    Error handling:
        ``ValueError`` saying what is accepted.
    """
    if value in ("start", "-"):
        return "-"
    if value in ("end", "+"):
        return "+"
    found = _ID.match(value)
    if found is not None:
        if found[2] is not None:
            return value
        return f"{found[1]}-{2**64 - 1 if end else 0}"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is not start, end, an entry id (1767225600000-0) or an ISO 8601 "
            f"time (2026-01-01T10:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    millis = int(moment.timestamp() * 1000)
    return f"{millis}-{2**64 - 1 if end else 0}"


def _order(entry_id: str) -> tuple[int, int]:
    millis, _, seq = entry_id.partition("-")
    return int(millis), int(seq or 0)


@attrs.frozen
class Entry:
    """One entry of a partition: where, its id, its fields."""

    partition: int
    id: str
    fields: dict[bytes, bytes]


def _entries(partition: int, reply: Any) -> list[Entry]:
    return [
        Entry(
            partition, text(e.identifier), {bytes(k): bytes(v) for k, v in e.field_values.items()}
        )
        for e in reply or ()
    ]


async def _pages(
    redis: Redis, keys: dict[int, str], starts: dict[int, str], end: str, count: int
) -> dict[int, list[Entry]]:
    """The next page of each partition of ``keys``: ``count`` entries from ``starts``
    (ids, ``(id`` after one) to ``end``, in one pipeline."""
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            requests = {p: pipe.xrange(keys[p], starts[p], end, count=count) for p in keys}
        return {p: _entries(p, await request) for p, request in requests.items()}


async def merged_range(
    redis: Redis, keys: dict[int, str], start: str, end: str
) -> AsyncIterator[Entry]:
    """The entries of the partitions ``keys`` from ``start`` to ``end``, by id."""
    pages = await _pages(redis, keys, dict.fromkeys(keys, start), end, PAGE)
    heap = [(_order(page[0].id), p, 0) for p, page in pages.items() if page]
    heapq.heapify(heap)
    while heap:
        _, partition, index = heapq.heappop(heap)
        page = pages[partition]
        entry = page[index]
        yield entry
        index += 1
        if index == len(page) and len(page) == PAGE:
            more = await _pages(
                redis, {partition: keys[partition]}, {partition: f"({entry.id}"}, end, PAGE
            )
            pages[partition], index = more[partition], 0
        if index < len(pages[partition]):
            heapq.heappush(heap, (_order(pages[partition][index].id), partition, index))


async def last_entries(redis: Redis, keys: dict[int, str], count: int) -> list[Entry]:
    """The last ``count`` entries of the partitions ``keys`` together, by id."""
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            requests = {p: pipe.xrevrange(keys[p], "+", "-", count=count) for p in keys}
        newest = [entry for p, r in requests.items() for entry in _entries(p, await r)]
    newest.sort(key=lambda e: _order(e.id))
    return newest[-count:] if count else []


async def follow_on(
    redis: Redis, keys: dict[int, str], after: dict[int, str]
) -> AsyncIterator[Entry]:
    """The entries added to the partitions ``keys`` after the ids ``after``, by id in
    each look, forever (until cancelled).

    Error handling:
        An outage is ridden out: a look that fails because Redis cannot be reached (or
        its reply was lost: a read is safe to send again) is tried again until Redis
        answers, said once in the log, and its end in one line (the client's
        :class:`~streamkit._outage.OutageLog`), as ``status --watch`` rides one out.
    """
    outage = health_of(redis).outage
    while True:
        starts = {p: f"({after[p]}" for p in keys}
        pages = await retry_unavailable(
            functools.partial(_pages, redis, keys, starts, "+", PAGE),
            backoff=FOLLOW_BACKOFF,
            give_up_after=None,
            what="reading new entries",
            outage=outage,
        )
        found = sorted(
            (entry for page in pages.values() for entry in page), key=lambda e: _order(e.id)
        )
        for entry in found:
            after[entry.partition] = entry.id
            yield entry
        if not any(len(page) == PAGE for page in pages.values()):
            await trio.sleep(FOLLOW_EVERY)


async def _noting(entries: AsyncIterator[Entry], after: dict[int, str]) -> AsyncIterator[Entry]:
    """``entries``, noting in ``after`` each partition's last id gone by."""
    async for entry in entries:
        if _order(entry.id) > _order(after[entry.partition]):
            after[entry.partition] = entry.id
        yield entry


async def last_ids(redis: Redis, keys: dict[int, str]) -> dict[int, str]:
    """Each partition's newest entry id (``0-0`` for an empty one)."""
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            requests = {p: pipe.xrevrange(keys[p], "+", "-", count=1) for p in keys}
        replies = {p: _entries(p, await r) for p, r in requests.items()}
    return {p: (found[0].id if found else "0-0") for p, found in replies.items()}


# -- showing entries -----------------------------------------------------------------


def _key_of(stream: Stream[Any]) -> Callable[[Any], object]:
    by = stream.partition_by
    if callable(by):
        return by
    if stream.record is dict:
        return lambda record: record.get(by)
    return lambda record: getattr(record, by, None)


def _typed_key(stream: Stream[Any], key: str) -> object:
    """``--key`` as the stream's keys are: an int where the key field is an int (bytes
    where the argument is not text: see :func:`key_argument`)."""
    by = stream.partition_by
    if isinstance(by, str) and attrs.has(stream.record):
        fields = attrs.fields_dict(attrs.resolve_types(stream.record))
        if by in fields and fields[by].type is int:
            try:
                return int(key)
            except ValueError:
                fail(f"--key: the key field {by!r} is an int, got {key!r}", 2)
    return key_argument(key)


@attrs.define
class Shower:
    """Turns entries into lines: decoded as the stream's records, or said undecodable;
    with a key, only the records of that key. An entry is a line, but for an inner
    stream's (a line per event: see :meth:`lines`). ``changes``: the stream is a table
    join's or a global table's inner stream, of changes (see :meth:`_change_lines`)."""

    stream: Stream[Any]
    as_json: bool
    key: bytes | None = None
    changes: bool = False
    key_of: Callable[[Any], object] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.key_of = _key_of(self.stream)

    def lines(self, entry: Entry) -> list[str]:
        """The entry's lines: one, none for a record of another key, or one per event
        of a join's inner entry (a forwarder's batch: up to 500)."""
        head: dict[str, Any] = {"partition": entry.partition, "id": entry.id}
        if len(entry.fields) == 1 and (PACKED in entry.fields or HEARTBEAT in entry.fields):
            joined = self._join_lines(entry, head)
            if joined is not None:
                return joined
        if self.changes and len(entry.fields) == 1 and CHANGE_FIELD in entry.fields:
            changed = self._change_lines(entry, head)
            if changed is not None:
                return changed
        line = self._line(entry, head)
        return [] if line is None else [line]

    def _line(self, entry: Entry, head: dict[str, Any]) -> str | None:
        """The line of an entry of one record, or ``None`` for a record of another key."""
        try:
            record = self.stream.codec.decode(
                entry.fields, stream=self.stream.name, partition=entry.partition, entry_id=entry.id
            )
        except DecodeError as exc:
            if self.key is not None:
                return None  # no key to match
            fields = {
                k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                for k, v in entry.fields.items()
            }
            if self.as_json:
                body = orjson.dumps({**head, "undecodable": exc.reason, "fields": fields})
                return printable(body.decode())
            return f"{entry.partition}\t{printable(entry.id)}\tundecodable: {printable(exc.reason)}"
        if self.key is not None:
            try:
                if canonical_key_bytes(self.key_of(record)) != self.key:
                    return None
            except Exception:
                return None
        value = orjson.dumps(converter.unstructure(record)).decode()
        if self.as_json:
            return printable(orjson.dumps({**head, "record": orjson.Fragment(value)}).decode())
        return f"{entry.partition}\t{printable(entry.id)}\t{printable(value)}"

    def _change_lines(self, entry: Entry, head: dict[str, Any]) -> list[str] | None:
        """A table join's or a global table's inner entry (see
        ``PartitionState._feed``): the change of one key, a JSON array ``[side, key as
        latin-1 text, value or null]``, shown as the side (a table join's ``left`` or
        ``right``), the key and the value (``deleted`` for null); ``None`` if it is not
        one (then said undecodable)."""
        try:
            tag, latin, value = orjson.loads(entry.fields[CHANGE_FIELD])
            field = latin.encode("latin-1")
        except (ValueError, TypeError, AttributeError):  # (UnicodeEncodeError too)
            return None
        if tag not in ("L", "R", "G"):
            return None
        if self.key is not None and field != self.key:
            return []
        side = {"L": "left", "R": "right"}.get(tag)
        key = key_text(field)
        if self.as_json:
            body = {**head, "side": side} if side is not None else {**head}
            body["key"] = key
            body.update({"deleted": True} if value is None else {"value": value})
            return [printable(orjson.dumps(body).decode())]
        said = printable(key) if side is None else f"{side} {printable(key)}"
        said += " deleted" if value is None else f": {printable(orjson.dumps(value).decode())}"
        return [f"{entry.partition}\t{printable(entry.id)}\t{said}"]

    def _join_lines(self, entry: Entry, head: dict[str, Any]) -> list[str] | None:
        """A join's inner entry (see :mod:`streamkit._joins`): a line per forwarded
        event (its side, key, event time and record), or the heartbeat of a side;
        ``None`` if it is not one (then said undecodable)."""
        try:
            if HEARTBEAT in entry.fields:
                side, at = read_heartbeat(entry.fields[HEARTBEAT])
                events: list[Any] = []
                beat = (("left", "right")[side], at)
            else:
                events, beat = unpack_forwarded(entry.fields[PACKED]), None
        except ValueError:
            return None

        def when(ms: int) -> str:
            return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")

        if beat is not None:
            if self.key is not None:
                return []
            if self.as_json:
                body = {**head, "heartbeat": beat[0], "time": when(beat[1])}
                return [printable(orjson.dumps(body).decode())]
            said = f"heartbeat: {beat[0]} side at {when(beat[1])}"
            return [f"{entry.partition}\t{printable(entry.id)}\t{said}"]
        lines = []
        for side, key, at, form, stored in events:
            if self.key is not None and key != self.key:
                continue
            record = (
                orjson.Fragment(stored) if form == JSON_FORM else {"fields": orjson.loads(stored)}
            )
            name = "left" if side == b"L" else "right"
            if self.as_json:
                body = {
                    **head,
                    "side": name,
                    "key": key_text(key),
                    "time": when(at),
                    "record": record,
                }
                lines.append(printable(orjson.dumps(body).decode()))
            else:
                value = orjson.dumps(record).decode()
                lines.append(
                    f"{entry.partition}\t{printable(entry.id)}\t{name} "
                    f"{printable(key_text(key))} at {when(at)}: {printable(value)}"
                )
        return lines


# -- the commands ----------------------------------------------------------------------


def _partitions(stream: Stream[Any], partition: int | None, key: object | None) -> list[int]:
    if partition is not None and key is not None:
        fail("give --partition or --key, not both", 2)
    if partition is not None:
        if not 0 <= partition < stream.partition_count:
            fail(f"--partition must be 0..{stream.partition_count - 1}", 2)
        return [partition]
    if key is not None:
        try:
            return [partition_for(key, stream.partition_count)]
        except ConfigError as exc:
            fail(f"--key: {exc.reason}", 2)
    return list(range(stream.partition_count))


_follow_option = click.option(
    "--follow", "-f", is_flag=True, help="Then print new entries as they come, until Ctrl-C."
)


def _filter_options(function: Any) -> Any:
    function = click.option(
        "--partition", type=click.IntRange(min=0), default=None, help="Only this partition."
    )(function)
    return click.option(
        "--key",
        default=None,
        metavar="KEY",
        help="Only the records of this partition key (its partition, filtered).",
    )(function)


async def _show(entries: AsyncIterator[Entry], shower: Shower, limit: int | None) -> None:
    """The lines of ``entries``, the first ``limit`` of them (lines, not entries: an
    inner stream's entry is many)."""
    shown = 0
    async for entry in entries:
        for line in shower.lines(entry):
            click.echo(line)
            shown += 1
            if limit is not None and shown >= limit:
                return


@click.command()
@click.argument("stream_path", metavar="MODULE:STREAM")
@click.option(
    "--from",
    "start",
    default="start",
    metavar="WHERE",
    help="start (the default), an entry id or an ISO 8601 time.",
)
@click.option(
    "--to",
    "end",
    default="end",
    metavar="WHERE",
    help="end (the default), an entry id or an ISO 8601 time.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Print at most N lines (an entry is a line; a join's inner entry a line per event).",
)
@_follow_option
@_filter_options
@json_option
@redis_url_option
async def read(
    stream_path: str,
    start: str,
    end: str,
    count: int | None,
    follow: bool,
    partition: int | None,
    key: str | None,
    as_json: bool,
    redis_url: str | None,
) -> None:
    """Print a stream's entries from --from to --to, all partitions merged in the order
    Redis added them: PARTITION<TAB>ID<TAB>RECORD (as JSON) a line, or one JSON object
    a line with --json. An entry that does not decode as the stream's record says so.
    MODULE:STREAM may name a stream a processor emits to (a window's output) by its
    name."""
    try:
        first, last = parse_position(start, end=False), parse_position(end, end=True)
    except ValueError as exc:
        fail(f"--from/--to: {exc}", 2)
    if follow and (end != "end" or count is not None):
        fail("--follow reads on past the end: it goes with neither --to nor --count", 2)
    app, shower, keys = _prepare(stream_path, redis_url, follow, partition, key, as_json)
    async with until_signal(), _connected(app) as redis:
        await _check_recorded(redis, shower.stream)
        if not follow:
            await _show(merged_range(redis, keys, first, last), shower, count)
            return
        # On from where the range ended, partition by partition.
        after = await last_ids(redis, keys)
        await _show(_noting(merged_range(redis, keys, first, "+"), after), shower, None)
        await _show(follow_on(redis, keys, after), shower, None)


@click.command()
@click.argument("stream_path", metavar="MODULE:STREAM")
@click.option(
    "-n",
    "--lines",
    "count",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="The last N lines (an entry is a line; a join's inner entry a line per event).",
)
@_follow_option
@_filter_options
@json_option
@redis_url_option
async def tail(
    stream_path: str,
    count: int,
    follow: bool,
    partition: int | None,
    key: str | None,
    as_json: bool,
    redis_url: str | None,
) -> None:
    """Print a stream's last entries, all partitions merged in the order Redis added
    them (as read does), then with --follow the new ones as they come."""
    app, shower, keys = _prepare(stream_path, redis_url, follow, partition, key, as_json)
    async with until_signal(), _connected(app) as redis:
        await _check_recorded(redis, shower.stream)
        after = await last_ids(redis, keys)
        for line in await _newest(redis, keys, shower, count):
            click.echo(line)
        if follow:
            await _show(follow_on(redis, keys, after), shower, None)


def _prepare(
    stream_path: str,
    redis_url: str | None,
    follow: bool,
    partition: int | None,
    key: str | None,
    as_json: bool,
) -> tuple[App, Shower, dict[int, str]]:
    """The app, the lines' maker and the partitions' keys of a read or a tail."""
    app, stream = load_stream(stream_path, redis_url, one_shot=not follow, by_name=True)
    typed = None if key is None else _typed_key(stream, key)
    partitions = _partitions(stream, partition, typed)
    inner = inner_stream_of(app, stream)
    changes = inner is not None and inner[0] != "join"
    shower = Shower(
        stream, as_json, None if typed is None else canonical_key_bytes(typed), changes=changes
    )
    return app, shower, {p: stream.key(p) for p in partitions}


async def _check_recorded(redis: Redis, stream: Stream[Any]) -> None:
    """Refuse (exit code 2) a stream the code declares with other settings than Redis
    records for it, as a send and a worker do: fewer partitions would hide some of its
    events without a word. A stream Redis records nothing of is not recorded here."""
    spec = stream.spec
    with redis_errors():
        recorded = await redis.hgetall(spec.meta_key)
    if recorded:
        mismatch = compare_metadata(metadata_pairs(recorded), spec.metadata())
        if mismatch is not None:
            fail(str(MetadataMismatch(spec.name, *mismatch)), 2)


@contextlib.asynccontextmanager
async def _connected(app: App) -> AsyncIterator[Redis]:
    """``app`` connected until the block ends; an error of streamkit's is the command's
    one line (a reader gone, ``| head``, is its quiet end: see streamkit._cli._exits).

    Entered inside :func:`until_signal`, never around it: a signal while connecting
    then cancels the connecting (exit code 0), where a generator that caught it
    itself would end without yielding.
    """
    try:
        async with app:
            yield app.redis
    except StreamkitError as exc:
        fail(str(exc))


async def _newest(redis: Redis, keys: dict[int, str], shower: Shower, count: int) -> Sequence[str]:
    """The last ``count`` lines shown (of the key, with ``--key``)."""
    if count == 0:
        return []
    if shower.key is None:
        # (Each entry a line at least: the last ``count`` entries have enough.)
        entries = await last_entries(redis, keys, count)
        return [line for e in entries for line in shower.lines(e)][-count:]
    # Records of one key among others: read back from the end until there are enough.
    found: list[list[str]] = []
    shown = 0
    async for entry in _backwards(redis, keys):
        lines = shower.lines(entry)
        found.append(lines)
        shown += len(lines)
        if shown >= count:
            break
    return [line for lines in found[::-1] for line in lines][-count:]


async def _backwards(redis: Redis, keys: dict[int, str]) -> AsyncIterator[Entry]:
    """One partition's entries, newest first (``--key`` names one partition)."""
    [(partition, key)] = keys.items()
    end = "+"
    while True:
        with redis_errors():
            reply = await redis.xrevrange(key, end, "-", count=PAGE)
        page = _entries(partition, reply)
        for entry in page:
            yield entry
        if len(page) < PAGE:
            return
        end = f"({page[-1].id}"
