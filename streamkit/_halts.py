"""Halted partitions: the record a halt leaves in Redis, and resuming.

When a processor's exception policy halts (see :class:`~streamkit.ExceptionPolicy`),
the worker stops that partition only: it keeps the partition's lease, so the
partition does not move to another worker to halt there too, and records why in the
hash ``__halt:{app.stream.N}.proc``. Whoever owns the partition, now or after a
rebalance, leaves it alone while the record exists; ``streamkit resume`` deletes it
(optionally acknowledging the halted events first, ``--skip``) and the owner runs
the processor again from the halted event.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs
import trio
import trio_util

from . import _keys
from ._redis import redis_errors
from ._wire import text

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._errors import ProcessorHalted
    from ._redis import Redis
    from ._spec import ProcessorKeys

__all__ = [
    "HALT_POLL_INTERVAL",
    "HaltRecord",
    "clear_halt",
    "decode_halt",
    "halt_key",
    "read_halt",
    "wait_resumed",
    "write_halt",
]

log = logging.getLogger("streamkit.worker")

#: How often the owner of a halted partition looks whether it was resumed (seconds).
HALT_POLL_INTERVAL = 1.0


@attrs.frozen(kw_only=True)
class HaltRecord:
    """Why, where and since when a processor halted on a partition.

    Attributes:
        partition: the partition number.
        error_type: the processor's exception's qualified name (``""`` if none).
        error: its message, or why the policy halted.
        entry_ids: the events being processed (they stay pending; may be empty).
        since: when it halted.
        worker: the worker that halted (``host:pid``).
    """

    partition: int
    error_type: str
    error: str
    entry_ids: tuple[str, ...]
    since: datetime
    worker: str

    def describe(self) -> str:
        """One line: the events, the error, since when and where."""
        at = f" at {', '.join(self.entry_ids)}" if self.entry_ids else ""
        error = f"{self.error_type}: {self.error}" if self.error_type else self.error
        since = self.since.isoformat(timespec="seconds")
        return f"halted{at} since {since} on {self.worker}: {error}"


def halt_key(keys: ProcessorKeys, partition: int) -> str:
    """The halt record's key of ``keys``' processor on ``partition``."""
    return _keys.halt_key(keys.app, keys.stream, keys.processor, partition)


def _error_name(error: BaseException) -> str:
    kind = type(error)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


async def write_halt(
    redis: Redis, keys: ProcessorKeys, halted: ProcessorHalted, *, worker: str
) -> HaltRecord:
    """Record that the processor halted on ``halted.partition``; return the record."""
    cause = halted.__cause__
    record = HaltRecord(
        partition=halted.partition,
        error_type=_error_name(cause) if cause is not None else "",
        error=str(cause) if cause is not None else halted.reason,
        entry_ids=halted.entry_ids,
        since=datetime.now(tz=UTC),
        worker=worker,
    )
    fields: dict[str | bytes, str | bytes | int | float] = {
        "error_type": record.error_type,
        "error": record.error,
        "entry_ids": ",".join(record.entry_ids),
        "since": f"{record.since.timestamp():.6f}",
        "worker": worker,
    }
    with redis_errors():
        await redis.hset(halt_key(keys, halted.partition), fields)
    return record


async def read_halt(redis: Redis, keys: ProcessorKeys, partition: int) -> HaltRecord | None:
    """The processor's halt record on ``partition``, or ``None`` if it is not halted."""
    with redis_errors():
        raw = await redis.hgetall(halt_key(keys, partition))
    return decode_halt(partition, raw)


def decode_halt(partition: int, raw: Mapping[Any, Any]) -> HaltRecord | None:
    """The halt record in the fields of a halt key (``HGETALL``), or ``None`` if empty."""
    if not raw:
        return None
    fields = {text(k): text(v) for k, v in raw.items()}
    try:
        since = datetime.fromtimestamp(float(fields.get("since", "0")), tz=UTC)
    except ValueError:
        since = datetime.fromtimestamp(0, tz=UTC)
    ids = fields.get("entry_ids", "")
    return HaltRecord(
        partition=partition,
        error_type=fields.get("error_type", ""),
        error=fields.get("error", ""),
        entry_ids=tuple(ids.split(",")) if ids else (),
        since=since,
        worker=fields.get("worker", "?"),
    )


async def clear_halt(
    redis: Redis, keys: ProcessorKeys, stream_key: str, partition: int, *, skip: bool
) -> HaltRecord | None:
    """Resume the processor on ``partition``: delete its halt record; with ``skip``,
    acknowledge the halted events first, so that they are not processed again.
    Return the record cleared, or ``None`` if the partition was not halted."""
    record = await read_halt(redis, keys, partition)
    if record is None:
        return None
    with redis_errors():
        if skip and record.entry_ids:
            await redis.xack(stream_key, keys.group, list(record.entry_ids))
        await redis.delete([halt_key(keys, partition)])
    return record


async def wait_resumed(
    redis: Redis, keys: ProcessorKeys, partition: int, draining: trio_util.AsyncBool
) -> bool:
    """Wait until the partition's halt record is gone (True) or ``draining`` turns
    true (False), looking every :data:`HALT_POLL_INTERVAL` seconds.

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    key = halt_key(keys, partition)
    started = time.monotonic()

    async def gone() -> None:
        while True:
            with redis_errors():
                if not await redis.exists([key]):
                    return
            await trio.sleep(HALT_POLL_INTERVAL)

    await trio_util.wait_any(gone, lambda: draining.wait_value(True))
    if draining.value:
        return False
    log.info(
        "%s partition %d resumed after %.1fs halted",
        keys.group,
        partition,
        time.monotonic() - started,
    )
    return True
