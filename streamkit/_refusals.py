"""Redis's passing refusals (``OOM``, ``LOADING``, ``READONLY``, ...): what each means, pure.

The Trio layer (:mod:`streamkit._redis._translate`, for coredis) and the redis-py
layer (:mod:`streamkit._redispy`, for Spark and the blocking and asyncio clients) turn
a refusal into the same :class:`~streamkit.ServerRefused`, with the same words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import ServerRefused
from ._urls import mask_url

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["REFUSALS", "code_types", "refusal_in", "refused"]

# Replies by which Redis refuses a command for a passing reason of its own: the command
# did not run (a script stopped at the refused command), and it may succeed later. Each
# code: what it means, and what to check.
REFUSALS: dict[str, tuple[str, str]] = {
    "OOM": (
        "out of memory",
        "raise maxmemory or free memory; appends then trim what consumers have processed",
    ),
    "LOADING": ("loading its data set", "wait until the server has loaded its data"),
    "BUSY": (
        "busy running a script or function",
        "wait for it to end, or stop it with SCRIPT KILL / FUNCTION KILL",
    ),
    "MASTERDOWN": (
        "a replica that lost its primary",
        "check the primary and replication, or point streamkit at the primary",
    ),
    "READONLY": (
        "a read-only replica",
        "point streamkit at the primary (after a failover, the old primary is a replica)",
    ),
    "NOREPLICAS": ("not enough replicas to write", "check the replicas (min-replicas-to-write)"),
    "MISCONF": ("unable to persist to disk", "check the Redis server's disk and its log"),
    "TRYAGAIN": ("moving a cluster slot", "wait for the resharding to end"),
    "MOVED": (
        "a cluster node that no longer serves the key's slot",
        "the cluster is resharding or failing over; the client follows its new layout",
    ),
    "ASK": ("a cluster node moving the key's slot", "wait for the resharding to end"),
    "CLUSTERDOWN": ("a cluster that is down", "check the cluster's state"),
    "UNBLOCKED": (
        "a blocking command unblocked by a role change",
        "check for a failover, and that streamkit points at the primary",
    ),
    "MAXCLIENTS": (
        "too many clients",
        "raise the server's maxclients, or run fewer clients (max_connections)",
    ),
}


# Codes that a client library (coredis, redis-py) strips from the reply and says by an
# exception type instead, by the type's name in its ``exceptions`` module (both libraries
# name them alike; each has some of them). MovedError is an AskError: MOVED first.
_CODE_TYPE_NAMES = (
    ("OutOfMemoryError", "OOM"),
    ("BusyLoadingError", "LOADING"),
    ("ReadOnlyError", "READONLY"),
    ("MasterDownError", "MASTERDOWN"),
    ("TryAgainError", "TRYAGAIN"),
    ("ClusterDownError", "CLUSTERDOWN"),
    ("UnblockedError", "UNBLOCKED"),
    ("MovedError", "MOVED"),
    ("AskError", "ASK"),
)


def code_types(exceptions: ModuleType) -> tuple[tuple[type[BaseException], str], ...]:
    """The exception types of a client library's ``exceptions`` module that stand for a
    refusal code, each with its code, subclasses first: the first that an error is an
    instance of names its code."""
    found = ((getattr(exceptions, name, None), code) for name, code in _CODE_TYPE_NAMES)
    return tuple(
        (kind, code)
        for kind, code in found
        if isinstance(kind, type) and issubclass(kind, BaseException)
    )


def refused(code: str, text: str, url: str) -> ServerRefused:
    """The refusal ``code`` (one of :data:`REFUSALS`) with Redis's ``text`` after it."""
    what, hint = REFUSALS[code]
    return ServerRefused(mask_url(url), code, text.rstrip(". ") or code, what=what, hint=hint)


def refusal_in(text: str, url: str) -> ServerRefused | None:
    """The refusal an error reply ``text`` is (``"OOM command not allowed ..."``), if any."""
    first, _, rest = text.strip().partition(" ")
    if first not in REFUSALS:
        return None
    return refused(first, rest, url)
