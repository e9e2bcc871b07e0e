"""Redis client errors translated into streamkit's, in one place.

coredis exceptions stop here: :func:`redis_errors` turns them into the streamkit
error tree (``raise ... from exc``), :func:`as_unavailable` tells a user's own Redis
error that means "Redis cannot be reached", and :func:`permanent_failure` tells a
connection failure that retrying cannot cure (a password, TLS, an unknown host).
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
from typing import TYPE_CHECKING

import anyio
import coredis
import coredis.exceptions
import trio

from .._acl import not_permitted
from .._errors import (
    BackendError,
    ConfigError,
    GroupExists,
    NoSuchGroup,
    NotReplicated,
    OutcomeUnknown,
    RedisUnavailable,
    ServerRefused,
    StreamkitError,
    current_url,
)
from .._nurseries import exception_chain, leaves
from .._refusals import code_types, refusal_in, refused
from .._urls import (
    credentials_refused,
    mask_url,
    password_required,
    tls_handshake_failed,
    tls_refusal,
    unknown_host,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "LOST",
    "TooFewReplicas",
    "as_unavailable",
    "permanent_failure",
    "reason",
    "redis_errors",
    "refusal",
    "translate",
    "unwrapped_group",
]

# coredis ConnectionErrors raised before the command was handed to a connection: the
# connection could not be opened, was found broken when the command was queued, or no
# pool slot came free in time.
_NOT_SENT_MESSAGES = (
    "Unable to establish a connection",
    "Connection not usable",
    "Connection pool exhausted",
)

#: Errors meaning the connection was lost (or never answered) with the command in flight.
#: anyio's own come from coredis's connection streams: a command queued on a connection
#: whose streams closed as it ended (coredis still counted it usable).
LOST = (
    coredis.exceptions.ConnectionError,
    ConnectionError,
    TimeoutError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)


class TooFewReplicas(coredis.exceptions.ReplicationError):
    """``WAIT`` after a command counted fewer replicas than asked (with the count)."""

    def __init__(self, command: bytes, wanted: int, timeout_ms: int, acknowledged: int) -> None:
        super().__init__(command, wanted, timeout_ms)
        self.wanted = wanted
        self.timeout_ms = timeout_ms
        self.acknowledged = acknowledged


def reason(exc: BaseException) -> str:
    """What ``exc`` says, or its type's name when it says nothing."""
    return str(exc) or type(exc).__name__


def _not_sent(exc: BaseException) -> bool:
    return isinstance(exc, coredis.exceptions.ConnectionError) and str(exc).startswith(
        _NOT_SENT_MESSAGES
    )


def _group_error(exc: coredis.exceptions.RedisError) -> BackendError | None:
    text = str(exc)
    if isinstance(exc, coredis.exceptions.StreamDuplicateConsumerGroupError) or (
        "BUSYGROUP" in text
    ):
        return GroupExists(text)
    # Redis 7 reports a missing group inside a script as "No such key '...' or consumer
    # group '...' in XREADGROUP with GROUP option"; coredis keeps the NOGROUP code as
    # the exception's type only.
    if isinstance(exc, coredis.exceptions.StreamConsumerGroupError) or (
        "NOGROUP" in text or ("No such key" in text and "consumer group" in text)
    ):
        return NoSuchGroup(text)
    return None


# coredis strips these codes from the message and says them by the exception's type.
_REFUSAL_TYPES = code_types(coredis.exceptions)

# coredis prefixes an error of a pipeline's command with the command.
_PIPELINE_PREFIX = re.compile(r"^Command # \d+ \(.*?\) of pipeline caused error: ", re.DOTALL)


def refusal(exc: BaseException, url: str) -> ServerRefused | None:
    """``exc`` as :class:`ServerRefused` if it is one of Redis's passing refusals."""
    if not isinstance(exc, coredis.exceptions.RedisError):
        return None
    text = _PIPELINE_PREFIX.sub("", str(exc), count=1).strip()
    code = next((c for t, c in _REFUSAL_TYPES if isinstance(exc, t)), None)
    if code is None:
        if isinstance(exc, coredis.exceptions.ConnectionError) and text.startswith(
            "max number of clients reached"
        ):
            code = "MAXCLIENTS"
        else:
            return refusal_in(text, url)
    elif text.startswith(code + " "):
        text = text[len(code) + 1 :]
    return refused(code, text, url)


