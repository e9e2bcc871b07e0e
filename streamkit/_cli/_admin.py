"""Inspection and administration of processors: status, position resets, resuming.

Used by ``streamkit status``, ``reset`` and ``resume``; usable from code too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import attrs

from .._data_loss import DataLossRecord, read_data_loss
from .._errors import ConfigError
from .._group_lag import undelivered
from .._halts import HaltRecord, clear_halt, decode_halt, halt_key, read_halt
from .._locks import _parse_value, lock_key
from .._membership_admin import read_membership, reset_membership
from .._redis import redis_errors
from .._replay import (
    ResetIncomplete,
    ResetRecord,
    ResetRefused,
    apply_reset,
    plan_reset,
    read_reset,
)
from .._state import BUFFERED_FIELD
from .._state_late import late_counts, late_fields, late_keys, windowed_names
from .._wire import text

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._app import App, Processor
    from .._membership_admin import MembershipSnapshot
    from .._streams import Stream

__all__ = [
    "MemberStatus",
    "PartitionStatus",
    "ProcessorReading",
    "ResetIncomplete",
    "ResetRefused",
    "delete_stream_keys",
    "halted_partitions",
    "lease_owner_name",
    "live_members",
    "member_name",
    "member_statuses",
    "processor_status",
    "read_processor",
    "reset_positions",
    "resume_partitions",
]


@attrs.frozen(kw_only=True)
class PartitionStatus:
    """One partition of a processor, as seen in Redis right now.

    Attributes:
        partition: the partition number.
        assigned_to: the member the assignment gives it to, or ``None``.
        owner: the owner id of the lease holder (the worker processing it), or
            ``None`` if nobody holds its lease.
        length: entries in the partition.
        lag: entries not yet processed: not yet delivered to the processor, or
            delivered and not yet acknowledged (a Kafka consumer's lag: the
            pending ones included, however far the worker read ahead), found from
            the entry ids rather than from Redis's own ``lag`` (which a restart from
            the AOF can leave wrong; see :mod:`streamkit._group_lag`); ``None`` if
            more than a thousand entries are not delivered yet and Redis cannot tell
            how many.
        pending: entries delivered but not yet acknowledged (part of ``lag``).
        last_event_at: when the newest entry was added, or ``None`` if empty.
        halted: why and since when the processor is halted on the partition (see
            ``streamkit resume``), or ``None``.
        entries_read: how many entries the processor's group has been delivered
            in all (Redis's ``entries-read`` counter, which trimming leaves alone;
            ``None`` if unknown): two readings give the processing rate.
        tables: the keys in the partition of each table the processor writes, by
            table name.
        reads_after: the id of the last entry delivered to the processor's group
            (where it reads from: after it), or ``None`` before a worker ran it.
        late: the late events each windowed table the processor writes dropped (or
            dead-lettered) on the partition so far, by table name: events whose
            windows had all closed.
        buffered: the events each stream-stream join the processor runs holds on the
            partition, waiting for a match or for their window to close, by join name.
    """

    partition: int
    assigned_to: str | None
    owner: str | None
    length: int
    lag: int | None
    pending: int
    last_event_at: datetime | None
    halted: HaltRecord | None = None
    entries_read: int | None = None
    tables: Mapping[str, int] = attrs.field(factory=dict)
    reads_after: str | None = None
    late: Mapping[str, int] = attrs.field(factory=dict)
    buffered: Mapping[str, int] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class ProcessorReading:
    """What :func:`read_processor` read of a processor.

    Attributes:
        members: the members of its group.
        partitions: its partitions, in order.
        ever_run: whether a worker ever joined its group (its state exists): with no
            member, the last worker left (or was reaped), rather than none ran yet.
        data_loss: the last data loss a worker found (Redis lost the processor's
            consumer groups or stream metadata while it ran), kept for a week.
        last_reset: the processor's last reset (``streamkit reset``), kept for a week.
    """

    members: list[MemberStatus]
    partitions: list[PartitionStatus]
    ever_run: bool
    data_loss: DataLossRecord | None = None
    last_reset: ResetRecord | None = None


def _entry_time(entry_id: bytes | str) -> datetime | None:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    milliseconds = int(text.split("-", 1)[0])
    if milliseconds == 0:
        return None
    return datetime.fromtimestamp(milliseconds / 1000, tz=UTC)


async def processor_status(app: App, processor: Processor) -> list[PartitionStatus]:
    """Describe every partition of ``processor``: owner, lag, pending, last event.

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    return (await read_processor(app, processor)).partitions


