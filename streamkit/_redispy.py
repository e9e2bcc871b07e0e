"""redis-py for the code that is not Trio: clients from streamkit URLs, and their errors translated.

streamkit's Trio side talks to Redis through coredis (:mod:`streamkit._redis`). The
code that runs without a Trio loop, the Spark executors (:mod:`streamkit.spark`) and
the blocking and asyncio clients (:mod:`streamkit.clients`), uses redis-py, with
hiredis parsing replies where it is installed. This is the one place where a
streamkit URL becomes a redis-py client, blocking or asyncio, of a server or of a
Redis Cluster, and where redis-py's exceptions become streamkit's:

* scripts (:mod:`streamkit._lua`) run by digest; a server that lacks one answers
  ``NOSCRIPT`` to an ``EVALSHA`` that ran nothing (:func:`script_missing`), and it is
  loaded where the call runs (:func:`script_load`) and the call sent again: for the
  Spark executors by :func:`run_script`, for the clients by their drivers;
* URLs are checked and read by :mod:`streamkit._urls`, as on the Trio side: the same
  forms (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``), the same TLS
  checks and options, passwords masked in every message;
* redis-py is told never to retry: its default sends a command again when its
  connection was lost, although Redis may have run it. Whether to try again is
  :mod:`streamkit._retrying`'s rule, as on the Trio side. A cluster client still
  follows ``MOVED`` and ``ASK`` redirections: the node that answered so ran nothing;
* a lost connection is :class:`~streamkit.OutcomeUnknown` when the command may have
  reached Redis, :class:`~streamkit.RedisUnavailable` when it surely did not
  (the connection could not be opened, or no pool slot came free); refusals
  (``OOM``, ``LOADING``, ...) are :class:`~streamkit.ServerRefused`, and failures
  that retrying cannot cure (a password, TLS, an unknown host) are one-line
  :class:`~streamkit.ConfigError` s, in the Trio side's words.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import urllib.parse
from typing import TYPE_CHECKING, Any, Generic, NotRequired, TypedDict, TypeVar, Unpack, cast

import attrs
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.backoff
import redis.cluster
import redis.exceptions
import redis.retry
import redis.utils

from ._acl import not_permitted
from ._errors import BackendError, ConfigError, OutcomeUnknown, RedisUnavailable, StreamkitError
from ._refusals import code_types, refusal_in, refused
from ._urls import (
    check_redis_url,
    credentials_refused,
    is_cluster_url,
    mask_url,
    password_required,
    seed_url,
    tls_handshake_failed,
    tls_options,
    tls_refusal,
    unknown_host,
    without_tls_arguments,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from . import _lua

__all__ = [
    "AsyncClient",
    "SyncClient",
    "connection_options",
    "no_node_for",
    "open_async",
    "open_sync",
    "redis_errors",
    "run_script",
    "script_load",
    "script_missing",
    "translate",
]

#: A blocking client of a server or of a cluster.
SyncClient = redis.Redis | redis.cluster.RedisCluster
#: An asyncio client of a server or of a cluster.
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

C = TypeVar("C", SyncClient, AsyncClient)

# redis-py raises these (ConnectionError, TimeoutError) before a command was written:
# the connection could not be opened, a pooled one was found broken before use, or no
# pool slot came free in time.
_NOT_SENT = (
    " connecting to ",
    "Timeout connecting to server",
    "No connection available",
    "Too many connections",
    "Connection has data",
    "Connection not ready",
)

# redis-py strips the code from these refusals and says it by the exception's type.
_REFUSAL_TYPES = code_types(redis.exceptions)


# ------------------------------------------------------------------------- clients


if redis.utils.HIREDIS_AVAILABLE:
    from redis.connection import HiredisRespSerializer

    # (Through Any: redis-py 8.2's constructor has no annotations, earlier ones do.)
    _PACKER: HiredisRespSerializer | None = cast("Any", HiredisRespSerializer)()
else:  # pragma: no cover - hiredis is a dependency
    _PACKER = None

_hiredis_classes: dict[type[Any], type[Any]] = {}


def packing_with_hiredis(connection_class: type[Any]) -> type[Any]:
    """``connection_class`` (an asyncio connection class of redis-py) packing commands
    with hiredis, as redis-py's blocking connections do: its asyncio connections pack
    them in Python, which takes over a third of a bulk send's time."""
    if _PACKER is None:
        return connection_class
    subclass = _hiredis_classes.get(connection_class)
    if subclass is None:
        packer = _PACKER

        def pack_command(self: Any, *args: Any) -> list[bytes]:
            return packer.pack(*args)  # type: ignore[no-any-return]

        subclass = _hiredis_classes[connection_class] = type(
            f"Hiredis{connection_class.__name__}",
            (connection_class,),
            {"pack_command": pack_command},
        )
    return subclass


