"""The hot path: the scripts run per batch of events or jobs, packed here, parsed by hiredis.

A consumed event costs its share of a fenced read script call, which also carries the
acknowledgement of the event before it; a sent record its share of an append script
call; a job its share of a claim and a finish script call. Through coredis, packing
such a call (its packer copies the command's buffer again for every argument) and
parsing its reply (its parser builds a node object for every array, and a read's reply
holds two per entry) cost more per event than everything else a worker does. The
scripts marked ``hot`` (:class:`~._commands.LuaScript`) run on connections of their
own, *hot* connections, from a third pool of the client (and a fourth, of dedicated
hot connections, carries the fetcher's blocking waits with the fenced reads around them,
see :func:`~._commands.run_blocking_between`):

* a hot connection is a coredis connection in every other respect: connecting, TLS,
  authentication, the handshake, the pool and its slot accounting (:mod:`._pool`),
  the end of the connection and the failing of the requests in flight on it;
* its requests are packed by :func:`pack` (with the same bytes as coredis would send:
  floats as ``%.15g``, bools as integers), and written by the calling
  task at once when the connection's writer task has nothing to write (a plain
  socket: no TLS), else by the writer task, several requests per write;
* its replies are parsed by ``hiredis.Reader`` into the Python objects coredis gives
  for the hot scripts' replies (lists, bytes, integers, ``None``), Redis's errors into
  coredis's own exception classes, chosen by coredis's own table;
* a call takes a free connection of the hot pool without waiting on the pool's lock
  (:meth:`~._pool.Pool.take_ready`), and waits for its reply on a Trio event
  (:class:`HotRequest`), not through anyio's.

Before these last three, a call cost its caller about 200 µs of CPU alone on a
connection (waking the writer task, the pool's lock, anyio's event and deadline);
after them about 100 µs, and a no-op job 26 µs instead of 35.

Only the hot scripts use it, and a table's ``HGET`` of a key its worker has not cached
(:func:`hget`): hiredis gives RESP3 sets as lists and big numbers as bytes, where
coredis's callbacks of other commands expect sets and integers; a script returns
neither, and an ``HGET`` a bulk string or nil, as from coredis.

The guarantees of the layer hold as for any simple command on the shared pool:

* cancelling a call never touches the connection (its reply is read and dropped);
* nothing is sent again: a connection lost with a call in flight fails it with
  coredis's ``ConnectionError``, which :func:`~._translate.redis_errors` makes
  :class:`~streamkit.OutcomeUnknown`, exactly as on the shared pool;
* on a Redis Cluster a call goes to the master of its first key's slot; a redirection
  (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``: the node ran nothing) sends it
  through coredis's cluster client instead, which follows redirections and learns the
  new layout;
* inside :func:`~._replicas.replicated`, and for a client that is not from
  :func:`~streamkit.open_redis`, a call takes coredis's usual path (its ``WAIT`` must
  follow it on the same dedicated connection).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, NoReturn, cast

import coredis.exceptions
import hiredis
import trio
from anyio import BrokenResourceError, ClosedResourceError, EndOfStream
from anyio.abc import SocketAttribute, SocketStream
from anyio.lowlevel import checkpoint
from coredis.connection import BaseConnection
from coredis.parser import Parser

from ._pool import ClusterPool
from ._slots import key_slot

if TYPE_CHECKING:
    import socket
    from collections.abc import Awaitable, Callable, Generator, Sequence

    from coredis.connection._request import BaseRequest
    from coredis.connection._statistics import ConnectionStatistics

    from ._routing import Redis

__all__ = [
    "HotConnection",
    "HotRequest",
    "HotTransaction",
    "can_transact",
    "evalsha",
    "hget",
    "hot_connection_class",
    "hot_transaction",
    "is_no_script",
    "pack",
    "script_load",
]

# Redis's error replies into coredis's exception classes, by coredis's own table.
_ERRORS = Parser()
# What hiredis returns when a reply is not complete yet (False is a RESP3 reply).
_NOT_ENOUGH_DATA = object()
# The command of a write queue item that is a request packed already.
_PACKED = b"\x00packed"
# Replies of a cluster node that ran nothing: coredis's cluster client follows them.
_REDIRECTIONS = (
    coredis.exceptions.AskError,  # MovedError is an AskError
    coredis.exceptions.TryAgainError,
    coredis.exceptions.ClusterDownError,
)


def _reply_error(message: str) -> coredis.exceptions.RedisError:
    return _ERRORS.parse_error(message)


def _as_coredis_sends(value: object) -> bytes:
    # coredis's request and packer: bools are ints, floats are written %.15g, text is
    # UTF-8.
    if isinstance(value, bool):
        return b"%d" % value
    if isinstance(value, float):
        return b"%.15g" % value
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return bytes(value)
    # As coredis's packer: nothing else (None, a bytearray, ...) is sent.
    raise TypeError(f"cannot send a {type(value).__name__} to Redis")


#: Argument types hiredis packs exactly as coredis does.
_DIRECT = frozenset({bytes, str, int})
#: Commands of this many arguments or more are packed by :func:`pack` itself.
_LONG = 24
#: The RESP length prefixes of the usual argument lengths, made once.
_PREFIXES = [b"$%d" % n for n in range(8192)]


def pack(command: Sequence[object]) -> bytes:
    """``command`` in RESP, byte for byte as coredis would send it.

    A long command (a commit of thousands of arguments) is packed here rather than by
    ``hiredis.pack_command``, about twice as fast: its arguments (bytes mostly, and
    ints) are joined once, each after its length prefix, made once for every length
    under 8 KiB."""
    if len(command) < _LONG:
        if not _DIRECT.issuperset(map(type, command)):
            command = [_as_coredis_sends(value) for value in command]
        packed: bytes = hiredis.pack_command(cast("Any", tuple(command)))
        return packed
    args = [
        a if a.__class__ is bytes else b"%d" % a if a.__class__ is int else _as_coredis_sends(a)
        for a in command
    ]
    n = len(args)
    try:
        prefixes = [_PREFIXES[len(a)] for a in args]
    except IndexError:
        prefixes = [b"$%d" % len(a) for a in args]
    # "*N\r\n" then "$LEN\r\nARG\r\n" for each argument: one join.
    parts = [b""] * (2 * n + 1)
    parts[0 : 2 * n : 2] = prefixes
    parts[1 : 2 * n : 2] = args
    parts[0] = b"*%d\r\n%s" % (n, parts[0])
    return b"\r\n".join(parts)


class HotRequest:
    """A request in flight on a hot connection: coredis's ``Request`` as the hot path
    needs it, on a Trio event (coredis's goes through anyio's, and opens a tracing
    span per request).

    Awaiting it returns the reply; as coredis's: a reply later than the connection's
    response timeout raises ``TimeoutError`` (the reply, when it comes, is dropped),
    and cancelling the wait for a ``blocking`` request discards its connection.
    """

    __slots__ = (
        "_connection",
        "_event",
        "_exc",
        "_result",
        "blocking",
        "command",
        "raise_exceptions",
        "response_timeout",
        "statistics",
    )

    def __init__(
        self,
        connection: BaseConnection,
        *,
        command: bytes,
        response_timeout: float | None,
        raise_exceptions: bool,
        blocking: bool,
    ) -> None:
        self._connection = connection
        self._event = trio.Event()
        self._exc: BaseException | None = None
        self._result: Any = None
        self.command = command
        self.response_timeout = response_timeout
        self.raise_exceptions = raise_exceptions
        self.blocking = blocking
        self.statistics: ConnectionStatistics = connection.statistics
        self.statistics.request_created()

    @property
    def complete(self) -> bool:
        """Whether the reply (or the failure) came."""
        return self._event.is_set()

    def consume(self, reply: Any) -> None:
        """The reply came (an exception for an error reply)."""
        self.statistics.request_resolved()
        if isinstance(reply, BaseException):
            self.fail(reply)
        else:
            self._result = reply
            self._event.set()

    def fail(self, error: BaseException) -> None:
        """No reply will come: ``error`` says why (the connection ended)."""
        if not self._event.is_set():
            self._exc = error
            self._event.set()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._reply().__await__()

    async def _reply(self) -> Any:
        if not self._event.is_set():
            try:
                if self.response_timeout is None:
                    await self._event.wait()
                else:
                    with trio.move_on_after(self.response_timeout):
                        await self._event.wait()
                    if not self._event.is_set():
                        reason = f"{self._name()} timed out after {self.response_timeout} seconds"
                        self._exc = TimeoutError(reason)
                        self._cancelled(reason)
            except trio.Cancelled:
                self._cancelled(f"{self._name()} was cancelled")
                raise
        if self._exc is None:
            return self._result
        if self.raise_exceptions:
            raise self._exc
        return self._exc

    def _name(self) -> str:
        return self.command.decode(errors="replace")

    def _cancelled(self, reason: str) -> None:
        if self.blocking:
            self._connection.invalidate(reason)


class HotTransaction(HotRequest):
    """``MULTI``, commands and ``EXEC`` written as one request: it takes the reply of
    each (``OK``, ``QUEUED``...) and gives ``EXEC``'s, a list with each command's reply
    (an error as its exception, not raised), or raises ``EXEC``'s error (``EXECABORT``:
    a command was refused as it was queued, and nothing ran)."""

    __slots__ = ("_left",)

    def __init__(self, connection: BaseConnection, *, replies: int, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._left = replies

    def consume(self, reply: Any) -> None:
        self._left -= 1
        if self._left <= 0:
            super().consume(reply)


class HotConnection(BaseConnection):
    """A coredis connection whose replies hiredis parses and which sends packed requests.

    Mixed into coredis's own connection classes by :func:`hot_connection_class`.

    A request packed already is written by the task that sends it, at once, when the
    connection's writer task has nothing to write and the transport is a plain socket
    (no TLS): a request costs no wake of the writer task. Otherwise, or for what the
    socket does not take at once, the writer task writes it, after what it has.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hot_reader = hiredis.Reader(
            notEnoughData=_NOT_ENOUGH_DATA,
            replyError=_reply_error,
            protocolError=coredis.exceptions.InvalidResponse,
        )
        # The plain socket under self.stream (None for TLS), for the stream it is of.
        self._hot_socket: socket.socket | None = None
        self._hot_socket_of: object = None

    def send_packed(
        self,
        data: bytes,
        *,
        command: bytes = b"EVALSHA",
        blocking: bool = False,
        raise_exceptions: bool = True,
    ) -> HotRequest:
        """Send ``data``, one ``command`` packed by :func:`pack`; return its request.

        A ``blocking`` request's connection is discarded when awaiting it is cancelled
        (as coredis does for its blocking commands): it is a dedicated connection.
        Without ``raise_exceptions``, awaiting the request returns Redis's error reply
        as an exception instead of raising it.

        Error handling:
            coredis's ``ConnectionError`` ("Connection not usable", which the error
            translation reads as never sent) if the connection is not usable.
        """
        if not self.usable:
            raise coredis.exceptions.ConnectionError("Connection not usable") from self._last_error
        request = HotRequest(
            self,
            command=command,
            response_timeout=self._stream_timeout,
            raise_exceptions=raise_exceptions,
            blocking=blocking,
        )
        # coredis's connection completes and fails its requests through the methods
        # HotRequest has (consume, complete, fail).
        self._requests.append(cast("BaseRequest", request))
        if not self._write_now(data):
            self._write_buffer_in.send_nowait([(_PACKED, (data,))])
        return request

    def send_transaction(self, data: bytes, *, replies: int) -> HotTransaction:
        """Send ``data``, ``MULTI``, commands and ``EXEC`` packed by :func:`pack` one
        after the other (``replies`` of them in all); return its request.

        The bytes of one request are written together, never between another's, so no
        other command of the connection lands inside the transaction.

        Error handling:
            As :meth:`send_packed`.
        """
        if not self.usable:
            raise coredis.exceptions.ConnectionError("Connection not usable") from self._last_error
        request = HotTransaction(
            self,
            replies=replies,
            command=b"EXEC",
            response_timeout=self._stream_timeout,
            raise_exceptions=True,
            blocking=False,
        )
        self._requests.append(cast("BaseRequest", request))
        if not self._write_now(data):
            self._write_buffer_in.send_nowait([(_PACKED, (data,))])
        return request

    def _write_now(self, data: bytes) -> bool:
        """Write ``data`` from this task if nothing else waits to be written, handing
        what the socket does not take to the writer task; whether it did."""
        stream = self.stream
        if stream is not self._hot_socket_of:
            self._hot_socket_of = stream
            self._hot_socket = (
                stream.extra(SocketAttribute.raw_socket)
                if isinstance(stream, SocketStream)
                else None
            )
        sock = self._hot_socket
        if sock is None:
            return False
        writer = self._write_buffer_out.statistics()
        if writer.tasks_waiting_receive != 1 or writer.current_buffer_used:
            return False  # the writer task is writing, or has something to write
        try:
            sent = sock.send(data)
        except OSError:
            # Full (the writer task waits until it is not), or broken (the writer task
            # meets the same error and ends the connection, as for any request).
            return False
        self.statistics.data_sent(sent)
        if sent < len(data):
            self._write_buffer_in.send_nowait([(_PACKED, (data[sent:],))])
        return True

    def _data_received(self, data: bytes) -> None:
        reader = self._hot_reader
        reader.feed(data)
        requests = self._requests
        while (reply := reader.gets()) is not _NOT_ENOUGH_DATA:
            if type(reply) is hiredis.PushNotification:
                self._push_message_buffer_in.send_nowait(list(reply))
            elif requests:
                request = requests[0]
                request.consume(reply)
                if request.complete:
                    requests.popleft()
            else:
                self._streamed_message_buffer_in.send_nowait(reply)

    async def _reader_task(self) -> None:
        # coredis's reader task, without its idle deadline when there is none (the
        # default): a deadline costs a cancel scope per read.
        if self._max_idle_time is not None:
            await super()._reader_task()
            return
        while (stream := self.stream) is not None:
            try:
                data = await stream.receive()
            except Exception as err:
                self._transport_broke(err, "Connection lost while receiving response")
            self.statistics.data_received(len(data))
            if not self._requests:
                # push messages with nothing in flight: coredis's budget limits them
                async with self._processing_budget:
                    self._data_received(data)
            else:
                self._data_received(data)

    async def _writer_task(self) -> None:
        # coredis's writer task, for requests packed already as well as commands.
        while self.stream is not None:
            requests = await self._write_buffer_out.receive()
            while self._write_buffer_out.statistics().current_buffer_used > 0:
                requests.extend(self._write_buffer_out.receive_nowait())
                await checkpoint()
            data = b"".join(
                cast("bytes", args[0])
                if command is _PACKED
                else b"".join(self._packer.pack_commands([(command, *args)]))
                for command, args in requests
            )
            try:
                await self.stream.send(data)
            except Exception as err:
                self._transport_broke(err, "Connection lost while sending request")
            self.statistics.data_sent(len(data))

    def _transport_broke(self, err: Exception, what: str) -> NoReturn:
        """Mark the transport failed and raise: coredis's ``ConnectionError(what)`` for a
        stream lost or closed (as coredis's reader and writer tasks do), else ``err``."""
        self._transport_failed = True
        if isinstance(err, EndOfStream | ClosedResourceError | BrokenResourceError):
            raise coredis.exceptions.ConnectionError(what) from err
        raise err


