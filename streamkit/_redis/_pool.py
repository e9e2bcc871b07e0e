"""The connection pools of a client, with every slot taken given back, whatever happens.

coredis 6.9 loses a pool slot whenever a leased connection ends unusable (a cancelled
blocking command invalidates its connection, then ``release`` drops it without
returning the slot) and when the task getting a connection is cancelled while the
connection is being opened: after 64 such cancellations the pool is empty and every
command waits forever. The per-node queues of its cluster pool have the same flaws.

Both pools here (:class:`Pool` for a server, :class:`ClusterPool` for a cluster, one
queue per node) take a slot only through :meth:`SlotAccounting._slot` and put it back
only through :func:`give_back`: the most delicate lines of the package, written once.
A slot holds an idle connection or none (a connection is then opened into it when a
command takes it), so a pool holds as many connections as were ever in use at once.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import coredis.exceptions
import trio
from coredis._concurrency import Queue, QueueFull
from coredis.connection import BaseConnection, ClusterConnection, TCPLocation
from coredis.pool import BaseConnectionPool, ClusterConnectionPool, ConnectionPool

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from coredis.cluster._node import ClusterNodeLocation

    from ._health import Health

__all__ = ["ClusterPool", "Pool", "Slot", "SlotAccounting", "give_back"]

C = TypeVar("C", bound=BaseConnection)


class Slot(Generic[C]):
    """A pool slot taken for a command: its idle connection, or none yet."""

    def __init__(self, connection: C | None) -> None:
        self._connection = connection
        self.opened = False

    @property
    def empty(self) -> bool:
        """Whether a connection must be opened into the slot (:meth:`fill`)."""
        return self._connection is None

    @property
    def connection(self) -> C:
        """The slot's connection."""
        if self._connection is None:
            raise RuntimeError("the pool slot is empty: open a connection into it first")
        return self._connection

    def fill(self, connection: C) -> None:
        """Put a connection just opened into the empty slot."""
        self._connection = connection
        self.opened = True

    def give_back(self, queue: Queue[C]) -> None:
        """Return the slot to ``queue`` (see :func:`give_back`)."""
        give_back(queue, self._connection)


def give_back(queue: Queue[C], connection: C | None) -> None:
    """Return a slot to ``queue``: with ``connection`` if it is usable, else empty.

    An unusable connection (lost, or invalidated by coredis because the command on it
    was cancelled) is closed; the next command to take the slot opens a fresh one.

    Error handling:
        ``QueueFull`` if ``queue`` has every slot already (a cluster node's queue made
        anew after the node left the layout).
    """
    if connection is not None and connection.usable:
        queue.put_nowait(connection)
        return
    if connection is not None:
        connection.invalidate()
    queue.append_nowait(None)


