"""Progress a running job reports with ``current_job().progress(value)``: kept with its
try and written to the job's record at most once per :data:`PROGRESS_EVERY` per try.

Reporting is a plain call that does no I/O: the try keeps the newest value, and the
worker's progress writer writes the newest value of every try that reported since its
last round, one fenced script call each (``jobs/progress``: a try taken over writes
nothing), then waits :data:`PROGRESS_EVERY` before the next round. So a job may report
per item of a long loop: a million reports cost a few writes a second. A try's newest
value is written before its outcome is recorded, so the last value reported is the
one its record keeps.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from .._errors import EncodeError, RedisUnavailable
from .._lua import script
from .._redis import LuaScript, retry_idempotent
from ._due import Due

if TYPE_CHECKING:
    from ._handle import QueueLike
    from ._tries import Try

__all__ = ["MAX_PROGRESS_BYTES", "PROGRESS_EVERY", "ProgressWriter", "encode_progress"]

log = logging.getLogger("streamkit.jobs")

#: Seconds between two writes of one try's progress, at least.
PROGRESS_EVERY = 0.5
#: The largest progress value, encoded (JSON).
MAX_PROGRESS_BYTES = 8_000

_PROGRESS = LuaScript(script("jobs/progress"))


def encode_progress(value: Any) -> bytes:
    """A progress value as stored: its JSON.

    Error handling:
        :class:`~streamkit.EncodeError` if it is not JSON, or over
        :data:`MAX_PROGRESS_BYTES` encoded.
    """
    try:
        encoded = orjson.dumps(value)
    except TypeError as exc:
        raise EncodeError(
            f"a job's progress must be JSON (a number, a small dict): {exc}"
        ) from None
    if len(encoded) > MAX_PROGRESS_BYTES:
        raise EncodeError(
            f"a job's progress: {len(encoded):,} bytes encoded, over {MAX_PROGRESS_BYTES:,}"
        )
    return encoded


@attrs.define(eq=False)
class ProgressWriter:
    """Writes the progress the tries of one worker report, rate-limited per try.

    Attributes:
        writes: progress writes sent so far.
    """

    queue: QueueLike
    writes: int = 0
    _due: Due[Try] = attrs.field(init=False, factory=Due)
    # One write at a time: a try's newest value is the last one to land.
    _lock: trio.Lock = attrs.field(init=False, factory=trio.Lock)

    def report(self, current: Try, value: Any) -> None:
        """``current`` reports ``value``: written in the writer's next round. Called
        from the event loop or a plain ``def`` job's thread.

        Error handling:
            As :func:`encode_progress`.
        """
        encoded = encode_progress(value)
        with self._due.guard:
            current.progress = encoded
            self._due.add(current)

    def take(self, current: Try) -> bytes | None:
        """``current``'s newest value if it was not written yet, taken out of the next
        round: the finish script writes it with the try's outcome."""
        with self._due.guard:
            if not self._due.discard(current):
                return None
            return current.progress

    async def run(self) -> None:
        """Write what the tries reported, a round at a time, until cancelled."""
        while True:
            due = await self._due.wait_taken()
            for current in due.values():
                if not current.finished:
                    await self._write(current)
            await trio.sleep(PROGRESS_EVERY)

    async def _write(self, current: Try) -> None:
        keys = self.queue.shard_keys[current.shard]
        async with self._lock:
            await self._send(current, keys.keys, keys.base)

    async def _send(self, current: Try, keys: tuple[str, ...], base: str) -> None:
        self.writes += 1
        try:
            await retry_idempotent(
                _PROGRESS,
                self.queue.redis,
                keys,
                (base, current.id, current.token, "", current.progress),
                what="reporting progress",
            )
        except RedisUnavailable as exc:
            # Progress is a hint: a value not written is overtaken by the next one.
            log.debug("job %s: progress not written: %s", current.id, exc)