async def read_processor(app: App, processor: Processor) -> ProcessorReading:
    """``processor``'s members and partitions, in three pipelined round trips.

    One read of the membership (state and heartbeats), one pipeline for every
    partition's length, newest entry, lease, halt record and the size of each
    table the processor writes, one for the consumer groups of the partitions
    that exist; then, for each partition with entries not delivered to the group
    yet, one count of them (:func:`streamkit._group_lag.undelivered`). On a Redis
    Cluster a pipeline is sent per node (each partition has a slot of its own).

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    redis = app.redis
    snapshot = await read_membership(redis, processor.group)
    assignment = snapshot.assignment if snapshot is not None else None
    keys = processor.stream.partition_keys()
    locks = [lock_key(processor.keys.lock_name(p)) for p in range(len(keys))]
    halts = [halt_key(processor.keys, p) for p in range(len(keys))]
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            exists_requests = [pipe.exists([key]) for key in keys]
            length_requests = [pipe.xlen(key) for key in keys]
            last_requests = [pipe.xrevrange(key, count=1) for key in keys]
            lease_requests = [pipe.get(key) for key in locks]
            halt_requests = [pipe.hgetall(key) for key in halts]
            # (A global table is one hash, whatever the partition: counted once, on the
            # first partition's line.)
            size_requests = {
                table.name: [
                    pipe.hlen(table.key(p))
                    for p in range(1 if getattr(table, "is_global", False) else len(keys))
                ]
                for table in processor.tables
                if not getattr(table, "fixed", False)
            }
            windowed = windowed_names(processor.tables)
            state_keys = late_keys(
                processor.stream.spec.app, processor.stream.name, processor.name, range(len(keys))
            )
            late_requests = (
                [pipe.hmget(key, late_fields(windowed)) for key in state_keys] if windowed else []
            )
            joins = [table.name for table in processor.tables if getattr(table, "joins", False)]
            buffered_requests = (
                [pipe.hmget(key, [BUFFERED_FIELD + name for name in joins]) for key in state_keys]
                if joins
                else []
            )
        exists = [await request for request in exists_requests]
        lengths = [await request for request in length_requests]
        lasts = [await request for request in last_requests]
        leases = [await request for request in lease_requests]
        halt_fields = [await request for request in halt_requests]
        sizes = {
            name: [int(await request) for request in requests]
            for name, requests in size_requests.items()
        }
        for table in processor.tables:
            if getattr(table, "fixed", False):  # a hash per window: counted per window
                sizes[table.name] = await table.sizes(redis=redis)
        late = [late_counts(windowed, await request) for request in late_requests]
        buffered = [late_counts(joins, await request) for request in buffered_requests]
        # A processor with no worker yet has no group: all of a partition is lag.
        existing = [key for key, found in zip(keys, exists, strict=True) if found]
        async with redis.pipeline(transaction=False) as pipe:
            group_requests = {key: pipe.xinfo_groups(key) for key in existing}
        groups_of = {key: await request for key, request in group_requests.items()}
    statuses = []
    for partition, key in enumerate(keys):
        length, last, lease = lengths[partition], lasts[partition], leases[partition]
        info: dict[str, Any] = {}
        for group in groups_of.get(key, ()):
            fields = {text(k): v for k, v in group.items()}
            if text(fields.get("name")) == processor.group:
                info = fields
        # Not Redis's lag, which a restart from the AOF can leave wrong for good: the
        # entries after the last delivered one (see streamkit._group_lag).
        lag = (
            await undelivered(
                redis, key, info, newest=last[0].identifier if last else None, length=length
            )
            if info
            else length
        )
        read = info.get("entries-read") if info else 0
        pending = int(info.get("pending", 0))
        statuses.append(
            PartitionStatus(
                partition=partition,
                assigned_to=assignment.owner(partition) if assignment is not None else None,
                owner=_parse_value(lease)[0] if lease is not None else None,
                length=length,
                # Not yet processed: whether the worker read them ahead (pending) or
                # not (Redis's lag) is its business, not the reader's.
                lag=None if lag is None else int(lag) + pending,
                pending=pending,
                last_event_at=_entry_time(last[0].identifier) if last else None,
                halted=decode_halt(partition, halt_fields[partition]),
                entries_read=None if read is None else int(read),
                tables={
                    name: counts[partition]
                    for name, counts in sizes.items()
                    if partition < len(counts)
                },
                reads_after=text(info["last-delivered-id"]) if info else None,
                late=late[partition] if late else {},
                buffered=buffered[partition] if buffered else {},
            )
        )
    return ProcessorReading(
        members=_members(snapshot),
        partitions=statuses,
        ever_run=snapshot is not None,
        data_loss=await read_data_loss(redis, processor.group),
        last_reset=await read_reset(redis, processor.group),
    )


@attrs.frozen(kw_only=True)
class MemberStatus:
    """A member of a processor's group, as seen in Redis right now.

    Attributes:
        id: the member id (a random one, or the static ``member_id``).
        name: a name a person recognises: ``host:pid``, plus the member id of a
            static member (``host:pid (web-1)``).
        host: the host it runs on.
        pid: its process id.
        static: whether it is a static member.
        alive: whether its heartbeat is current.
        joined_at: when it joined.
        heartbeat_ttl: seconds until its heartbeat expires (``None`` if expired).
    """

    id: str
    name: str
    host: str
    pid: int
    static: bool
    alive: bool
    joined_at: datetime | None
    heartbeat_ttl: float | None


def member_name(host: str, pid: int, member_id: str, *, static: bool) -> str:
    """``host:pid``, with the member id of a static member: the name status shows."""
    name = f"{host}:{pid}" if host else member_id
    return f"{name} ({member_id})" if static and host else name


def lease_owner_name(owner: str) -> str:
    """The ``host:pid`` of a lease owner id (``host:pid:random`` by default)."""
    host_pid, sep, _ = owner.rpartition(":")
    if sep and host_pid.rpartition(":")[2].isdigit():
        return host_pid  # without the random part
    return owner


async def member_statuses(app: App, processor: Processor) -> list[MemberStatus]:
    """Every member of ``processor``'s group, alive or not (a static member that left).

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    return _members(await read_membership(app.redis, processor.group))