def translate(exc: BaseException, url: str) -> StreamkitError | None:
    """``exc`` as the streamkit error it means, or ``None`` if it is none of Redis's."""
    if isinstance(exc, StreamkitError):
        return exc
    if isinstance(exc, TooFewReplicas):
        return NotReplicated(exc.wanted, exc.acknowledged, exc.timeout_ms / 1000)
    masked = mask_url(url)
    refused = refusal(exc, url)
    if refused is not None:
        # Redis refused the command (out of memory, loading, a replica, ...): it did
        # not run, and may succeed later.
        return refused
    if _not_sent(exc):
        return RedisUnavailable(masked, reason(exc))
    if isinstance(exc, coredis.exceptions.ClusterResponseError):
        # A command sent to every node (SCRIPT LOAD, PING) had differing answers:
        # some node is failing over or unreachable.
        return RedisUnavailable(masked, f"the cluster's nodes disagree ({exc})")
    if isinstance(exc, coredis.exceptions.ClusterError):
        # The cluster client followed MOVED / ASK / TRYAGAIN redirections until it gave
        # up: no node ran the command.
        return RedisUnavailable(masked, f"the cluster kept redirecting the command ({exc})")
    if isinstance(exc, LOST):
        return OutcomeUnknown(masked, reason(exc))
    if isinstance(exc, coredis.exceptions.AuthenticationError):
        return RedisUnavailable(masked, f"authentication failed: {exc}")
    if isinstance(exc, coredis.exceptions.RedisError):
        return not_permitted(str(exc), masked) or _group_error(exc) or BackendError(str(exc))
    if isinstance(exc, BaseExceptionGroup):
        # coredis runs its pool in a task group, so a dropped connection can arrive
        # wrapped in a group. Unwrap it when every leaf is a Redis error.
        translated = [translate(e, url) for e in exc.exceptions]
        if translated and all(leaf is not None for leaf in translated):
            return translated[0]
    return None


def as_unavailable(exc: BaseException, url: str | None = None) -> RedisUnavailable | None:
    """``exc`` as :class:`RedisUnavailable` if it says Redis cannot be reached, else ``None``.

    For errors raised by code that uses the client directly (a processor calling
    ``app.redis``), where coredis exceptions are not translated: a streamkit
    :class:`RedisUnavailable`, a coredis connection error or a passing refusal by the
    server (out of memory, loading, a read-only replica, ...: :class:`ServerRefused`),
    alone or in an exception group of them, as :class:`OutcomeUnknown` where the
    command may have run. Built-in ``ConnectionError`` / ``TimeoutError`` do not count
    here: user code raises those for its own reasons.
    """
    if isinstance(exc, RedisUnavailable):
        return exc
    if url is None:
        url = current_url()
    refused = refusal(exc, url)
    if refused is not None:
        return refused
    if isinstance(exc, coredis.exceptions.ConnectionError):
        translated = translate(exc, url)
        assert isinstance(translated, RedisUnavailable)
        return translated
    if isinstance(exc, BaseExceptionGroup):
        found = [as_unavailable(e, url) for e in exc.exceptions]
        if found and all(leaf is not None for leaf in found):
            return found[0]
    return None


@contextlib.contextmanager
def unwrapped_group() -> Iterator[None]:
    """Re-raise a lone exception that coredis's pool task group wrapped in a group."""
    try:
        yield
    except BaseExceptionGroup as group:
        found = leaves(group)
        if len(found) != 1:
            raise
        raise found[0] from None


@contextlib.contextmanager
def redis_errors(url: str | None = None) -> Iterator[None]:
    """Translate Redis client errors raised in the block into streamkit errors.

    Messages name ``url`` (masked), by default the URL of the client in use: the
    innermost :func:`open_redis` of the calling task (see
    :func:`streamkit._errors.current_url`).

    Error handling:
        :class:`OutcomeUnknown` when the connection was lost with a command in flight
        (it may have run); :class:`RedisUnavailable` when Redis could not be reached,
        :class:`ServerRefused` (a subclass) when it refused to run the command for a
        passing reason (out of memory, loading, a replica, ...): it did not run;
        :class:`GroupExists` / :class:`NoSuchGroup` for ``BUSYGROUP`` / ``NOGROUP`` replies;
        :class:`BackendError` for other errors Redis replied with. Anything else
        passes through untouched.
    """
    try:
        yield
    except BaseException as exc:
        translated = translate(exc, current_url() if url is None else url)
        if translated is None or translated is exc:
            raise
        raise translated from exc


# ------------------------------------------------------- failures to connect


def permanent_failure(exc: BaseException, url: str) -> ConfigError | None:
    """A connection failure that retrying cannot cure, as a ConfigError saying what to check.

    A refused or missing password, a TLS handshake that fails (``rediss://`` to a plain
    server, an untrusted certificate, a certificate for another host) and a host name
    that does not exist fail at once.
    A host name that cannot be resolved *for now* (``EAI_AGAIN``: DNS not ready yet, as
    in a starting container) is transient, like a refused connection or a timeout.
    """
    tls = url.lower().startswith(("rediss:", "rediss+cluster:"))
    for error in exception_chain(exc):
        if isinstance(error, coredis.exceptions.AuthenticationRequiredError):
            return password_required(url, setting="redis_url")
        if isinstance(error, coredis.exceptions.AuthenticationError):
            return credentials_refused(url, str(error), setting="redis_url")
        if isinstance(error, ssl.SSLCertVerificationError):
            return tls_refusal(error, url, setting="redis_url")
        if tls and isinstance(error, ssl.SSLError):
            return tls_handshake_failed(url, reason(error), setting="redis_url")
        if isinstance(error, socket.gaierror) and error.errno in (
            socket.EAI_NONAME,
            getattr(socket, "EAI_NODATA", socket.EAI_NONAME),
        ):
            return unknown_host(url, error.strerror, setting="redis_url")
    return None
