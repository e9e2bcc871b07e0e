"""Redis URLs: which ones streamkit takes, their parts, and their passwords masked.

Pure (no trio, no Redis client): the Trio side and Spark's executors check, open and
show URLs with it alike. Which URL is in use (named by errors raised without one) is
:func:`streamkit._errors.current_url`.
"""

from __future__ import annotations

import re
import urllib.parse

from ._errors import ConfigError

__all__ = [
    "CLUSTER_SCHEMES",
    "SCHEMES",
    "check_redis_url",
    "is_cluster_url",
    "mask_url",
    "seed_url",
]

SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

# ---------------------------------------------------------------------- masking

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


# --------------------------------------------------------------------- checking


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def check_redis_url(url: object, *, setting: str = "redis_url") -> None:
    """Check that ``url`` is a Redis URL streamkit can use.

    ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS),
    ``unix:///path/to/socket[?db=N]``, or ``redis+cluster://[[user]:password@]host[:port]``
    (``rediss+cluster://`` for TLS) for a Redis Cluster, naming any one of its nodes;
    a password holding ``@``, ``/``, ``:`` and the like must be percent-encoded
    (``%40``, ``%2F``, ``%3A``).

    Error handling:
        :class:`ConfigError` naming ``setting``, with the masked URL and what to
        write instead: no scheme (``127.0.0.1:6379``: use ``redis://127.0.0.1:6379``),
        another scheme, no host, a port that is not a number, or a path that is not
        a database number (``redis://host/abc``), a database other than 0 on a cluster.
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
            setting,
            f"{masked!r}: expected redis://, rediss://, unix:// or redis+cluster://, "
            f"not {scheme}://",
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
    if scheme in CLUSTER_SCHEMES and path and int(path) != 0:
        raise ConfigError(
            setting, f"{masked!r}: a Redis Cluster has database 0 only; drop the /{path}"
        )


def seed_url(url: str) -> str:
    """The plain ``redis://`` (``rediss://``) URL of a cluster URL's node."""
    scheme, _, rest = url.partition("://")
    return f"{scheme.lower().removesuffix('+cluster')}://{rest}"
