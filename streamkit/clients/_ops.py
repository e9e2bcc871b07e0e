"""What the blocking and asyncio clients do, written once, without I/O: operations as generators.

Each operation (send records, enqueue jobs, follow a job, read a table) is a generator
that yields the Redis work it needs and is sent back the replies (the requests of
:mod:`streamkit._ops`: a ``Call``, a ``CallBatch`` of calls sent together, a ``Sleep``
before trying again, ``NOW``). The blocking client runs it with blocking sockets and
``time.sleep``; the asyncio client with awaits (:mod:`._blocking`, :mod:`._asyncio`):
one definition, thin drivers, never a generated copy. What the Trio side does too is
not here but below, run by its driver as well: the idempotent append
(:func:`streamkit._ops.append`) and enqueueing (:mod:`streamkit.jobs._ops`).

Below the operations, every decision is the Trio side's own, from the same pure
modules: records into append calls and the metadata check (:mod:`streamkit._produce`),
the retry rule (:mod:`streamkit._retrying`), job enqueue plans
(:mod:`streamkit.jobs._plan`), the queue's replies (:mod:`streamkit.jobs._replies`),
and the scripts (:mod:`streamkit._lua`).

Why one room (about 600 lines): every client operation, so that both drivers read one
list and none can drift from the other.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs

from .. import _lua
from .._defaults import DEFAULT_JOB_MAX_BYTES
from .._errors import ConfigError, JobNotFound, RedisUnavailable, StreamkitError
from .._keys import parse_window_member as parse_member
from .._ops import NOW, Call, CallBatch, Now, Op, Request, Sleep, append, retried
from .._partitioner import canonical_key_bytes, key_text
from .._produce import (
    AppendCall,
    FinishedMarkers,
    check_metadata_reply,
    check_send_options,
    encode_window,
    metadata_arguments,
    windows,
)
from .._retrying import RetryRule
from .._tables import _NO_DEFAULT
from .._tables_versioned import VersionedTable, as_of_ms
from .._tables_windowed import WindowedTable
from .._windows import Window
from ..jobs._layout import DEFAULT_QUEUE, ShardKeys, routed_queue, shard_for
from ..jobs._ops import send_plan, send_workflow
from ..jobs._plan import JobIds, Placement, plan_enqueue
from ..jobs._replies import (
    abort_reply,
    decode_events,
    decode_output,
    events_after,
    info_reply,
    status_reply,
    watch_reply,
)
from ..jobs._workflow import plan_workflow

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from .._settings import Settings
    from .._spec import StreamSpec
    from .._tables import Table
    from ..jobs._model import JobCall, JobChunk, JobEvent, JobInfo, JobStatus, Priority, When
    from ..jobs._plan import JobLike
    from ..jobs._workflow import Workflow

__all__ = [
    "NOW",
    "Call",
    "CallBatch",
    "ClientState",
    "Now",
    "Op",
    "Request",
    "SendsRecords",
    "Sleep",
]

T = TypeVar("T")

#: Longest block of one ``XREAD`` waiting for a job's end: well within the socket
#: timeout, so a server that died is noticed.
RESULT_BLOCK = 5.0
#: Keys read per ``HSCAN`` call when iterating a table.
SCAN_COUNT = 1000


_METADATA = _lua.script("streams/metadata")
_TABLE_READ = _lua.script("tables/read")
_TABLE_SCAN = _lua.script("tables/scan")
_WATCH = _lua.script("jobs/watch")
_ABORT = _lua.script("jobs/abort")


# --------------------------------------------------------------------------- state


class SendsRecords(Protocol):
    """What a client needs of a stream (a :class:`~streamkit.Stream`)."""

    @property
    def spec(self) -> StreamSpec[Any]: ...

    @property
    def settings(self) -> Settings: ...


@attrs.define(eq=False)
class ClientState:
    """What one client keeps between operations; safe to share between threads.

    Attributes:
        queue: the app's job queue name.
        shards: its shard count.
        jobs: the app's declared jobs, by name.
        markers: the markers of finished appends (deleted by the next appends).
        new_id: makes job ids.
        checked: the streams whose metadata this client checked.
        max_bytes: the most bytes a job's encoded arguments may take (the queue's
            ``job_max_bytes``).
        placement: ``shards``, ``new_id`` and ``max_bytes``, for planning enqueues.
    """

    queue: str
    shards: int
    jobs: Mapping[str, JobLike]
    max_bytes: int = DEFAULT_JOB_MAX_BYTES
    markers: FinishedMarkers = attrs.field(factory=FinishedMarkers)
    new_id: JobIds = attrs.field(factory=JobIds)
    checked: set[str] = attrs.field(factory=set)
    placement: Placement = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.placement = Placement(self.shards, self.new_id, self.max_bytes)

    def job(self, job: JobLike | str) -> JobLike:
        """The app's job ``job`` (given, or by name).

        Error handling:
            :class:`~streamkit.ConfigError` for a job the app does not declare.
        """
        name = job if isinstance(job, str) else getattr(job, "name", None)
        declared = self.jobs.get(name) if isinstance(name, str) else None
        if declared is None or (not isinstance(job, str) and declared is not job):
            raise ConfigError("job", f"{job!r} is not a job of app {self.queue!r}")
        return declared

    def keys(self, shard: int, queue: str | None = None) -> ShardKeys:
        """The keys of a shard of the app's queue (or of its queue ``queue``, a full
        name)."""
        return ShardKeys(queue or self.queue, shard)

    def named_queues(self) -> list[str]:
        """The app's named queues (``@app.job(queue=...)``), by their short names, sorted."""
        return sorted(
            {job.options.queue for job in self.jobs.values() if job.options.queue} - {DEFAULT_QUEUE}
        )

    def queue_named(self, queue: str | None) -> str | None:
        """The full name of the app's queue ``queue`` (a short name, as given to
        ``@app.job(queue=...)``), or ``None`` for its default one (``None`` or
        ``"default"``).

        Error handling:
            :class:`~streamkit.ConfigError` for a queue none of the app's jobs is
            routed to.
        """
        if queue is None or queue == DEFAULT_QUEUE:
            return None
        named = self.named_queues()
        if queue not in named:
            known = ", ".join([DEFAULT_QUEUE, *named])
            raise ConfigError(
                "queue", f"app {self.queue!r} has no queue {queue!r} (known: {known})"
            )
        return routed_queue(self.queue, queue)

    def hinted(self, exc: JobNotFound, queue: str | None) -> JobNotFound:
        """``exc``, for a job looked for on ``queue`` (``None``: the default one), with a
        hint at the app's named queues where it has any and the default one was looked at."""
        named = self.named_queues()
        if queue is not None or not named:
            return exc
        plural = "s" if len(named) > 1 else ""
        return JobNotFound(
            exc.job_id,
            exc.queue,
            hint=(
                f" (a job of the app's named queue{plural} {', '.join(named)} is found with "
                f"handle(job_id, queue={named[0]!r}))"
            ),
        )

    def queue_of(self, job: JobLike) -> str:
        """The name of the queue ``job`` is routed to (see ``@app.job(queue=...)``)."""
        return routed_queue(self.queue, job.options.queue)

    def shard_of(self, job_id: str) -> int:
        """The shard job ``job_id`` lives on."""
        return shard_for(job_id, self.shards)