@functools.cache
def hot_connection_class(base: type[BaseConnection]) -> type[HotConnection]:
    """``base`` (a coredis connection class) as a :class:`HotConnection`."""
    return type(f"Hot{base.__name__}", (HotConnection, base), {})


async def evalsha(redis: Redis, sha: str, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
    """``EVALSHA sha`` on the hot path of ``redis`` if it has one, else through coredis.

    Errors are coredis's, as from ``redis.evalsha`` (wrap in :func:`redis_errors`).
    """
    return await _hot_call(
        redis,
        (b"EVALSHA", sha, len(keys), *keys, *args),
        keys[0] if keys else None,
        functools.partial(redis.evalsha, sha, keys=keys, args=args),
    )


async def hget(redis: Redis, key: str | bytes, field: str | bytes) -> bytes | None:
    """``HGET key field`` on the hot path of ``redis`` if it has one (its reply, a bulk
    string or nil, is the same from hiredis), else through coredis: a table's read of
    a key its worker has not cached.

    Errors are coredis's, as from ``redis.hget`` (wrap in :func:`redis_errors`).
    """
    reply: bytes | None = await _hot_call(
        redis, (b"HGET", key, field), key, functools.partial(redis.hget, key, field)
    )
    return reply


def can_transact(redis: Redis) -> bool:
    """Whether :func:`hot_transaction` runs on ``redis``: a single server's client from
    :func:`~streamkit.open_redis` with hot connections, outside ``replicated()``."""
    pool = getattr(redis, "_hot_pool", None)
    dedicated = getattr(redis, "_dedicated", None)
    return (
        pool is not None
        and not isinstance(pool, ClusterPool)
        and dedicated is not None
        and not dedicated.requires_wait
    )


def is_no_script(reply: object) -> bool:
    """Whether the reply of one command of a :func:`hot_transaction` says that the
    server lacks the script it was to run (``NOSCRIPT``)."""
    return isinstance(reply, coredis.exceptions.NoScriptError)


async def hot_transaction(redis: Redis, commands: Sequence[Sequence[object]]) -> list[Any]:
    """``MULTI``, ``commands``, ``EXEC`` on a hot connection of ``redis`` (which
    :func:`can_transact`): ``EXEC``'s reply, each command's reply in a list, an error
    reply as its exception object (not raised).

    Error handling:
        coredis's errors, as from a command: ``EXECABORT`` (nothing ran), a connection
        lost (the outcome is unknown).
    """
    pool = redis._hot_pool  # type: ignore[attr-defined]
    data = b"".join([pack((b"MULTI",)), *map(pack, commands), pack((b"EXEC",))])
    await trio.lowlevel.checkpoint_if_cancelled()
    connection = pool.take_ready() or await pool.get_connection()
    try:
        request = cast("HotConnection", connection).send_transaction(
            data, replies=len(commands) + 2
        )
    finally:
        pool.release(connection)
    reply: list[Any] = await request
    return reply


async def _hot_call(
    redis: Redis,
    command: tuple[Any, ...],
    key: str | bytes | None,
    fallback: Callable[[], Awaitable[Any]],
) -> Any:
    """``command`` on a hot connection where ``key`` lives, or ``fallback()`` (coredis's
    usual path) for a client without hot connections or inside ``replicated()``."""
    pool = getattr(redis, "_hot_pool", None)
    dedicated = getattr(redis, "_dedicated", None)
    if pool is None or dedicated is None or dedicated.requires_wait:
        return await fallback()
    data = pack(command)
    if not isinstance(pool, ClusterPool):
        # As waiting for a slot would: a cancelled caller sends nothing.
        await trio.lowlevel.checkpoint_if_cancelled()
        connection = pool.take_ready() or await pool.get_connection()
        try:
            request = cast("HotConnection", connection).send_packed(data, command=command[0])
        finally:
            pool.release(connection)
        return await request
    if key is None:
        return await fallback()
    return await _on_slot_owner(pool, data, key, fallback)


async def script_load(redis: Redis, source: str, keys: Sequence[str | bytes]) -> Any:
    """``SCRIPT LOAD source`` where a script on ``keys`` runs: on a cluster, the node
    that owns them only (coredis's own sends it to every node, and fails while one of
    them is failing over); on a single server, that server.

    Errors are coredis's, as from ``redis.script_load``.
    """
    pool = getattr(redis, "_hot_pool", None)
    if not isinstance(pool, ClusterPool) or not keys:
        return await redis.script_load(source)
    data = pack((b"SCRIPT", b"LOAD", source))
    return await _on_slot_owner(pool, data, keys[0], functools.partial(redis.script_load, source))


async def _on_slot_owner(
    pool: ClusterPool, data: bytes, key: str | bytes, fallback: Callable[[], Awaitable[Any]]
) -> Any:
    """Send the packed command ``data`` to the master of ``key``'s slot; where the
    layout does not know it or the node redirects, ``fallback()`` (coredis's client)."""
    layout = pool.cluster_layout
    try:
        node = layout.node_for_slot(key_slot(key))
    except coredis.exceptions.RedisClusterError:
        return await fallback()
    node_connection = await pool.get_connection(node=node)
    try:
        request = cast("HotConnection", node_connection).send_packed(data)
    finally:
        pool.release(node_connection)
    try:
        return await request
    except _REDIRECTIONS as exc:
        # The node ran nothing: coredis's cluster client follows the redirection.
        layout.report_errors(node, exc)
        return await fallback()
    except coredis.exceptions.RedisError as exc:
        # As coredis's cluster client does: its layout learns from the errors.
        layout.report_errors(node, exc)
        raise
