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

Everything but the sending and the waiting (the markers, the call's arguments, the
reply, whether to try again) is :mod:`streamkit._produce` and
:mod:`streamkit._retrying`, which the blocking and asyncio clients use alike; the
script, ``streams/append``, is a file of :mod:`streamkit._lua`.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

import trio

from ._errors import RedisUnavailable
from ._lua import script
from ._produce import MARKER_TTL, AppendCall, FinishedMarkers, append_reply, marker_key
from ._redis import DEFAULT_RETRY_FOR, RETRY_BACKOFF, LuaScript, redis_errors
from ._retrying import RetryRule

if TYPE_CHECKING:
    from ._backoff import Backoff
    from ._redis import Redis

__all__ = ["MARKER_TTL", "append_once", "marker_key"]

log = logging.getLogger("streamkit.redis")

# Per client: the markers of appends whose replies arrived (safe to delete).
_finished: weakref.WeakKeyDictionary[Any, FinishedMarkers] = weakref.WeakKeyDictionary()

_APPEND = LuaScript(script("streams/append"), hot=True)


async def append_once(
    redis: Redis,
    key: str,
    *,
    keep: int,
    cap: int,
    entries: list[bytes | int],
    give_up_after: float = DEFAULT_RETRY_FOR,
    backoff: Backoff = RETRY_BACKOFF,
) -> tuple[list[str], int]:
    """Append ``entries`` to the stream ``key`` exactly once; return (ids, dropped).

    Args:
        redis: a client from :func:`streamkit.open_redis`.
        key: the partition's stream key.
        keep: the partition size trimming keeps (``partition_size``).
        cap: the hard cap, ``max_len`` (0 for none).
        entries: the entries, flat (see :meth:`streamkit._produce.SendWindow.arguments`).
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
    markers = _finished.get(redis)
    if markers is None:
        markers = _finished[redis] = FinishedMarkers()
    call = AppendCall.make(markers, key, keep=keep, cap=cap, entries=entries)
    rule = RetryRule(
        f"appending to {key}",
        idempotent=True,
        started=trio.current_time(),
        give_up_after=give_up_after,
        backoff=backoff,
        fail_fast_oom=True,
        unknown_is_final=True,
    )
    try:
        while True:
            try:
                with redis_errors():
                    reply = await _APPEND(redis, keys=call.keys, args=call.args)
                break
            except RedisUnavailable as exc:
                delay = rule.next_delay(exc, trio.current_time())
                log.debug(
                    "appending to %s: %s (attempt %d, retrying in %.2fs)",
                    key,
                    exc.reason,
                    rule.attempts,
                    delay,
                )
                call.retrying()
                await trio.sleep(delay)
    except BaseException:
        call.failed(markers)
        raise
    call.succeeded(markers)
    ids, dropped, before = append_reply(reply)
    if before:
        log.debug("append to %s was applied before its connection was lost; not repeated", key)
    return ids, dropped
