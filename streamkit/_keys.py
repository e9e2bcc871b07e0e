"""The Redis key layout, in one place.

Hash tags (the part in braces) decide the Redis Cluster slot of a key. Each partition's
stream and that partition's locks share the tag ``{app.stream.N}``, so one Lua script
can check a lease and acknowledge in a single step; each processor's coordination keys
share the tag ``{app.stream.processor}``.

=================================  ===================================================
key                                what it holds
=================================  ===================================================
``__strm:{app.stream.N}``          partition N of a stream (a Redis stream)
``__meta:{app.stream}``            the stream's recorded metadata (a hash)
``__lock:{app.stream.N}.proc``     processor ``proc``'s lease on partition N
``__halt:{app.stream.N}.proc``     why processor ``proc`` halted on partition N (a hash)
``__memb:{app.stream.proc}``       the processor's members and assignment
``__ctrl:{app.stream.proc}``       the processor's control stream
``__beat:{app.stream.proc}:ID``    member ID's heartbeat
``__rset:{app.stream.proc}``       the last reset of the processor (JSON, for
                                   ``streamkit status``; expires)
``__loss:{app.stream.proc}``       the last data loss a worker found for the processor
                                   (JSON, for ``streamkit status``; expires)
``__dead:{app.stream.proc}``       the processor's dead letters (a Redis stream)
``__lock:{app}.leader``            the app's leader lease
``__lock:{name}:fence``            a lock's fencing-token counter (no TTL)
``__lock:{app.stream.N}.proc:      a fenced read's permit: exists only inside the
permit``                           transaction of one read (see ``commit/permit``)
``__lock:{name}``                  any lock of the lock manager (the name is made a
                                   hash tag unless it holds one)
``__sprk:{app.stream.N}:...``      a Spark write's idempotency marker (expires)
``__once:{app.stream.N}:...``      a producer append's idempotency marker (expires)
``__tabl:{app.stream.N}.table``    partition N of a table written by a processor of
                                   the stream (a hash: canonical key -> value)
``__texp:{app.stream.N}.table``    its keys by when they expire, for a table with a
                                   ``ttl`` (a sorted set: key -> ms)
``__wind:{app.stream.N}.table``    partition N of a session table (a hash: key ->
                                   its sessions)
``__wndx:{app.stream.N}.table``    its keys by when their windows are next due (a
                                   sorted set)
``__wins:{app.stream.N}.table``    the windows of a tumbling or hopping windowed
                                   table (a sorted set of starts, by when due)
``__wval:{app.stream.N}.table:S``  the keys' values in its window starting at ``S``
                                   (ms), open (a hash: canonical key -> value)
``__wcls:{app.stream.N}.table:S``  the same once closed, kept for the retention
``__join:{app.J__in.N}.J``         join ``J``'s events waiting for a match on partition
                                   N (a hash: side and key -> its events)
``__jndx:{app.J__in.N}.J``         its keys, by when their events go (a sorted set)
``__stat:{app.stream.N}.proc``     processor ``proc``'s state of partition N: its
                                   watermark and late-event counts (a hash)
``__obox:{app.stream.N}.proc``     records processor ``proc`` emitted on partition N,
                                   waiting to be relayed (Redis Cluster only)
``__rely:{app.out.M}:source``      the last outbox entry relayed from ``source`` to
                                   partition M of stream ``out`` (Redis Cluster only)
=================================  ===================================================

The job queue's keys are laid out by its own module, :mod:`streamkit.jobs._layout`
(``__jobs:{queue.shard}...``), under the same rule: one hash tag per shard.
"""

from __future__ import annotations

import re

from ._errors import ConfigError

__all__ = [
    "closed_window_member",
    "control_key",
    "data_loss_key",
    "dead_letter_key",
    "fence_key",
    "halt_key",
    "hash_tag_of",
    "heartbeat_key",
    "join_index_key",
    "join_key",
    "leader_lock_name",
    "lock_key",
    "membership_key",
    "meta_key",
    "once_marker_prefix",
    "open_window_member",
    "outbox_key",
    "parse_partition_lock_name",
    "parse_window_member",
    "partition_lock_name",
    "permit_key",
    "processor_group",
    "relay_key",
    "reset_key",
    "spark_marker_key",
    "state_key",
    "stream_key",
    "table_expiry_key",
    "table_key",
    "tagged",
    "validate_name",
    "window_closed_key",
    "window_index_key",
    "window_key",
    "window_values_key",
    "windows_key",
]