def _tls(url: str, setting: str) -> dict[str, Any]:
    """redis-py's TLS options for ``url``: the Trio side's checks, by the same rules
    (:func:`streamkit._urls.tls_options`), with the same warning when one is off."""
    tls = tls_options(url, setting=setting)
    if tls is None:
        return {}
    tls.context(setting=setting)  # its files load: a clear error now, not at first use
    tls.warn_once(url)
    options: dict[str, Any] = {
        "ssl_cert_reqs": "required" if tls.verify else "none",
        "ssl_check_hostname": tls.verify and tls.check_hostname,
        "ssl_certfile": tls.certfile,
        "ssl_keyfile": tls.keyfile,
    }
    if tls.ca_certs:
        options["ssl_ca_path" if os.path.isdir(tls.ca_certs) else "ssl_ca_certs"] = tls.ca_certs
    return options


def connection_options(
    url: str,
    *,
    connect_timeout: float,
    socket_timeout: float | None,
    setting: str = "redis_url",
) -> dict[str, Any]:
    """The keyword arguments of a redis-py client (either kind) for ``url``, but its retries.

    Error handling:
        :class:`~streamkit.ConfigError` naming ``setting`` for a URL streamkit does
        not take, or TLS files that do not load.
    """
    check_redis_url(url, setting=setting)
    return {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": socket_timeout,
        "decode_responses": False,
        **_tls(url, setting),
    }


def _bad_url(url: str, setting: str, exc: ValueError) -> ConfigError:
    return ConfigError(setting, f"not a Redis URL: {mask_url(url)!r} ({exc})")


class _Options(TypedDict):
    """The options of :func:`open_sync` and :func:`open_async`."""

    connect_timeout: float
    socket_timeout: float | None
    max_connections: int
    pool_timeout: NotRequired[float | None]
    setting: NotRequired[str]


def _pack_with_hiredis(pool: Any) -> None:
    pool.connection_class = packing_with_hiredis(pool.connection_class)


@attrs.frozen
class _Family(Generic[C]):
    """redis-py's blocking or asyncio clients: what :func:`_open` builds one of."""

    cluster: Callable[..., C]  # the cluster client's from_url
    pool: Callable[..., Any]  # the blocking pool's from_url
    client: Callable[[Any], C]  # the server client's from_pool
    retry: Callable[[], Any]  # a Retry that never retries
    cluster_options: Mapping[str, Any] = attrs.field(factory=dict)
    prepare_pool: Callable[[Any], None] = lambda pool: None


_SYNC = _Family[SyncClient](
    cluster=redis.cluster.RedisCluster.from_url,
    pool=redis.BlockingConnectionPool.from_url,
    client=redis.Redis.from_pool,
    retry=lambda: redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    cluster_options={"connection_pool_class": redis.BlockingConnectionPool},
)
_ASYNC = _Family[AsyncClient](
    cluster=redis.asyncio.cluster.RedisCluster.from_url,
    pool=redis.asyncio.BlockingConnectionPool.from_url,
    client=redis.asyncio.Redis.from_pool,
    retry=lambda: redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0),
    prepare_pool=_pack_with_hiredis,
)