# ------------------------------------------------------------------------- streams


def check_metadata(state: ClientState, spec: StreamSpec[Any]) -> Op[None]:
    """Record ``spec``'s metadata in Redis, or check it against what is recorded; once
    per stream and client (see :meth:`Stream.check_metadata <streamkit.Stream>`)."""
    if spec.meta_key in state.checked:
        return
    reply = yield from retried(
        Call.run(_METADATA, [spec.meta_key], metadata_arguments(spec)),
        what=f"checking the metadata of {spec.name}",
    )
    check_metadata_reply(spec, reply)
    state.checked.add(spec.meta_key)


def send_many(
    state: ClientState,
    stream: SendsRecords,
    records: Iterable[Any],
    *,
    chunk_size: int | None,
    on_sent: Callable[[int], None] | None,
    replicas: int,
    replica_timeout: float,
) -> Op[list[str]]:
    """Append ``records``; return their entry ids (see :meth:`Stream.send_many
    <streamkit.Stream.send_many>`)."""
    spec, settings = stream.spec, stream.settings
    chunk = chunk_size if chunk_size is not None else settings.send_chunk_size
    check_send_options(chunk, replicas, replica_timeout)
    yield from check_metadata(state, spec)
    ids: list[str] = []
    for records_window in windows(records, chunk, spec.partition_count):
        window = encode_window(spec, records_window)
        # Round after round, the next chunk of every partition, in one batch: the
        # chunks of a partition are appended one after the other, in order, as the Trio
        # producer does; the partitions' chunks travel together.
        queued = {p: window.chunks(p, chunk) for p in window.positions}
        while queued:
            step = [(p, *chunks.pop(0)) for p, chunks in queued.items()]
            appends = [
                AppendCall.make(
                    state.markers,
                    spec.key(partition),
                    keep=settings.partition_size,
                    cap=settings.max_len or 0,
                    entries=window.arguments(partition, start, end),
                    stream=spec.name,
                    partition=partition,
                )
                for partition, start, end in step
            ]
            replies = yield from append(
                state.markers, appends, replicas=replicas, replica_timeout=replica_timeout
            )
            for (partition, start, _), (entry_ids, _) in zip(step, replies, strict=True):
                window.landed(partition, start, entry_ids)
            queued = {p: chunks for p, chunks in queued.items() if chunks}
        ids.extend(window.ids)
        if on_sent is not None:
            on_sent(len(records_window))
    return ids