def _members(snapshot: MembershipSnapshot | None) -> list[MemberStatus]:
    if snapshot is None:
        return []
    return [
        MemberStatus(
            id=m.id,
            name=member_name(m.host, m.pid, m.id, static=m.static),
            host=m.host,
            pid=m.pid,
            static=m.static,
            alive=m.heartbeat_ttl is not None and m.heartbeat_ttl > 0,
            joined_at=datetime.fromtimestamp(m.joined_at, tz=UTC) if m.joined_at else None,
            heartbeat_ttl=m.heartbeat_ttl,
        )
        for m in snapshot.members
    ]


async def live_members(app: App, processor: Processor) -> list[str]:
    """The ids of the processor's members whose heartbeat has not expired."""
    snapshot = await read_membership(app.redis, processor.group)
    if snapshot is None:
        return []
    return [m.id for m in snapshot.members if m.heartbeat_ttl is not None and m.heartbeat_ttl > 0]


async def reset_positions(app: App, processor: Processor, *, to: Literal["start", "end"]) -> None:
    """Move a stateless ``processor`` to the start or the end of every partition (see
    :func:`streamkit._replay.plan_reset` for the general case, with state).

    Error handling:
        As :func:`~streamkit._replay.plan_reset` and
        :func:`~streamkit._replay.apply_reset`.
    """
    plan = await plan_reset(app, processor, to=to, state="keep" if to == "start" else None)
    await apply_reset(app, processor, plan)


async def halted_partitions(app: App, processor: Processor) -> dict[int, HaltRecord]:
    """The partitions ``processor`` is halted on, with why and since when.

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    halted = {}
    for partition in range(processor.stream.partition_count):
        record = await read_halt(app.redis, processor.keys, partition)
        if record is not None:
            halted[partition] = record
    return halted


async def resume_partitions(
    app: App, processor: Processor, *, partitions: list[int] | None = None, skip: bool = False
) -> dict[int, HaltRecord]:
    """Resume ``processor`` on its halted ``partitions`` (all halted ones by default).

    The worker owning each partition notices within a second and processes the
    halted events again, or, with ``skip``, the events after them (the halted
    events are acknowledged without being processed). Return the halt records
    cleared, by partition.

    Error handling:
        :class:`~streamkit.ConfigError` naming a partition the stream does not have;
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    count = processor.stream.partition_count
    for partition in partitions or ():
        if not 0 <= partition < count:
            raise ConfigError(
                "partition",
                f"{processor.stream.name} has no partition {partition} (0..{count - 1})",
            )
    wanted = range(count) if partitions is None else sorted(set(partitions))
    cleared = {}
    for partition in wanted:
        record = await clear_halt(
            app.redis, processor.keys, processor.stream.key(partition), partition, skip=skip
        )
        if record is not None:
            cleared[partition] = record
    return cleared


async def delete_stream_keys(app: App, stream: Stream[Any], processors: list[Processor]) -> int:
    """Delete ``stream``'s partitions and metadata, and its processors' memberships.

    What ``streamkit delete-stream`` does, so that the stream can be created again with
    other settings. Dead letters are kept. Returns how many events were deleted.

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    redis = app.redis
    keys = stream.partition_keys()
    # One pipeline, sent per node on a Redis Cluster; one key per DEL, as each
    # partition has a slot of its own.
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            lengths = [pipe.xlen(key) for key in keys]
            for key in keys:
                pipe.delete([key])
        events = sum([await length for length in lengths])
    for processor in processors:
        await reset_membership(redis, processor.group)
    with redis_errors():
        await redis.delete([stream.spec.meta_key])
    return events
