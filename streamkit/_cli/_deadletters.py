"""Dead letters: list, replay and purge the events a processor's policy set aside.

A dead letter is an entry of a processor's dead-letter stream
(:attr:`ProcessorKeys.dead_letter_key`, ``__dead:{app.stream.processor}``): the
original event's fields, unchanged, plus ``dl.*`` fields describing the failure (see
:data:`streamkit._policies.DEAD_LETTER_FIELDS`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import attrs

from .._redis import redis_errors
from .._streams import append_entries
from .._wire import flatten_fields

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .._redis import Redis
    from .._spec import ProcessorKeys, StreamSpec

__all__ = [
    "DeadLetter",
    "count_dead_letters",
    "list_dead_letters",
    "parse_dead_letter_id",
    "purge_dead_letters",
    "replay_dead_letters",
]

_PREFIX = b"dl."

_ID = re.compile(r"(\d+)(?:-(\d+))?\Z")

_N = TypeVar("_N", int, float)


@attrs.frozen(kw_only=True)
class DeadLetter:
    """An event a processor's policy sent to its dead-letter stream.

    Attributes:
        id: the dead letter's own entry id (in the dead-letter stream).
        reason: ``"error"``, ``"retries exhausted"``, ``"poison"`` or ``"undecodable"``.
        error_type: the exception's qualified name (empty for poison events).
        error: the exception's message, or why the event is poison.
        partition: the partition the event came from.
        entry_id: the event's entry id in that partition.
        delivery_count: how often it had been delivered.
        failed_at: when it was dead-lettered.
        fields: the event's original fields, as stored in the stream.
    """

    id: str
    reason: str
    error_type: str
    error: str
    partition: int
    entry_id: str
    delivery_count: int
    failed_at: datetime
    fields: dict[bytes, bytes]


def _parse(entry_id: bytes | str, raw: dict[bytes, bytes]) -> DeadLetter:
    """A dead letter from its entry; fields that do not parse (whoever wrote them)
    read as their defaults, rather than failing the listing."""
    info = {_text(k[len(_PREFIX) :]): _text(v) for k, v in raw.items() if k.startswith(_PREFIX)}
    return DeadLetter(
        id=_text(entry_id),
        reason=info.get("reason", ""),
        error_type=info.get("error_type", ""),
        error=info.get("error", ""),
        partition=_number(info.get("partition"), int, 0),
        entry_id=info.get("entry_id", ""),
        delivery_count=_number(info.get("delivery_count"), int, 0),
        failed_at=datetime.fromtimestamp(_number(info.get("time"), _timestamp, 0.0), tz=UTC),
        fields={k: v for k, v in raw.items() if not k.startswith(_PREFIX)},
    )


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _timestamp(text: str) -> float:
    seconds = float(text)
    datetime.fromtimestamp(seconds, tz=UTC)  # in range (raises ValueError, OverflowError)
    return seconds


def _number(text: str | None, parse: Callable[[str], _N], default: _N) -> _N:
    if text is None:
        return default
    try:
        return parse(text)
    except (ValueError, OverflowError, OSError):
        return default


def parse_dead_letter_id(text: str) -> str | None:
    """The dead letter id ``text`` names, in full form (``"5-0"`` for ``"5"``).

    Returns ``None`` if ``text`` is not an entry id (two numbers joined by ``-``),
    rather than letting Redis answer with its own error.
    """
    match = _ID.match(text.strip())
    if match is None:
        return None
    milliseconds, sequence = match.groups()
    if int(milliseconds) >= 2**64 or int(sequence or 0) >= 2**64:
        return None
    return f"{int(milliseconds)}-{int(sequence or 0)}"


async def count_dead_letters(redis: Redis, keys: ProcessorKeys) -> int:
    """How many dead letters the processor has."""
    with redis_errors():
        return await redis.xlen(keys.dead_letter_key)


async def list_dead_letters(
    redis: Redis, keys: ProcessorKeys, *, count: int | None = None
) -> list[DeadLetter]:
    """The processor's dead letters, oldest first (at most ``count``)."""
    with redis_errors():
        entries = await redis.xrange(keys.dead_letter_key, count=count)
    return [
        _parse(entry.identifier, cast("dict[bytes, bytes]", dict(entry.field_values)))
        for entry in entries
    ]


async def replay_dead_letters(
    redis: Redis,
    stream: StreamSpec[Any],
    keys: ProcessorKeys,
    *,
    partition_size: int,
    max_len: int | None = None,
    ids: Sequence[str] | None = None,
    on_progress: Callable[[int, int], object] | None = None,
) -> int:
    """Send dead letters back to their partitions, then remove them.

    The original fields are appended to the end of the partition they came from, so
    the processor sees them again after the events already there (their order
    relative to other events of the same key changes). Each is removed from the
    dead-letter stream only after it was appended: a failure midway replays one
    twice at worst, never loses one. Returns how many were replayed.

    ``partition_size`` and ``max_len`` trim the partitions as the producer does.
    ``on_progress(1, 1)`` is called after each dead letter is replayed (an exception
    it raises stops the replay there, between two letters).
    """
    letters = await list_dead_letters(redis, keys)
    if ids is not None:
        wanted = set(ids)
        letters = [letter for letter in letters if letter.id in wanted]
    for letter in letters:
        entry: list[bytes | int] = []
        flatten_fields(letter.fields, entry)
        await append_entries(
            redis,
            stream,
            letter.partition,
            [entry],
            partition_size=partition_size,
            max_len=max_len,
        )
        with redis_errors():
            await redis.xdel(keys.dead_letter_key, [letter.id])
        if on_progress is not None:
            on_progress(1, 1)
    return len(letters)


async def purge_dead_letters(
    redis: Redis,
    keys: ProcessorKeys,
    *,
    ids: Sequence[str] | None = None,
    on_progress: Callable[[int, int], object] | None = None,
) -> int:
    """Delete dead letters (all, or those with the given ids); return how many.

    One step: ``on_progress(through, deleted)`` is called once, after it.
    """
    key = keys.dead_letter_key
    with redis_errors():
        if ids is None:
            count = await redis.xlen(key)
            await redis.delete([key])
            through = count
        else:
            count = await redis.xdel(key, list(ids))
            through = len(ids)
    if on_progress is not None:
        on_progress(through, count)
    return count