def send(
    state: ClientState,
    stream: SendsRecords,
    records: Sequence[Any],
    *,
    replicas: int,
    replica_timeout: float,
) -> Op[list[str]]:
    """Append ``records`` (a client's ``send(stream, *records)``): one record without
    ``replicas`` by :func:`send_one`, for its latency, else by :func:`send_many`."""
    if len(records) == 1 and not replicas:
        return send_one(state, stream, records[0])
    return send_many(
        state,
        stream,
        records,
        chunk_size=None,
        on_sent=None,
        replicas=replicas,
        replica_timeout=replica_timeout,
    )


def send_one(state: ClientState, stream: SendsRecords, record: Any) -> Op[list[str]]:
    """Append one record (``send(stream, record)``): :func:`send_many`'s steps for one
    record, without its windows and batches, for the latency of a single send."""
    spec, settings = stream.spec, stream.settings
    # Encoded first: an invalid record is refused before any round trip.
    window = encode_window(spec, (record,))
    if spec.meta_key not in state.checked:
        yield from check_metadata(state, spec)
    (partition,) = window.positions
    append_call = AppendCall.make(
        state.markers,
        spec.key(partition),
        keep=settings.partition_size,
        cap=settings.max_len or 0,
        entries=window.arguments(partition, 0, 1),
        stream=spec.name,
        partition=partition,
    )
    ((entry_ids, _),) = yield from append(state.markers, (append_call,))
    return entry_ids


# ---------------------------------------------------------------------------- jobs


