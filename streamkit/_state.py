"""Partition state: a processor's table writes and emitted records, committed exactly once.

While a processor works on a partition, its effects pass through three layers, which
mirror the delivery's bookkeeping (:mod:`streamkit._events_ledger`):

* *tentative*: the effects of the events in flight. When the processor moves past
  them they are promoted; when it fails on them (a retry, a dead letter, a halt, a
  cancellation) they are discarded with them;
* *done*: the effects of events the processor moved past, waiting for the commit;
* *committed*: handed to the feed as :class:`~streamkit.lowlevel.Changes` with the
  acknowledgement of the events behind them, and applied by the same fenced script
  call, or not at all. A per-partition cache remembers committed values, so a hot key
  costs one round trip per partition, not one per event.

A refused or doubtful commit (the lease lost, the connection lost mid-call) stops the
partition; whoever processes it next starts from what Redis holds, and the events
whose commit did not land are delivered again. So every table and every emitted
stream reflects each event exactly once.

The state of the partition being processed is found through a context variable set by
:func:`~streamkit.open_events`: a table's ``get``/``set`` inside the processor reach
its view without passing anything around.
"""

from __future__ import annotations

import contextvars
import logging
import math
from typing import TYPE_CHECKING, Any, final

import orjson
import trio

from . import _keys
from ._codec import _DATA_FIELDS
from ._commit import Changes
from ._defaults import DEFAULT_PARTITION_SIZE, DEFAULT_STATE_CACHE_SIZE
from ._errors import ConfigError, EncodeError, RedisUnavailable, StreamkitError
from ._event import UNDECODED
from ._json_converter import converter
from ._partitioner import canonical_key_bytes, key_text
from ._redis import is_cluster, redis_errors
from ._spec import spec_of
from ._state_expiry import ExpiringTableView
from ._state_join_sides import HEARTBEAT
from ._state_joins import JoinView
from ._state_relay import OutboxRelay
from ._state_views import (
    GlobalWriterView,
    TableLike,
    TableView,
    WindowLike,
    WindowView,
)
from ._state_windows import Closed, FixedWindowView
from ._streams import Stream, check_metadata
from ._windows import Window, idle_watermark
from .jobs._committed import CommittedJobs

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    #: What emits plain JSON dicts to an output, into a list of emitted entries.
    PlainEmitter = Callable[[list[dict[str, Any]], list["Emitted"]], None]

    from ._locks import HeldLease
    from ._redis import Redis
    from ._spec import HasSpec, ProcessorKeys, StreamSpec
    from .jobs import Job, JobCall, JobHandle

__all__ = [
    "DEFAULT_STATE_CACHE_SIZE",
    "PartitionState",
    "TableLike",
    "current_view",
    "current_window_view",
    "writing_view",
]

log = logging.getLogger("streamkit.state")

#: The state hash's field holding the partition's watermark (ms since the epoch).
WATERMARK_FIELD = b"watermark"
#: The state hash's field prefix of a windowed table's count of late events.
LATE_FIELD = "late:"
#: The state hash's field (then the join's name) counting a join's buffered events.
BUFFERED_FIELD = "buffered:"
#: The state hash's field (a prefix, then the join's name) of how far each side of a
#: join has come (see :meth:`streamkit._state_join_sides.Sides.stored`).
SIDES_FIELD = "sides:"
#: Seconds after which a partition waiting for events settles again when some window
#: or join buffer is due but was put off (its commit in flight, or more due than one
#: round closes): the watermark passed it, and no later event need come to close it.
SETTLE_RETRY = 0.02
#: The one field of an entry carrying a table's change on (see PartitionState._feed).
CHANGE_FIELD = _DATA_FIELDS[None]


_current: contextvars.ContextVar[PartitionState | None] = contextvars.ContextVar(
    "streamkit_partition_state", default=None
)


def current_view(table: TableLike) -> TableView | None:
    """The view of ``table`` of the partition being processed here, if its writer."""
    state = _current.get()
    if state is None:
        return None
    return state.views.get(table)


def writing_view(table: TableLike) -> TableView:
    """As :func:`current_view`, for a write: raise unless this processor writes it."""
    view = current_view(table)
    if view is None:
        raise ConfigError(
            "tables",
            f"table {table.name!r} is written only by its processor, inside it (name "
            f"it in @app.processor(..., tables=[...]), or pass it to open_events)",
        )
    return view


def current_window_view(table: WindowLike) -> WindowView | FixedWindowView:
    """The view of the windowed ``table`` of the partition being processed here."""
    state = _current.get()
    fixed = None if state is None else state.fixed_views.get(table)
    if fixed is not None:
        return fixed
    view = writing_view(table)
    assert isinstance(view, WindowView)
    return view


