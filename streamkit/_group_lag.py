"""A consumer group's lag on a stream partition: the entries not delivered to it yet.

Redis reports a ``lag`` in ``XINFO GROUPS`` (the stream's ``entries-added`` less the
group's ``entries-read``), but that figure cannot always be trusted: after a restart
that loads the AOF, Redis 7.0 can bring a group's ``entries-read`` back as 0 while its
``last-delivered-id`` is the stream's newest entry, and report every entry as lag, for
good (reads add to the wrong counter from then on). Nor does it know the lag at all
after some trims. So the lag is found from the ids, which a reload keeps: none when the
group was delivered the newest entry (``streams/caught_up`` compares them alike), else
the entries after its last delivered one, counted by Redis up to
:data:`LAG_COUNT_LIMIT`; past that, Redis's own figure if it is at least that (and no
more than the stream holds), else unknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._lua import script
from ._redis import LuaScript, redis_errors
from ._wire import text

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._redis import Redis

__all__ = ["LAG_COUNT_LIMIT", "entry_id_order", "undelivered"]

#: The most entries counted for a lag: a partition further behind shows Redis's own
#: figure (or an unknown lag), so that a status of many partitions stays cheap.
LAG_COUNT_LIMIT = 1000

_UNDELIVERED = LuaScript(script("streams/undelivered"))


def entry_id_order(entry_id: bytes | str) -> tuple[int, int]:
    """A stream entry id (``ms-seq``) as a pair that sorts as Redis sorts the ids."""
    milliseconds, _, sequence = text(entry_id).partition("-")
    return int(milliseconds), int(sequence or 0)


async def undelivered(
    redis: Redis,
    key: str,
    group: Mapping[str, Any],
    *,
    newest: bytes | str | None,
    length: int,
    limit: int = LAG_COUNT_LIMIT,
) -> int | None:
    """The entries of the stream ``key`` not delivered yet to a consumer group.

    Args:
        redis: the client.
        key: the stream.
        group: the group's fields of ``XINFO GROUPS`` (``last-delivered-id``, ``lag``),
            their names as text.
        newest: the id of the stream's newest entry (``None``: the stream is empty).
        length: the stream's length.
        limit: the most entries counted (see the module docs).

    Returns:
        The entries after the group's last delivered one; ``None`` if more than
        ``limit`` and Redis cannot tell how many.

    Error handling:
        :class:`~streamkit.RedisUnavailable` and the like if Redis cannot be asked.
    """
    last = group.get("last-delivered-id")
    if newest is None or last is None or entry_id_order(last) >= entry_id_order(newest):
        return 0  # no command: the usual case of a group keeping up
    with redis_errors():
        counted = int(await _UNDELIVERED(redis, keys=[key], args=[text(last), limit]))
    if counted < limit:
        return counted
    reported = group.get("lag")
    if reported is not None and int(reported) >= limit:
        return min(int(reported), length)
    return None