def enqueue(
    state: ClientState,
    job: JobLike,
    calls: Iterable[JobCall | tuple[Any, ...] | Mapping[str, Any]],
    *,
    priority: Priority | None = None,
    delay: When | None = None,
) -> Op[list[tuple[str, int, bool]]]:
    """Enqueue ``job`` once per call; return per call the job that runs for it, ``(id,
    shard, added)`` (see :meth:`Job.enqueue_many <streamkit.jobs.Job.enqueue_many>`;
    ``added`` is false for a debounced or throttled call that another job took).

    An enqueue is not idempotent (without ``job_id``): like the Trio queue's, a call
    is sent again only while it surely never reached Redis.
    """
    queue = state.queue_of(job)
    plan = plan_enqueue(job, calls, state.placement, queue=queue, priority=priority, delay=delay)
    return (yield from send_plan(plan, queue))


def enqueue_workflow(state: ClientState, workflow: Workflow) -> Op[tuple[str, str, int]]:
    """Enqueue a workflow (see :meth:`JobQueue.enqueue_workflow
    <streamkit.jobs.JobQueue.enqueue_workflow>`); return its final job's ``(queue, id,
    shard)``. Links are retried (they are idempotent); an enqueue is sent again only
    while it surely never reached Redis."""
    plan = plan_workflow(
        workflow,
        queue_of=lambda job: state.queue_of(state.job(job)),
        placement=state.placement,
    )
    yield from send_workflow(plan)
    final = plan.placed[plan.final]
    return final.queue, final.id, final.shard


def hinting(state: ClientState, queue: str | None, op: Op[T]) -> Op[T]:
    """``op``, on a job of ``queue``, with :meth:`ClientState.hinted`'s hint on its
    :class:`~streamkit.jobs.JobNotFound`."""
    try:
        return (yield from op)
    except JobNotFound as exc:
        raise state.hinted(exc, queue) from None


def job_status(
    state: ClientState, job_id: str, shard: int, queue: str | None = None
) -> Op[JobStatus]:
    """Where job ``job_id`` is now.

    See :meth:`JobHandle.status <streamkit.jobs.JobHandle.status>`.
    """
    value = yield from retried(
        Call.command("HGET", state.keys(shard, queue).job(job_id), "status"),
        what="reading a job's status",
    )
    return status_reply(value, job_id, queue or state.queue)


def job_info(state: ClientState, job_id: str, shard: int, queue: str | None = None) -> Op[JobInfo]:
    """Everything the queue records of job ``job_id``."""
    fields = yield from retried(
        Call.command("HGETALL", state.keys(shard, queue).job(job_id)), what="reading a job"
    )
    return info_reply(fields, job_id, queue or state.queue)


def job_abort(
    state: ClientState, job_id: str, shard: int, reason: str, queue: str | None = None
) -> Op[JobStatus]:
    """Abort job ``job_id`` (see :meth:`JobHandle.abort <streamkit.jobs.JobHandle.abort>`)."""
    keys = state.keys(shard, queue)
    reply = yield from retried(
        Call.run(_ABORT, list(keys.keys), (keys.base, job_id, reason)), what="aborting a job"
    )
    return abort_reply(reply, job_id, queue or state.queue)


