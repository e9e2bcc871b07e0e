"""Idempotent appends: the producer's append-and-trim, safe to send again.

A lost connection leaves an append's outcome unknown: Redis may have appended the
entries and the reply got lost, or never seen the command. Sending it again blindly
could append every entry twice; giving up would lose them. So each append carries an
idempotency marker, the pattern of the Spark writer (:mod:`streamkit.spark._writer`):

* every call draws a fresh marker key, ``__once:{<partition's hash tag>}:<token>``, in
  the hash slot of the partition's stream (one atomic script, also on Redis Cluster);
* the script appends only if the marker does not exist, and records the new entry ids
  in it (``SET marker ids EX ttl``) in the same atomic step;
* the call is retried, with the same marker, while Redis is unavailable or the outcome
  is unknown; a retry that finds the marker returns the recorded ids instead of
  appending again.

Markers of calls whose reply arrived are deleted by the next append to the same
partition through the same client (no extra round trip), so a busy producer keeps
about one marker per partition; the TTL removes the rest.

The retry loop is one operation, :func:`streamkit._ops.append`, which the Trio side
runs through its driver (:func:`streamkit._redis.run_op`) and the blocking and asyncio
clients through theirs; below it, the markers, the call's arguments and the reply are
:mod:`streamkit._produce`, whether to try again :mod:`streamkit._retrying`; the script,
``streams/append``, is a file of :mod:`streamkit._lua`.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from ._ops import APPEND, append
from ._produce import MARKER_TTL, AppendCall, FinishedMarkers, marker_key
from ._redis import DEFAULT_RETRY_FOR, RETRY_BACKOFF, LuaScript, run_op

if TYPE_CHECKING:
    from ._backoff import Backoff
    from ._redis import Redis

__all__ = ["MARKER_TTL", "append_once", "marker_key", "markers_of"]

# Per client: the markers of appends whose replies arrived (safe to delete).
_finished: weakref.WeakKeyDictionary[Any, FinishedMarkers] = weakref.WeakKeyDictionary()

#: The script, as the Trio side runs it (the tests call it directly).
_APPEND = LuaScript(APPEND, hot=True)


def markers_of(redis: Redis) -> FinishedMarkers:
    """The markers of ``redis``'s finished appends (made on its first append)."""
    markers = _finished.get(redis)
    if markers is None:
        markers = _finished[redis] = FinishedMarkers()
    return markers


async def append_once(
    redis: Redis,
    key: str,
    *,
    keep: int,
    cap: int,
    entries: list[bytes | int],
    stream: str = "",
    partition: int = 0,
    give_up_after: float = DEFAULT_RETRY_FOR,
    backoff: Backoff = RETRY_BACKOFF,
) -> tuple[list[str], int]:
    """Append ``entries`` to the stream ``key`` exactly once; return (ids, dropped).

    The operation :func:`streamkit._ops.append`, the clients' own, run by the Trio
    driver (:func:`streamkit._redis.run_op`).

    Args:
        redis: a client from :func:`streamkit.open_redis`.
        key: the partition's stream key.
        keep: the partition size trimming keeps (``partition_size``).
        cap: the hard cap, ``max_len`` (0 for none).
        entries: the entries, flat (see :meth:`streamkit._produce.SendWindow.arguments`).
        stream: the stream's name (the key if not given), and ``partition`` the
            partition, for the warning when the cap dropped unprocessed entries.
        give_up_after: seconds to keep retrying while Redis is unavailable.
        backoff: delays between retries.

    Returns:
        The new entries' ids, and how many unprocessed entries the hard cap dropped.

    Error handling:
        :class:`RedisUnavailable` if Redis stayed unreachable for ``give_up_after``
        seconds and the append surely did not happen; :class:`OutcomeUnknown` if it
        may have (a connection was lost with it in flight, and no later attempt got
        through to tell). :class:`ServerRefused` with ``out_of_memory`` at once,
        without retrying, when Redis is at ``maxmemory``: nothing was appended.
        Other refusals (loading, a replica, ...) are retried like an outage.
    """
    markers = markers_of(redis)
    call = AppendCall.make(
        markers, key, keep=keep, cap=cap, entries=entries, stream=stream, partition=partition
    )
    ((ids, dropped),) = await run_op(
        redis, append(markers, (call,), give_up_after=give_up_after, backoff=backoff)
    )
    return ids, dropped
