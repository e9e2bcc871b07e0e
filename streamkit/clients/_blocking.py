"""The blocking client: send events, enqueue jobs and read tables from plain Python code.

``with app.blocking() as client:`` in a Flask or Django view, a management command, a
notebook or a cron script; no event loop. The operations are :mod:`._ops`, run here with
blocking sockets: this module only sends what they ask and sleeps when they say.

Threads share one client: redis-py's connection pool hands each thread its own
connection, and the client's own bookkeeping is locked. A client used after ``fork``
(gunicorn's preloaded app) makes new connections in the child and leaves the parent's
alone.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, overload

import attrs
import redis
import redis.cluster

from .. import _redispy
from .._errors import StreamkitError
from .._ops import drive_blocking
from .._produce import DEFAULT_REPLICA_TIMEOUT
from .._tables import _NO_DEFAULT
from ..jobs._model import JobCall, P as JobParams, R as JobResult, TypedJob
from ..jobs._replies import event_cursors
from . import _ops
from ._driving import (
    ClientBase,
    JobHandleBase,
    by_node,
    failed_pipeline,
    gathered,
    load_failed,
    pair,
    pipeline,
    raise_translated,
    script_load,
    settled,
    to_load,
    untyped,
)
from ._ops import Call, CallBatch, Sleep

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
    from datetime import datetime

    from .._ops import Work
    from .._tables import Table
    from .._tables_windowed import WindowedTable
    from ..jobs._model import JobChunk, JobEvent, JobInfo, JobRef, JobStatus, Priority, When
    from ..jobs._plan import JobLike
    from ..jobs._workflow import Workflow
    from ._ops import Op, SendsRecords

__all__ = ["BlockingClient", "BlockingJobHandle"]

T = TypeVar("T")

# Every blocking client, to give each fresh locks in a forked child (a lock another
# thread held at the fork would stay locked there forever).
_clients: weakref.WeakSet[BlockingClient] = weakref.WeakSet()


def _after_fork() -> None:
    for client in list(_clients):
        client._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


class BlockingClient(ClientBase):
    """A blocking client of an app's streams, job queue and tables.

    Get one from :meth:`App.blocking <streamkit.App.blocking>`; use it as a context
    manager, or keep one for the life of a process (a web app's module) and
    :meth:`close` it at exit. Opening does no I/O: the first command connects.

    Every method is the Trio API's, with the stream, job or table as first argument:
    ``client.send(orders, order)`` is ``await orders.send(order)``. Records, job
    arguments and table values go to Redis exactly as the Trio side writes them.

    Threads: one client serves all the threads of a process (a threaded WSGI server's
    workers): each command takes a connection of the pool, at most
    ``max_connections``, waiting up to ``pool_timeout`` seconds for one.

    Fork: a client used in a child process after ``fork`` makes its own connections
    there; the parent's stay the parent's.
    """

    def _unconnected(self) -> None:
        self._redis: _redispy.SyncClient | None = None
        self._pid = 0
        self._lock = threading.Lock()
        _clients.add(self)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the client's connections; it cannot be used afterwards."""
        with self._lock:
            self._closed = True
            client, self._redis = self._redis, None
        if client is not None and self._pid == os.getpid():
            client.close()

    def _client(self) -> _redispy.SyncClient:
        pid = os.getpid()
        client = self._redis
        if client is not None and self._pid == pid:
            return client
        with self._lock:
            if self._closed:
                raise StreamkitError(f"the blocking client of {self.url!r} is closed")
            if self._redis is None or self._pid != pid:
                # A new client in a forked child: the parent's connections are left
                # alone, not closed (closing them would cut the parent's off too).
                with _redispy.redis_errors(self.url):
                    self._redis = _redispy.open_sync(self.url, **self._options)
                self._pid = pid
            return self._redis

    # ------------------------------------------------------------------ the driver

    def run(self, op: Op[T]) -> T:
        """Run an operation of :mod:`._ops`: do what it asks until it returns."""
        return drive_blocking(op, self._do, time.monotonic)

    def _do(self, request: Work) -> Any:
        if isinstance(request, Sleep):
            time.sleep(request.seconds)
            return None
        client = self._client()
        if isinstance(request, Call):
            return self._call(client, request)
        if isinstance(client, redis.cluster.RedisCluster):
            return self._cluster_batch(client, request)
        return self._batch(client, request.calls, request)

    def _call(self, client: _redispy.SyncClient, call: Call) -> Any:
        # Not redis_errors(): a try costs less than a context manager, per command.
        try:
            return untyped(client).execute_command(*call.args)
        except Exception as exc:
            if not _redispy.script_missing(exc):
                raise_translated(exc, self.url)
        try:
            self._load(client, call)
            return untyped(client).execute_command(*call.args)
        except Exception as exc:
            raise_translated(exc, self.url)

    def _load(self, client: _redispy.SyncClient, call: Call) -> None:
        """Load the script of ``call``, which the server lacked (its ``EVALSHA`` ran
        nothing), where the call runs: each refused call comes here."""
        script_load(client, call)

    def _batch(self, client: redis.Redis, calls: Sequence[Call], batch: CallBatch) -> list[Any]:
        """Run ``calls`` in one pipeline on ``client`` (a server, or a cluster's node)."""
        if len(calls) == 1 and not batch.replicas:
            try:
                return [self._call(client, calls[0])]
            except StreamkitError as exc:
                return [exc]
        try:
            raw = pipeline(client, calls, batch).execute(raise_on_error=False)
        except Exception as exc:
            return failed_pipeline(exc, self.url, len(calls))
        replies, missing = pair(raw, calls, batch)
        if not missing:
            return settled(replies, self.url)
        # Refused EVALSHAs ran nothing: load their scripts, run them again.
        try:
            with _redispy.redis_errors(self.url):
                for call in to_load(calls, missing):
                    self._load(client, call)
        except StreamkitError as exc:
            return load_failed(replies, missing, exc)
        again = self._batch(client, [calls[i] for i in missing], batch)
        return settled(replies, self.url, missing, again)

    def _cluster_batch(self, client: redis.cluster.RedisCluster, batch: CallBatch) -> list[Any]:
        """Run a batch on a cluster: one pipeline per node, each on its node's client."""
        try:
            groups = by_node(client, batch.calls, self.url)
        except StreamkitError as exc:
            return [exc] * len(batch.calls)
        results = [
            self._batch(client.get_redis_connection(node), [batch.calls[i] for i in at], batch)
            for node, at in groups
        ]
        replies, moved = gathered(len(batch.calls), groups, results)
        if moved:
            # The slot map changed: read it again before the calls are retried.
            with _redispy.redis_errors(self.url):
                client.nodes_manager.initialize()
        return replies

    # ------------------------------------------------------------------ streams

    def send(
        self,
        stream: SendsRecords,
        *records: Any,
        replicas: int = 0,
        replica_timeout: float = DEFAULT_REPLICA_TIMEOUT,
    ) -> list[str]:
        """Append ``records`` to their partitions of ``stream``; return their entry ids.

        As :meth:`Stream.send <streamkit.Stream.send>`, with the same errors:
        :class:`~streamkit.EncodeError`, :class:`~streamkit.RedisUnavailable`,
        :class:`~streamkit.OutcomeUnknown`, :class:`~streamkit.MetadataMismatch`,
        :class:`~streamkit.NotReplicated`.
        """
        return self.run(
            _ops.send(
                self._state, stream, records, replicas=replicas, replica_timeout=replica_timeout
            )
        )

    def send_many(
        self,
        stream: SendsRecords,
        records: Iterable[Any],
        *,
        chunk_size: int | None = None,
        on_sent: Callable[[int], None] | None = None,
        replicas: int = 0,
        replica_timeout: float = DEFAULT_REPLICA_TIMEOUT,
    ) -> list[str]:
        """Append many records, pipelined: the chunks of all partitions travel together.

        As :meth:`Stream.send_many <streamkit.Stream.send_many>`: a window of records
        at a time, each partition's records in order, ``on_sent(n)`` after each window.
        """
        return self.run(
            _ops.send_many(
                self._state,
                stream,
                records,
                chunk_size=chunk_size,
                on_sent=on_sent,
                replicas=replicas,
                replica_timeout=replica_timeout,
            )
        )

    # ------------------------------------------------------------------ jobs

    @overload
    def delay(
        self, job: TypedJob[JobParams, JobResult], *args: JobParams.args, **kwargs: JobParams.kwargs
    ) -> BlockingJobHandle[JobResult]: ...

    @overload
    def delay(self, job: str, *args: Any, **kwargs: Any) -> BlockingJobHandle[Any]: ...

    def delay(self, job: Any, *args: Any, **kwargs: Any) -> BlockingJobHandle[Any]:
        """Enqueue ``job`` (declared with ``@app.job``, or its name) with these arguments
        and its declared options (as :meth:`Job.delay <streamkit.jobs.Job.delay>`)."""
        return self.enqueue_many(job, [JobCall(args=args, kwargs=kwargs)])[0]

    def enqueue(
        self,
        job: JobLike | str,
        *args: Any,
        job_id: str | None = None,
        delay: When | None = None,
        at: datetime | None = None,
        priority: Priority | None = None,
        expires: When | datetime | None = None,
        after: Sequence[JobRef | str] = (),
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> BlockingJobHandle[Any]:
        """Enqueue ``job`` with these arguments and options (as :meth:`Job.enqueue
        <streamkit.jobs.Job.enqueue>`: ``job_id`` dedupes, ``delay``/``at`` schedule,
        ``priority``, ``expires``, ``after`` for dependencies, ``headers``).

        Error handling:
            ``TypeError`` if the function does not accept the arguments;
            :class:`~streamkit.EncodeError` if they are not JSON-serialisable;
            :class:`~streamkit.ConfigError` for bad options or a job the app does not
            declare; :class:`~streamkit.OutcomeUnknown` if the connection was lost
            with the enqueue in flight (it is not sent again).
        """
        call = JobCall(
            args=args,
            kwargs=kwargs,
            job_id=job_id,
            delay=delay,
            at=at,
            priority=priority,
            expires=expires,
            after=after,
            headers=headers,
        )
        return self.enqueue_many(job, [call])[0]

    def enqueue_many(
        self,
        job: JobLike | str,
        calls: Iterable[JobCall | tuple[Any, ...] | Mapping[str, Any]],
        *,
        priority: Priority | None = None,
        delay: When | None = None,
    ) -> list[BlockingJobHandle[Any]]:
        """Enqueue many jobs at once, pipelined (as :meth:`Job.enqueue_many
        <streamkit.jobs.Job.enqueue_many>`)."""
        op, queue = self._enqueue(job, calls, priority, delay)
        placed = self.run(op)
        return [
            BlockingJobHandle(self, job_id, shard, queue, added=added)
            for job_id, shard, added in placed
        ]

    def enqueue_workflow(self, workflow: Workflow) -> BlockingJobHandle[Any]:
        """Enqueue a workflow of the app's jobs (a chain, a group, a chord; see
        :meth:`JobQueue.enqueue_workflow <streamkit.jobs.JobQueue.enqueue_workflow>`)
        and return the handle of its final job: its result is the workflow's."""
        queue, job_id, shard = self.run(_ops.enqueue_workflow(self._state, workflow))
        return BlockingJobHandle(self, job_id, shard, queue)

    def handle(self, job_id: str, *, queue: str | None = None) -> BlockingJobHandle[Any]:
        """A handle on job ``job_id`` of the app's queue (e.g. an id sent to a browser),
        or of its named queue ``queue`` (as given to ``@app.job(queue=...)``: a job
        routed there lives there).

        Error handling:
            :class:`~streamkit.ConfigError` for a queue none of the app's jobs is
            routed to. A job not found on the default queue of an app with named
            queues is a :class:`~streamkit.jobs.JobNotFound` that names them.
        """
        named = self._state.queue_named(queue)
        return BlockingJobHandle(self, job_id, self._state.shard_of(job_id), named)

    def job_events(self, *, after: str | None = None, follow: bool = False) -> Iterator[JobEvent]:
        """The state changes of the app's jobs (see :meth:`JobQueue.events
        <streamkit.jobs.JobQueue.events>`): ``for event in client.job_events()``; after
        the event whose cursor is ``after``; with ``follow``, waiting for new ones.

        Error handling:
            :class:`~streamkit.ConfigError` for a cursor of another queue.
        """
        cursors = event_cursors(after, self._state.shards)
        while True:
            events = self.run(_ops.job_events(self._state, cursors, follow=follow))
            yield from events
            if not events and not follow:
                return

    # ------------------------------------------------------------------ tables

    def read(
        self,
        table: Table[Any] | WindowedTable[Any],
        key: object,
        default: Any = _NO_DEFAULT,
        *,
        as_of: object = None,
    ) -> Any:
        """The committed value of ``key`` in ``table`` (``default``, or the table's,
        when missing); for a windowed table, its windows and their values (as
        :meth:`Table.read <streamkit.Table.read>`, :meth:`WindowedTable.read
        <streamkit.WindowedTable.read>`)."""
        return self.run(_ops.table_read(table, key, default, as_of))

    def read_many(
        self, table: Table[Any] | WindowedTable[Any], keys: Iterable[object]
    ) -> list[Any]:
        """The committed values of ``keys``, in order: one round trip."""
        return self.run(_ops.table_read_many(table, keys))

    def items(
        self, table: Table[Any] | WindowedTable[Any], *, partition: int | None = None
    ) -> Iterator[tuple[str, Any]]:
        """Every committed ``(key, value)`` of ``table``, partition by partition (or of
        one), read a page at a time (as :meth:`Table.items <streamkit.Table.items>`)."""
        for p in _ops.table_partitions(table, partition):
            cursor = 0
            while True:
                cursor, page = self.run(_ops.table_page(table, p, cursor))
                yield from page
                if cursor == 0:
                    break

    def sizes(self, table: Table[Any] | WindowedTable[Any]) -> list[int]:
        """The number of keys in each partition of ``table``, in partition order."""
        return self.run(_ops.table_sizes(table))


@attrs.frozen
class BlockingJobHandle(JobHandleBase, Generic[JobResult]):
    """A job on the app's queue, by id, for blocking code (see :class:`~streamkit.jobs.JobHandle`).

    Attributes:
        id: the job's id.
        shard: the queue shard it lives on.
        added: whether the enqueue that returned it added the job: ``False`` when
            it merged into a debounced job of its key or was dropped by a throttle
            (the handle is then that job's), or when its ``job_id`` named a job that
            was there already (a duplicate: the handle is that job's); ``True`` for
            every other handle.
    """

    _client: BlockingClient = attrs.field(repr=False)
    id: str
    shard: int
    #: The name of the queue it is on (the app's, or one of its named queues).
    queue: str | None = None
    added: bool = attrs.field(default=True, eq=False, repr=False, kw_only=True)

    def status(self) -> JobStatus:
        """Where the job is now.

        Error handling:
            :class:`~streamkit.jobs.JobNotFound` if there is no record of it.
        """
        return self._client.run(self._status())

    def info(self) -> JobInfo:
        """Everything the queue records of the job (see :meth:`JobHandle.info
        <streamkit.jobs.JobHandle.info>`)."""
        return self._client.run(self._info())

    def progress(self) -> Any:
        """The newest progress the job reported (see :meth:`JobHandle.progress
        <streamkit.jobs.JobHandle.progress>`); ``None`` if none yet."""
        return self.info().progress_value

    def stream(self, *, after: str | None = None) -> Iterator[JobChunk]:
        """The chunks the job streams, in order, until it ends (see
        :meth:`JobHandle.stream <streamkit.jobs.JobHandle.stream>`): a blocking
        iterator, ``for chunk in handle.stream(): ...``.

        Error handling:
            :class:`~streamkit.jobs.JobNotFound` if there is no record of it;
            :class:`~streamkit.jobs.JobFailed` at the end of a job that failed.
        """
        cursor = after or "0-0"
        while True:
            chunks, end = self._client.run(self._output(cursor))
            for chunk in chunks:
                cursor = chunk.id
                yield chunk
            if end is not None:
                if end != "success":
                    self.result(timeout=10)  # raises JobFailed
                return

    def result(self, timeout: float | None = None) -> JobResult:
        """Wait until the job is over and return its result.

        Args:
            timeout: give up after this many seconds (``None``: as long as it takes).

        Error handling:
            :class:`~streamkit.jobs.JobFailed` if it ended dead, aborted or expired;
            :class:`~streamkit.jobs.JobNotFound` if there is no record of it;
            :class:`~streamkit.jobs.ResultNotKept` if its job keeps no results;
            ``TimeoutError`` after ``timeout``.
        """
        result: JobResult = self._client.run(self._result(timeout))
        return result

    def abort(self, reason: str = "aborted") -> JobStatus:
        """Abort the job (see :meth:`JobHandle.abort <streamkit.jobs.JobHandle.abort>`);
        return its status after the call."""
        return self._client.run(self._abort(reason))