#: Values the converter returns unchanged, whatever they are (not floats: NaN).
_JSON_SCALARS = frozenset({str, int, bool, type(None)})


def default_result(key: str, window: Window, value: Any) -> dict[str, Any]:
    """A closed window as a ``dict`` record: key, start, end (ISO 8601) and value."""
    return {
        "key": key,
        "start": window.start.isoformat(),
        "end": window.end.isoformat(),
        "value": converter.unstructure(value),
    }


Value = bytes | str | int | float


@final
class Run:
    """Entries of one field each, to one partition of an output, in order: what a
    window's closing or a join emits in bulk (a commit appends them as one run)."""

    __slots__ = ("field", "target", "values")

    def __init__(self, target: str, field: bytes, values: list[Value]) -> None:
        self.target = target
        self.field = field
        self.values = values


#: An emitted entry: ``(stream key, entry fields)`` (an empty key: a job, for the
#: relay), or a :class:`Run` of single-field entries.
Emitted = tuple[str, list[Value]] | Run


def _is_windowed(table: TableLike) -> bool:
    return getattr(table, "kind", None) is not None


def _resolved(record: Any) -> Any:
    """``record`` with the JSON it holds in place (``orjson.Fragment``: a join's default
    result) made values, for a codec that takes values only."""
    if type(record) is dict and any(type(v) is orjson.Fragment for v in record.values()):
        return orjson.loads(orjson.dumps(record))
    return record


