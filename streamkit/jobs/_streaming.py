"""Streamed results: chunks a running job streams with ``current_job().stream(chunk)``,
written in order to the job's output stream and read from the start, or from where a
reader was, until the job's outcome ends it.

Streaming is a plain call that does no I/O: the try keeps its chunks in order, and the
worker's chunk writer appends them, a round every :data:`STREAM_EVERY` seconds, one
fenced script call per try and round (``jobs/stream``: a try taken over appends
nothing; each chunk's sequence number makes a call sent again append nothing twice).
A try's chunks not written yet are written before its outcome is recorded, and the
finish script then appends the outcome: a reader sees every chunk, then the end.

The output stream (``__jobs:{Q.S}:out:ID``) keeps the newest :data:`MAX_CHUNKS` chunks
(``MAXLEN ~``) and expires with the result when the job succeeds (else
:data:`OUTPUT_TTL` after its last chunk). Each entry is a chunk (its try and its JSON)
or the end (the job's final status).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from .._errors import ConfigError, EncodeError, RedisUnavailable
from .._lua import script
from .._redis import LuaScript, retry_idempotent
from ._due import Due

if TYPE_CHECKING:
    from ._handle import QueueLike
    from ._layout import ShardKeys
    from ._tries import Try

__all__ = [
    "MAX_CHUNKS",
    "MAX_CHUNK_BYTES",
    "MAX_PENDING",
    "OUTPUT_TTL",
    "STREAM_EVERY",
    "ChunkWriter",
    "encode_chunk",
]

log = logging.getLogger("streamkit.jobs")

#: Seconds between two rounds of the chunk writer, at least.
STREAM_EVERY = 0.005
#: Chunks an output stream keeps, about (the oldest go first).
MAX_CHUNKS = 10_000
#: The largest chunk, encoded (JSON).
MAX_CHUNK_BYTES = 64 * 1024
#: Chunks of one try waiting to be written, at most (Redis unreachable, say).
MAX_PENDING = 10_000
#: Seconds an output stream outlives its last chunk (a job that succeeds: its result's
#: ``result_ttl`` instead, from its end).
OUTPUT_TTL = 7 * 86_400
#: Chunks per script call, at most.
CALL_CHUNKS = 500

_STREAM = LuaScript(script("jobs/stream"))


def encode_chunk(chunk: Any) -> bytes:
    """A chunk as stored: its JSON.

    Error handling:
        :class:`~streamkit.EncodeError` if it is not JSON, or over
        :data:`MAX_CHUNK_BYTES` encoded.
    """
    try:
        encoded = orjson.dumps(chunk)
    except TypeError as exc:
        raise EncodeError(f"a job's streamed chunk must be JSON: {exc}") from None
    if len(encoded) > MAX_CHUNK_BYTES:
        raise EncodeError(
            f"a job's streamed chunk: {len(encoded):,} bytes encoded, over {MAX_CHUNK_BYTES:,}"
        )
    return encoded


@attrs.define(eq=False)
class ChunkWriter:
    """Appends the chunks the tries of one worker stream, in order, a round at a time.

    Attributes:
        writes: script calls sent so far.
    """

    queue: QueueLike
    writes: int = 0
    _due: Due[Try] = attrs.field(init=False, factory=Due)
    # One write at a time per try (its chunks land in order), by the try's identity.
    _locks: dict[int, trio.Lock] = attrs.field(init=False, factory=dict)

    def report(self, current: Try, chunk: Any) -> None:
        """``current`` streams ``chunk``: appended in the writer's next round. Called
        from the event loop or a plain ``def`` job's thread.

        Error handling:
            As :func:`encode_chunk`; :class:`~streamkit.ConfigError` when
            :data:`MAX_PENDING` chunks of the try wait to be written already.
        """
        encoded = encode_chunk(chunk)
        with self._due.guard:
            if len(current.chunks) >= MAX_PENDING:
                raise ConfigError(
                    "stream", f"{MAX_PENDING:,} chunks of this try wait to be written already"
                )
            current.chunks.append(encoded)
            self._due.add(current)

    async def flush(self, current: Try) -> None:
        """Append ``current``'s chunks not written yet, now (before its outcome)."""
        with self._due.guard:
            self._due.discard(current)
        await self._write(current)

    async def run(self) -> None:
        """Append what the tries streamed, a round at a time, until cancelled."""
        while True:
            due = await self._due.wait_taken()
            for current in due.values():
                if not current.finished:
                    await self._write(current)
            await trio.sleep(STREAM_EVERY)

    async def _write(self, current: Try) -> None:
        keys = self.queue.shard_keys[current.shard]
        lock = self._locks.get(id(current))
        if lock is None:
            lock = self._locks[id(current)] = trio.Lock()
        try:
            async with lock:
                await self._send(current, keys)
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._locks.pop(id(current), None)

    async def _send(self, current: Try, keys: ShardKeys) -> None:
        while current.chunks:
            batch = current.chunks[:CALL_CHUNKS]
            first = current.chunks_written + 1
            self.writes += 1
            try:
                appended = await retry_idempotent(
                    _STREAM,
                    self.queue.redis,
                    keys.keys,
                    (
                        keys.base,
                        current.id,
                        current.token,
                        current.try_number,
                        first,
                        MAX_CHUNKS,
                        OUTPUT_TTL,
                        *batch,
                    ),
                    what="streaming a job's output",
                )
            except RedisUnavailable as exc:
                log.warning("job %s: streamed chunks not written yet: %s", current.id, exc)
                return  # kept: written by a later round, or before the outcome
            del current.chunks[: len(batch)]
            current.chunks_written += len(batch)
            if appended == -1:
                current.chunks.clear()  # taken over: its chunks go nowhere
                return
