"""What the blocking and asyncio drivers share that is not about awaiting: their
settings and state, their name, the arguments of their operations, and how a
pipeline's raw replies become one per call.

The drivers (:mod:`._blocking`, :mod:`._asyncio`) differ only where one awaits and the
other does not; what they decide the same way is written here once: :class:`ClientBase`
and :class:`JobHandleBase` are the parts of each client and handle that do no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from .. import _redispy
from .._defaults import DEFAULT_JOB_MAX_BYTES
from .._errors import BackendError, NotReplicated, StreamkitError
from .._urls import mask_url
from . import _ops
from ._ops import ClientState

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from ..jobs._model import JobCall, JobChunk, JobInfo, JobStatus, Priority, When
    from ..jobs._plan import JobLike
    from ._ops import Call, CallBatch, Op

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_POOL_TIMEOUT",
    "DEFAULT_SOCKET_TIMEOUT",
    "ClientBase",
    "JobHandleBase",
    "by_node",
    "failed_pipeline",
    "gathered",
    "load_failed",
    "pair",
    "pipeline",
    "raise_translated",
    "redirected",
    "script_load",
    "settled",
    "to_load",
    "translated",
    "untyped",
]

#: Connections of a client's pool (per node of a cluster), at most.
DEFAULT_MAX_CONNECTIONS = 64
#: Seconds a reply may take: longer than a job result's blocking read (5 s).
DEFAULT_SOCKET_TIMEOUT = 10.0
#: Seconds a thread waits for a free connection of the pool.
DEFAULT_POOL_TIMEOUT = 10.0


class ClientBase:
    """A client before it connects: its URL, its redis-py options, its state, its name.

    The URL is checked at construction, so that a bad one is one line there, not at
    the first command.

    Error handling:
        :class:`~streamkit.ConfigError` for a URL streamkit does not take.
    """

    url: str
    _closed: bool

    def __init__(
        self,
        url: str,
        *,
        queue: str,
        jobs: Mapping[str, JobLike] | None = None,
        shards: int = 1,
        max_bytes: int = DEFAULT_JOB_MAX_BYTES,
        connect_timeout: float = 2.0,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
    ) -> None:
        _redispy.connection_options(
            url, connect_timeout=connect_timeout, socket_timeout=socket_timeout
        )
        self.url = url
        self._options: dict[str, Any] = {
            "connect_timeout": connect_timeout,
            "socket_timeout": socket_timeout,
            "max_connections": max_connections,
            "pool_timeout": pool_timeout,
        }
        self._state = ClientState(queue=queue, shards=shards, jobs=jobs or {}, max_bytes=max_bytes)
        self._closed = False
        self._unconnected()

    def _unconnected(self) -> None:
        """Set the driver's own connection state to "not connected yet"."""
        raise NotImplementedError

    def _enqueue(
        self,
        job: JobLike | str,
        calls: Iterable[JobCall | tuple[Any, ...] | Mapping[str, Any]],
        priority: Priority | None,
        delay: When | None,
    ) -> tuple[Op[list[tuple[str, int, bool]]], str]:
        """The operation that enqueues ``calls`` of ``job``, and the queue they go to."""
        declared = self._state.job(job)
        op = _ops.enqueue(self._state, declared, calls, priority=priority, delay=delay)
        return op, self._state.queue_of(declared)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {mask_url(self.url)} queue={self._state.queue} "
            f"{'closed' if self._closed else 'open'}>"
        )


class JobHandleBase:
    """The operations that the methods of a client's job handle run (the fields are
    the handle's own)."""

    __slots__ = ()

    _client: ClientBase
    id: str
    shard: int
    queue: str | None

    def _status(self) -> Op[JobStatus]:
        return _ops.hinting(
            self._client._state,
            self.queue,
            _ops.job_status(self._client._state, self.id, self.shard, self.queue),
        )

    def _info(self) -> Op[JobInfo]:
        return _ops.hinting(
            self._client._state,
            self.queue,
            _ops.job_info(self._client._state, self.id, self.shard, self.queue),
        )

    def _result(self, timeout: float | None) -> Op[Any]:
        return _ops.hinting(
            self._client._state,
            self.queue,
            _ops.job_result(self._client._state, self.id, self.shard, timeout, self.queue),
        )

    def _abort(self, reason: str) -> Op[JobStatus]:
        return _ops.hinting(
            self._client._state,
            self.queue,
            _ops.job_abort(self._client._state, self.id, self.shard, reason, self.queue),
        )

    def _output(self, cursor: str) -> Op[tuple[list[JobChunk], str | None]]:
        return _ops.hinting(
            self._client._state,
            self.queue,
            _ops.job_output(self._client._state, self.id, self.shard, cursor, self.queue),
        )


