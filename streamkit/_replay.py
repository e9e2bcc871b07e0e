"""Where a processor reads from, moved: to the start, the end, a time or an entry id.

A reset is checked first (:func:`check_reset`: what was asked makes sense, before
anything is read), planned (:func:`plan_reset`: pure decisions on what Redis says of
each partition) and then applied (:func:`apply_reset`), one atomic script call per
partition (``admin/reset``) that moves the processor's consumer group, takes the lease
of a worker running the partition (which then starts it again, loading the state
afresh) and, to rebuild state, deletes the processor's state of the partition, all in
the same step.

The state of a processor with tables, windows or outputs decides what a replay means:

* ``state="clear"`` with ``to="start"``: a **rebuild**. The processor's tables, windows,
  watermarks and outbox are deleted with the group's reset, atomically per partition;
  the retained events are then processed again from an empty state, so every value
  ends equal to a fold of the retained events, exactly (the commits that fold them are
  exactly once, whatever fails meanwhile). Outputs emitted during the replay are
  emitted again.
* ``state="keep"``: the events are processed again against the state as it stands
  (a count then counts them twice): the operator's choice, never a default.
* neither: refused, since either may be what was meant. A replay from a time or an
  entry id rebuilds nothing (the state would lack the events before it): only with
  ``keep``. ``clear`` with ``to="end"`` is refused too: nothing is replayed to rebuild
  the state from, so it would only be wiped.

A worker running a partition while it is reset (``streamkit reset --force``) loses its
lease in the reset's own step: whatever it had in flight is refused at its next fenced
commit, and it starts the partition again once the reset's hold on the lock ends (what
was left of the worker's lease), reading from the new position with the state as Redis
holds it. So a rebuild under running workers is as exact as one with them stopped.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import orjson

from . import _keys
from ._errors import ConfigError, StreamkitError
from ._lua import script
from ._redis import LuaScript, redis_errors
from ._wire import text

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._redis import Redis

__all__ = [
    "RESET_OWNER",
    "PartitionReplay",
    "ResetIncomplete",
    "ResetPlan",
    "ResetRecord",
    "ResetRefused",
    "StateChoice",
    "apply_reset",
    "check_reset",
    "parse_position",
    "plan_reset",
    "read_reset",
]

StateChoice = Literal["clear", "keep"]


class App(Protocol):
    """What a reset needs of the app (:class:`streamkit.App`): its Redis client."""

    @property
    def redis(self) -> Redis: ...


class Processor(Protocol):
    """What a reset needs of a processor (``App.processors[name]``)."""

    @property
    def name(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def stream(self) -> Any: ...
    @property
    def keys(self) -> Any: ...
    @property
    def tables(self) -> Sequence[Any]: ...
    @property
    def outputs(self) -> Sequence[Any]: ...


#: The largest sequence number of an entry id: ``ms-MAX_SEQ`` is the last id of ``ms``.
MAX_SEQ = 2**64 - 1
#: Entries a count of what a replay processes reads per round trip.
COUNT_PAGE = 10_000

#: The owner a reset takes a running worker's lease as (the lock's value is this, a
#: colon and a fresh fencing token, until the worker's lease would have ended).
RESET_OWNER = "streamkit reset"

_RESET = LuaScript(script("admin/reset"))
_ENTRY_ID = re.compile(r"(\d+)-(\d+)\Z")
_RELATIVE = re.compile(r"-(\d+(?:\.\d+)?)([smhdw])\Z")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class ResetRefused(StreamkitError):
    """A reset was refused before anything changed (one line says why)."""


class ResetIncomplete(StreamkitError):
    """A reset stopped part-way (Redis failed); running it again finishes it.

    Attributes:
        done: the partitions that were reset.
        total: the number of partitions.
    """

    def __init__(self, cause: StreamkitError, done: int, total: int) -> None:
        super().__init__(
            f"{cause}\nreset {done} of {total} partitions before that; the reset can be "
            f"run again safely, and finishes the rest"
        )
        self.done = done
        self.total = total


def parse_position(value: str, *, now: datetime | None = None) -> str | datetime:
    """What ``--to`` says: ``"start"``, ``"end"``, an entry id (``"1700000000000-0"``,
    kept as text), or a time: ISO 8601 (a naive one is UTC) or relative to now
    (``"-2h"``, ``"-30m"``, ``"-90s"``, ``"-1d"``, ``"-1w"``).

    Error handling:
        :class:`ConfigError` for anything else.
    """
    value = value.strip()
    if value in ("start", "end") or _ENTRY_ID.match(value):
        return value
    relative = _RELATIVE.match(value)
    if relative:
        seconds = float(relative[1]) * _UNITS[relative[2]]
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(
            "to",
            f"expected start, end, a time (ISO 8601, or -2h, -30m, -1d ago) or an entry id "
            f"(1700000000000-0), got {value!r}",
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def before(entry_id: str) -> str:
    """The greatest entry id below ``entry_id`` (``ms-seq``): what a group has been
    delivered when it is to read from ``entry_id`` on."""
    ms, _, seq = entry_id.partition("-")
    if int(seq) > 0:
        return f"{ms}-{int(seq) - 1}"
    if int(ms) == 0:
        return "0-0"
    return f"{int(ms) - 1}-{MAX_SEQ}"


def _ms_of(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def _time_of(entry_id: str | None) -> datetime | None:
    if entry_id is None:
        return None
    return datetime.fromtimestamp(_ms_of(entry_id) / 1000, UTC)


def _less(a: str, b: str) -> bool:
    am, _, aseq = a.partition("-")
    bm, _, bseq = b.partition("-")
    return (int(am), int(aseq)) < (int(bm), int(bseq))


@attrs.frozen(kw_only=True)
class PartitionReplay:
    """What a reset does to one partition.

    Attributes:
        partition: the partition.
        after: the id the processor's group is set to have been delivered
            (``"$"``: the end): it reads every retained entry after it.
        events: the retained events it processes (again).
        entries_read: the group's entries-read counter after the reset (its lag is
            exact), or ``None`` if unknown.
        first: the id of the oldest retained entry, if any.
        last: the id of the newest entry, if any.
        gone: events sent to the partition that are no longer retained (trimmed)
            and that a replay from the start would have processed, as far as Redis
            can tell (an upper bound for a time before the oldest retained entry).
    """

    partition: int
    after: str
    events: int
    entries_read: int | None
    first: str | None
    last: str | None
    gone: int = 0


@attrs.frozen(kw_only=True)
class ResetPlan:
    """A reset, worked out and not yet applied (:func:`plan_reset`).

    Attributes:
        processor: the processor's name.
        stream: its stream's name.
        to: what was asked: ``"start"``, ``"end"``, an entry id, or a time.
        state: what happens to the processor's state (``None``: it has none).
        partitions: what happens to each partition reset.
        tables: the tables and windowed tables the processor writes.
        outputs: the streams it emits to (emitted again by a replay).
        windows: the windowed tables among ``tables``.
        window_outputs: the streams among ``outputs`` only windowed tables emit to
            (their windows' results).
        batched: whether its stream's entries are a join's (each a forwarder's batch of
            events, or a side's heartbeat), so counted as entries, not events.
    """

    processor: str
    stream: str
    to: str | datetime
    state: StateChoice | None
    partitions: tuple[PartitionReplay, ...]
    tables: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    windows: tuple[str, ...] = ()
    window_outputs: tuple[str, ...] = ()
    batched: bool = False

    @property
    def events(self) -> int:
        """The events processed (again) in all."""
        return sum(p.events for p in self.partitions)

    @property
    def gone(self) -> int:
        """The events no longer retained that the replay cannot process."""
        return sum(p.gone for p in self.partitions)

    @property
    def nothing_to_do(self) -> bool:
        """A replay from a time or an id after every selected partition's newest event."""
        return self.to not in ("start", "end") and self.events == 0

    def loss(self) -> str | None:
        """The events gone (trimmed) that the replay cannot process, in words (no
        final stop), or ``None`` if none are: before when they were sent (the newest
        of the oldest retained events of the partitions that lost some) and where."""
        losing = [p for p in self.partitions if p.gone]
        if not losing:
            return None
        firsts = [p.first for p in losing]
        since = None
        if all(firsts):
            since = _time_of(max((f for f in firsts if f), key=_ms_of))
        numbers = [str(p.partition) for p in losing]
        where = (
            f"partition {numbers[0]}"
            if len(numbers) == 1
            else f"partitions {', '.join(numbers)}"
            if len(numbers) <= 8
            else f"{len(numbers)} partitions"
        )
        return (
            f"{self.gone:,} event(s) sent before "
            f"{since.isoformat(timespec='seconds') if since else 'now'} are no longer "
            f"retained (trimmed, in {where}): they are not processed"
        )

    def where(self) -> str:
        """Where the processor reads from, in words."""
        if isinstance(self.to, datetime):
            return f"from {self.to.isoformat(timespec='seconds')}"
        if self.to in ("start", "end"):
            return f"from the {self.to}"
        return f"from entry {self.to}"

    def describe(self) -> list[str]:
        """The lines the confirmation prompt shows (what happens, and to what)."""
        count = len(self.partitions)
        what = (
            "entries (each a forwarder's batch of events, or a side's heartbeat)"
            if self.batched
            else "event(s)"
        )
        lines = [
            (
                f"Reset {self.processor} to read {self.stream} {self.where()} "
                f"({count} partition{'s' if count != 1 else ''}): {self.events:,} {what} "
                f"will be processed{' again' if self.to != 'end' else ''}."
            )
        ]
        loss = self.loss()
        if loss:
            lines.append(f"{loss}.")
        replayed = self.to != "end"
        if self.state == "clear":
            lines.append(
                f"Its state ({', '.join(self.tables) or 'none'}) is cleared with the reset and "
                f"rebuilt from the retained events."
            )
        elif self.state == "keep" and replayed:
            plain = [t for t in self.tables if t not in self.windows]
            if plain:
                lines.append(
                    f"Its state ({', '.join(plain)}) is kept: the events are processed again "
                    f"against it (counts include them twice)."
                )
            if self.windows:
                lines.append(
                    f"Its windows ({', '.join(self.windows)}) are kept, with the watermark: a "
                    f"replayed event whose windows have all closed is late (dropped, or "
                    f'dead-lettered for late="dead_letter"; counted as late), so closed '
                    f"windows neither change nor emit again; windows still open fold the "
                    f"replayed events again (counts include them twice)."
                )
        emitted = self.outputs
        if self.state == "keep":
            emitted = tuple(o for o in self.outputs if o not in self.window_outputs)
        if emitted and replayed:
            lines.append(
                f"What it emits to {', '.join(emitted)} during the replay is emitted again."
            )
        return lines


def _stateful(processor: Processor) -> bool:
    return bool(processor.tables or processor.outputs)


def _outputs(processor: Processor) -> tuple[str, ...]:
    return _outputs_of(processor.outputs, processor.tables)


def _outputs_of(outputs: Sequence[Any], tables: Sequence[Any]) -> tuple[str, ...]:
    """The streams emitted to: ``outputs``, then those of ``tables`` with an ``output``
    (a windowed table's results, say)."""
    names = [spec_name(o) for o in outputs]
    for table in tables:
        output = getattr(table, "output", None)
        if output is not None:
            names.append(spec_name(output))
    return tuple(dict.fromkeys(names))


def _windowed(table: Any) -> bool:
    """Whether ``table`` is a windowed table (tumbling, hopping or sessions): what
    keeps a watermark, and not a join."""
    return getattr(table, "kind", None) is not None and not getattr(table, "joins", False)


def spec_name(stream: Any) -> str:
    spec = getattr(stream, "spec", stream)
    return str(spec.name)


def check_reset(processor: Processor, *, to: str | datetime, state: StateChoice | None) -> None:
    """Check that a reset of ``processor`` to ``to`` says what becomes of its state as
    it must (see the module docs), before anything is read: pure.

    Error handling:
        :class:`ResetRefused` (one line) for a processor with tables, windows or
        outputs without ``state`` (except with ``"end"``), or ``"clear"`` with
        anything but ``"start"``.
    """
    mid = to not in ("start", "end")
    if _stateful(processor) and state is None and to != "end":
        kept = ", ".join(
            (
                *(table.name for table in processor.tables),
                *(f"outputs {o}" for o in _outputs(processor)),
            )
        )
        if mid:
            raise ResetRefused(
                f"{processor.name} keeps state ({kept}): a replay {_where(to)} can only "
                f"process the events again against the state as it stands (say --state "
                f"keep); rebuilding it from the middle of the stream cannot be exact, as the "
                f"state would lack the events before; nothing was reset"
            )
        raise ResetRefused(
            f"{processor.name} keeps state ({kept}): say --state clear to rebuild it from "
            f"the retained events, or --state keep to process them again against the state "
            f"as it stands (counts would include them twice); nothing was reset"
        )
    if state == "clear" and mid:
        raise ResetRefused(
            f"--state clear rebuilds the state from the start of the stream: a rebuild "
            f"{_where(to)} cannot be exact (the state would lack the events before it); use "
            f"--to start --state clear, or --state keep; nothing was reset"
        )
    if state == "clear" and to == "end":
        raise ResetRefused(
            "--state clear rebuilds the state from the retained events, and --to end "
            "replays none: the state would only be wiped; use --to start --state clear to "
            "rebuild it, or --to end alone to skip the events sent so far (the state "
            "kept); nothing was reset"
        )


async def plan_reset(
    app: App,
    processor: Processor,
    *,
    to: str | datetime,
    state: StateChoice | None = None,
    partitions: Sequence[int] | None = None,
) -> ResetPlan:
    """Work out a reset of ``processor`` (see the module docs): where each partition
    will read from and how many events it processes. Nothing changes.

    Args:
        to: ``"start"``, ``"end"``, an entry id (``"1700000000000-0"``: read from that
            entry on), or a time (an aware datetime: read the events sent at or after it).
        state: ``"clear"`` (rebuild the state from the start: only with ``"start"``)
            or ``"keep"``; required for a processor with tables, windows or outputs,
            except with ``"end"``.
        partitions: the partitions to reset (default: all).

    Error handling:
        :class:`ResetRefused` (one line, nothing changed) as :func:`check_reset`
        says, or for a partition key holding something other than a stream;
        :class:`ConfigError` for a partition the stream does not have;
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    stream = processor.stream
    count = stream.partition_count
    wanted = list(range(count)) if not partitions else sorted(set(partitions))
    for partition in wanted:
        if not 0 <= partition < count:
            raise ConfigError(
                "partition", f"{stream.name} has no partition {partition} (0..{count - 1})"
            )
    check_reset(processor, to=to, state=state)
    stateful = _stateful(processor)
    tables = tuple(table.name for table in processor.tables)
    if not stateful:
        state = None
    keys = [stream.key(p) for p in wanted]
    redis = app.redis
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            type_requests = [pipe.type(key) for key in keys]
        types = [text(await request) for request in type_requests]
    wrong = [(k, t) for k, t in zip(keys, types, strict=True) if t not in ("stream", "none")]
    if wrong:
        key, kind = wrong[0]
        raise ResetRefused(
            f"{key} holds a {kind}, not a stream: {stream.name} cannot be reset there; "
            f"nothing was reset"
        )
    replays = []
    for partition, key, kind in zip(wanted, keys, types, strict=True):
        replays.append(await _plan_partition(redis, partition, key, kind == "stream", to))
    windows = [t for t in processor.tables if _windowed(t)]
    others = [t for t in processor.tables if not _windowed(t)]
    fed_by_others = set(_outputs_of(processor.outputs, others))
    return ResetPlan(
        processor=processor.name,
        stream=stream.name,
        to=to,
        state=state,
        partitions=tuple(replays),
        tables=tables,
        outputs=_outputs(processor),
        windows=tuple(t.name for t in windows),
        window_outputs=tuple(o for o in _outputs_of((), windows) if o not in fed_by_others),
        batched=any(getattr(table, "joins", False) for table in processor.tables),
    )


def _where(to: str | datetime) -> str:
    if isinstance(to, datetime):
        return f"from {to.isoformat(timespec='seconds')}"
    return f"from entry {to}"


async def _plan_partition(
    redis: Any, partition: int, key: str, exists: bool, to: str | datetime
) -> PartitionReplay:
    if not exists:
        return PartitionReplay(
            partition=partition,
            after="0-0" if to != "end" else "$",
            events=0,
            entries_read=0,
            first=None,
            last=None,
        )
    with redis_errors():
        info: Any = await redis.xinfo_stream(key)
    fields = {text(k): v for k, v in info.items()}
    length = int(fields.get("length", 0))
    added = fields.get("entries-added")
    added = None if added is None else int(added)
    first_entry = fields.get("first-entry")
    last_entry = fields.get("last-entry")
    first = _entry_id_of(first_entry)
    last = _entry_id_of(last_entry) or (text(fields["last-generated-id"]) if length else None)
    trimmed = 0 if added is None else max(0, added - length)
    if to == "end":
        return PartitionReplay(
            partition=partition,
            after="$",
            events=0,
            entries_read=added,
            first=first,
            last=last,
        )
    if to == "start":
        after = "0-0"
    elif isinstance(to, datetime):
        after = before(f"{int(to.timestamp() * 1000)}-0")
    else:
        after = before(to)
    if first is None:
        events = 0
    elif _less(after, first):
        events = length
    else:
        events = await _count_after(redis, key, after, last)
    gone = trimmed if first is None or _less(after, first) else 0
    return PartitionReplay(
        partition=partition,
        after=after,
        events=events,
        entries_read=None if added is None else max(0, added - events),
        first=first,
        last=last,
        gone=gone,
    )


def _entry_id_of(entry: Any) -> str | None:
    if not entry:
        return None
    identifier = getattr(entry, "identifier", None)
    if identifier is None:
        identifier = entry[0]
    return text(identifier)


async def _count_after(redis: Any, key: str, after: str, last: str | None) -> int:
    """The entries of ``key`` after id ``after``, counted a page at a time."""
    if last is None or not _less(after, last):
        return 0
    total = 0
    cursor = after
    while True:
        with redis_errors():
            page: Any = await redis.xrange(key, f"({cursor}", "+", count=COUNT_PAGE)
        total += len(page)
        if len(page) < COUNT_PAGE:
            return total
        cursor = text(page[-1].identifier)


def state_keys(app: App, processor: Processor, partition: int) -> tuple[list[str], list[str]]:
    """The keys of ``processor``'s state of ``partition``: the windows' indexes (whose
    windows' hashes go with them), and the others."""
    stream = processor.stream.spec
    name = processor.keys.processor
    indexes: list[str] = []
    others = [
        _keys.state_key(stream.app, stream.name, name, partition),
        _keys.outbox_key(stream.app, stream.name, name, partition),
    ]
    for table in processor.tables:
        if getattr(table, "is_global", False):
            # One hash for every partition (in a slot of its own): the replay's writes
            # overwrite its keys, as they land (see docs/joins.md).
            continue
        if getattr(table, "fixed", False):
            indexes.append(table.windows_key(partition))
        elif getattr(table, "kind", None) is not None or getattr(table, "joins", False):
            others += [table.key(partition), table.index_key(partition)]
        else:
            others += [table.key(partition), table.expiry_key(partition)]
    return indexes, others


async def apply_reset(app: App, processor: Processor, plan: ResetPlan) -> int:
    """Apply ``plan`` (from :func:`plan_reset`): one atomic step per partition, that
    moves the group, takes the lease of a worker running the partition and, with
    ``state="clear"``, deletes the partition's state. Returns the number of leases
    taken: those workers start their partitions again once the reset's hold on the
    lock ends (at most the lease's TTL), from the new position, loading the state as
    Redis holds it (see the module docs).

    The partitions live in different Redis Cluster slots, so no transaction spans them:
    if Redis fails part-way, some partitions are reset and the others not yet, and
    running the reset again finishes it (each step is idempotent).

    Error handling:
        :class:`ResetIncomplete` if Redis failed part-way.
    """
    stream = processor.stream
    taken = 0
    for done, replay in enumerate(plan.partitions):
        indexes: list[str] = []
        others: list[str] = []
        if plan.state == "clear":
            indexes, others = state_keys(app, processor, replay.partition)
        prefixes: list[str] = []
        for index in indexes:
            tag_and_table = index.removeprefix("__wins:")
            prefixes += [f"__wval:{tag_and_table}:", f"__wcls:{tag_and_table}:"]
        entries_read = -1 if replay.entries_read is None else replay.entries_read
        lock = processor.keys.lock_name(replay.partition)
        try:
            with redis_errors():
                reply: Any = await _RESET(
                    app.redis,
                    keys=[
                        stream.key(replay.partition),
                        _keys.lock_key(lock),
                        _keys.fence_key(lock),
                        *indexes,
                        *others,
                    ],
                    args=[
                        processor.group,
                        replay.after,
                        entries_read,
                        RESET_OWNER,
                        len(indexes),
                        *prefixes,
                    ],
                )
        except StreamkitError as exc:
            raise ResetIncomplete(exc, done, len(plan.partitions)) from exc
        taken += int(reply[1])
    with redis_errors():
        if plan.state == "clear":
            await app.redis.delete([_keys.data_loss_key(processor.group)])
        count = processor.stream.partition_count
        moved = [p.partition for p in plan.partitions]
        record = {
            "at": time.time(),
            "where": f"{processor.stream.name} {plan.where()}",
            "partitions": None if len(moved) == count else ", ".join(map(str, moved)),
            "state": plan.state,
            "gone": plan.gone,
        }
        await app.redis.set(_keys.reset_key(processor.group), orjson.dumps(record), ex=RECORD_TTL)
    return taken


#: Seconds the last reset stays recorded for ``streamkit status``.
RECORD_TTL = 7 * 24 * 3600


@attrs.frozen(kw_only=True)
class ResetRecord:
    """The last reset of a processor, as ``streamkit status`` shows it.

    Attributes:
        at: when it was applied.
        where: where the processor reads from since (``orders from the start``).
        partitions: the partitions reset, when not all.
        state: what became of the state (``"clear"``, ``"keep"``, or ``None``).
        gone: the events no longer retained (trimmed) that the replay could not
            process.
    """

    at: datetime
    where: str
    partitions: str | None
    state: str | None
    gone: int = 0


async def read_reset(redis: Any, group: str) -> ResetRecord | None:
    """The last reset recorded for processor group ``group``, if any (for status).

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached.
    """
    with redis_errors():
        raw = await redis.get(_keys.reset_key(group))
    if raw is None:
        return None
    try:
        fields: dict[str, Any] = orjson.loads(raw)
        return ResetRecord(
            at=datetime.fromtimestamp(float(fields["at"]), UTC),
            where=str(fields["where"]),
            partitions=None if fields.get("partitions") is None else str(fields["partitions"]),
            state=None if fields.get("state") is None else str(fields["state"]),
            gone=int(fields.get("gone") or 0),
        )
    except (ValueError, KeyError, TypeError):
        return None