def open_sync(url: str, **options: Unpack[_Options]) -> SyncClient:
    """A blocking redis-py client for ``url``: a server's, or a cluster's for a
    ``redis+cluster://`` URL, which connects (and reads the slot map) as it is built.

    Connections are opened lazily and pooled, at most ``max_connections`` (per node of
    a cluster); a thread that finds none free waits up to ``pool_timeout`` seconds
    (``None``, the default: as long as it takes). Safe to share between threads.
    ``setting`` (default ``"redis_url"``) is the name errors give the URL.

    Error handling:
        :class:`~streamkit.ConfigError` for a bad URL; errors of a cluster client that
        cannot reach any node, as by :func:`translate`.
    """
    return _open(_SYNC, url, options)


def open_async(url: str, **options: Unpack[_Options]) -> AsyncClient:
    """An asyncio redis-py client for ``url`` (see :func:`open_sync`); a cluster's
    connects on its first command. Safe to share between the tasks of one event loop.

    Error handling:
        :class:`~streamkit.ConfigError` for a bad URL.
    """
    return _open(_ASYNC, url, options)


def _open(family: _Family[C], url: str, options: _Options) -> C:
    setting = options.get("setting", "redis_url")
    connection = connection_options(
        url,
        connect_timeout=options["connect_timeout"],
        socket_timeout=options["socket_timeout"],
        setting=setting,
    )
    # The TLS arguments are given as options; redis-py would read the URL's its own way.
    plain = without_tls_arguments(url)
    try:
        if is_cluster_url(url):
            return family.cluster(
                seed_url(plain),
                retry=family.retry(),
                max_connections=options["max_connections"],
                **family.cluster_options,
                **connection,
            )
        pool = family.pool(
            plain,
            max_connections=options["max_connections"],
            timeout=options.get("pool_timeout"),
            retry=family.retry(),
            **connection,
        )
        family.prepare_pool(pool)
        return family.client(pool)  # the client owns (and closes) its pool
    except ValueError as exc:
        raise _bad_url(url, setting, exc) from exc


# -------------------------------------------------------------------------- errors


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes and contexts."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _gives_password(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    return bool(parts.password or query.get("password"))


def permanent_failure(exc: BaseException, url: str, setting: str) -> ConfigError | None:
    """A connection failure that retrying cannot cure, as the Trio side says it."""
    tls = url.lower().startswith(("rediss:", "rediss+cluster:"))
    for error in _chain(exc):
        if isinstance(error, redis.exceptions.AuthenticationError):
            # redis-py words a missing password in several ways (NOAUTH, or HELLO
            # refused): whether the URL gives one tells them apart.
            if not _gives_password(url):
                return password_required(url, setting=setting)
            return credentials_refused(url, str(error), setting=setting)
        if isinstance(error, ssl.SSLCertVerificationError):
            return tls_refusal(error, url, setting=setting)
        if tls and isinstance(error, ssl.SSLError):
            return tls_handshake_failed(url, _reason(error), setting=setting)
        if isinstance(error, socket.gaierror) and error.errno in (
            socket.EAI_NONAME,
            getattr(socket, "EAI_NODATA", socket.EAI_NONAME),
        ):
            return unknown_host(url, error.strerror, setting=setting)
    return None


def _refusal(exc: BaseException, url: str) -> StreamkitError | None:
    if not isinstance(exc, redis.exceptions.RedisError):
        return None
    text = str(exc)
    code = next((c for t, c in _REFUSAL_TYPES if isinstance(exc, t)), None)
    if code is not None:
        return refused(code, text, url)
    if isinstance(exc, redis.exceptions.ConnectionError) and "max number of clients" in text:
        return refused("MAXCLIENTS", text, url)
    if isinstance(exc, redis.exceptions.ResponseError):
        return refusal_in(text, url)
    return None