_NAME = re.compile(r"[A-Za-z0-9_\-]+\Z")


def validate_name(kind: str, name: str) -> str:
    """Return ``name`` if it is usable in key names, else raise :class:`ConfigError`.

    Names are letters, digits, ``_`` and ``-``: dots and braces separate the parts of
    keys and hash tags, so allowing them would let two names map to one key.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(kind, f"must be letters, digits, '_' or '-', got {name!r}")
    return name


def stream_key(app: str, stream: str, partition: int) -> str:
    """The Redis stream holding ``partition`` of ``stream``."""
    return f"__strm:{{{app}.{stream}.{partition}}}"


def meta_key(app: str, stream: str) -> str:
    """The hash recording a stream's partition count, record type and format."""
    return f"__meta:{{{app}.{stream}}}"


def partition_lock_name(app: str, stream: str, processor: str, partition: int) -> str:
    """The lock name (for the lock manager) of a processor's lease on a partition."""
    return f"{{{app}.{stream}.{partition}}}.{processor}"


_PARTITION_LOCK = re.compile(r"\{(.+)\.(\d+)\}\.([^.{}]+)\Z")


def parse_partition_lock_name(name: str) -> tuple[str, int] | None:
    """The processor group and partition of a partition lock's name (see
    :func:`partition_lock_name`), or ``None`` for another lock's."""
    match = _PARTITION_LOCK.match(name)
    if match is None:
        return None
    return f"{match[1]}.{match[3]}", int(match[2])


def processor_group(app: str, stream: str, processor: str) -> str:
    """The membership group, and consumer group, name of a processor."""
    return f"{app}.{stream}.{processor}"


def dead_letter_key(app: str, stream: str, processor: str) -> str:
    """The Redis stream collecting a processor's dead letters."""
    return f"__dead:{{{app}.{stream}.{processor}}}"


def halt_key(app: str, stream: str, processor: str, partition: int) -> str:
    """The hash recording that ``processor`` halted on ``partition`` (absent: not
    halted); in the partition's slot, beside its stream and lease."""
    return f"__halt:{{{app}.{stream}.{partition}}}.{processor}"


def leader_lock_name(app: str) -> str:
    """The lock name (for the lock manager) of the app's leader lease."""
    return f"{{{app}}}.leader"


def table_key(app: str, stream: str, table: str, partition: int) -> str:
    """The hash holding ``partition`` of ``table``, beside the stream's partition."""
    return f"__tabl:{{{app}.{stream}.{partition}}}.{table}"


def table_expiry_key(app: str, stream: str, table: str, partition: int) -> str:
    """The sorted set of ``partition``'s keys of ``table`` by when they expire (ms)."""
    return f"__texp:{{{app}.{stream}.{partition}}}.{table}"


def join_key(app: str, stream: str, join: str, partition: int) -> str:
    """The hash of a join's buffered events on ``partition`` of its inner stream."""
    return f"__join:{{{app}.{stream}.{partition}}}.{join}"


def join_index_key(app: str, stream: str, join: str, partition: int) -> str:
    """The sorted set of a join's buffered keys on ``partition``, by when they are due."""
    return f"__jndx:{{{app}.{stream}.{partition}}}.{join}"


def window_key(app: str, stream: str, table: str, partition: int) -> str:
    """The hash holding ``partition`` of the windowed table ``table``."""
    return f"__wind:{{{app}.{stream}.{partition}}}.{table}"


def window_index_key(app: str, stream: str, table: str, partition: int) -> str:
    """The sorted set of the windows of ``partition`` of ``table``, by end time."""
    return f"__wndx:{{{app}.{stream}.{partition}}}.{table}"


def windows_key(app: str, stream: str, table: str, partition: int) -> str:
    """The sorted set of the windows of ``partition`` of a tumbling or hopping table."""
    return f"__wins:{{{app}.{stream}.{partition}}}.{table}"


def window_values_key(app: str, stream: str, table: str, partition: int, start: int) -> str:
    """The hash of every key's value in the window starting at ``start`` (ms)."""
    return f"__wval:{{{app}.{stream}.{partition}}}.{table}:{start}"


def window_closed_key(app: str, stream: str, table: str, partition: int, start: int) -> str:
    """The hash of every key's final value in the closed window starting at ``start``."""
    return f"__wcls:{{{app}.{stream}.{partition}}}.{table}:{start}"


#: The suffix of a closed window's member in a windows index.
_CLOSED_WINDOW = b":c"


