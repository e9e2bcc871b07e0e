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
"""

from __future__ import annotations

import functools
import itertools
import logging
import uuid
import weakref
from typing import TYPE_CHECKING, Any

import trio

from . import _keys
from ._errors import OutcomeUnknown, RedisUnavailable, ServerRefused
from ._redis import DEFAULT_RETRY_FOR, RETRY_BACKOFF, LuaScript, redis_errors

if TYPE_CHECKING:
    from ._backoff import Backoff
    from ._redis import Redis

__all__ = ["MARKER_TTL", "append_once", "marker_key"]

log = logging.getLogger("streamkit.redis")

# Seconds a marker lives unless deleted earlier: far longer than the retries of a call.
MARKER_TTL = 300
# Markers of finished appends deleted per call, at most.
MAX_DONE_PER_CALL = 64

_PROCESS = uuid.uuid4().hex[:16]
_tokens = itertools.count()

# Per client: stream key -> markers of appends whose replies arrived (safe to delete).
_prefixes: dict[str, str] = {}

_finished: weakref.WeakKeyDictionary[Any, dict[str, list[str]]] = weakref.WeakKeyDictionary()


def marker_key(stream_key: str, token: str) -> str:
    """The idempotency marker ``token`` of an append to ``stream_key``, in its hash slot."""
    prefix = _prefixes.get(stream_key)
    if prefix is None:
        if len(_prefixes) > 10_000:
            _prefixes.clear()
        prefix = _prefixes[stream_key] = _marker_prefix(stream_key)
    return prefix + token


def _marker_prefix(stream_key: str) -> str:
    return _keys.once_marker_prefix(stream_key)


@functools.cache
def _script(body: str) -> LuaScript:
    # KEYS: stream, marker, markers of finished appends to delete.
    # ARGV: partition_size, max_len (0 = no cap), marker ttl, whether the marker may exist
    # already (1 on a retry), then the entries.
    # Returns {entry ids, dropped, 1 if the marker was there (appended before) else 0}.
    return LuaScript(
        """
local key = KEYS[1]
local keep = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local first = 5
-- Finished markers are deleted after the append, never before: Redis at maxmemory
-- lets a script that has written once write on (DEL would let XADD past the limit),
-- so the append is refused exactly when Redis is full.
local function forget_finished()
  for i = 3, #KEYS do redis.call('DEL', KEYS[i]) end
end
if ARGV[4] == '1' then
  local seen = redis.call('GET', KEYS[2])
  if seen then
    -- A write, so that a WAIT after this call (send(..., replicas=N)) waits for the
    -- replication stream to pass it, and so the earlier append too.
    redis.call('EXPIRE', KEYS[2], ARGV[3])
    forget_finished()
    local bar = string.find(seen, '|', 1, true)
    local done = {}
    for id in string.gmatch(string.sub(seen, bar + 1), '[^,]+') do done[#done + 1] = id end
    return {done, tonumber(string.sub(seen, 1, bar - 1)), 1}
  end
end
"""
        + body
        + """
redis.call('SET', KEYS[2], dropped .. '|' .. table.concat(ids, ','), 'EX', ARGV[3])
forget_finished()
return {ids, dropped, 0}
"""
    )


async def append_once(
    redis: Redis,
    key: str,
    *,
    keep: int,
    cap: int,
    entries: list[bytes | int],
    body: str,
    give_up_after: float = DEFAULT_RETRY_FOR,
    backoff: Backoff = RETRY_BACKOFF,
) -> tuple[list[bytes], int]:
    """Append ``entries`` to the stream ``key`` exactly once; return (ids, dropped).

    Args:
        redis: a client from :func:`streamkit.open_redis`.
        key: the partition's stream key.
        keep: the partition size trimming keeps (``partition_size``).
        cap: the hard cap, ``max_len`` (0 for none).
        entries: per entry, its field count then names and values, flat.
        body: the append-and-trim Lua (``streamkit._streams.APPEND_AND_TRIM_LUA``).
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
    finished = _finished.get(redis)
    if finished is None:
        finished = _finished[redis] = {}
    done = finished.pop(key, None) or []
    if len(done) > MAX_DONE_PER_CALL:
        finished[key] = done[MAX_DONE_PER_CALL:]
        done = done[:MAX_DONE_PER_CALL]
    marker = marker_key(key, f"{_PROCESS}:{next(_tokens)}")
    keys = [key, marker, *done]
    # ARGV[4]: 0 on the first attempt (a fresh marker cannot exist yet), 1 on retries.
    args: list[bytes | int] = [keep, cap, MARKER_TTL, 0, *entries]
    script = _script(body)
    reply: Any = None
    try:
        with redis_errors():
            reply = await script(redis, keys=keys, args=args)
    except RedisUnavailable as exc:
        if isinstance(exc, ServerRefused) and exc.out_of_memory:
            # Nothing was appended; waiting seconds for memory would only keep the
            # caller waiting: say so at once.
            finished.setdefault(key, []).extend(done)
            raise
        args[3] = 1
        try:
            reply = await _retry(script, keys, args, redis, exc, key, give_up_after, backoff)
        except BaseException:
            # Deleting a marker twice is harmless: keep those not surely deleted.
            finished.setdefault(key, []).extend(done)
            raise
    except BaseException:
        finished.setdefault(key, []).extend(done)
        raise
    finished.setdefault(key, []).append(marker)
    if reply[2]:
        log.debug("append to %s was applied before its connection was lost; not repeated", key)
    return reply[0], reply[1]


async def _retry(
    script: LuaScript,
    keys: list[str],
    args: list[bytes | int],
    redis: Redis,
    first: RedisUnavailable,
    key: str,
    give_up_after: float,
    backoff: Backoff,
) -> Any:
    """Send the append again, with the same marker, until it gets through."""
    deadline = trio.current_time() + give_up_after
    unknown = first if isinstance(first, OutcomeUnknown) else None
    error = first
    for attempt, delay in enumerate(backoff.delays(), start=1):
        if trio.current_time() + delay > deadline:
            if unknown is not None:
                raise OutcomeUnknown(
                    error.url,
                    f"appending to {key}: {unknown.reason}; retried for {give_up_after:g}s "
                    f"without learning whether it was applied",
                ) from error
            raise error
        log.debug(
            "appending to %s: %s (attempt %d, retrying in %.2fs)", key, error.reason, attempt, delay
        )
        await trio.sleep(delay)
        try:
            with redis_errors():
                return await script(redis, keys=keys, args=args)
        except ServerRefused as exc:
            if exc.out_of_memory:
                # The script looks for the marker before it appends, and Redis
                # refuses for memory only at the append: the marker was not there, so
                # no attempt was applied. Nothing appended, surely.
                raise
            error = exc
        except RedisUnavailable as exc:
            error = exc
            if isinstance(exc, OutcomeUnknown):
                unknown = exc
    raise AssertionError("unreachable")  # pragma: no cover
