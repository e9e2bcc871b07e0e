"""Enqueue plans, pure: job calls into the enqueue script's arguments, for every client.

The Trio queue (:meth:`JobQueue.enqueue_calls <streamkit.jobs.JobQueue>`) and the
blocking and asyncio clients (:mod:`streamkit.clients`) enqueue through
:func:`plan_enqueue`: the same checks of arguments and options, the same job ids,
shards and dependencies, the same JSON and the same script calls, so that a job
enqueued from a Flask view runs exactly as one enqueued from a Trio service.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import orjson

from .._errors import ConfigError, EncodeError
from .._lua import CONSTANTS
from .._validate import non_negative_number, positive_number
from .._wire import text
from ._batches import chunks
from ._layout import ShardKeys, shard_for
from ._limits import limit_key_of, limit_shard
from ._model import MAX_AFTER, PRIORITIES, JobCall, JobOptions, JobRef, Priority, When, dumps
from ._trace import inject_trace

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

__all__ = [
    "DEBOUNCE_KEEP_MS",
    "ENQUEUE_CHUNK",
    "OPTION_KEYS",
    "EnqueuePlan",
    "JobIds",
    "JobLike",
    "Placement",
    "add_call_times",
    "answer",
    "encode_arguments",
    "link_answers",
    "plan_enqueue",
]

#: Jobs per enqueue script call.
ENQUEUE_CHUNK = 250

#: How long a debounce key outlives its pending job's time (ms): while its job is
#: scheduled and its key lives, an enqueue of the key merges into the job.
DEBOUNCE_KEEP_MS = int(CONSTANTS["DEBOUNCE_KEEP_MS"])

#: The enqueue script's per-job options, by the short key each travels under in the
#: job's options JSON: the one place the keys are named here (the script names them in
#: its table ``OPT``, ``streamkit/_lua/lib/jobs/options.lua``; ``tests/test_lua.py``
#: checks that the two agree).
OPTION_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "priority": "p",
        "delay_ms": "d",
        "at_ms": "a",
        "expires_ms": "e",
        "dedupe": "w",
        "after": "after",
        "remote": "x",
        "limit_key": "k",
        "headers": "h",
        "relayed": "r",
        "name": "n",
        "max_tries": "m",
        "result_ttl_s": "t",
        "limits": "l",
        "dedupe_window_s": "dw",
        "feed": "f",
        "order": "o",
        "debounce": "b",
        "throttle": "th",
    }
)
_O = OPTION_KEYS


class JobLike(Protocol):
    """What enqueueing needs of a declared job (a :class:`~streamkit.jobs.Job`)."""

    @property
    def name(self) -> str: ...

    @property
    def options(self) -> JobOptions: ...

    def check_arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None: ...

    def bind_arguments(
        self, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Mapping[str, Any]: ...


# Bumped in a forked child: id makers of the parent draw a new prefix there, so that
# processes forked from one parent (gunicorn's workers) never make the same job ids.
_generation = 0


def _after_fork() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_after_fork)


@attrs.define(eq=False)
class JobIds:
    """New job ids: a random prefix and a counter; a new prefix after ``fork``."""

    _prefix: str = attrs.field(init=False, factory=lambda: secrets.token_hex(8))
    _counter: int = attrs.field(init=False, default=0)
    _generation: int = attrs.field(init=False, factory=lambda: _generation)

    def __call__(self) -> str:
        """A job id no other call of any process makes."""
        if self._generation != _generation:
            self._prefix, self._counter, self._generation = secrets.token_hex(8), 0, _generation
        self._counter += 1
        return f"{self._prefix}{self._counter:x}"


def encode_arguments(
    name: str, args: Sequence[Any], kwargs: Mapping[str, Any], max_bytes: int | None = None
) -> bytes:
    """A job's arguments as stored: JSON ``[args, kwargs]``.

    Every client (the Trio queue, the blocking and asyncio clients) encodes a job's
    arguments here, so their size limit is checked here.

    Error handling:
        :class:`~streamkit.EncodeError` if they are not JSON-serialisable, or take more
        than ``max_bytes`` encoded.
    """
    encoded = dumps([args, kwargs], f"the arguments of job {name}")
    if max_bytes is not None and len(encoded) > max_bytes:
        raise EncodeError(
            f"the arguments of job {name}: {len(encoded):,} bytes encoded, over the "
            f"queue's limit of {max_bytes:,} (max_bytes)"
        )
    return encoded


#: The longest delay or expiry a job may be given: a century (its time, in ms since
#: the epoch, must stay a whole number Redis stores exactly).
MAX_WAIT = 100 * 365 * 86_400


def _ms(value: When | None, name: str) -> int:
    if value is None:
        return 0
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    # 0 is accepted, meaning none (a delay of 0: now); the refusal of a negative one
    # says so (it said "> 0").
    non_negative_number.check(name, seconds)
    if seconds > MAX_WAIT:
        raise ConfigError(name, f"must be at most a century ({MAX_WAIT:,} s), got {seconds!r}")
    return math.ceil(seconds * 1000)


def _at_ms(value: datetime | None, name: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ConfigError(name, f"must be a timezone-aware datetime, got {value!r}")
    return math.ceil(value.timestamp() * 1000)


def _headers(given: Mapping[str, str] | None, trace: dict[str, str]) -> bytes | None:
    """A job's headers as stored (JSON text), the call's own over the trace context;
    ``None`` for none.

    Error handling:
        :class:`~streamkit.ConfigError` unless they are text keys and text values.
    """
    if not given:
        return orjson.dumps(trace) if trace else None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in given.items()):
        raise ConfigError("headers", f"must map text to text, got {dict(given)!r}")
    return orjson.dumps({**trace, **given})


def add_call_times(opts: dict[str, Any], call: JobCall) -> None:
    """Add to the enqueue script's options what ``call`` says of when it runs (``delay``,
    ``at``, ``expires``) and whether it has an id of its own (to dedupe by)."""
    if call.delay is not None:
        opts[_O["delay_ms"]] = _ms(call.delay, "delay")
    if call.at is not None:
        opts[_O["at_ms"]] = _at_ms(call.at, "at")
    if call.expires is not None:
        if not isinstance(call.expires, datetime):
            # (A job that must start within no time at all: the job option refuses it
            # too; 0 would read as "no expiry".)
            seconds = (
                call.expires.total_seconds()
                if isinstance(call.expires, timedelta)
                else call.expires
            )
            positive_number.check("expires", seconds)
        opts[_O["expires_ms"]] = (
            _at_ms(call.expires, "expires")
            if isinstance(call.expires, datetime)
            else -_ms(call.expires, "expires")
        )
    if call.job_id is not None:
        opts[_O["dedupe"]] = 1


def _options(
    call: JobCall,
    after: list[str],
    key: str | None = None,
    headers: bytes | None = None,
    coalesce: tuple[str, list[Any]] | None = None,
) -> bytes:
    """The per-job options field of the enqueue script: "" when there are none."""
    opts: dict[str, Any] = {}
    if coalesce is not None:
        opts[_O[coalesce[0]]] = coalesce[1]
    if key is not None:
        opts[_O["limit_key"]] = key
    if headers is not None:
        opts[_O["headers"]] = headers.decode()
    if call.priority is not None:
        opts[_O["priority"]] = PRIORITIES[call.priority]
    add_call_times(opts, call)
    if after:
        opts[_O["after"]] = after
    return orjson.dumps(opts) if opts else b""


def _place(
    call: JobCall,
    after: list[tuple[str, int]],
    shards: int,
    new_id: Callable[[], str],
    home: int | None = None,
) -> tuple[str, int]:
    """The id and shard of a new job: the shard its id maps to, which for a job with
    limits must be its limits' (``home``); a job with dependencies (``after``: those on
    its own queue) and a generated id goes on the shard of its first dependency (a
    generated id is drawn until it fits), and is linked to those on other shards."""
    if call.job_id is not None and (not isinstance(call.job_id, str) or not call.job_id):
        raise ConfigError("job_id", f"must be a non-empty string, got {call.job_id!r}")
    if shards == 1 or (home is None and (call.job_id is not None or not after)):
        job_id = call.job_id if call.job_id is not None else new_id()
        return job_id, shard_for(job_id, shards)
    shard = home if home is not None else after[0][1]
    if call.job_id is None:
        while shard_for(job_id := new_id(), shards) != shard:
            pass
        return job_id, shard
    if shard_for(call.job_id, shards) != shard:
        raise ConfigError(
            "job_id",
            f"job id {call.job_id!r} maps to shard {shard_for(call.job_id, shards)} "
            f"but its limits live on shard {shard}: leave job_id out, or pick one on that shard",
        )
    return call.job_id, shard


def _coalesce(job: JobLike, call: JobCall, delay: When | None) -> tuple[str, tuple[str, list[Any]]]:
    """A debounced or throttled call's key and its enqueue script option: ``b`` (key,
    debounce and max_wait in ms, 0 for none) or ``th`` (key, period in ms).

    Error handling:
        :class:`~streamkit.ConfigError` for a call with options the key replaces: an id
        of its own, dependencies, or (debounced) its own time.
    """
    options, name = job.options, job.name
    what = options.coalesced
    assert what is not None
    for given, option in ((call.job_id, "job_id"), (call.after or None, "after")):
        if given is not None:
            raise ConfigError(
                option, f"job {name} is {what}d by its key: leave {option}= out of its enqueues"
            )
    if what == "debounce" and (call.delay, call.at, delay) != (None, None, None):
        raise ConfigError(
            "delay", f"job {name} is debounced: its debounce sets when it runs (no delay= or at=)"
        )
    key = ""
    if options.key is not None:
        key = limit_key_of(name, options.key, job.bind_arguments, call.args, call.kwargs, "key")
    if what == "debounce":
        assert options.debounce is not None
        wait = 0 if options.max_wait is None else _ms(options.max_wait, "max_wait")
        return key, ("debounce", [key, _ms(options.debounce, "debounce"), wait])
    assert options.throttle is not None
    return key, ("throttle", [key, _ms(options.throttle, "throttle")])


def _ref(ref: JobRef | str, shards: int, queue: str) -> tuple[str, int, str | None]:
    """A dependency's id, shard and queue: ``None`` for one of ``queue`` (an id, or a
    handle of a job on it), else the name of the other queue its handle is of."""
    if isinstance(ref, str):
        return ref, shard_for(ref, shards), None
    # A Trio handle's queue is the queue (its name an attribute), a client handle's
    # its name (None: the client's own queue).
    of = getattr(ref, "queue", None)
    name = of if of is None or isinstance(of, str) else getattr(of, "name", None)
    return ref.id, ref.shard, None if name is None or name == queue else name


@attrs.frozen
class EnqueuePlan:
    """Jobs checked and encoded, ready to send: the enqueue script's calls.

    Attributes:
        placed: per call, in order, the job's ``(id, shard)``.
        defaults: the script's per-call arguments after the shard's key base (name,
            default priority, delay, tries, result ttl, dedupe window, expiry, limits).
        per_shard: per shard, the jobs' fields: id, arguments, options, id, ...
        costs: per shard where some job names dependencies, each job's cost in a call
            (1 plus the jobs it depends on).
    """

    placed: list[tuple[str, int]]
    defaults: tuple[Any, ...]
    per_shard: dict[int, list[Any]]
    costs: dict[int, list[int]] = attrs.field(factory=dict)
    #: Per job (id) with dependencies on other shards or queues: those, ``(id, shard,
    #: queue)`` each (``queue``: ``None`` for the plan's own).
    remote: dict[str, list[tuple[str, int, str | None]]] = attrs.field(factory=dict)
    #: Whether its jobs are debounced or throttled: the script's replies then say which
    #: job each call is (see :meth:`effective`).
    coalesced: bool = False
    #: Whether some of its jobs have ids of the caller's: the script's replies then say
    #: which were duplicates (see :meth:`effective`).
    deduped: bool = False

    def effective(self, replies: Sequence[Sequence[Any]]) -> list[tuple[str, int, bool]]:
        """Per call, in order, the job that runs for it, ``(id, shard, added)``: its own
        (``added``, unless a job of its id was there already: a duplicate), or the
        pending job a debounce merged it into, or the job a throttle kept (not
        ``added``); ``replies``: the script calls' replies, in the order of
        :meth:`script_calls`."""
        answers = iter(reply for call in replies for reply in call)
        # Per shard, its calls' replies in order: the order of its jobs in ``placed``.
        per_shard = {
            shard: iter([next(answers) for _ in fields[::3]])
            for shard, fields in self.per_shard.items()
        }
        effective: list[tuple[str, int, bool]] = []
        for job_id, shard in self.placed:
            reply = next(per_shard[shard])
            if isinstance(reply, bytes | str):  # the job a debounce or throttle kept
                effective.append((text(reply), shard, False))
            else:  # 1: added; 0: a duplicate, the job of its id
                effective.append((job_id, shard, reply != 0))
        return effective

    def link_calls(self, queue: str) -> Iterator[tuple[ShardKeys, tuple[Any, ...]]]:
        """The link script's calls to make first, for the jobs depending on jobs of
        other shards or queues (none for most plans): per call, the dependencies'
        shard's keys and its arguments."""
        links: dict[tuple[str, int], list[Any]] = {}
        shard_of = dict(self.placed)
        for job_id, deps in self.remote.items():
            member = orjson.dumps([queue, shard_of[job_id], job_id])
            for dep_id, dep_shard, dep_queue in deps:
                links.setdefault((dep_queue or queue, dep_shard), []).extend((dep_id, member))
        for (of, shard), flat in links.items():
            keys = ShardKeys(of, shard)
            for i in range(0, len(flat), 2 * ENQUEUE_CHUNK):
                yield keys, (keys.base, *flat[i : i + 2 * ENQUEUE_CHUNK])

    def script_calls(
        self, queue: str, linked: Mapping[tuple[str, str], Any] | None = None
    ) -> Iterator[tuple[ShardKeys, tuple[Any, ...]]]:
        """The enqueue script's calls: per call, the shard's keys and its arguments
        (``linked``: the link script's answer per (dependency id, job id), after
        :meth:`link_calls`).

        A call holds at most :data:`ENQUEUE_CHUNK` jobs and the dependencies they
        name, and about :data:`~streamkit.jobs._batches.MAX_CALL_BYTES` (a larger job
        goes alone): one call runs while Redis serves no one else. Every client cuts
        its calls here.
        """
        for shard, fields in self.per_shard.items():
            if self.remote:
                fields = list(fields)
                for i in range(0, len(fields), 3):
                    deps = self.remote.get(fields[i])
                    if deps:
                        opts = orjson.loads(fields[i + 2] or b"{}")
                        opts[_O["remote"]] = {
                            dep: answer(linked[(dep, fields[i])]) if linked else ["unknown"]
                            for dep, _, _ in deps
                        }
                        fields[i + 2] = orjson.dumps(opts)
            keys = ShardKeys(queue, shard)
            sizes = [
                len(fields[i]) + len(fields[i + 1]) + len(fields[i + 2])
                for i in range(0, len(fields), 3)
            ]
            for jobs in chunks(sizes, max_cost=ENQUEUE_CHUNK, costs=self.costs.get(shard)):
                yield keys, (keys.base, *self.defaults, *fields[3 * jobs.start : 3 * jobs.stop])