def open_window_member(start: int, end: int) -> bytes:
    """The index member of the open window from ``start`` to ``end`` (ms)."""
    return b"%d:%d" % (start, end)


def closed_window_member(start: int, end: int) -> bytes:
    """The index member of that window once closed (and kept for the retention)."""
    return b"%d:%d:c" % (start, end)


def parse_window_member(member: bytes | str) -> tuple[int, int, bool]:
    """An index member as ``(start, end, closed)``."""
    raw = member.encode() if isinstance(member, str) else member
    closed = raw.endswith(_CLOSED_WINDOW)
    start, _, end = (raw[:-2] if closed else raw).partition(b":")
    return int(start), int(end), closed


def state_key(app: str, stream: str, processor: str, partition: int) -> str:
    """The hash of ``processor``'s state of ``partition`` (its watermark)."""
    return f"__stat:{{{app}.{stream}.{partition}}}.{processor}"


def outbox_key(app: str, stream: str, processor: str, partition: int) -> str:
    """The stream of records ``processor`` emitted on ``partition``, to be relayed."""
    return f"__obox:{{{app}.{stream}.{partition}}}.{processor}"


def relay_key(target_stream_key: str, source: str) -> str:
    """The last outbox entry relayed from ``source`` into ``target_stream_key``, in
    the target's hash slot."""
    tag = target_stream_key[target_stream_key.index("{") :]
    return f"__rely:{tag}:{source}"


# --- locks, membership and idempotency markers: each module asks here ------------

#: The prefix of every lock's key.
LOCK_KEY_PREFIX = "__lock:"
#: The suffix of a lock's fencing counter, after its key.
FENCE_KEY_SUFFIX = ":fence"
#: The suffix of a partition's read permit, after its lock's key.
PERMIT_KEY_SUFFIX = ":permit"


def _has_hash_tag(name: str) -> bool:
    start = name.find("{")
    return start >= 0 and name.find("}", start + 1) > start + 1


def tagged(name: str) -> str:
    """Return ``name`` as a Redis Cluster hash tag: ``{name}``, unless it has one.

    A name that already contains a hash tag (``{app.stream.3}.proc``) is kept as it
    is, so the lock lands in the slot of whatever else carries that tag.
    """
    return name if _has_hash_tag(name) else f"{{{name}}}"


def lock_key(name: str) -> str:
    """The Redis key of lock ``name``: ``"__lock:" + tagged(name)``."""
    return LOCK_KEY_PREFIX + tagged(name)


def fence_key(name: str) -> str:
    """The Redis key of lock ``name``'s fencing counter (same hash slot, no TTL)."""
    return lock_key(name) + FENCE_KEY_SUFFIX


def permit_key(lock: str) -> str:
    """The read permit of the partition whose lease is the lock key ``lock``: a stream
    that exists only inside the transaction of one fenced read (``commit/permit``)."""
    return lock + PERMIT_KEY_SUFFIX


def membership_key(group: str) -> str:
    """The membership group's state (JSON)."""
    return f"__memb:{{{group}}}"


def control_key(group: str) -> str:
    """The membership group's control stream."""
    return f"__ctrl:{{{group}}}"


def data_loss_key(group: str) -> str:
    """The last data loss a worker found for processor group ``group`` (for status)."""
    return f"__loss:{{{group}}}"


def reset_key(group: str) -> str:
    """The last reset of processor group ``group`` (``streamkit reset``, for status)."""
    return f"__rset:{{{group}}}"


def heartbeat_key(group: str, member_id: str) -> str:
    """Member ``member_id``'s heartbeat in ``group``."""
    return f"__beat:{{{group}}}:{member_id}"


def hash_tag_of(key: str) -> str:
    """The hash tag (``{...}``) of ``key``, or the whole key as one when it has none
    (a key without a tag hashes to its own slot, as does ``{key}``)."""
    start = key.find("{")
    end = key.find("}", start + 1)
    if start >= 0 and end > start + 1:
        return key[start : end + 1]
    return "{" + key + "}"


def once_marker_prefix(stream_key: str) -> str:
    """The prefix of a producer append's idempotency markers, in ``stream_key``'s slot."""
    return f"__once:{hash_tag_of(stream_key)}:"


def spark_marker_key(
    app: str, stream: str, partition: int, write_id: str, batch: str, task: int, chunk: int
) -> str:
    """The idempotency marker of one Spark write chunk, in its partition's slot."""
    return f"__sprk:{{{app}.{stream}.{partition}}}:{write_id}:{batch}:{task}:{chunk}"