def translate(exc: BaseException, url: str, *, setting: str = "redis_url") -> StreamkitError | None:
    """``exc`` (redis-py's, or a socket's) as the streamkit error it means; ``None`` if
    it is none of those."""
    if isinstance(exc, StreamkitError):
        return exc
    masked = mask_url(url)
    permanent = permanent_failure(exc, url, setting)
    if permanent is not None:
        return permanent
    if isinstance(exc, redis.exceptions.AskError) and not is_cluster_url(url):
        # MOVED too (a subclass): a cluster's node, named by a plain URL.
        scheme, _, rest = masked.partition("://")
        return ConfigError(
            setting,
            f"{masked!r} names a node of a Redis Cluster, which redirected a command "
            f"({exc}): write {scheme}+cluster://{rest}",
        )
    refusal = _refusal(exc, url)
    if refusal is not None:
        return refusal
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError | OSError):
        reason = _reason(exc)
        if any(part in reason for part in _NOT_SENT):
            return RedisUnavailable(masked, reason)
        return OutcomeUnknown(masked, reason)
    if isinstance(exc, redis.exceptions.ClusterError):
        # Redirections still failing after the client followed them: no node ran it.
        return RedisUnavailable(masked, f"the cluster kept redirecting the command ({exc})")
    if isinstance(exc, redis.exceptions.RedisClusterException):
        # Raised by the cluster client itself, before sending: no reachable node, a
        # node without cluster mode, a slot no node serves.
        return RedisUnavailable(masked, _reason(exc))
    if isinstance(exc, redis.exceptions.RedisError):
        return not_permitted(str(exc), masked) or BackendError(str(exc))
    return None


@contextlib.contextmanager
def redis_errors(url: str, *, setting: str = "redis_url") -> Iterator[None]:
    """Translate redis-py exceptions raised in the block into streamkit errors
    (:func:`translate`); anything else passes through untouched."""
    try:
        yield
    except Exception as exc:
        translated = translate(exc, url, setting=setting)
        if translated is None or translated is exc:
            raise
        raise translated from exc


# ------------------------------------------------------------------ scripts


def script_missing(reply: object) -> bool:
    """Whether ``reply`` (a reply, or an error raised) says that the server lacks the
    script an ``EVALSHA`` named: the call ran nothing, and may be sent again once the
    script is loaded."""
    return isinstance(reply, redis.exceptions.NoScriptError)


def script_load(client: Any, script: _lua.Script, key: str) -> Any:
    """``SCRIPT LOAD`` of ``script`` on ``client``, on a cluster on the node of ``key``:
    the reply, or for an asyncio client the coroutine that gives it.

    Error handling: redis-py's (wrap in :func:`redis_errors`)."""
    if isinstance(client, redis.cluster.RedisCluster | redis.asyncio.cluster.RedisCluster):
        node = client.get_node_from_key(key)
        return client.execute_command("SCRIPT LOAD", script.text, target_nodes=node)
    return client.execute_command("SCRIPT LOAD", script.text)


def run_script(client: SyncClient, script: _lua.Script, keys: list[str], args: list[Any]) -> Any:
    """Run ``script`` on a blocking client by its digest; load it where the call runs
    and send the call again if the server lacked it.

    Error handling: redis-py's (wrap in :func:`redis_errors`)."""
    untyped: Any = client
    try:
        return untyped.evalsha(script.sha, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        script_load(client, script, keys[0])
    return untyped.evalsha(script.sha, len(keys), *keys, *args)


def no_node_for(key: str, url: str) -> StreamkitError:
    """The error of a cluster's call on ``key`` when the slot map says no node serves it."""
    error = translate(redis.exceptions.SlotNotCoveredError(f"no node serves {key}"), url)
    assert error is not None
    return error