def job_result(
    state: ClientState, job_id: str, shard: int, timeout: float | None, queue: str | None = None
) -> Op[Any]:
    """Wait until job ``job_id`` is over; return its result (see :meth:`JobHandle.result
    <streamkit.jobs.JobHandle.result>`).

    Waiting does not poll: it blocks on the shard's completion stream (``XREAD
    BLOCK``), to which the queue's scripts add the ids of awaited jobs as they end,
    and looks at the job again when its id comes by (or every few seconds).

    Error handling:
        ``TimeoutError`` after ``timeout`` seconds; the queue's errors as
        :func:`streamkit.jobs._replies.watch_reply` says.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    keys = state.keys(shard, queue)
    # Where the completion stream ends now, before the job is looked at: a completion
    # added after the look is then read.
    last = yield from retried(
        Call.command("XREVRANGE", keys.done, "+", "-", "COUNT", 1),
        what="reading job completions",
    )
    cursor = last[0][0] if last else b"0-0"
    while True:
        reply = yield from retried(
            Call.run(_WATCH, list(keys.keys), (keys.base, job_id)),
            what="waiting for a job's result",
        )
        final, result = watch_reply(reply, job_id, queue or state.queue)
        if final:
            return result
        while True:
            block = RESULT_BLOCK
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"job {job_id} did not end within {timeout:g}s")
                block = min(block, remaining)
            entries = yield from retried(
                Call.command(
                    "XREAD", "COUNT", 1000, "BLOCK", max(1, round(block * 1000)), "STREAMS",
                    keys.done, cursor,
                ),
                what="waiting for job results",
            )  # fmt: skip
            ended = not entries  # nothing within the block: look at the job again
            for _, stream_entries in entries or ():
                for entry_id, fields in stream_entries:
                    cursor = entry_id
                    if fields.get(b"id") == job_id.encode():
                        ended = True
            if ended:
                break


#: How long one read of a job's streamed output blocks before the job is looked at (ms).
OUTPUT_BLOCK_MS = 1000


def job_output(
    state: ClientState, job_id: str, shard: int, cursor: str, queue: str | None = None
) -> Op[tuple[list[JobChunk], str | None]]:
    """One read of the chunks job ``job_id`` streamed after ``cursor`` (blocking up to
    :data:`OUTPUT_BLOCK_MS`), and its final status once it ended (see
    :meth:`JobHandle.stream <streamkit.jobs.JobHandle.stream>`)."""
    keys = state.keys(shard, queue)
    reply = yield from retried(
        Call.command(
            "XREAD", "COUNT", 500, "BLOCK", OUTPUT_BLOCK_MS, "STREAMS", keys.output(job_id), cursor
        ),
        what="reading a job's streamed output",
    )
    entries = [entry for _, stream_entries in reply or () for entry in stream_entries]
    chunks, end = decode_output(entries)
    if end is None and not entries:
        status = yield from job_status(state, job_id, shard, queue)
        if status.final:
            end = status.value
    return chunks, end


#: How long one read of a single shard's job events blocks (ms); several shards are
#: read in turn without blocking, every :data:`EVENTS_POLL` seconds while idle.
EVENTS_BLOCK_MS = 1000
EVENTS_POLL = 0.1


def job_events(state: ClientState, cursors: list[str], *, follow: bool) -> Op[list[JobEvent]]:
    """The job events of every shard of the app's queue after ``cursors`` (one
    position per shard, moved past what is read; see :meth:`JobQueue.events
    <streamkit.jobs.JobQueue.events>`); following, a read waits a while for new ones."""
    events: list[JobEvent] = []
    for shard in range(state.shards):
        key = f"{state.keys(shard).base}:events"
        if follow and state.shards == 1:
            start = events_after(cursors[0])
            reply = yield from retried(
                Call.command(
                    "XREAD", "COUNT", 500, "BLOCK", EVENTS_BLOCK_MS, "STREAMS", key, start
                ),
                what="reading job events",
            )
            entries = [entry for _, stream_entries in reply or () for entry in stream_entries]
        else:
            entries = yield from retried(
                Call.command("XRANGE", key, f"({events_after(cursors[shard])}", "+", "COUNT", 500),
                what="reading job events",
            )
        for eid, fields in entries:
            events.extend(decode_events(eid, fields, shard, cursors))
    if follow and not events and state.shards > 1:
        yield Sleep(EVENTS_POLL)
    return events


# -------------------------------------------------------------------------- tables


def _decoded(table: Table[Any] | WindowedTable[Any], raw: bytes) -> Any:
    if isinstance(table, WindowedTable):
        return [(Window.from_ms(s.start, s.end), s.value) for s in table.decode(raw)]
    return table.decode(raw)


def _missing(table: Table[Any] | WindowedTable[Any], default: Any) -> Any:
    if isinstance(table, WindowedTable):
        return []
    return table.default if default is _NO_DEFAULT else default


def _check_table(table: object) -> None:
    """Refuse what is not a table the clients read (a stream-stream join, say)."""
    if getattr(table, "joins", False):
        raise ConfigError(
            "table",
            f"{table!r} is a stream-stream join, not a table: its results are records of "
            f"its output stream (read them with the stream's reader)",
        )


def table_read(
    table: Table[Any] | WindowedTable[Any], key: object, default: Any, as_of: object = None
) -> Op[Any]:
    """The committed value of ``key`` (see :meth:`Table.read <streamkit.Table.read>`,
    :meth:`WindowedTable.read <streamkit.WindowedTable.read>`); of a versioned table,
    the one in force ``as_of`` a time (see :meth:`VersionedTable.read
    <streamkit.lowlevel.VersionedTable.read>`)."""
    _check_table(table)
    if as_of is not None:
        if not isinstance(table, VersionedTable):
            raise ConfigError("as_of", f"{table!r} is not a versioned table: it has no history")
        moment = as_of_ms(as_of)
        versions = yield from table_read(table.versions, key, None)
        return table.value_as_of(versions, moment, default)
    partition = table.partition_of(key)
    field = canonical_key_bytes(key)
    if isinstance(table, WindowedTable) and table.fixed:
        hashes = yield from _window_hashes(table, partition)
        raws = yield from batched(
            [Call.command("HGET", key, field) for _, _, key in hashes],
            what=f"reading table {table.name}",
        )
        found = sorted(
            (start, end, table.decode_value(raw))
            for (start, end, _), raw in zip(hashes, raws, strict=True)
            if raw is not None
        )
        return [(Window.from_ms(start, end), value) for start, end, value in found]
    call = _table_get(table, partition, [field], one=True)
    raw = yield from retried(call, what=f"reading table {table.name}")
    if isinstance(raw, list):  # read through tables/read (a table whose keys expire)
        raw = raw[0]
    return _missing(table, default) if raw is None else _decoded(table, raw)


def _table_get(
    table: Table[Any] | WindowedTable[Any], partition: int, fields: list[bytes], *, one: bool
) -> Call:
    """The call reading ``fields`` of a table's partition: ``HGET`` (``one``) or
    ``HMGET``, or, for a table whose keys expire, ``tables/read`` (a list, never an
    expired key)."""
    if getattr(table, "ttl", None) is not None:
        keys = [table.key(partition), table.expiry_key(partition)]  # type: ignore[union-attr]
        return Call.run(_TABLE_READ, keys, fields)
    if one:
        return Call.command("HGET", table.key(partition), fields[0])
    return Call.command("HMGET", table.key(partition), *fields)


def _window_hashes(table: WindowedTable[Any], partition: int) -> Op[list[tuple[int, int, str]]]:
    """The hashes of ``partition``'s windows (tumbling, hopping): ``(start, end, key)``."""
    members = yield from retried(
        Call.command("ZRANGE", table.windows_key(partition), 0, -1),
        what=f"reading table {table.name}",
    )
    hashes = []
    for member in members:
        start, end, closed = parse_member(member)
        make = table.closed_key if closed else table.values_key
        hashes.append((start, end, make(partition, start)))
    return hashes


