"""The asyncio client: send events, enqueue jobs and read tables from asyncio code.

``async with app.asyncio() as client:`` in a FastAPI or aiohttp handler, or any asyncio
service. The operations are :mod:`._ops`, run here with awaits: this module only sends
what they ask and sleeps when they say, exactly as the blocking client does.

The tasks of one event loop share a client: redis-py's asyncio pool hands each command
a connection of its own. Used from another event loop, or in a child process after
``fork``, the client makes new connections there and leaves the old ones alone.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, overload

import attrs
import redis.asyncio
import redis.asyncio.cluster

from .. import _redispy
from .._errors import StreamkitError
from .._ops import drive
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
    from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
    from datetime import datetime

    from .._ops import Work
    from .._tables import Table
    from .._tables_windowed import WindowedTable
    from ..jobs._model import JobChunk, JobEvent, JobInfo, JobRef, JobStatus, Priority, When
    from ..jobs._plan import JobLike
    from ..jobs._workflow import Workflow
    from ._ops import Op, SendsRecords

__all__ = ["AsyncioClient", "AsyncioJobHandle"]

T = TypeVar("T")


class AsyncioClient(ClientBase):
    """An asyncio client of an app's streams, job queue and tables.

    Get one from :meth:`App.asyncio <streamkit.App.asyncio>` and use it as an async
    context manager (in a FastAPI app, in its lifespan), or keep one for the life of
    the event loop and :meth:`aclose` it at the end. Opening does no I/O: the first
    command connects.

    Every method is the Trio API's as a coroutine, with the stream, job or table as
    first argument: ``await client.send(orders, order)`` is ``await orders.send(order)``
    on the Trio side, and writes the same bytes.
    """

    def _unconnected(self) -> None:
        self._redis: _redispy.AsyncClient | None = None
        # A cluster's nodes: a client of each, for batches (one pipeline per node).
        self._nodes: dict[str, redis.asyncio.Redis] = {}
        self._owner: tuple[int, asyncio.AbstractEventLoop] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client's connections; it cannot be used afterwards."""
        self._closed = True
        client, nodes, owner = self._redis, self._nodes, self._owner
        self._redis, self._nodes = None, {}
        if client is not None and owner == (os.getpid(), asyncio.get_running_loop()):
            for node in nodes.values():
                await node.aclose()
            await client.aclose()

    async def _client(self) -> _redispy.AsyncClient:
        owner = (os.getpid(), asyncio.get_running_loop())
        if self._redis is not None and self._owner == owner:
            return self._redis
        if self._closed:
            raise StreamkitError(f"the asyncio client of {self.url!r} is closed")
        # A new client in a forked child or another event loop: the old connections
        # belong to the parent or to the other loop, and are left alone.
        self._nodes = {}
        with _redispy.redis_errors(self.url):
            client = _redispy.open_async(self.url, **self._options)
            if isinstance(client, redis.asyncio.cluster.RedisCluster):
                await client.initialize()
        self._redis, self._owner = client, owner
        return client

    # ------------------------------------------------------------------ the driver

    async def run(self, op: Op[T]) -> T:
        """Run an operation of :mod:`._ops`: do what it asks until it returns."""
        return await drive(op, self._do, asyncio.get_running_loop().time)

    async def _do(self, request: Work) -> Any:
        if isinstance(request, Sleep):
            await asyncio.sleep(request.seconds)
            return None
        client = await self._client()
        if isinstance(request, Call):
            return await self._call(client, request)
        if isinstance(client, redis.asyncio.cluster.RedisCluster):
            return await self._cluster_batch(client, request)
        return await self._batch(client, request.calls, request)

    async def _call(self, client: _redispy.AsyncClient, call: Call) -> Any:
        # Not redis_errors(): a try costs less than a context manager, per command.
        try:
            return await untyped(client).execute_command(*call.args)
        except Exception as exc:
            if not _redispy.script_missing(exc):
                raise_translated(exc, self.url)
        try:
            await self._load(client, call)
            return await untyped(client).execute_command(*call.args)
        except Exception as exc:
            raise_translated(exc, self.url)

    async def _load(self, client: _redispy.AsyncClient, call: Call) -> None:
        """Load the script of ``call``, which the server lacked (its ``EVALSHA`` ran
        nothing), where the call runs: each refused call comes here."""
        await script_load(client, call)

    async def _batch(
        self, client: redis.asyncio.Redis, calls: Sequence[Call], batch: CallBatch
    ) -> list[Any]:
        """Run ``calls`` in one pipeline on ``client`` (a server, or a cluster's node)."""
        if len(calls) == 1 and not batch.replicas:
            try:
                return [await self._call(client, calls[0])]
            except StreamkitError as exc:
                return [exc]
        try:
            raw = await pipeline(client, calls, batch).execute(raise_on_error=False)
        except Exception as exc:
            return failed_pipeline(exc, self.url, len(calls))
        replies, missing = pair(raw, calls, batch)
        if not missing:
            return settled(replies, self.url)
        # Refused EVALSHAs ran nothing: load their scripts, run them again.
        try:
            with _redispy.redis_errors(self.url):
                for call in to_load(calls, missing):
                    await self._load(client, call)
        except StreamkitError as exc:
            return load_failed(replies, missing, exc)
        again = await self._batch(client, [calls[i] for i in missing], batch)
        return settled(replies, self.url, missing, again)

    def _node(self, node: Any) -> redis.asyncio.Redis:
        """A client of one node of the cluster, with the cluster client's options."""
        client = self._nodes.get(node.name)
        if client is None:
            pool = redis.asyncio.ConnectionPool(
                connection_class=_redispy.packing_with_hiredis(node.connection_class),
                max_connections=node.max_connections,
                **node.connection_kwargs,
            )
            client = self._nodes[node.name] = redis.asyncio.Redis.from_pool(pool)
        return client

    async def _cluster_batch(
        self, client: redis.asyncio.cluster.RedisCluster, batch: CallBatch
    ) -> list[Any]:
        """Run a batch on a cluster: one pipeline per node, the nodes at once."""
        try:
            groups = by_node(client, batch.calls, self.url)
        except StreamkitError as exc:
            return [exc] * len(batch.calls)
        results = await asyncio.gather(
            *(
                self._batch(self._node(node), [batch.calls[i] for i in at], batch)
                for node, at in groups
            )
        )
        replies, moved = gathered(len(batch.calls), groups, results)
        if moved:
            # The slot map changed: read it again before the calls are retried.
            with _redispy.redis_errors(self.url):
                await client.nodes_manager.initialize()
        return replies

    # ------------------------------------------------------------------ streams

    async def send(
        self,
        stream: SendsRecords,
        *records: Any,
        replicas: int = 0,
        replica_timeout: float = DEFAULT_REPLICA_TIMEOUT,
    ) -> list[str]:
        """Append ``records`` to their partitions of ``stream``; return their entry ids
        (as :meth:`Stream.send <streamkit.Stream.send>`, with the same errors)."""
        return await self.run(
            _ops.send(
                self._state, stream, records, replicas=replicas, replica_timeout=replica_timeout
            )
        )

    async def send_many(
        self,
        stream: SendsRecords,
        records: Iterable[Any],
        *,
        chunk_size: int | None = None,
        on_sent: Callable[[int], None] | None = None,
        replicas: int = 0,
        replica_timeout: float = DEFAULT_REPLICA_TIMEOUT,
    ) -> list[str]:
        """Append many records, pipelined (as :meth:`Stream.send_many
        <streamkit.Stream.send_many>`)."""
        return await self.run(
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
    async def delay(
        self, job: TypedJob[JobParams, JobResult], *args: JobParams.args, **kwargs: JobParams.kwargs
    ) -> AsyncioJobHandle[JobResult]: ...

    @overload
    async def delay(self, job: str, *args: Any, **kwargs: Any) -> AsyncioJobHandle[Any]: ...

    async def delay(self, job: Any, *args: Any, **kwargs: Any) -> AsyncioJobHandle[Any]:
        """Enqueue ``job`` with these arguments and its declared options (as
        :meth:`Job.delay <streamkit.jobs.Job.delay>`)."""
        return (await self.enqueue_many(job, [JobCall(args=args, kwargs=kwargs)]))[0]

    async def enqueue(
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
    ) -> AsyncioJobHandle[Any]:
        """Enqueue ``job`` with these arguments and options (as :meth:`Job.enqueue
        <streamkit.jobs.Job.enqueue>`; errors as :meth:`BlockingClient.enqueue
        <streamkit.clients.BlockingClient.enqueue>`)."""
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
        return (await self.enqueue_many(job, [call]))[0]

    async def enqueue_many(
        self,
        job: JobLike | str,
        calls: Iterable[JobCall | tuple[Any, ...] | Mapping[str, Any]],
        *,
        priority: Priority | None = None,
        delay: When | None = None,
    ) -> list[AsyncioJobHandle[Any]]:
        """Enqueue many jobs at once, pipelined (as :meth:`Job.enqueue_many
        <streamkit.jobs.Job.enqueue_many>`)."""
        op, queue = self._enqueue(job, calls, priority, delay)
        placed = await self.run(op)
        return [
            AsyncioJobHandle(self, job_id, shard, queue, added=added)
            for job_id, shard, added in placed
        ]

    async def enqueue_workflow(self, workflow: Workflow) -> AsyncioJobHandle[Any]:
        """Enqueue a workflow of the app's jobs (a chain, a group, a chord; see
        :meth:`JobQueue.enqueue_workflow <streamkit.jobs.JobQueue.enqueue_workflow>`)
        and return the handle of its final job: its result is the workflow's."""
        queue, job_id, shard = await self.run(_ops.enqueue_workflow(self._state, workflow))
        return AsyncioJobHandle(self, job_id, shard, queue)

    def handle(self, job_id: str, *, queue: str | None = None) -> AsyncioJobHandle[Any]:
        """A handle on job ``job_id`` of the app's queue, or of its named queue
        ``queue`` (see :meth:`BlockingClient.handle
        <streamkit.clients.BlockingClient.handle>`)."""
        named = self._state.queue_named(queue)
        return AsyncioJobHandle(self, job_id, self._state.shard_of(job_id), named)

    async def job_events(
        self, *, after: str | None = None, follow: bool = False
    ) -> AsyncIterator[JobEvent]:
        """The state changes of the app's jobs (see :meth:`JobQueue.events
        <streamkit.jobs.JobQueue.events>`): ``async for event in client.job_events()``;
        after the event whose cursor is ``after``; with ``follow``, waiting for new ones.

        Error handling:
            :class:`~streamkit.ConfigError` for a cursor of another queue.
        """
        cursors = event_cursors(after, self._state.shards)
        while True:
            events = await self.run(_ops.job_events(self._state, cursors, follow=follow))
            for event in events:
                yield event
            if not events and not follow:
                return

    # ------------------------------------------------------------------ tables

    async def read(
        self,
        table: Table[Any] | WindowedTable[Any],
        key: object,
        default: Any = _NO_DEFAULT,
        *,
        as_of: object = None,
    ) -> Any:
        """The committed value of ``key`` in ``table`` (as :meth:`BlockingClient.read
        <streamkit.clients.BlockingClient.read>`)."""
        return await self.run(_ops.table_read(table, key, default, as_of))

    async def read_many(
        self, table: Table[Any] | WindowedTable[Any], keys: Iterable[object]
    ) -> list[Any]:
        """The committed values of ``keys``, in order: one round trip."""
        return await self.run(_ops.table_read_many(table, keys))

    async def items(
        self, table: Table[Any] | WindowedTable[Any], *, partition: int | None = None
    ) -> AsyncIterator[tuple[str, Any]]:
        """Every committed ``(key, value)`` of ``table``, a page at a time."""
        for p in _ops.table_partitions(table, partition):
            cursor = 0
            while True:
                cursor, page = await self.run(_ops.table_page(table, p, cursor))
                for item in page:
                    yield item
                if cursor == 0:
                    break

    async def sizes(self, table: Table[Any] | WindowedTable[Any]) -> list[int]:
        """The number of keys in each partition of ``table``, in partition order."""
        return await self.run(_ops.table_sizes(table))


@attrs.frozen
class AsyncioJobHandle(JobHandleBase, Generic[JobResult]):
    """A job on the app's queue, by id, for asyncio code (see :class:`~streamkit.jobs.JobHandle`).

    Attributes:
        id: the job's id.
        shard: the queue shard it lives on.
        added: whether the enqueue that returned it added the job: ``False`` when
            it merged into a debounced job of its key or was dropped by a throttle
            (the handle is then that job's), or when its ``job_id`` named a job that
            was there already (a duplicate: the handle is that job's); ``True`` for
            every other handle.
    """

    _client: AsyncioClient = attrs.field(repr=False)
    id: str
    shard: int
    #: The name of the queue it is on (the app's, or one of its named queues).
    queue: str | None = None
    added: bool = attrs.field(default=True, eq=False, repr=False, kw_only=True)

    async def status(self) -> JobStatus:
        """Where the job is now (:class:`~streamkit.jobs.JobNotFound` if unknown)."""
        return await self._client.run(self._status())

    async def info(self) -> JobInfo:
        """Everything the queue records of the job."""
        return await self._client.run(self._info())

    async def progress(self) -> Any:
        """The newest progress the job reported (see :meth:`JobHandle.progress
        <streamkit.jobs.JobHandle.progress>`); ``None`` if none yet."""
        return (await self.info()).progress_value

    async def stream(self, *, after: str | None = None) -> AsyncIterator[JobChunk]:
        """The chunks the job streams, in order, until it ends (see
        :meth:`JobHandle.stream <streamkit.jobs.JobHandle.stream>`):
        ``async for chunk in handle.stream(): ...``."""
        cursor = after or "0-0"
        while True:
            chunks, end = await self._client.run(self._output(cursor))
            for chunk in chunks:
                cursor = chunk.id
                yield chunk
            if end is not None:
                if end != "success":
                    await self.result(timeout=10)  # raises JobFailed
                return

    async def result(self, timeout: float | None = None) -> JobResult:  # noqa: ASYNC109 (the familiar API)
        """Wait until the job is over and return its result (errors as
        :meth:`BlockingJobHandle.result <streamkit.clients.BlockingJobHandle.result>`)."""
        result: JobResult = await self._client.run(self._result(timeout))
        return result

    async def abort(self, reason: str = "aborted") -> JobStatus:
        """Abort the job; return its status after the call."""
        return await self._client.run(self._abort(reason))
