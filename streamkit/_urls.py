"""Redis URLs: masked for messages and logs, and the one in use.

Pure (no trio, no Redis client), so that Spark's workers can use it cheaply.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["current_url", "mask_url", "using_url"]

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