class SlotAccounting(BaseConnectionPool[C]):
    """Taking, giving back and serving pool slots: what :class:`Pool` and
    :class:`ClusterPool` share, with each connection's opening and end reported to
    the client's :class:`~._health.Health`."""

    _online_connections: set[C]
    _health: Health
    _dedicated: bool
    _established: weakref.WeakSet[C]

    def _setup(self, health: Health, *, dedicated: bool) -> None:
        self._health = health
        self._dedicated = dedicated
        self._established = weakref.WeakSet()

    def _queue_of(self, connection: C) -> Queue[C]:
        """The queue whose slot ``connection`` holds."""
        raise NotImplementedError

    def _queues(self) -> Iterable[Queue[C]]:
        """Every queue of slots."""
        raise NotImplementedError

    def in_use(self) -> int:
        """Slots taken by a command now."""
        return sum(queue._maxsize - len(queue) for queue in self._queues())

    @contextlib.asynccontextmanager
    async def _slot(self, queue: Queue[C], where: str = "") -> AsyncIterator[Slot[C]]:
        """Take a slot of ``queue`` for the block, which opens a connection into it
        if it is empty (:meth:`Slot.fill`).

        Cancellation:
            Cancelling the wait for a free slot takes none. Once taken, the slot is
            given back if the block raises or is cancelled (a connection being opened
            is dropped, the slot goes back empty).

        Error handling:
            A coredis ``ConnectionError`` ("Connection pool exhausted", which the error
            translation reads as never sent) when no slot came free within the pool's
            ``timeout`` (``?timeout=`` in the URL; no limit by default). Errors of the
            block propagate, except that a cancellation wins over them (coredis turns
            the cancellation of a connection being opened into a ``ConnectionError``).
        """
        try:
            with trio.fail_after(math.inf if self.timeout is None else self.timeout):
                connection = await queue.get()
        except trio.TooSlowError as exc:
            raise coredis.exceptions.ConnectionError(
                f"Connection pool exhausted: no free connection{where} within {self.timeout}s"
            ) from exc
        # The slot is ours now: give it back if anything below fails or is cancelled.
        if connection is not None and not connection.reusable:
            connection.invalidate()
            connection = None
        slot = Slot(connection)
        try:
            yield slot
        except BaseException as exc:
            slot.give_back(queue)
            if isinstance(exc, Exception):
                await trio.lowlevel.checkpoint_if_cancelled()
                if slot.empty:
                    # Not cancelled: the connection could not be opened.
                    self._health.could_not_connect(exc)
            raise
        if slot.opened:
            self._established.add(slot.connection)
            self._health.established()

    def release(self, connection: C) -> None:
        self.statistics.connection_released(connection)
        try:
            give_back(self._queue_of(connection), connection)
        except QueueFull:
            # Only a cluster node's queue made anew (the node left the layout) is full.
            connection.invalidate()

    async def _serve(
        self,
        connection: C,
        *,
        task_status: trio.TaskStatus[Exception | None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run ``connection`` (in the pool's task group) until it ends.

        An error before the connection was ready is handed to whoever opens it, as
        coredis does; an idle connection that ends leaves its slot empty.
        """
        try:
            await connection.run(task_status=task_status)
        except coredis.exceptions.RedisError as error:
            task_status.started(error)
        finally:
            self._online_connections.discard(connection)
            queue = self._queue_of(connection)
            if connection in queue:
                queue.remove(connection)
                queue.append_nowait(None)
            if connection in self._established:
                self._health.ended(connection, dedicated=self._dedicated)


class Pool(SlotAccounting[BaseConnection], ConnectionPool[BaseConnection]):
    """coredis's pool of a server, with :class:`SlotAccounting`."""

    def _queue_of(self, connection: BaseConnection) -> Queue[BaseConnection]:
        return self._available_connections

    def _queues(self) -> Iterable[Queue[BaseConnection]]:
        return (self._available_connections,)

    def take_ready(self) -> BaseConnection | None:
        """A free slot's open, usable connection, taken at once (no wait, no
        checkpoint), or ``None``: then :meth:`get_connection`. Give it back with
        :meth:`release`. Takes none while a command waits for a slot (no jumping the
        line). It reads coredis's queue (a stack) where its ``get`` would, without the
        lock its ``get`` takes and yields on."""
        queue = self._available_connections
        if queue._getters or queue._lock.locked():
            return None
        slots = queue._queue
        connection = slots[-1] if slots else None
        if connection is None or not connection.usable:
            return None
        slots.pop()
        self.statistics.connection_leased(connection)
        return connection

    async def get_connection(self, **_: Any) -> BaseConnection:
        async with self._slot(self._available_connections) as slot:
            if slot.empty:
                fresh = await self._construct_connection()
                error = await self.task_group.start(self._serve, fresh)
                if error is not None:
                    raise error
                self.statistics.connection_created(fresh)
                self._online_connections.add(fresh)
                slot.fill(fresh)
        self.statistics.connection_leased(slot.connection)
        return slot.connection


class ClusterPool(SlotAccounting[ClusterConnection], ClusterConnectionPool):
    """coredis's cluster pool (a queue of slots per node), with :class:`SlotAccounting`."""

    def _setup(self, health: Health, *, dedicated: bool) -> None:
        super()._setup(health, dedicated=dedicated)
        layout = self.cluster_layout
        learn = layout._refresh

        async def learn_and_report() -> None:
            await learn()
            health.learned_layout(sorted(node.name for node in layout.primaries))

        # coredis learns the layout again by itself (after redirections and errors):
        # say so when the masters changed, the mark of a failover.
        setattr(layout, "_refresh", learn_and_report)  # noqa: B010 (mypy: a method)

    def _queue_of(self, connection: ClusterConnection) -> Queue[ClusterConnection]:
        return self._node_pool(connection.location)

    def _queues(self) -> Iterable[Queue[ClusterConnection]]:
        return self._cluster_available_connections.values()

    async def _get_connection_by_node(self, node: ClusterNodeLocation) -> ClusterConnection:
        queue = self._node_pool(TCPLocation(node.host, node.port))
        async with self._slot(queue, f" to {node.name}") as slot:
            if slot.empty:
                try:
                    slot.fill(await self._make_node_connection(node))
                except coredis.exceptions.ConnectionError as exc:
                    # coredis counts errors to decide when to learn the cluster's layout
                    # again, but not this one (raised before its command's error
                    # handling): a dead master's slots would be sent to it forever,
                    # never to the replica promoted in its place. A cancelled attempt
                    # is no fault of the node's.
                    await trio.lowlevel.checkpoint_if_cancelled()
                    self.cluster_layout.report_errors(node, exc)
                    raise
        return slot.connection

    async def _wrap_connection(
        self,
        connection: ClusterConnection,
        *,
        task_status: trio.TaskStatus[Exception | None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await self._serve(connection, task_status=task_status)
