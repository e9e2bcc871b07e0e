"""The hot path: the scripts run per batch of events or jobs, packed and parsed by hiredis.

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
* its requests are packed by ``hiredis.pack_command`` (with the same bytes as coredis
  would send: floats as ``%.15g``, bools as integers), written by the connection's
  own writer task, several requests per write;
* its replies are parsed by ``hiredis.Reader`` into the Python objects coredis gives
  for the hot scripts' replies (lists, bytes, integers, ``None``), Redis's errors into
  coredis's own exception classes, chosen by coredis's own table.

Only the hot scripts use it: hiredis gives RESP3 sets as lists and big numbers as
bytes, where coredis's callbacks of other commands expect sets and integers; a script
returns neither.

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
from typing import TYPE_CHECKING, Any, cast

import coredis.exceptions
import hiredis
from anyio import BrokenResourceError, ClosedResourceError
from anyio.lowlevel import checkpoint
from coredis.connection import BaseConnection
from coredis.connection._request import Request
from coredis.parser import Parser

from ._pool import ClusterPool
from ._slots import key_slot

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ._routing import Redis

__all__ = ["HotConnection", "evalsha", "hot_connection_class", "pack", "script_load"]

# Redis's error replies into coredis's exception classes, by coredis's own table.
_ERRORS = Parser()
# What hiredis returns when a reply is not complete yet (False is a RESP3 reply).
_NOT_ENOUGH_DATA = object()
# The command of a write queue item that is a request packed already.
_PACKED = b"\x00packed"
# Argument types hiredis packs exactly as coredis does.
_DIRECT = frozenset({bytes, str, int})
# Replies of a cluster node that ran nothing: coredis's cluster client follows them.
_REDIRECTIONS = (
    coredis.exceptions.AskError,  # MovedError is an AskError
    coredis.exceptions.TryAgainError,
    coredis.exceptions.ClusterDownError,
)


def _reply_error(message: str) -> coredis.exceptions.RedisError:
    return _ERRORS.parse_error(message)


def _as_coredis_sends(value: object) -> bytes | str | int:
    # coredis's request and packer: bools are ints, floats are written %.15g.
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return b"%.15g" % value
    if isinstance(value, bytes | str | int):
        return value
    # As coredis's packer: nothing else (None, a bytearray, ...) is sent.
    raise TypeError(f"cannot send a {type(value).__name__} to Redis")


def pack(command: Sequence[object]) -> bytes:
    """``command`` in RESP, byte for byte as coredis would send it."""
    if not _DIRECT.issuperset(map(type, command)):
        command = [_as_coredis_sends(value) for value in command]
    packed: bytes = hiredis.pack_command(cast("Any", tuple(command)))
    return packed


class HotConnection(BaseConnection):
    """A coredis connection whose replies hiredis parses and which sends packed requests.

    Mixed into coredis's own connection classes by :func:`hot_connection_class`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hot_reader = hiredis.Reader(
            notEnoughData=_NOT_ENOUGH_DATA,
            replyError=_reply_error,
            protocolError=coredis.exceptions.InvalidResponse,
        )

    def send_packed(
        self,
        data: bytes,
        *,
        command: bytes = b"EVALSHA",
        blocking: bool = False,
        raise_exceptions: bool = True,
    ) -> Request:
        """Queue ``data``, one ``command`` packed by :func:`pack`; return its request.

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
        request = Request(
            connection=self,
            command=command,
            decode=False,
            response_timeout=self._stream_timeout,
            raise_exceptions=raise_exceptions,
            disconnect_on_cancellation=blocking,
        )
        self._write_buffer_in.send_nowait([(_PACKED, (data,))])
        self._requests.append(request)
        return request

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
                self.statistics.data_sent(len(data))
            except (ClosedResourceError, BrokenResourceError) as err:
                self._transport_failed = True
                raise coredis.exceptions.ConnectionError(
                    "Connection lost while sending request"
                ) from err
            except Exception:
                self._transport_failed = True
                raise


@functools.cache
def hot_connection_class(base: type[BaseConnection]) -> type[HotConnection]:
    """``base`` (a coredis connection class) as a :class:`HotConnection`."""
    return type(f"Hot{base.__name__}", (HotConnection, base), {})


async def evalsha(redis: Redis, sha: str, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
    """``EVALSHA sha`` on the hot path of ``redis`` if it has one, else through coredis.

    Errors are coredis's, as from ``redis.evalsha`` (wrap in :func:`redis_errors`).
    """
    pool = getattr(redis, "_hot_pool", None)
    dedicated = getattr(redis, "_dedicated", None)
    if pool is None or dedicated is None or dedicated.requires_wait:
        return await redis.evalsha(sha, keys=keys, args=args)
    data = pack((b"EVALSHA", sha, len(keys), *keys, *args))
    if not isinstance(pool, ClusterPool):
        connection = await pool.get_connection()
        try:
            request = cast("HotConnection", connection).send_packed(data)
        finally:
            pool.release(connection)
        return await request
    if not keys:
        return await redis.evalsha(sha, keys=keys, args=args)
    return await _on_slot_owner(
        pool, data, keys[0], functools.partial(redis.evalsha, sha, keys=keys, args=args)
    )


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
