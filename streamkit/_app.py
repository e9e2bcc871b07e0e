"""The App facade: names a set of streams and processors and owns the connection.

Why one room (about 650 lines): the facade users read first declares everything an app
has (streams, tables, windows, processors, tasks, jobs, clients) in one place, each
declaration a few lines that hand over to the piece it configures.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Self, TypeVar, Unpack, overload

import attrs

from . import _keys
from ._background import BackgroundTask
from ._errors import ConfigError, NotConnected
from ._joins import (
    JOIN_SHARE,
    JoinHow,
    StreamJoin,
    check_copartitioned,
    check_time_field,
    default_join_result,
    forward,
    positive_window,
    run_join,
)
from ._policies import ExceptionPolicy
from ._redis import Redis, open_redis
from ._replay import ResetPlan, StateChoice, apply_reset, plan_reset
from ._settings import Settings, check_setting_names
from ._spec import ProcessorKeys, StreamSpec
from ._streams import Stream
from ._table_joins import (
    GlobalTable,
    TableJoin,
    apply_global,
    default_table_result,
    run_table_join,
)
from ._tables import Table
from ._tables_versioned import VersionedTable
from ._tables_windowed import LatePolicy, WindowedTable, default_result
from ._windows import Window, duration_ms, positive_ms
from .jobs._cron import cron_decorator
from .jobs._handle import Job, JobDecorator
from .jobs._layout import DEFAULT_QUEUE, routed_queue
from .jobs._model import AppJobOptionsArgs, JobOptions, P as JobParams, R as JobResult

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager
    from datetime import datetime, timedelta
    from types import TracebackType

    from ._events import Events, Middleware
    from ._windows import WindowKind
    from .clients import AsyncioClient, BlockingClient
    from .jobs import JobQueue
    from .jobs._context import JobMiddleware

__all__ = ["App", "NotConnected", "Processor"]

R = TypeVar("R")
L = TypeVar("L")
JR = TypeVar("JR")
V = TypeVar("V")

#: Partitions per stream above which declaring one logs a warning: every partition a
#: worker owns holds a lease renewed every ``lease_ttl / 3`` seconds and costs a read
#: per fetch round, so a worker owning thousands falls behind on renewals, loses
#: leases and shuts down slowly (10,000 partitions on one worker: leases lost,
#: shutdown took 40 s). See docs/worker.md, "How many partitions".
PARTITION_WARNING_THRESHOLD = 1024

log = logging.getLogger("streamkit.app")

ProcessorFunction = Callable[["Events[Any]"], Awaitable[None]]
BackgroundFunction = Callable[[], Awaitable[object]]


@attrs.frozen(kw_only=True)
class Processor:
    """A registered processor: a function run over every partition of a stream.

    Attributes:
        name: the processor's name, also its consumer group's.
        stream: the stream it processes.
        fn: ``async def fn(events)``.
        policy: what happens when processing an event fails.
        middleware: wrappers of the event iterator.
        settings: the app's settings with this processor's overrides.
        tables: the tables it writes, committed with its acknowledgements.
        outputs: the streams it emits records to, committed the same way.
        jobs: the jobs it enqueues with :meth:`Events.enqueue`, committed the same way.
    """

    name: str
    stream: Stream[Any]
    fn: ProcessorFunction
    policy: ExceptionPolicy
    middleware: tuple[Middleware, ...]
    settings: Settings
    tables: tuple[Table[Any] | WindowedTable[Any] | StreamJoin[Any, Any], ...] = ()
    outputs: tuple[Stream[Any], ...] = ()
    jobs: tuple[Job[Any, Any], ...] = ()

    @property
    def keys(self) -> ProcessorKeys:
        """The processor's Redis names: consumer group, lock names, dead letters."""
        return self.stream.spec.processor(self.name)

    @property
    def group(self) -> str:
        """The processor's membership group and consumer group name."""
        return self.keys.group


def _forwarded_key(record: Any) -> object:
    """An inner stream (a join's, a table join's, a global table's) is routed by
    partition number (its writers'), never by key: nothing is sent to it but by them."""
    raise ConfigError(
        "join", "an inner stream (a join's or a table's) takes events from streamkit only"
    )


#: The inner streams' names, ``NAME`` and a suffix, and what they are of.
_INNER_SUFFIXES = {"__in": "join", "__changes": "table join", "__global": "global table"}


def inner_stream_of(app: App, stream: Stream[Any]) -> tuple[str, str] | None:
    """What ``stream`` is the inner stream of, made by :meth:`App.join` (``("join",
    "paid")`` for ``paid__in``), :meth:`App.join_tables` (``("table join", "accounts")``
    for ``accounts__changes``) or :meth:`App.global_table` (``("global table",
    "products")`` for ``products__global``); ``None`` for any other stream."""
    if stream.partition_by is not _forwarded_key or app.streams.get(stream.name) is not stream:
        return None
    for suffix, kind in _INNER_SUFFIXES.items():
        if stream.name.endswith(suffix):
            return kind, stream.name.removesuffix(suffix)
    return None  # pragma: no cover - every inner stream has one of them


def _duration_ms(name: str, value: timedelta | float) -> int:
    ms = duration_ms(name, value)
    if ms < 0:
        raise ConfigError(name, f"must not be negative, got {value!r}")
    return ms


def _name_of(fn: object) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _check_async(kind: str, fn: object, name: str | None = None) -> None:
    """Refuse anything but an async function (or an object with an async ``__call__``).

    A plain ``def`` would be accepted and fail only when first run, deep in a worker.
    """
    if inspect.isasyncgenfunction(fn):
        raise ConfigError(
            kind,
            f"{name or _name_of(fn)!r} is an async generator; it must be an async "
            f"function (async def without yield)",
        )
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (an object with an async __call__)
    ):
        return
    if callable(fn):
        raise ConfigError(
            kind, f"{name or _name_of(fn)!r} must be an async function (async def), not a def"
        )
    raise ConfigError(kind, f"expected an async function to decorate, got {fn!r}")


