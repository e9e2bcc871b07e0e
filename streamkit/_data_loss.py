"""What a worker says when Redis lost its data under it: one line per processor.

The pieces report the keys that vanished under them (a lease's lock, a consumer
group, a membership state: :mod:`streamkit._vanished`). :func:`watch_data_loss`, a task
of the worker, gathers what they report in the same moment (:data:`SETTLE` seconds),
looks whether each processor's stream metadata is still there, and says it once per
processor:

* at ERROR when a consumer group or the stream's metadata vanished: Redis lost data (a
  restart without persistence, a ``FLUSHALL``, a failover to an empty replica). The
  groups are re-created and processing goes on, but a table's updates committed before
  the loss are gone: the line says so. It is counted (``streamkit_data_loss_total``)
  and recorded for ``streamkit status`` (``__loss:{app.stream.processor}``, kept
  :data:`RECORD_TTL` seconds);
* at WARNING when only leases or the membership state vanished (their keys deleted):
  taken again, nothing else lost.

What the pieces report for :data:`ABSORB` seconds after a line is folded into it (a
member rejoining a few seconds later is the same loss).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from ._keys import data_loss_key
from ._redis import health_of, redis_errors

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._app import App, Processor
    from ._redis import Redis
    from ._vanished import Episode

__all__ = [
    "ABSORB",
    "RECORD_TTL",
    "SETTLE",
    "DataLossRecord",
    "DataLossWatch",
    "read_data_loss",
    "watch_data_loss",
]

log = logging.getLogger("streamkit.worker")

#: Seconds the watch waits after a first report, for the rest of the same moment.
SETTLE = 1.0
#: Seconds after a line during which what vanishes in the same processor is folded in.
ABSORB = 60.0
#: Seconds a data loss stays recorded for ``streamkit status``.
RECORD_TTL = 7 * 24 * 3600


@attrs.frozen(kw_only=True)
class DataLossRecord:
    """A data loss a worker found, as ``streamkit status`` shows it.

    Attributes:
        at: when it was found.
        what: what vanished, in words.
        by: the worker that found it (``host:pid``).
    """

    at: datetime
    what: str
    by: str


def _describe(episode: Episode, metadata_gone: bool) -> tuple[bool, str]:
    """Whether ``episode`` is a data loss, and what vanished, in words."""
    parts = []
    partitions = episode.partitions
    if "group" in partitions:
        parts.append(_counted(partitions["group"], "consumer group"))
    if metadata_gone:
        parts.append("the stream's metadata")
    if "membership" in partitions:
        parts.append("the membership state")
    if "lease" in partitions:
        parts.append(_counted(partitions["lease"], "held lease"))
    return bool("group" in partitions or metadata_gone), _joined(parts)


def _counted(partitions: set[int], what: str) -> str:
    numbered = sorted(p for p in partitions if p >= 0)
    if not numbered:
        return f"a {what}"
    plural = "s" if len(numbered) > 1 else ""
    return f"the {what}{plural} of {len(numbered)} partition{plural}"


def _joined(parts: Sequence[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


@attrs.define(eq=False)
class DataLossWatch:
    """What :func:`watch_data_loss` found so far.

    Attributes:
        losses: data losses found, per processor name.
    """

    app: App
    processors: dict[str, Processor]
    worker: str
    losses: dict[str, int] = attrs.field(factory=dict)
    _metadata: dict[str, bool] = attrs.field(factory=dict)
    _said: dict[str, float] = attrs.field(factory=dict)

    async def learn_metadata(self) -> None:
        """Note which streams have their metadata recorded (to notice it vanish)."""
        for processor in self.processors.values():
            self._metadata[processor.group] = await self._has_metadata(processor)

    async def _has_metadata(self, processor: Processor) -> bool:
        with redis_errors():
            return bool(await self.app.redis.exists([processor.stream.spec.meta_key]))

    async def say(self, episode: Episode) -> None:
        """Say what vanished in ``episode``: one line (see the module docs)."""
        processor = self.processors.get(episode.scope)
        if processor is None:
            log.warning(
                "%s vanished from %s while it was held: deleted, or Redis lost its data",
                _joined(sorted(_plain(episode))),
                episode.scope,
            )
            return
        name = processor.name
        metadata_gone = False
        if self._metadata.get(processor.group):
            metadata_gone = not await self._has_metadata(processor)
        lost, what = _describe(episode, metadata_gone)
        said = self._said.get(name)
        now = trio.current_time()
        if said is not None and now - said < ABSORB:
            log.debug("processor %s: also vanished: %s", name, what)
            return
        self._said[name] = now
        if not lost:
            log.warning(
                "processor %s: %s vanished while in use (their keys deleted, or Redis lost "
                "data); taken again, nothing else is missing",
                name,
                what,
            )
            return
        self.losses[name] = self.losses.get(name, 0) + 1
        tables = [table.name for table in processor.tables]
        consequence = (
            f"its table{'s' if len(tables) > 1 else ''} {', '.join(tables)} may have lost "
            "updates committed before"
            if tables
            else "the events sent before it and not yet processed are gone"
        )
        log.error(
            "processor %s: Redis lost its data: %s vanished while the worker ran (likely a "
            "Redis restart without persistence, a FLUSHALL or a failover to an empty "
            "replica); the consumer groups are re-created and processing goes on from the "
            "events still in Redis, but %s",
            name,
            what,
            consequence,
        )
        await self._record(processor, what)

    async def _record(self, processor: Processor, what: str) -> None:
        key = data_loss_key(processor.keys.group)
        record = {"at": time.time(), "what": what, "by": self.worker}
        try:
            with redis_errors():
                await self.app.redis.set(key, orjson.dumps(record), ex=RECORD_TTL)
        except Exception:
            log.debug("could not record the data loss of %s", processor.name, exc_info=True)


def _plain(episode: Episode) -> list[str]:
    names = {"lease": "a held lease", "group": "a consumer group", "membership": "its state"}
    return [names.get(kind, kind) for kind in episode.kinds]


async def watch_data_loss(
    app: App,
    processors: Sequence[Processor],
    worker: str,
    *,
    task_status: trio.TaskStatus[DataLossWatch] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Watch what vanishes under the pieces of ``app``'s client and say it, once per
    processor (see the module docs); ``task_status.started()`` gets the watch.

    Cancellation:
        Cancel to stop watching; the pieces then say what vanishes themselves.
    """
    vanished = health_of(app.redis).vanished
    watch = DataLossWatch(app, {p.group: p for p in processors}, worker)
    try:
        await watch.learn_metadata()
    except Exception:
        log.debug("could not read the streams' metadata", exc_info=True)
    vanished.watched = True
    task_status.started(watch)
    try:
        while True:
            if not vanished.pending:
                await vanished.reports.wait_transition()
            await trio.sleep(SETTLE)
            for episode in vanished.take():
                try:
                    await watch.say(episode)
                except Exception:
                    log.error("Redis lost data of %s (%s)", episode.scope, _plain(episode))
    finally:
        vanished.watched = False


async def read_data_loss(redis: Redis, group: str) -> DataLossRecord | None:
    """The data loss recorded for processor group ``group``, if any (for status).

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    with redis_errors():
        raw = await redis.get(data_loss_key(group))
    if raw is None:
        return None
    try:
        fields: dict[str, Any] = orjson.loads(raw)
        return DataLossRecord(
            at=datetime.fromtimestamp(float(fields["at"]), UTC),
            what=str(fields["what"]),
            by=str(fields["by"]),
        )
    except (ValueError, KeyError, TypeError):
        return None