def raise_translated(exc: Exception, url: str) -> NoReturn:
    """Raise a command's error: redis-py's as streamkit's (:func:`redis_errors
    <streamkit._redispy.redis_errors>` without a context manager, whose cost per
    command the hot path does not pay), any other as it is."""
    error = _redispy.translate(exc, url)
    if error is None or error is exc:
        raise exc
    raise error from exc


def script_load(client: Any, call: Call) -> Any:
    """``SCRIPT LOAD`` of ``call``'s script on ``client`` (on a cluster, on the node of
    its key): the reply, or for an asyncio client the coroutine that gives it."""
    assert call.script is not None
    return _redispy.script_load(client, call.script, call.key)


def pipeline(client: Any, calls: Sequence[Call], batch: CallBatch) -> Any:
    """A pipeline of ``client`` (a server, or a cluster's node) with ``calls`` queued,
    each followed by its ``WAIT`` when the batch asks for replicas."""
    wait = max(1, round(batch.replica_timeout * 1000))
    pipe = untyped(client).pipeline(transaction=False)
    for call in calls:
        pipe.execute_command(*call.args)
        if batch.replicas:
            pipe.execute_command("WAIT", batch.replicas, wait)
    return pipe


def failed_pipeline(exc: Exception, url: str, count: int) -> list[Any]:
    """The replies of ``count`` calls whose pipeline failed as a whole: its error for
    each (raised again if it is not a Redis error)."""
    error = _redispy.translate(exc, url)
    if error is None:
        raise exc
    return [error] * count


def to_load(calls: Sequence[Call], missing: Sequence[int]) -> list[Call]:
    """A call of each script that the node lacked (one load serves every call of it)."""
    return list({calls[i].script: calls[i] for i in missing}.values())


def load_failed(replies: list[Any], missing: Sequence[int], exc: StreamkitError) -> list[Any]:
    """The replies when a lacking script could not be loaded: its error for the calls
    that needed one, their replies for the others."""
    return [exc if i in missing else r for i, r in enumerate(replies)]


def settled(
    replies: list[Any], url: str, missing: Sequence[int] = (), again: Sequence[Any] = ()
) -> list[Any]:
    """One reply per call, the replies of the calls run ``again`` in place of the
    ``missing``, redis-py's errors as streamkit's."""
    for i, reply in zip(missing, again, strict=True):
        replies[i] = reply
    return [translated(r, url) for r in replies]


def by_node(client: Any, calls: Sequence[Call], url: str) -> list[tuple[Any, list[int]]]:
    """The positions of ``calls`` by the node of the cluster that serves their key.

    Error handling:
        :class:`~streamkit.RedisUnavailable` (and the like) if the slot map says no
        node serves one.
    """
    groups: dict[str, tuple[Any, list[int]]] = {}
    with _redispy.redis_errors(url):
        for i, call in enumerate(calls):
            node = untyped(client).get_node_from_key(call.key)
            if node is None:
                raise _redispy.no_node_for(call.key, url)
            groups.setdefault(node.name, (node, []))[1].append(i)
    return list(groups.values())


def gathered(
    count: int, groups: Sequence[tuple[Any, list[int]]], results: Sequence[list[Any]]
) -> tuple[list[Any], bool]:
    """The ``count`` replies of a cluster's batch from each node's (in ``groups``
    order), and whether one was ``MOVED`` or ``ASK`` (the slot map changed)."""
    replies: list[Any] = [None] * count
    moved = False
    for (_, positions), got in zip(groups, results, strict=True):
        for i, reply in zip(positions, got, strict=True):
            replies[i] = reply
            moved = moved or redirected(reply)
    return replies, moved


def pair(raw: list[Any], calls: Sequence[Call], batch: CallBatch) -> tuple[list[Any], list[int]]:
    """A pipeline's raw replies as one reply per call (its ``WAIT`` folded in), and the
    calls whose script the node lacked."""
    step = 2 if batch.replicas else 1
    replies: list[Any] = []
    missing: list[int] = []
    for i in range(len(calls)):
        reply = raw[i * step]
        if _redispy.script_missing(reply):
            missing.append(i)
        elif batch.replicas and not isinstance(reply, Exception):
            acknowledged = raw[i * step + 1]
            if isinstance(acknowledged, Exception):
                reply = acknowledged
            elif int(acknowledged) < batch.replicas:
                reply = NotReplicated(batch.replicas, int(acknowledged), batch.replica_timeout)
        replies.append(reply)
    return replies, missing


def translated(reply: Any, url: str) -> Any:
    """A reply, or the streamkit error for a redis-py error reply."""
    if isinstance(reply, Exception) and not isinstance(reply, StreamkitError):
        return _redispy.translate(reply, url) or BackendError(str(reply))
    return reply


def redirected(reply: Any) -> bool:
    """Whether a reply is a cluster's ``MOVED`` or ``ASK``."""
    return getattr(reply, "code", None) in ("MOVED", "ASK")


def untyped(client: object) -> Any:
    """redis-py's methods that carry no types (``execute_command``, ...)."""
    return client