@attrs.frozen
class Placement:
    """What planning an enqueue needs of a queue (a :class:`JobQueue`, a client):
    where its jobs go and how large their arguments may be.

    Attributes:
        shards: the queue's shard count.
        new_id: makes a job id (a :class:`JobIds`).
        max_bytes: the most bytes a job's encoded arguments may take (the queue's
            limit), if any.
    """

    shards: int
    new_id: Callable[[], str]
    max_bytes: int | None = None


def plan_enqueue(
    job: JobLike,
    calls: Iterable[JobCall | tuple[Any, ...] | Mapping[str, Any]],
    placement: Placement,
    *,
    queue: str,
    priority: Priority | None = None,
    delay: When | None = None,
) -> EnqueuePlan:
    """Check and encode one enqueue of ``job`` per call (see :meth:`Job.enqueue_many
    <streamkit.jobs.Job.enqueue_many>`).

    Args:
        job: the declared job.
        calls: a tuple (positional arguments), a mapping (keyword arguments) or a
            :class:`~streamkit.jobs.JobCall` per job.
        placement: the queue's shards and limit on arguments.
        queue: the queue's full name (a dependency's handle of another queue is
            linked to its job there).
        priority: the priority of the calls that name none.
        delay: the delay of the calls that name none.

    Error handling:
        ``TypeError`` if the function does not accept a call's arguments;
        :class:`~streamkit.EncodeError` if they are not JSON-serialisable;
        :class:`~streamkit.ConfigError` for bad options. Every call is checked before
        the plan is returned, so nothing is sent when one is wrong.
    """
    if priority is not None and priority not in PRIORITIES:
        raise ConfigError("priority", f"must be 'high', 'normal' or 'low', got {priority!r}")
    shards, new_id, max_bytes = placement.shards, placement.new_id, placement.max_bytes
    options = job.options
    placed: list[tuple[str, int]] = []
    per_shard: dict[int, list[Any]] = {}
    # Per shard, the cost of each job in a script call once some name dependencies.
    costs: dict[int, list[int]] = {}
    name = job.name
    check = job.check_arguments
    # The enqueuer's trace context, once for the whole plan (it is the same for every
    # call); and the shard of jobs whose name's limits bind them to one.
    trace = inject_trace()
    keyed = options.limit_key
    home = limit_shard(name, None, options.limited_by_name, shards)
    coalesced = options.coalesced
    simple = not trace and keyed is None and home is None and coalesced is None
    single = per_shard.setdefault(0, []) if shards == 1 else None
    remote: dict[str, list[tuple[str, int, str | None]]] = {}
    deduped = False
    for item in calls:
        after: list[tuple[str, int, str | None]] = []
        if isinstance(item, tuple) and simple:
            check(item, {})
            job_id = new_id()
            args = encode_arguments(name, item, {}, max_bytes)
            opts = b""
            shard = 0 if shards == 1 else shard_for(job_id, shards)
        else:
            if isinstance(item, tuple):
                call = JobCall(args=item)
            elif isinstance(item, JobCall):
                call = item
            elif isinstance(item, Mapping):
                call = JobCall(kwargs=item)
            else:
                raise not_a_call(name, item)
            check(call.args, call.kwargs)
            if len(call.after) > MAX_AFTER:
                raise ConfigError(
                    "after", f"a job depends on at most {MAX_AFTER} jobs, got {len(call.after)}"
                )
            key = None
            if keyed is not None:
                key = limit_key_of(name, keyed, job.bind_arguments, call.args, call.kwargs)
            after = [_ref(ref, shards, queue) for ref in call.after]
            shard_home = (
                home if home is not None or key is None else (limit_shard(name, key, False, shards))
            )
            coalesce = None
            if coalesced is not None:
                # Every job of one key on one shard, whose script sees them all.
                ckey, coalesce = _coalesce(job, call, delay)
                if shard_home is None and shards > 1:
                    shard_home = shard_for(f"{coalesced}:{name}:{ckey}", shards)
            own = [(dep, s) for dep, s, of in after if of is None]
            job_id, shard = _place(call, own, shards, new_id, shard_home)
            deduped = deduped or call.job_id is not None
            args = encode_arguments(name, call.args, call.kwargs, max_bytes)
            elsewhere = [(dep, s, of) for dep, s, of in after if of is not None or s != shard]
            if elsewhere:
                remote[job_id] = elsewhere
            opts = _options(
                call,
                [dep for dep, s, of in after if of is None and s == shard],
                key,
                _headers(call.headers, trace),
                coalesce,
            )
        fields = single if single is not None else per_shard.setdefault(shard, [])
        if after or shard in costs:
            # From the first job with dependencies on, every job of the shard has a
            # cost (the jobs before it, 1 each).
            shard_costs = costs.setdefault(shard, [1] * (len(fields) // 3))
            shard_costs.append(1 + len(after))
        fields.extend((job_id, args, opts))
        placed.append((job_id, shard))
    expires = options.expires
    defaults = (
        name,
        PRIORITIES[priority or options.priority],
        _ms(delay, "delay"),
        options.retries + 1,
        math.ceil(options.result_ttl),
        options.dedupe_window,
        -_ms(expires, "expires") if expires is not None else 0,
        options.limits,
    )
    return EnqueuePlan(
        placed,
        defaults,
        {s: f for s, f in per_shard.items() if f},
        costs,
        remote,
        coalesced is not None,
        deduped,
    )


def not_a_call(name: str, item: object) -> TypeError:
    """The error for an item of ``enqueue_many`` that is not a call: each one is a
    tuple of positional arguments, a mapping of keyword arguments or a JobCall."""
    try:
        shown = repr(item)
    except Exception:
        shown = f"<{type(item).__name__}>"
    if len(shown) > 40:
        shown = shown[:37] + "..."
    hint = " (a list of arguments: make it a tuple)" if isinstance(item, list) else ""
    return TypeError(
        f"job {name}: each call of enqueue_many is a tuple of positional arguments "
        f"((5,) for one), a mapping of keyword arguments or a JobCall, got "
        f"{type(item).__qualname__} {shown}{hint}"
    )


def link_answers(args: Sequence[Any], replies: Sequence[Any]) -> dict[tuple[str, str], Any]:
    """The link script's answers of one call (its arguments ``args``), per (dependency
    id, dependent id)."""
    return {
        (args[1 + 2 * i], orjson.loads(args[2 + 2 * i])[2]): reply
        for i, reply in enumerate(replies)
    }


def answer(reply: Any) -> list[Any]:
    """A link script's answer (bytes from Redis) as the enqueue script's ``x`` entry."""
    return [v.decode() if isinstance(v, bytes) else v for v in reply]
