"""Redis URLs: checked, masked for messages and logs, and the one in use.

Pure (no trio, no Redis client), so that Spark's workers can use it cheaply.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import urllib.parse
from typing import TYPE_CHECKING

from ._errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["check_redis_url", "current_url", "mask_url", "using_url"]

SCHEMES = ("redis", "rediss", "unix")
#: Shown where no URL is known (code using no client from ``open_redis``).
UNKNOWN_URL = "(unknown URL)"

_MASK = "***"
# A password given as a query argument (``?password=...``), which coredis accepts too.
_PASSWORD_ARGUMENT = re.compile(r"([?&](?:password|username)=)[^&#]*", re.IGNORECASE)


def mask_url(url: str) -> str:
    """Return ``url`` with every password replaced by ``***``, for messages and logs.

    Masks ``user:password@``, ``:password@`` and a lone ``secret@`` (which is at best
    a user name, more likely a password put in the wrong place), percent-encoded or
    not, and even when an unencoded ``/``, ``?`` or ``#`` in the password keeps the
    URL from parsing: everything from the scheme up to the last ``@`` is the
    credentials part. ``password=`` query arguments are masked too.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    at = rest.rfind("@")
    if at >= 0:
        credentials = rest[:at]
        user, colon, _ = credentials.partition(":")
        masked = f"{user}:{_MASK}" if colon else _MASK
        rest = masked + rest[at:]
    rest = _PASSWORD_ARGUMENT.sub(lambda m: m.group(1) + _MASK, rest)
    return f"{scheme}{separator}{rest}" if separator else rest


def check_redis_url(url: object, *, setting: str = "redis_url") -> None:
    """Check that ``url`` is a Redis URL streamkit can use.

    ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS) or
    ``unix:///path/to/socket[?db=N]``; a password holding ``@``, ``/``, ``:`` and the
    like must be percent-encoded (``%40``, ``%2F``, ``%3A``).

    Error handling:
        :class:`ConfigError` naming ``setting``, with the masked URL and what to
        write instead: no scheme (``127.0.0.1:6379``: use ``redis://127.0.0.1:6379``),
        another scheme, no host, a port that is not a number, or a path that is not
        a database number (``redis://host/abc``).
    """
    if not isinstance(url, str):
        raise ConfigError(setting, f"must be a redis:// URL, got {url!r}")
    masked = mask_url(url)
    if "://" not in url:
        raise ConfigError(
            setting,
            f"{masked!r} is not a URL; write redis://{masked} (rediss:// for TLS, "
            f"unix:///path for a socket)",
        )
    scheme = url.partition("://")[0].lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            setting, f"{masked!r}: expected redis://, rediss:// or unix://, not {scheme}://"
        )
    parts = urllib.parse.urlsplit(url)
    if scheme == "unix":
        if not parts.path:
            raise ConfigError(setting, f"{masked!r}: expected unix:///path/to/socket")
        return
    rest = url.partition("://")[2]
    if "@" in parts.path or "@" in parts.query or "@" in parts.fragment:
        raise ConfigError(
            setting,
            f"{masked!r}: the password holds a character that ends it early; "
            f"percent-encode it (@ as %40, / as %2F, : as %3A, ? as %3F, # as %23)",
        )
    if not parts.hostname and not rest.startswith("/"):
        raise ConfigError(setting, f"{masked!r}: no host; expected redis://host[:port][/db]")
    try:
        parts.port  # noqa: B018 (parsing it is the check)
    except ValueError:
        raise ConfigError(
            setting,
            f"{masked!r}: the port is not a number; expected redis://host[:port][/db] "
            f"(percent-encode a password holding ':')",
        ) from None
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ConfigError(
            setting,
            f"{masked!r}: the path must be a database number (redis://host:6379/0), got /{path}",
        )


# ------------------------------------------------------------- the URL in use

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "streamkit_redis_url", default=None
)
# Masked URLs of the clients open in this process, with how many are open.
_open: dict[str, int] = {}


@contextlib.contextmanager
def using_url(url: str) -> Iterator[None]:
    """Make ``url`` (masked) the one :func:`current_url` reports while the block runs.

    :func:`~streamkit.open_redis` wraps its client's lifetime in it, so that errors
    raised by code using the client name its server without being told.
    """
    masked = mask_url(url)
    token = _current.set(masked)
    _open[masked] = _open.get(masked, 0) + 1
    try:
        yield
    finally:
        _open[masked] -= 1
        if not _open[masked]:
            del _open[masked]
        with contextlib.suppress(ValueError):  # exited in another context
            _current.reset(token)


def current_url() -> str:
    """The masked URL of the Redis server in use, for messages.

    The one of the innermost :func:`~streamkit.open_redis` of the calling task (or of
    the task that started it), else the only one open in the process, else
    :data:`UNKNOWN_URL`.
    """
    url = _current.get()
    if url is not None:
        return url
    if len(_open) == 1:
        return next(iter(_open))
    return UNKNOWN_URL