@attrs.define(eq=False, init=False)
class App:
    """A named streamkit application: its streams, processors and settings.

    The name namespaces every Redis key the app uses, so apps sharing one Redis
    server never see each other's data.

    Args:
        name: letters, digits, ``_`` and ``-``.
        redis_url: overrides ``settings.redis_url`` / ``STREAMKIT_REDIS_URL``.
        settings: a complete :class:`Settings`; by default read from the environment.
        **overrides: any other :class:`Settings` field, e.g. ``partition_count=8``.

    Use it as an async context manager to connect (``async with app: ...``); the
    connection retries an unreachable server with backoff for
    ``settings.connect_give_up_after`` seconds.
    """

    name: str
    settings: Settings
    streams: dict[str, Stream[Any]]
    processors: dict[str, Processor]
    tables: dict[str, Table[Any] | WindowedTable[Any]]
    background: list[BackgroundTask]
    jobs: dict[str, Job[Any, Any]]
    #: Run around each try of the app's jobs (see :meth:`job_middleware`).
    job_middleware_chain: list[JobMiddleware]
    #: Entered by each worker around all it runs (see :meth:`lifespan`).
    worker_lifespan: Callable[[], AbstractAsyncContextManager[Any]] | None
    _redis: Redis | None
    _inner_tables: list[Table[Any]]
    _job_queues: dict[str, JobQueue]
    _exit_stack: contextlib.AsyncExitStack | None
    _entered: int

    def __init__(
        self,
        name: str,
        *,
        redis_url: str | None = None,
        settings: Settings | None = None,
        **overrides: Any,
    ) -> None:
        self.name = _keys.validate_name("app name", name)
        check_setting_names(overrides, where=f" for app {name!r}")
        if redis_url is not None:
            overrides["redis_url"] = redis_url
        if settings is None:
            settings = Settings.from_env(**overrides)
        elif overrides:
            settings = attrs.evolve(settings, **overrides)
        self.settings = settings
        self.streams = {}
        self.processors = {}
        self.tables = {}
        # The tables of joins' and global tables' own processors (not for users' use).
        self._inner_tables = []
        self.background = []
        self.jobs = {}
        self.job_middleware_chain = []
        self.worker_lifespan = None
        self._redis = None
        self._job_queues = {}
        self._exit_stack = None
        self._entered = 0

    def stream(
        self,
        name: str,
        *,
        record: type[R],
        partition_by: str | Callable[[R], object],
        partition_count: int | None = None,
        partition_size: int | None = None,
        max_len: int | None = None,
        compression: str | None = None,
    ) -> Stream[R]:
        """Declare a partitioned stream of ``record`` s.

        Args:
            name: the stream's name (letters, digits, ``_``, ``-``).
            record: the :class:`~streamkit.Record` subclass of its events.
            partition_by: a field name of ``record``, or a function of a record that
                returns its key. Records with equal keys go to the same partition, in
                order.
            partition_count: overrides the app's ``partition_count`` setting.
            partition_size: overrides the app's ``partition_size`` setting.
            max_len: overrides the app's ``max_len`` setting (a hard cap).
            compression: overrides the app's ``compression`` setting.

        Error handling:
            :class:`ConfigError` for a bad name, option, or a name declared twice.
        """
        if name in self.streams:
            raise ConfigError("stream", f"{name!r} is already declared in app {self.name!r}")
        given = {
            "partition_count": partition_count,
            "partition_size": partition_size,
            "max_len": max_len,
            "compression": compression,
        }
        changes: dict[str, Any] = {f: v for f, v in given.items() if v is not None}
        settings = attrs.evolve(self.settings, **changes) if changes else self.settings
        if settings.partition_count > PARTITION_WARNING_THRESHOLD:
            log.warning(
                "stream %r has %d partitions, more than %d: each partition a worker owns "
                "holds a lease renewed every lease_ttl/3 (%.1fs) and costs a read per fetch "
                "round, so unless each worker owns at most about %d (run at least %d "
                "workers), leases are lost and shutdowns are slow; see docs/worker.md",
                name,
                settings.partition_count,
                PARTITION_WARNING_THRESHOLD,
                settings.lease_ttl / 3,
                PARTITION_WARNING_THRESHOLD,
                -(-settings.partition_count // PARTITION_WARNING_THRESHOLD),
            )
        spec: StreamSpec[R] = StreamSpec(
            app=self.name,
            name=name,
            record=record,
            partition_by=partition_by,
            partition_count=settings.partition_count,
            compression=settings.compression,
            max_decoded_size=settings.max_decoded_size,
            max_record_size=settings.max_record_size,
        )
        stream: Stream[R] = Stream(spec, settings, lambda: self.redis)
        self.streams[name] = stream
        return stream

    def table(
        self,
        name: str,
        *,
        value: type[V] | Any,
        default: V | None = None,
        ttl: timedelta | float | None = None,
    ) -> Table[V]:
        """Declare a table: keyed state that one processor writes, exactly once.

        Name it in the processor that writes it (``@app.processor(orders,
        tables=[totals])``); the table is then partitioned like that processor's
        stream, and its keys are that stream's partition keys. See :doc:`state`.

        Args:
            name: the table's name (letters, digits, ``_``, ``-``), unique in the app.
            value: the type of its values: any type a record field may have.
            default: what reading a missing key returns.
            ttl: how long a key lives after its last write (a timedelta, or seconds):
                then it is gone, as if deleted (see :doc:`state`, "Expiry"). ``None``
                (the default): keys live until deleted.

        Error handling:
            :class:`ConfigError` for a bad name, a name declared twice, a ``default``
            that is not a valid ``value``, or a ``ttl`` that is not positive.
        """
        if name in self.tables:
            raise ConfigError("table", f"{name!r} is already declared in app {self.name!r}")
        table: Table[V] = Table(
            name,
            value,
            default,
            ttl=None if ttl is None else positive_ms("ttl", ttl),
            connection=lambda: self.redis,
        )
        self.tables[name] = table
        return table

    def versioned_table(
        self,
        name: str,
        *,
        value: type[V] | Any,
        retention: timedelta | float,
        default: V | None = None,
        ttl: timedelta | float | None = None,
    ) -> VersionedTable[V]:
        """Declare a versioned table: a table that keeps each key's values over time, so
        that a read gets the value in force as of a time (an event's) rather than now.
        See :doc:`joins`, "As-of lookups".

        For example, currency rates, read as of each payment's time::

            rates = app.versioned_table("rates", value=float, retention=timedelta(days=1))

        Its writer (``tables=[rates]``) writes ``await rates.put(key, value, at=...)``;
        anyone reads ``await rates.get(key, as_of=...)``.

        Args:
            name: the table's name (unique in the app).
            value: the type of its values.
            retention: how much of each key's history is kept behind its newest
                version (a timedelta, or seconds).
            default: what reading a missing key (or a time before its history) returns.
            ttl: how long a key, with its history, lives after its last write.

        Error handling:
            :class:`ConfigError` for a bad name, a name declared twice, a ``default``
            that is not a valid ``value``, or a ``retention`` or ``ttl`` not positive.
        """
        if name in self.tables:
            raise ConfigError("table", f"{name!r} is already declared in app {self.name!r}")
        table: VersionedTable[V] = VersionedTable(
            name,
            value,
            default,
            ttl=None if ttl is None else positive_ms("ttl", ttl),
            retention=positive_ms("retention", retention),
            connection=lambda: self.redis,
        )
        self._inner_tables.append(table.versions)
        self.tables[name] = table
        return table

    def window(
        self,
        name: str,
        kind: WindowKind,
        *,
        value: type[V] | Any,
        initial: V,
        grace: timedelta | float = 0,
        retention: timedelta | float = 0,
        time: str | Callable[[Any], Any] | None = None,
        output: Stream[Any] | None = None,
        result: Callable[[str, Window, V], Any] = default_result,
        late: LatePolicy = "drop",
        merge: Callable[[V, V], V] | None = None,
        idle: bool = True,
    ) -> WindowedTable[V]:
        """Declare a windowed table: per key and window of event time, an aggregate.

        Name it in the processor that writes it (``tables=[...]``); inside, fold each
        event in with ``await table.update(key, at, fn, *args)``. A window closes when the
        partition's watermark passes its end plus ``grace``; its final value then goes
        to ``output`` once, as ``result(key, window, value)``. See :doc:`state`.

        Args:
            name: the table's name, unique in the app.
            kind: :func:`~streamkit.tumbling`, :func:`~streamkit.hopping` or
                :func:`~streamkit.session` windows.
            value: the type of a window's value.
            initial: the value a window starts from.
            grace: how long a window stays open after its end, for late events.
            retention: how long a closed window stays readable after its end.
            time: a record's event time, for ``update(key, record, fn)``: a field name
                or a function of the record (a datetime or seconds since the epoch).
            output: the stream final results go to (made an output of the writing
                processor).
            result: builds an output record from ``(key, window, value)``; by default
                a dict with key, start, end and value (for a ``dict`` stream).
            late: ``"drop"`` (counted) or ``"dead_letter"`` a late event.
            merge: combines two sessions' values when an event bridges them.
            idle: whether a quiet partition's event time moves on with the wall clock,
                closing its windows without a later event (for event times that follow
                the wall clock); ``False``: only events close windows.

        Error handling:
            :class:`ConfigError` for a bad name, option (an ``initial`` that is not a
            valid ``value``, say), or a name declared twice.
        """
        if name in self.tables:
            raise ConfigError("table", f"{name!r} is already declared in app {self.name!r}")
        if output is not None and self.streams.get(output.name) is not output:
            raise ConfigError("output", f"{output!r} is not a stream of app {self.name!r}")
        _check_window_functions(time, result, merge, idle)
        table: WindowedTable[V] = WindowedTable(
            name,
            kind,
            value,
            initial,
            grace=_duration_ms("grace", grace),
            retention=_duration_ms("retention", retention),
            time=time,
            output=output,
            result=result,
            late=late,
            merge=merge,
            idle=idle,
            connection=lambda: self.redis,
        )
        self.tables[name] = table
        return table

    def join(
        self,
        name: str,
        left: Stream[L],
        right: Stream[JR],
        *,
        within: timedelta | float,
        output: Stream[Any],
        how: JoinHow = "inner",
        grace: timedelta | float = 0,
        left_time: str | Callable[[L], Any] | None = None,
        right_time: str | Callable[[JR], Any] | None = None,
        result: Callable[[str, L | None, JR | None], Any] = default_join_result,
        idle: bool = True,
        **overrides: Any,
    ) -> StreamJoin[L, JR]:
        """Join two co-partitioned streams within a time: each pair of a left and a
        right event of the same key at most ``within`` apart in event time is emitted to
        ``output`` once, as ``result(key, left, right)``. See :doc:`joins`.

        For example, orders and their payments within ten minutes, and the orders never
        paid (``how="left"``) once their ten minutes are over::

            paid = app.join(
                "paid", orders, payments, within=timedelta(minutes=10), how="left",
                output=settled, left_time="created_at", right_time="paid_at",
            )

        The join runs as processors of the app (``NAME__left`` and ``NAME__right``
        forward each side's events, ``NAME`` joins them): any worker runs them.

        Args:
            name: the join's name (letters, digits, ``_``, ``-``).
            left: the left stream.
            right: the right stream, with the same partition count, keyed alike.
            within: how far apart in event time two events may be and match (a
                timedelta, or seconds).
            output: the stream the results go to (emitted exactly once).
            how: ``"inner"``: pairs only; ``"left"``: and each left event that matched
                nothing, once its window closed, with ``None`` for the right; ``"outer"``:
                and each event of either side that matched nothing.
            grace: how long beyond ``within`` an event waits for late events of the
                other side (a timedelta, or seconds). An event ``within + grace`` or more
                behind the newest of its own side is late: counted, matching nothing.
            left_time, right_time: each side's event time: a field name (of a
                ``dict`` record, a key), a function of a record, or ``None`` for when
                its event was appended to its stream. The time is a datetime or
                seconds since the epoch; an event without one halts its forwarder's
                partition, as its policy says, naming the join and the entry.
            result: builds a result from ``(key, left record or None, right record or
                None)``; by default a ``dict`` with ``key``, ``left`` and ``right``.
            idle: whether a quiet partition's event time moves on with the wall clock,
                so that its windows close without a later event (as a windowed
                table's), and a side with nothing to forward is moved on to the other
                side's time; with ``False`` only a side's events move it on (event
                times of their own: a backfill, say).
            **overrides: settings of the join's processors (``batch_size``, ...).

        Error handling:
            :class:`ConfigError` for streams of another app or of different partition
            counts, an ``output`` that is ``left`` or ``right``, a bad window, grace,
            ``how``, ``result`` (not callable) or ``idle`` (not a bool), or a name used
            twice.
        """
        for stream in (left, right, output):
            if not isinstance(stream, Stream) or self.streams.get(stream.name) is not stream:
                raise ConfigError("join", f"{stream!r} is not a stream of app {self.name!r}")
        if output is left or output is right:
            which = "left" if output is left else "right"
            raise ConfigError(
                "output",
                f"join {name!r} cannot emit to its own {which} stream {output.name!r}: each "
                f"result would be joined again (give it a stream of its own)",
            )
        check_copartitioned(left.spec, right.spec)
        check_time_field(left.spec, "left_time", left_time)
        check_time_field(right.spec, "right_time", right_time)
        _keys.validate_name("join name", name)
        # Everything checked before anything is declared: a refused join leaves the app
        # as it was, so the call, corrected, can be made again.
        parts = (name, f"{name}__left", f"{name}__right")
        if f"{name}__in" in self.streams or any(p in self.processors for p in parts):
            raise ConfigError("join name", f"{name!r} is used already in app {self.name!r}")
        self._check_overrides(overrides, where=f" for join {name!r}")
        joined: StreamJoin[L, JR] = StreamJoin(
            name,
            left=left.spec,
            right=right.spec,
            within=positive_window("within", within),
            grace=positive_window("grace", grace),
            how=how,
            output=output.spec,
            result=result,
            left_time=left_time,
            right_time=right_time,
            idle=idle,
            # (longer than a failover takes: a side held back for that long is stalled)
            stall_warning=float(overrides.get("session_timeout", self.settings.session_timeout))
            + float(overrides.get("lease_ttl", self.settings.lease_ttl)),
            connection=lambda: self.redis,
        )
        inner = self.stream(
            f"{name}__in",
            record=dict,
            partition_by=_forwarded_key,
            partition_count=left.spec.partition_count,
        )
        for side, stream in ((b"L", left), (b"R", right)):
            suffix = "left" if side == b"L" else "right"

            async def forwarder(events: Events[Any], side: bytes = side) -> None:
                await forward(events, joined, side, inner.spec)

            self.processor(stream, name=f"{name}__{suffix}", outputs=[inner], **overrides)(
                forwarder
            )

        async def joiner(events: Events[Any]) -> None:
            await run_join(events, joined)

        # Each entry of the inner stream is a forwarder's batch (up to batch_size
        # events): the join reads a 32nd as many entries at a time.
        batch = overrides.get("batch_size", self.settings.batch_size)
        joiner_settings = {**overrides, "batch_size": max(1, -(-batch // JOIN_SHARE))}
        self.processor(inner, name=name, tables=[joined], outputs=[output], **joiner_settings)(
            joiner
        )
        return joined

    def join_tables(
        self,
        name: str,
        left: Table[Any],
        right: Table[Any],
        *,
        how: JoinHow = "inner",
        result: Callable[[str, Any, Any], Any] = default_table_result,
        value: type[V] | Any = Any,
        ttl: timedelta | float | None = None,
        **overrides: Any,
    ) -> Table[V]:
        """Declare a table derived from two co-partitioned tables: under each key,
        ``result(key, left value, right value)``, updated exactly once whenever either
        side's value of that key changes. See :doc:`joins`.

        For example, each user's latest profile beside their account's status::

            accounts = app.join_tables("accounts", profiles, statuses, how="left")

        Declare it after the processors that write ``left`` and ``right``. The derived
        table is a :class:`Table` written by the join's processor ``NAME`` (``get``,
        ``read``, ``items``, the CLI and the clients read it as any other); each side's
        writes reach it through the join's stream ``NAME__changes``, sent on in the
        writer's commit.

        Args:
            name: the join's name, and its derived table's (unique in the app).
            left, right: the joined tables, written by processors of streams with the
                same partition count, keyed alike.
            how: ``"inner"``: a key has a value when both sides have one; ``"left"``:
                when the left side has one (``None`` for a missing right); ``"outer"``:
                when either has.
            result: the derived value of ``(key, left or None, right or None)``; by
                default ``{"left": ..., "right": ...}`` of both values as JSON.
            value: the type of the derived values (``result``'s).
            ttl: how long a derived key lives after its last change (``None``: for ever).
            **overrides: settings of the join's processor (``batch_size``, ...).

        Error handling:
            :class:`ConfigError` for tables of another app, tables no processor writes
            yet, windowed or global tables, tables of different partition counts, a bad
            ``how`` or a name used twice.
        """
        for table in (left, right):
            if getattr(table, "kind", None) is not None:  # a WindowedTable
                raise ConfigError(
                    "join_tables",
                    f"{table!r} is windowed: join what its processor emits when a window "
                    f"closes, with app.join, or keep its values in a table",
                )
            if self.tables.get(table.name) is not table or not isinstance(table, Table):
                raise ConfigError("join_tables", f"{table!r} is not a table of app {self.name!r}")
            if isinstance(table, GlobalTable):
                raise ConfigError("join_tables", f"{table!r} is global: read it with get instead")
            if table.stream is None:
                raise ConfigError(
                    "join_tables",
                    f"table {table.name!r} is written by no processor yet: declare the join "
                    f"after the processors that write its tables",
                )
        assert left.stream is not None
        assert right.stream is not None
        check_copartitioned(left.stream, right.stream)
        if how not in ("inner", "left", "outer"):
            raise ConfigError("how", f"must be 'inner', 'left' or 'outer', got {how!r}")
        if not callable(result):
            raise ConfigError(
                "result", f"must be a function of (key, left value, right value), got {result!r}"
            )
        if name in self.tables:
            raise ConfigError("table", f"{name!r} is already declared in app {self.name!r}")
        self._check_overrides(overrides, where=f" for table join {name!r}")
        changes = self.stream(
            f"{name}__changes",
            record=dict,
            partition_by=_forwarded_key,
            partition_count=left.stream.partition_count,
        )
        expiry = None if ttl is None else positive_ms("ttl", ttl)
        derived: Table[V] = Table(name, value, ttl=expiry, connection=lambda: self.redis)
        sides: Table[Any] = Table(f"{name}__sides", Any, ttl=expiry, connection=lambda: self.redis)
        self._inner_tables.append(sides)
        joined = TableJoin(name, left, right, how, result, sides, derived)
        self.tables[name] = derived
        left.feeds.append((changes.spec, b"L"))
        right.feeds.append((changes.spec, b"R"))

        async def joiner(events: Events[Any]) -> None:
            await run_table_join(events, joined)

        self.processor(changes, name=name, tables=[sides, derived], **overrides)(joiner)
        return derived

    def _check_overrides(self, overrides: Mapping[str, Any], *, where: str) -> None:
        """Check the settings a declaration gives its processors before it declares
        anything: a refused declaration leaves the app as it was, so that the call,
        corrected, can be made again."""
        check_setting_names(overrides, where=where)
        if overrides:
            attrs.evolve(self.settings, **overrides)

    def global_table(
        self, name: str, *, value: type[V] | Any, default: V | None = None, **overrides: Any
    ) -> GlobalTable[V]:
        """Declare a global table: one hash that every processor reads, whatever the
        key; one processor writes it. See :doc:`joins`.

        For example, products by sku, read by a processor of orders keyed by customer::

            products = app.global_table("products", value=Product)

        Name it in the processor that writes it (``tables=[products]``): any of its
        partitions may write any key. A write lands in the table's hash exactly once,
        shortly after the writer's commit (through the table's stream ``NAME__global``
        and its processor ``NAME__apply``). Everywhere else ``await products.get(sku)``
        reads the value last applied, at the moment of the read.

        Args:
            name: the table's name (unique in the app).
            value: the type of its values.
            default: what reading a missing key returns.
            **overrides: settings of the table's processor (``batch_size``, ...).

        Error handling:
            :class:`ConfigError` for a bad name, a name declared twice or a ``default``
            that is not a valid ``value``.
        """
        if name in self.tables:
            raise ConfigError("table", f"{name!r} is already declared in app {self.name!r}")
        table: GlobalTable[V] = GlobalTable(name, value, default, connection=lambda: self.redis)
        self._check_overrides(overrides, where=f" for global table {name!r}")
        changes = self.stream(
            f"{name}__global", record=dict, partition_by=_forwarded_key, partition_count=1
        )
        table.applied = Table(name, value, default, connection=lambda: self.redis)
        self._inner_tables.append(table.applied)
        table.feeds.append((changes.spec, b"G"))
        self.tables[name] = table

        async def apply(events: Events[Any]) -> None:
            await apply_global(events, table)

        self.processor(changes, name=f"{name}__apply", tables=[table.applied], **overrides)(apply)
        return table

    def processor(
        self,
        stream: Stream[Any],
        *,
        name: str | None = None,
        policy: ExceptionPolicy | None = None,
        middleware: Sequence[Middleware] = (),
        tables: Sequence[Table[Any] | WindowedTable[Any] | StreamJoin[Any, Any]] = (),
        outputs: Sequence[Stream[Any]] = (),
        jobs: Sequence[Job[Any, Any]] = (),
        **overrides: Any,
    ) -> Callable[[ProcessorFunction], ProcessorFunction]:
        """Register ``async def fn(events)`` to process every event of ``stream``.

        Partitions of the stream are spread over all workers running the processor;
        each partition is processed by one worker at a time, in order::

            @app.processor(orders)
            async def printer(events):
                async for order in events.records():
                    print(order.amount)

        Args:
            stream: a stream of this app.
            name: the processor's name (its consumer group); the function's name by
                default. Renaming a processor starts it again from the beginning.
            policy: what to do when processing fails (see
                :class:`~streamkit.ExceptionPolicy`); halting by default.
            middleware: wrappers of the event iterator, outermost last.
            tables: the tables the processor writes (see :meth:`table`): their writes
                are committed with the acknowledgement of the events behind them.
            outputs: streams of this app the processor emits records to with
                :meth:`Events.emit`, committed the same way: exactly once.
            jobs: jobs of this app the processor enqueues with
                :meth:`Events.enqueue`, committed the same way: once per event.
            **overrides: per-processor settings (``lease_ttl``, ``grace_period``,
                ``batch_size``, ``prefetch``, ...).

        Error handling:
            :class:`ConfigError` for a stream, table or output of another app, a name
            used twice, a table another processor writes, or a bad setting.
        """
        if not isinstance(stream, Stream) or self.streams.get(stream.name) is not stream:
            raise ConfigError("stream", f"{stream!r} belongs to another app")
        for table in tables:
            if (
                self.tables.get(getattr(table, "name", "")) is not table
                and not isinstance(table, StreamJoin)
                and not any(table is own for own in self._inner_tables)
            ):
                raise ConfigError("tables", f"{table!r} is not a table of app {self.name!r}")
        for output in outputs:
            if not isinstance(output, Stream) or self.streams.get(output.name) is not output:
                raise ConfigError("outputs", f"{output!r} is not a stream of app {self.name!r}")
        for job in jobs:
            if not isinstance(job, Job) or self.jobs.get(job.name) is not job:
                raise ConfigError("jobs", f"{job!r} is not a job of app {self.name!r}")
        check_setting_names(overrides, where=f" for a processor of {stream.name!r}")
        settings = attrs.evolve(self.settings, **overrides) if overrides else self.settings

        def register(fn: ProcessorFunction) -> ProcessorFunction:
            _check_async("processor", fn, name)
            processor_name = _keys.validate_name("processor name", name or _name_of(fn))
            if processor_name in self.processors:
                raise ConfigError("processor", f"{processor_name!r} is already registered")
            for table in tables:
                table.bind(stream.spec, processor_name)
            # A versioned table's versions are written by its processor too.
            written = (*tables, *(t.versions for t in tables if isinstance(t, VersionedTable)))
            self.processors[processor_name] = Processor(
                name=processor_name,
                stream=stream,
                fn=fn,
                policy=policy or ExceptionPolicy(),
                middleware=tuple(middleware),
                settings=settings,
                tables=written,
                outputs=tuple(outputs),
                jobs=tuple(jobs),
            )
            return fn

        return register

    def task(self, fn: BackgroundFunction | None = None, *, on_leader: bool = False) -> Any:
        """Register ``async def fn()`` to run once in the background of each worker.

        With ``on_leader=True`` it runs only on the elected leader worker, and is
        cancelled when leadership moves (and started on the new leader). Usable as
        ``@app.task`` or ``@app.task(on_leader=True)``.
        """
        register = self._background(partial(BackgroundTask, kind="task", on_leader=on_leader))
        return register if fn is None else register(fn)

    def timer(
        self, *, interval: float, on_leader: bool = False
    ) -> Callable[[BackgroundFunction], BackgroundFunction]:
        """Register ``async def fn()`` to run every ``interval`` seconds.

        The schedule does not drift: runs start at ``interval`` multiples from the
        worker's start; a run that overruns skips the ticks it missed.
        """
        return self._background(
            partial(BackgroundTask, kind="timer", interval=interval, on_leader=on_leader)
        )

    def crontab(
        self, expression: str, *, on_leader: bool = False
    ) -> Callable[[BackgroundFunction], BackgroundFunction]:
        """Register ``async def fn()`` to run at the times of a crontab ``expression``.

        For example ``"*/5 * * * *"`` runs every five minutes, in local time.

        A background task, not a job: it runs in every worker (or, with
        ``on_leader=True``, on the leader only), in the worker's local time, and a tick
        missed while no worker runs is not made up. For work that must run once per
        tick across the fleet, with retries and a result, use :meth:`cron`.
        """
        return self._background(
            partial(BackgroundTask, kind="crontab", cron=expression, on_leader=on_leader)
        )

    def _background(
        self, make: Callable[..., BackgroundTask]
    ) -> Callable[[BackgroundFunction], BackgroundFunction]:
        """The decorator of :meth:`task`, :meth:`timer` and :meth:`crontab`: it checks
        ``fn`` and appends ``make(name=..., fn=fn)`` (validated then) to
        :attr:`background`."""

        def register(fn: BackgroundFunction) -> BackgroundFunction:
            _check_async("background task", fn)
            self.background.append(make(name=fn.__name__, fn=fn))
            return fn

        return register

    @overload
    def job(  # an async def matches the next one too: this one comes first
        self,
        fn: Callable[JobParams, Coroutine[Any, Any, JobResult]],
        *,
        name: str | None = None,
        **options: Unpack[AppJobOptionsArgs],
    ) -> Job[JobParams, JobResult]: ...

    @overload
    def job(
        self,
        fn: Callable[JobParams, JobResult],
        *,
        name: str | None = None,
        **options: Unpack[AppJobOptionsArgs],
    ) -> Job[JobParams, JobResult]: ...

    @overload
    def job(
        self, fn: None = None, *, name: str | None = None, **options: Unpack[AppJobOptionsArgs]
    ) -> JobDecorator: ...

    def job(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        **options: Unpack[AppJobOptionsArgs],
    ) -> Any:
        """Declare ``fn`` (``async def`` or plain ``def``) as a job of the app's queue.

        Use as ``@app.job`` or ``@app.job(retries=3, timeout=30)``; the options are
        those of :meth:`streamkit.jobs.JobQueue.job`. ``streamkit worker`` runs the
        app's jobs; inside ``async with app:`` the job's ``delay``, ``enqueue`` and
        ``enqueue_many`` enqueue it. The queue is named after the app; ``queue="gpu"``
        routes the job to the app's queue ``gpu`` instead (keys ``APP.gpu``), served
        by the workers that serve it (``streamkit worker --queues``).
        """

        job_options = JobOptions.taken(options, by="App.job", routing=True)
        queue = job_options.queue or DEFAULT_QUEUE

        def declare(fn: Callable[..., Any]) -> Job[Any, Any]:
            job: Job[Any, Any] = Job(
                name or fn.__name__, fn, job_options, None, lambda: self._routed(queue)
            )
            if job.name in self.jobs:
                raise ConfigError("job name", f"app {self.name!r} has a job {job.name!r} already")
            self.jobs[job.name] = job
            return job

        return declare if fn is None else declare(fn)

    def cron(
        self,
        expression: str,
        *,
        misfire_grace: float = 60.0,
        tz: str | None = None,
        name: str | None = None,
        **options: Unpack[AppJobOptionsArgs],
    ) -> JobDecorator:
        """Declare a job run at the times of a crontab ``expression`` in the timezone
        ``tz`` (UTC by default), each tick once across all workers. See
        :meth:`streamkit.jobs.JobQueue.cron`.

        A job, not a background task: each tick is enqueued once however many workers
        run, and runs with the job's retries and dead letters. For code that simply
        runs on a schedule in each worker (or on the leader), in local time, use
        :meth:`crontab`."""
        return cron_decorator(
            lambda fn: self.job(fn, name=name, **options),
            expression,
            misfire_grace=misfire_grace,
            tz=tz,
        )

    def blocking(
        self,
        *,
        max_connections: int | None = None,
        socket_timeout: float | None = None,
        pool_timeout: float | None = None,
    ) -> BlockingClient:
        """A blocking client of the app: send events, enqueue jobs, read tables, no
        Trio loop needed (a Flask or Django view, a script)::

            with app.blocking() as client:
                client.send(orders, Order(customer="ada", amount=5))
                handle = client.enqueue(send_receipt, 42, delay=timedelta(minutes=5))
                print(handle.result(timeout=30))

        One client serves every thread of a process; keep one for the process's life
        in a web app (closing it at exit). After ``fork`` it connects anew in the
        child. See :doc:`clients`.

        Args:
            max_connections: connections of its pool, at most (per node of a cluster).
            socket_timeout: seconds a reply may take.
            pool_timeout: seconds a thread waits for a free connection.

        Error handling:
            :class:`ConfigError` for a bad ``redis_url``, at once; nothing connects
            before the first command.
        """
        from .clients import BlockingClient

        return BlockingClient(
            self.settings.redis_url,
            **self._client_options(max_connections, socket_timeout, pool_timeout),
        )

    def asyncio(
        self,
        *,
        max_connections: int | None = None,
        socket_timeout: float | None = None,
        pool_timeout: float | None = None,
    ) -> AsyncioClient:
        """An asyncio client of the app, with the blocking client's methods as
        coroutines (a FastAPI or aiohttp handler)::

            async with app.asyncio() as client:
                await client.send(orders, Order(customer="ada", amount=5))
                handle = await client.delay(send_receipt, 42)
                print(await handle.result(timeout=30))

        Its tasks share its connection pool. See :doc:`clients`; the arguments are
        :meth:`blocking`'s.
        """
        from .clients import AsyncioClient

        return AsyncioClient(
            self.settings.redis_url,
            **self._client_options(max_connections, socket_timeout, pool_timeout),
        )

    def _client_options(
        self, max_connections: int | None, socket_timeout: float | None, pool_timeout: float | None
    ) -> dict[str, Any]:
        given = {
            "max_connections": max_connections,
            "socket_timeout": socket_timeout,
            "pool_timeout": pool_timeout,
        }
        return {
            "queue": self.name,
            "jobs": self.jobs,
            "shards": self.settings.job_shards,
            "max_bytes": self.settings.job_max_bytes,
            "connect_timeout": self.settings.connect_timeout,
            **{name: value for name, value in given.items() if value is not None},
        }

    def job_middleware(self, middleware: JobMiddleware) -> JobMiddleware:
        """Run ``middleware`` around each try of the app's jobs, on every queue of the
        app; usable as a decorator (see :meth:`JobQueue.add_middleware
        <streamkit.jobs.JobQueue.add_middleware>`)."""
        self.job_middleware_chain.append(middleware)
        return middleware

    def lifespan(self, fn: Callable[[], AsyncIterator[Any]]) -> Callable[[], AsyncIterator[Any]]:
        """Run the async generator ``fn`` around each job worker of the app (one per
        queue it serves, in ``streamkit worker`` or ``app.job_queue.serve``); usable
        as a decorator.

        Its code before ``yield`` runs when the worker starts, before it takes any
        job; its code after ``yield`` when it has stopped (shielded from the stop, for
        at most 10 s). The value it yields is the
        :attr:`~streamkit.jobs.JobContext.state` of the jobs it runs (a database
        pool, say). An app has one lifespan.

        Error handling:
            :class:`ConfigError` for a second lifespan.
        """
        if self.worker_lifespan is not None:
            raise ConfigError("lifespan", f"app {self.name!r} has a lifespan already")
        self.worker_lifespan = contextlib.asynccontextmanager(fn)
        return fn

    def queue_names(self) -> list[str]:
        """The app's job queues that have jobs (``"default"``, the queue named after
        the app, and the names given as ``queue=`` to :meth:`job`), sorted."""
        return sorted({job.options.queue or DEFAULT_QUEUE for job in self.jobs.values()})

    @property
    def job_queues(self) -> Mapping[str, JobQueue]:
        """The app's job queues, by name: ``"default"`` (the one named after the app)
        and those its jobs are routed to (``@app.job(queue=...)``).

        Error handling:
            :class:`NotConnected` outside ``async with app:``, or if the app declares
            no jobs.
        """
        if not self._job_queues:
            raise NotConnected(self.name)
        return MappingProxyType(self._job_queues)

    def _routed(self, queue: str) -> JobQueue:
        """The app's job queue ``queue``, for its jobs routed there."""
        try:
            return self.job_queues[queue]
        except KeyError:
            known = ", ".join(sorted(self._job_queues))
            raise ConfigError(
                "queue", f"app {self.name!r} has no queue {queue!r} (known: {known})"
            ) from None

    @property
    def job_queue(self) -> JobQueue:
        """The app's job queue (the default one, named after the app).

        Error handling:
            :class:`NotConnected` outside ``async with app:``, or if the app declares
            no jobs.
        """
        return self.job_queues[DEFAULT_QUEUE]

    @property
    def redis(self) -> Redis:
        """The app's Redis client.

        Error handling:
            :class:`NotConnected` outside ``async with app:``.
        """
        if self._redis is None:
            raise NotConnected(self.name)
        return self._redis

    async def plan_reset(
        self,
        processor: str,
        *,
        to: str | datetime,
        state: StateChoice | None = None,
        partitions: Sequence[int] | None = None,
    ) -> ResetPlan:
        """Work out where ``processor`` would read from after a reset, and how many
        events it would process, changing nothing (what ``streamkit reset`` shows before
        it asks). Inside ``async with app:``.

        Args:
            processor: the processor's name.
            to: ``"start"``, ``"end"``, an entry id (``"1700000000000-0"``: from that
                entry on), or an aware datetime (the events sent at or after it).
            state: for a processor with tables, windows or outputs: ``"clear"`` (with
                ``"start"``: rebuild its state from the retained events) or ``"keep"``
                (process the events again against the state as it stands).
            partitions: the partitions to reset (default: all).

        Error handling:
            :class:`~streamkit.lowlevel.ResetRefused` (one line, nothing changed) when
            the state's fate is missing or cannot be exact; :class:`ConfigError` for an
            unknown processor or partition.
        """
        return await plan_reset(
            self, self._processor(processor), to=to, state=state, partitions=partitions
        )

    async def reset(
        self,
        processor: str,
        *,
        to: str | datetime,
        state: StateChoice | None = None,
        partitions: Sequence[int] | None = None,
    ) -> ResetPlan:
        """Reset where ``processor`` reads its stream from, as ``streamkit reset`` does
        (see :meth:`plan_reset` for the arguments): one atomic step per partition,
        moving its consumer group and, with ``state="clear"``, deleting its state of
        the partition. Best run while no worker runs the processor; a worker that does
        loses the partition's lease to the reset's step, and starts the partition again
        (within the lease's TTL) from the new position, with the state loaded afresh.
        Returns the plan applied.

        Error handling:
            As :meth:`plan_reset`; :class:`~streamkit.lowlevel.ResetIncomplete` if Redis
            failed part-way (running it again finishes it).
        """
        found = self._processor(processor)
        plan = await plan_reset(self, found, to=to, state=state, partitions=partitions)
        if not plan.nothing_to_do:
            await apply_reset(self, found, plan)
        return plan

    def _processor(self, name: str) -> Processor:
        found = self.processors.get(name)
        if found is None:
            known = ", ".join(sorted(self.processors)) or "none"
            raise ConfigError("processor", f"unknown processor {name!r} (known: {known})")
        return found

    async def __aenter__(self) -> Self:
        if self._entered == 0:
            stack = contextlib.AsyncExitStack()
            async with stack:
                self._redis = await stack.enter_async_context(
                    open_redis(
                        self.settings.redis_url,
                        connect_timeout=self.settings.connect_timeout,
                        give_up_after=self.settings.connect_give_up_after,
                    )
                )
                if self.jobs:
                    from .jobs import open_job_queue

                    queues: dict[str, JobQueue] = {}
                    for short in {DEFAULT_QUEUE, *self.queue_names()}:
                        queue = await stack.enter_async_context(
                            open_job_queue(
                                self._redis,
                                routed_queue(self.name, short),
                                shards=self.settings.job_shards,
                                lease_ttl=self.settings.job_lease_ttl,
                                max_bytes=self.settings.job_max_bytes,
                            )
                        )
                        queue.middleware = self.job_middleware_chain
                        queue.lifespan = self.worker_lifespan
                        queues[short] = queue
                    for job in self.jobs.values():
                        queues[job.options.queue or DEFAULT_QUEUE].add(job)
                    self._job_queues = queues
                self._exit_stack = stack.pop_all()
        self._entered += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._entered -= 1
        if self._entered == 0 and self._exit_stack is not None:
            stack, self._exit_stack = self._exit_stack, None
            self._redis = None
            self._job_queues = {}
            await stack.__aexit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        state = "connected" if self._redis is not None else "not connected"
        return f"<App {self.name} streams={sorted(self.streams)} {state}>"


def _check_window_functions(time: object, result: object, merge: object, idle: object) -> None:
    """Refuse, where :meth:`App.window` is called, what would fail only at run time."""
    if not isinstance(time, str) and time is not None and not callable(time):
        raise ConfigError(
            "time", f"expected a field name, a function of the record or None, got {time!r}"
        )
    if not callable(result):
        raise ConfigError("result", f"must be a function of (key, window, value), got {result!r}")
    if merge is not None and not callable(merge):
        raise ConfigError("merge", f"must be a function of two values, or None, got {merge!r}")
    if not isinstance(idle, bool):
        raise ConfigError("idle", f"must be True or False, got {idle!r}")