def batched(calls: Sequence[Call], *, what: str) -> Op[list[Any]]:
    """Run idempotent ``calls`` together, all of them again while Redis is unavailable."""
    if not calls:
        return []
    rule = RetryRule(what, idempotent=True, started=(yield NOW))
    while True:
        replies = yield CallBatch(tuple(calls))
        failed = next((r for r in replies if isinstance(r, StreamkitError)), None)
        if failed is None:
            return list(replies)
        if not isinstance(failed, RedisUnavailable):
            raise failed
        yield Sleep(rule.next_delay(failed, (yield NOW)))


def table_read_many(
    table: Table[Any] | WindowedTable[Any], keys: Iterable[object]
) -> Op[list[Any]]:
    """The committed values of ``keys``, in order; one batch of one ``HMGET`` per partition."""
    _check_table(table)
    keys = list(keys)
    by_partition: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_partition.setdefault(table.partition_of(key), []).append(i)
    if isinstance(table, WindowedTable) and table.fixed:
        windows = []
        for key in keys:
            windows.append((yield from table_read(table, key, _NO_DEFAULT)))  # noqa: PERF401
        return windows
    calls = [
        _table_get(table, p, [canonical_key_bytes(keys[i]) for i in positions], one=False)
        for p, positions in by_partition.items()
    ]
    out = [_missing(table, _NO_DEFAULT)] * len(keys)
    replies = yield from batched(calls, what=f"reading table {table.name}")
    for positions, raws in zip(by_partition.values(), replies, strict=True):
        for i, raw in zip(positions, raws, strict=True):
            if raw is not None:
                out[i] = _decoded(table, raw)
    return out