class PartitionState:
    """The state of one partition of one processor: its tables, emitted records and
    enqueued jobs.

    Created by :func:`~streamkit.open_events` (``tables=``, ``outputs=``, ``jobs=``)
    for the partition it opens; see the module docs for the layers.

    Attributes:
        partition: the partition.
        views: each table's view of the partition.
        outputs: the streams the processor may emit to, by name.
    """

    def __init__(
        self,
        redis: Redis,
        stream: StreamSpec[Any],
        keys: ProcessorKeys,
        partition: int,
        *,
        tables: Iterable[TableLike] = (),
        outputs: Iterable[StreamSpec[Any] | HasSpec[Any]] = (),
        jobs: Iterable[Job[Any, Any]] = (),
        cache_size: int = DEFAULT_STATE_CACHE_SIZE,
        replicas: int = 0,
    ) -> None:
        self.partition = partition
        self._redis = redis
        self._stream = stream
        # Tables' (and sessions') views, and the views of tumbling and hopping windows.
        self.views: dict[TableLike, TableView] = {}
        self.fixed_views: dict[TableLike, FixedWindowView] = {}
        self.windows: list[WindowView | FixedWindowView] = []
        self.expiring: list[ExpiringTableView] = []
        # The views whose done writes are also sent on, as changes, to these streams.
        self._feeding: list[tuple[TableView, list[tuple[StreamSpec[Any], bytes]]]] = []
        # The partition's clock for expiry: the time (ms) of the newest event processed
        # (its entry id's), and when (Trio time) it last moved; the id of the newest
        # event in flight, as the delivery's ledger tells.
        self._clock: float = -math.inf
        self._clock_at = trio.current_time()
        self.event_id: Callable[[], bytes | None] = lambda: None
        self._clock_id: bytes | None = None
        self._clock_ms = 0
        count = stream.partition_count
        # The joins' views: their sides bound the watermark (see _state_join_sides).
        self._joins: list[JoinView] = []
        for table in tables:
            if getattr(table, "joins", False):
                joined = JoinView(table, partition, count, redis, cache_size)  # type: ignore[arg-type]
                joined.on_time = self.observe
                self._joins.append(joined)
                self.views[table] = joined
                self.windows.append(joined)
                # (its inner stream, this processor's own, for the sides' heartbeats)
                outputs = [*outputs, table.output, stream]  # type: ignore[attr-defined]
            elif _is_windowed(table):
                window: WindowView | FixedWindowView
                if getattr(table, "fixed", False):
                    window = FixedWindowView(table, partition, count, redis, cache_size)  # type: ignore[arg-type]
                    self.fixed_views[table] = window
                else:
                    window = WindowView(table, partition, count, redis, cache_size)  # type: ignore[arg-type]
                    self.views[table] = window
                window.on_time = self.observe
                self.windows.append(window)
                output = getattr(table, "output", None)
                if output is not None:
                    outputs = [*outputs, output]
            elif getattr(table, "is_global", False):
                self.views[table] = GlobalWriterView(table, partition, count, redis, cache_size)
            elif getattr(table, "ttl", None) is not None:
                expiring = ExpiringTableView(table, partition, count, redis, cache_size)
                expiring.now = self.event_time
                self.expiring.append(expiring)
                self.views[table] = expiring
            else:
                self.views[table] = TableView(table, partition, count, redis, cache_size)
            feeds: list[tuple[StreamSpec[Any], bytes]] = getattr(table, "feeds", [])
            if feeds:
                # Its changes go on to a table join or a global table (see _table_joins).
                self._feeding.append((self.views[table], feeds))
                outputs = [*outputs, *(spec for spec, _ in feeds)]
        # The plain tables' views, which a batch's partition keys are read into at once
        # (a table is keyed like its stream, as a rule: see prefetch).
        self._prefetched = [
            v for v in self.views.values() if type(v) is TableView or type(v) is ExpiringTableView
        ]
        self._key_of = stream.partitioner.key_of
        # Every view, for the per-event calls.
        self._view_list: list[TableView | FixedWindowView] = [
            *self.views.values(),
            *self.fixed_views.values(),
        ]
        self._state_key = _keys.state_key(stream.app, stream.name, keys.processor, partition)
        # The partition's watermark (ms): done (of events moved past, and idle ticks),
        # tentative (of the events in flight), and as last handed to a commit.
        self.watermark = -math.inf
        self._watermark_tentative = -math.inf
        self._watermark_written = -math.inf
        # When (Trio time) the watermark last moved: idle time counts from there.
        self._moved_at = trio.current_time()
        self._moved_pending = False
        self._late_base: dict[str, int] = {}
        self._buffered_base: dict[str, int] = {}
        outputs = list(dict.fromkeys(outputs))
        self.outputs: dict[str, StreamSpec[Any]] = {spec_of(o).name: spec_of(o) for o in outputs}
        # Entries each output's partitions keep when appends trim them.
        self._keep = {
            spec_of(o).name: (
                o.settings.partition_size if isinstance(o, Stream) else DEFAULT_PARTITION_SIZE
            )
            for o in outputs
        }
        self._keep_of_key: dict[str, int] = {}
        # What emitting to each output needs, by the id of the object given (kept).
        self._emitters: dict[
            int, tuple[object, StreamSpec[Any], list[str], list[bytes] | None]
        ] = {}
        self._plain_emitters: dict[int, tuple[object, PlainEmitter | None]] = {}
        # Emitted records go through the outbox on Redis Cluster; enqueued jobs always
        # do (the enqueue script runs on the job's shard, see jobs._committed).
        outbox = _keys.outbox_key(stream.app, stream.name, keys.processor, partition)
        self._outbox = outbox if is_cluster(redis) and self.outputs else None
        jobs = list(jobs)
        self._jobs = CommittedJobs(jobs) if jobs else None
        self._job_outbox = outbox if jobs else None
        self._source = f"{stream.app}.{stream.name}.{partition}.{keys.processor}"
        self._replicas = replicas
        self.relay: OutboxRelay | None = None
        self._tentative_out: list[Emitted] = []
        self._done_out: list[Emitted] = []
        # Why a settling round was cut short, if one was: its windows may be closed here
        # with their results lost with the error, so nothing of this state is committed
        # any more (the partition starts over from what Redis holds).
        self._unsettled: StreamkitError | None = None

    async def open(self) -> None:
        """Check the output streams' metadata (commits write them) and, with windows,
        load the watermark and the windows' index."""
        for spec in self.outputs.values():
            await check_metadata(self._redis, spec)
        for expiring in self.expiring:
            await expiring.open()
        if self.windows:
            with redis_errors():
                stored: Any = await self._redis.hgetall(self._state_key)
            fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in stored.items()}
            if WATERMARK_FIELD.decode() in fields:
                self.watermark = int(fields[WATERMARK_FIELD.decode()])
                self._watermark_written = self.watermark
            self._watermark_tentative = self.watermark
            for view in self.windows:
                self._late_base[view.table.name] = int(fields.get(LATE_FIELD + view.table.name, 0))
                if isinstance(view, JoinView):
                    stored_count = fields.get(BUFFERED_FIELD + view.table.name, 0)
                    self._buffered_base[view.table.name] = int(stored_count)
                    view.sides.load(fields.get(SIDES_FIELD + view.table.name))
                view.watermark = self.watermark
                await view.open()

    @property
    def prefetches(self) -> bool:
        """Whether :meth:`prefetch` reads anything: the processor keeps plain tables,
        or tumbling or hopping windows with values in Redis not known here."""
        return bool(self._prefetched) or any(v.prefetches for v in self.fixed_views.values())

    async def prefetch(self, records: list[Any]) -> None:
        """Read the partition keys of a batch's ``records`` that the plain tables do not
        know yet, in one ``HMGET`` per table: a processor keeping state by its stream's
        key (the usual case) then finds each event's value cached, where a ``get`` of a
        key new to the worker would cost a round trip per event. A table keyed
        otherwise costs one ``HMGET`` per batch and finds nothing."""
        key_of = self._key_of
        fields: dict[bytes, None] = {}
        try:
            for record in records:
                if record is not UNDECODED:
                    fields[canonical_key_bytes(key_of(record))] = None
        except Exception:  # a bad key: the processor meets it, and its policy decides
            return
        for view in self._prefetched:
            await view.prefetch(fields, checked=False)
        for window in self.fixed_views.values():
            if window.prefetches:
                await window.prefetch(records, key_of)

    # -- the watermark --

    def observe(self, at: int) -> None:
        """An event in flight has event time ``at`` (ms)."""
        if at > self._watermark_tentative:
            self._watermark_tentative = at
            for view in self.windows:
                view.watermark = at

    @property
    def settles(self) -> bool:
        """Whether the partition has windows to close or keys to expire before commits."""
        return bool(self.windows or self.expiring)

    def event_time(self) -> int:
        """The time (ms) of the newest event in flight (its entry id's): the partition's
        clock for expiry; with none in flight, the clock moved on by the time idle."""
        event_id = self.event_id()
        if event_id is None:
            return self._idle_clock()
        if event_id is self._clock_id:  # the same event as the last call (get, then set)
            return self._clock_ms
        ms = int(event_id[: event_id.index(b"-")])
        self._clock_id = event_id
        self._clock_ms = ms
        if ms > self._clock:
            self._clock = ms
            self._clock_at = trio.current_time()
        return ms

    def note_done(self, newest: bytes) -> None:
        """The events up to entry ``newest`` are done: the clock is at least its time."""
        ms = int(newest[: newest.index(b"-")])
        if ms > self._clock:
            self._clock = ms
            self._clock_at = trio.current_time()

    def _idle_clock(self) -> int:
        if self._clock == -math.inf:
            return 0
        return int(self._clock) + math.floor((trio.current_time() - self._clock_at) * 1000)

    def idle_deadline(self) -> float:
        """The Trio time at which idleness would close a window or expire a key of this
        partition, or a settling round put off is tried again (``inf`` if none): see
        :func:`~streamkit._windows.idle_watermark`."""
        deadline = math.inf
        if self.watermark != -math.inf and any(
            view.next_due <= self.watermark for view in self.windows
        ):
            # Due and put off (see SETTLE_RETRY), whatever the idle rule.
            deadline = trio.current_time() + SETTLE_RETRY
        idle = [view for view in self.windows if view.window.idle]
        base = self._idle_base()
        if idle and base != -math.inf:
            due = min(view.next_due for view in idle)
            if due != math.inf:
                at = self.moved_at + max(0.0, (due - base) / 1000) + 0.001
                for join in self._joins:  # Redis asked at most so often
                    at = max(at, join.sides.next_check)
                deadline = min(deadline, at)
        for join in self._joins:
            # (without the idle rule, a side holding the windows open is watched until
            # it has been said: see tick)
            if not join.window.idle and join.withholding() and not join.sides.warned():
                deadline = min(deadline, join.sides.next_check)
        if self.expiring and self._clock != -math.inf:
            due = min(view.next_due for view in self.expiring)
            if due != math.inf:
                at = self._clock_at + max(0.0, (due - self._clock) / 1000) + 0.001
                deadline = min(deadline, at)
        return deadline

    @property
    def moved_at(self) -> float:
        """When (Trio time) the watermark last moved: idle time counts from there."""
        if self._moved_pending:
            self._moved_pending = False
            self._moved_at = trio.current_time()
        return self._moved_at

    def restart_idle(self) -> None:
        """The partition was not idle after all: count idle time from now."""
        self._moved_at = self._clock_at = trio.current_time()
        self._moved_pending = False

    def _idle_base(self) -> float:
        """What idle time counts on from: the watermark, or a join's newest event
        (which its sides may not let the watermark reach yet)."""
        base = self.watermark
        for join in self._joins:
            base = max(base, *join.sides.seen)
        return base

    async def tick(self) -> None:
        """The partition is idle: move the watermark on by the time it has been idle
        (if a window or join follows the idle rule), and settle. A join's moves only
        with its sides: each side whose forwarder has nothing left to forward, Redis
        says, gets a heartbeat of that time (see :mod:`streamkit._state_join_sides`)."""
        base = self._idle_base()
        if base != -math.inf and any(view.window.idle for view in self.windows):
            idle_for = math.floor((trio.current_time() - self.moved_at) * 1000)
            target = idle_watermark(int(base), idle_for)
            if not self._joins:
                self._advance(target)
            for join in self._joins:  # (moved on by the heartbeats, once read back)
                beats = await join.sides.idle_heartbeats(target)
                if beats:
                    self.emit_run(self._stream, self.partition, HEARTBEAT, beats, done=True)
        for join in self._joins:
            # Without the idle rule only events move a side on: one that holds the
            # windows open is watched, to be said (see _state_join_sides).
            if not join.window.idle and join.withholding() and join.sides.due():
                await join.sides.caught_up(max(join.sides.seen), moves=False)
        await self.settle(clock=self._idle_clock())

    def _advance(self, watermark: float) -> None:
        if watermark > self.watermark:
            self.watermark = watermark
            self._moved_at = trio.current_time()
            self._moved_pending = False
        if self.watermark > self._watermark_tentative:
            self._watermark_tentative = self.watermark
        for view in self.windows:
            view.watermark = self._watermark_tentative

    async def settle(self, *, clock: int | None = None) -> None:
        """Close the windows the watermark has passed (their final values become done
        outputs, written with the next commit) and delete the keys expired by
        ``clock`` (the partition's clock by default).

        Error handling:
            A round cut short (Redis lost while it read, say) may have closed windows
            whose results go with the error: its error is raised again by every later
            ``settle`` and :meth:`take_changes`, so that nothing of this state is
            committed and the partition starts over from what Redis holds.
        """
        self._check_settled()
        try:
            await self._settle(clock)
        except BaseException as exc:
            self._unsettled = (
                exc
                if isinstance(exc, StreamkitError)
                else RedisUnavailable("redis", "closing the windows was cut short")
            )
            raise

    def _check_settled(self) -> None:
        if self._unsettled is not None:
            raise self._unsettled

    async def _settle(self, clock: int | None) -> None:
        if self._moved_pending:
            self._moved_at = trio.current_time()  # the batch's end: when it moved, closely
            self._moved_pending = False
        if self.expiring:
            at = int(self._clock) if clock is None and self._clock != -math.inf else clock
            if at is not None:
                for expiring in self.expiring:
                    await expiring.sweep(at)
        if self.watermark == -math.inf:
            return
        watermark = int(self.watermark)
        for view in self.windows:
            if isinstance(view, JoinView):  # unmatched events, their results made
                join: Any = view.window
                results: list[Any] = await view.settle(watermark)
                fast = self._plain_emitter_of(join.output) if join.plain else None
                if fast is not None:
                    fast(results, self._done_out)
                else:
                    self._done_out.extend(
                        self._encode_output(join.output, _resolved(r)) for r in results
                    )
                continue
            closed: list[Closed]
            if isinstance(view, FixedWindowView):
                closed = await view.settle(watermark)
            else:  # sessions: each key's own bounds
                sessions = await view.settle(watermark)
                closed = [(start, end, {field: value}) for field, start, end, value in sessions]
            output = getattr(view.window, "output", None)
            if output is not None and closed:
                self._emit_closed(view.window, output, closed)

    def _emit_closed(
        self, table: Any, output: StreamSpec[Any] | HasSpec[Any], closed: list[Closed]
    ) -> None:
        """Emit the results of the windows closed now, ``(start, end, {key field:
        value})`` each, to ``output`` (done)."""
        result = getattr(table, "result", default_result)
        done = self._done_out
        encode = self._encode_output
        if result is not default_result:
            for start, end, values in closed:
                window = Window.from_ms(start, end)
                for field, value in values.items():
                    done.append(encode(output, result(key_text(field), window, value)))
            return
        fast = self._plain_emitter_of(output)
        unstructure = converter.unstructure

        def records_of(
            values: dict[bytes, Any], first: str, last: str, text: Callable[[bytes], str]
        ) -> list[dict[str, Any]]:
            return [
                {
                    "key": text(field),
                    "start": first,
                    "end": last,
                    "value": value if type(value) in _JSON_SCALARS else unstructure(value),
                }
                for field, value in values.items()
            ]

        for start, end, values in closed:
            window = Window.from_ms(start, end)
            # The keys of one window share its bounds: written once per window.
            first, last = window.start.isoformat(), window.end.isoformat()
            try:  # (key_text, its usual case first)
                records = records_of(values, first, last, bytes.decode)
            except UnicodeDecodeError:
                records = records_of(values, first, last, key_text)
            if fast is not None:
                fast(records, done)
            else:
                done.extend(encode(output, record) for record in records)

    def emit_run(
        self,
        stream: StreamSpec[Any] | HasSpec[Any],
        partition: int,
        field: bytes,
        values: list[Any],
        *,
        done: bool = False,
    ) -> None:
        """Emit entries of the one field ``field``, one per value of ``values``, as
        stored (no codec), to ``partition`` of ``stream`` (tentatively, in order; or
        ``done``, for the next commit): a join's forwarder, a batch at a time (one
        :class:`Run`; one entry each through an outbox)."""
        emitter = self._emitters.get(id(stream))
        if emitter is None or emitter[0] is not stream:
            emitter = self._emitter(stream)
        _, _, keys, targets = emitter
        key = keys[partition]
        out = self._done_out if done else self._tentative_out
        if targets is None:
            out.append(Run(key, field, values))
        else:
            target = targets[partition]
            out.extend([(key, [b"__to", target, field, v]) for v in values])

    def _plain_emitter_of(self, stream: StreamSpec[Any] | HasSpec[Any]) -> PlainEmitter | None:
        """:meth:`_plain_emitter` of ``stream``, made once."""
        known = self._plain_emitters.get(id(stream))
        if known is None or known[0] is not stream:
            known = self._plain_emitters[id(stream)] = (stream, self._plain_emitter(stream))
        return known[1]

    def _plain_emitter(self, stream: StreamSpec[Any] | HasSpec[Any]) -> PlainEmitter | None:
        """For an output of plain JSON ``dict`` records, what emits dicts already made of
        JSON values (a window's default results, a join's) with one ``orjson.dumps``
        each, their partitions found in one loop and each partition's entries added as
        one :class:`Run`: as the codec would, without its checks of each item; ``None``
        for other outputs."""
        emitter = self._emitters.get(id(stream))
        if emitter is None or emitter[0] is not stream:
            emitter = self._emitter(stream)
        _, spec, keys, targets = emitter
        codec = spec.codec
        if spec.record is not dict or codec.name != "json" or targets is not None:
            return None
        field = _DATA_FIELDS[None]
        limit = min(codec.max_decoded_size, codec.max_record_size - len(field))
        partitions_of = spec.partitioner.partitions_of
        dumps = orjson.dumps

        def emit(records: list[dict[str, Any]], into: list[Emitted]) -> None:
            if len(records) == 1:  # a join's pair, say: an entry, no run
                record = records[0]
                try:
                    payload = dumps(record)
                except TypeError:
                    payload = b""
                if not payload or len(payload) > limit:
                    into.append(self._encode_output(stream, record))
                else:
                    into.append((keys[partitions_of(records)[0]], [field, payload]))
                return
            runs: dict[int, list[Value]] = {}
            for record, partition in zip(records, partitions_of(records), strict=True):
                try:
                    payload = dumps(record)
                except TypeError:
                    payload = b""
                if not payload or len(payload) > limit:
                    # The codec says why, or encodes it otherwise (compressed, say):
                    # after what went before it to the same partition.
                    into.extend(Run(keys[p], field, values) for p, values in runs.items())
                    runs = {}
                    into.append(self._encode_output(stream, record))
                    continue
                run = runs.get(partition)
                if run is None:
                    runs[partition] = [payload]
                else:
                    run.append(payload)
            into.extend(Run(keys[p], field, values) for p, values in runs.items())

        return emit

    # -- emitting --

    def emit(self, stream: StreamSpec[Any] | HasSpec[Any], record: Any) -> None:
        """Emit ``record`` to ``stream`` (tentatively, in order)."""
        self._tentative_out.append(self._encode_output(stream, record))

    def emit_many(self, stream: StreamSpec[Any] | HasSpec[Any], records: list[Any]) -> None:
        """Emit ``records`` to ``stream`` (tentatively, in order)."""
        self._tentative_out.extend([self._encode_output(stream, r) for r in records])

    def emit_plain(
        self, stream: StreamSpec[Any] | HasSpec[Any], records: list[dict[str, Any]]
    ) -> None:
        """Emit ``records``, ``dict`` s already made of JSON values (a join's default
        results), to ``stream`` (tentatively, in order): one ``orjson.dumps`` each
        where the output takes plain JSON dicts, else as :meth:`emit`."""
        fast = self._plain_emitter_of(stream)
        if fast is None:
            self._tentative_out.extend([self._encode_output(stream, _resolved(r)) for r in records])
        else:
            fast(records, self._tentative_out)

    def _encode_output(
        self, stream: StreamSpec[Any] | HasSpec[Any], record: Any
    ) -> tuple[str, list[bytes | str | int | float]]:
        emitter = self._emitters.get(id(stream))
        if emitter is None or emitter[0] is not stream:
            emitter = self._emitter(stream)
        _, spec, keys, targets = emitter
        try:
            fields = spec.codec.encode(record)
        except EncodeError:
            raise
        except Exception as exc:
            raise EncodeError(f"cannot encode {record!r} for {spec.name}: {exc}") from exc
        partition = spec.partitioner.partition_of(record)
        pairs: list[bytes | str | int | float] = (
            [] if targets is None else [b"__to", targets[partition]]
        )
        for name, value in fields.items():
            pairs.append(name)
            pairs.append(value)
        return keys[partition], pairs

    def _emitter(
        self, stream: StreamSpec[Any] | HasSpec[Any]
    ) -> tuple[object, StreamSpec[Any], list[str], list[bytes] | None]:
        """What emitting to ``stream`` needs, worked out once: the stream as given, its
        spec, its partitions' keys and, with an outbox, those keys as relay targets."""
        spec = spec_of(stream)
        known = self.outputs.get(spec.name)
        if known is not spec and known != spec:
            raise ConfigError(
                "outputs",
                f"{spec.name!r} is not an output of this processor: name it in "
                f"@app.processor(..., outputs=[...])",
            )
        keys = spec.partition_keys()
        for key in keys:
            self._keep_of_key[key] = self._keep[spec.name]
        targets = None if self._outbox is None else [key.encode() for key in keys]
        emitter = (stream, spec, keys, targets)
        self._emitters[id(stream)] = emitter
        return emitter

    # -- enqueueing --

    def enqueue(self, job: Job[Any, Any], call: JobCall) -> JobHandle[Any]:
        """Enqueue ``call`` of ``job`` (tentatively, in order): it exists once its
        commit landed and the relay ran it on the job's shard."""
        if self._jobs is None:
            raise ConfigError(
                "jobs",
                "this processor enqueues no jobs: name them in @app.processor(..., "
                "jobs=[...]) or open_events(..., jobs=[...])",
            )
        queue, job_id, shard, pairs = self._jobs.entry(job, call)
        self._tentative_out.append(("", pairs))
        return queue.handle(job_id, shard=shard)

    # -- the layers --

    def promote(self) -> None:
        """The events in flight were processed: their effects are done."""
        for view in self._view_list:
            view.promote()
        if self._watermark_tentative > self.watermark:
            self.watermark = self._watermark_tentative
            # When it moved is read at the batch's end (see moved_at): a clock read
            # per event costs more than the few milliseconds it would tell apart.
            self._moved_pending = True
        if self._tentative_out:
            self._done_out.extend(self._tentative_out)
            self._tentative_out = []

    def discard(self, *, late: str | None = None) -> None:
        """The events in flight failed: forget their effects. ``late``: the windowed
        table whose late event failed them (``update`` raised
        :class:`~streamkit.LateEvent`): the event goes to the dead letters, and counts
        as that table's late event, committed with the acknowledgement behind it as a
        dropped one is."""
        for view in self._view_list:
            view.discard()
        if late is not None:
            for view in self.windows:
                if view.table.name == late:
                    view.late += 1
        self._tentative_out = []
        if self._watermark_tentative > self.watermark:
            self._advance(self.watermark)
            self._watermark_tentative = self.watermark
            for view in self.windows:
                view.watermark = self.watermark

    def take_changes(self) -> Changes | None:
        """The done effects, as changes for the next commit; ``None`` if there are none.

        Error handling:
            The error that cut a settling round short, if one did (:meth:`settle`).
        """
        self._check_settled()
        pins: list[tuple[TableView | FixedWindowView, list[Any]]] = []
        changes = Changes()
        for feeding, feeds in self._feeding:
            self._feed(feeding, feeds)
        for view in self._view_list:
            pinned: list[Any] = []
            view.contribute(changes, pinned)
            if pinned:
                pins.append((view, pinned))
        if self.windows:
            state: list[bytes | str | int | float] = []
            if self.watermark > self._watermark_written:
                self._watermark_written = self.watermark
                state += [WATERMARK_FIELD, int(self.watermark)]
            for view in self.windows:
                if isinstance(view, JoinView) and view.buffered_delta:
                    name = view.table.name
                    self._buffered_base[name] = (
                        self._buffered_base.get(name, 0) + view.buffered_delta
                    )
                    view.buffered_delta = 0
                    state += [BUFFERED_FIELD + name, max(self._buffered_base[name], 0)]
                if isinstance(view, JoinView):
                    sides = view.sides.stored()
                    if sides is not None:
                        state += [SIDES_FIELD + view.table.name, sides]
                if view.late:
                    name = view.table.name
                    self._late_base[name] = self._late_base.get(name, 0) + view.late
                    view.late = 0
                    state += [LATE_FIELD + name, self._late_base[name]]
            changes.hset(self._state_key, state)
        relay = None
        if self._done_out:
            outbox = self._outbox
            appended: dict[str, int] = {}
            if outbox is None:
                # Entries of one field (a JSON record) go to each target as one run: the
                # order per target is kept, and a commit carries 2 values per entry, not 5.
                runs: dict[tuple[str, Any], list[bytes | str | int | float]] = {}
                for item in self._done_out:
                    if type(item) is Run:
                        target = item.target
                        run = runs.get((target, item.field))
                        if run is None:
                            runs[target, item.field] = item.values
                        else:
                            run.extend(item.values)
                        appended[target] = appended.get(target, 0) + len(item.values)
                        continue
                    target, pairs = item
                    if not target:  # a job, for the relay
                        changes.xadd(self._job_outbox, pairs)  # type: ignore[arg-type]
                        continue
                    if len(pairs) == 2:
                        run = runs.get((target, pairs[0]))
                        if run is None:
                            run = runs[target, pairs[0]] = []
                        run.append(pairs[1])
                    else:
                        for (key, field), values in runs.items():
                            changes.xadd_run(key, field, values)
                        runs = {}
                        changes.xadd(target, pairs)
                    appended[target] = appended.get(target, 0) + 1
                for (key, field), values in runs.items():
                    changes.xadd_run(key, field, values)
            else:
                for item in self._done_out:
                    # (No runs: an output through the outbox has no plain emitter.)
                    assert type(item) is not Run
                    target, pairs = item
                    changes.xadd(outbox, pairs)
                    if target:
                        appended[target] = appended.get(target, 0) + 1
            if outbox is None:
                # Straight to the output streams: they are trimmed like any append.
                for target, count in appended.items():
                    keep = self._keep_of_key.get(target, DEFAULT_PARTITION_SIZE)
                    changes.trim(target, count, keep)
            self._done_out = []
            relay = self.relay
        if not changes:
            return None
        if pins or relay is not None:

            def landed() -> None:
                for view, fields in pins:
                    view.unpin(fields)
                if relay is not None:
                    relay.wake()

            changes.on_landed = landed
        return changes

    def _feed(self, view: TableView, feeds: list[tuple[StreamSpec[Any], bytes]]) -> None:
        """Send the done writes of ``view`` on as changes (one entry each: the JSON array
        ``[tag, key as latin-1 text, value as stored or null]``), to the same partition
        of each stream of ``feeds``; committed with them, so exactly once."""
        writes = view.done_writes()
        if not writes:
            return
        dumps = orjson.dumps
        fragment = orjson.Fragment
        for spec, tag in feeds:
            _, _, keys, targets = self._emitter(spec)
            partition = self.partition if len(keys) > 1 else 0
            target = keys[partition]
            side = tag.decode()
            for field, (_, encoded) in writes.items():
                payload = dumps(
                    [side, field.decode("latin-1"), None if encoded is None else fragment(encoded)]
                )
                pairs: list[bytes | str | int | float] = [CHANGE_FIELD, payload]
                if targets is not None:
                    pairs = [b"__to", targets[partition], *pairs]
                self._done_out.append((target, pairs))

    def start_relay(self, held: HeldLease) -> OutboxRelay | None:
        """The relay of this partition's outbox (Redis Cluster, with outputs; jobs), if any:
        run its :meth:`~streamkit._state_relay.OutboxRelay.run` in the partition."""
        outbox = self._outbox or self._job_outbox
        if outbox is None:
            return None
        self.relay = OutboxRelay(
            self._redis,
            outbox,
            self._source,
            held,
            lambda key: self._keep_of_key.get(key, DEFAULT_PARTITION_SIZE),
            replicas=self._replicas,
        )
        return self.relay

    def late_events(self) -> dict[str, int]:
        """Late events counted per windowed table on this partition (committed and
        done)."""
        return {
            view.table.name: self._late_base.get(view.table.name, 0) + view.late
            for view in self.windows
        }

    def activate(self) -> contextvars.Token[PartitionState | None]:
        """Make this the state tables find in this task (and the tasks it starts)."""
        return _current.set(self)

    @staticmethod
    def deactivate(token: contextvars.Token[PartitionState | None]) -> None:
        _current.reset(token)

    def __repr__(self) -> str:
        return (
            f"<PartitionState {self._stream.name} partition {self.partition}: "
            f"{len(self._view_list)} tables, {len(self.outputs)} outputs>"
        )