def table_page(
    table: Table[Any] | WindowedTable[Any], partition: int, cursor: int
) -> Op[tuple[int, list[tuple[str, Any]]]]:
    """One ``HSCAN`` page of a partition: the next cursor (0: done) and its items (for
    tumbling and hopping windows, the whole partition: its keys' windows span hashes)."""
    _check_table(table)
    if isinstance(table, WindowedTable) and table.fixed:
        by_key: dict[bytes, list[tuple[int, int, Any]]] = {}
        for start, end, key in (yield from _window_hashes(table, partition)):
            window_cursor = 0
            while True:
                window_cursor, window_page = yield from retried(
                    Call.command("HSCAN", key, window_cursor, "COUNT", SCAN_COUNT),
                    what=f"reading table {table.name}",
                )
                for field, raw in window_page.items():
                    value = table.decode_value(raw)
                    by_key.setdefault(field, []).append((start, end, value))
                if int(window_cursor) == 0:
                    break
        return 0, [
            (key_text(field), [(Window.from_ms(s, e), v) for s, e, v in sorted(found)])
            for field, found in by_key.items()
        ]
    if getattr(table, "ttl", None) is not None:
        keys = [table.key(partition), table.expiry_key(partition)]  # type: ignore[union-attr]
        next_cursor, flat = yield from retried(
            Call.run(_TABLE_SCAN, keys, [cursor, SCAN_COUNT]), what=f"reading table {table.name}"
        )
        items = [(key_text(flat[i]), _decoded(table, flat[i + 1])) for i in range(0, len(flat), 2)]
        return int(next_cursor), items
    reply = yield from retried(
        Call.command("HSCAN", table.key(partition), cursor, "COUNT", SCAN_COUNT),
        what=f"reading table {table.name}",
    )
    next_cursor, page = reply
    return int(next_cursor), [
        (key_text(field), _decoded(table, raw)) for field, raw in page.items()
    ]


def table_partitions(
    table: Table[Any] | WindowedTable[Any], partition: int | None
) -> range | list[int]:
    """The partitions an iteration over ``table`` reads."""
    _check_table(table)
    count = table.partition_total()  # raises the table's ConfigError if nothing writes it
    return range(count) if partition is None else [partition]


def table_sizes(table: Table[Any] | WindowedTable[Any]) -> Op[list[int]]:
    """The number of keys in each partition, in partition order (as
    :meth:`WindowedTable.sizes <streamkit.WindowedTable.sizes>` for windows)."""
    _check_table(table)
    what = f"reading table {table.name}"
    if isinstance(table, WindowedTable) and table.fixed:
        sizes = []
        for p in table_partitions(table, None):
            hashes = yield from _window_hashes(table, p)
            calls = [Call.command("HLEN", k) for _, _, k in hashes]
            lengths = yield from batched(calls, what=what)
            sizes.append(sum(int(n) for n in lengths))
        return sizes
    calls = [Call.command("HLEN", table.key(p)) for p in table_partitions(table, None)]
    return [int(r) for r in (yield from batched(calls, what=what))]
