"""Rate limits and concurrency limits of a job, as declared and as recorded (pure).

A job may declare limits on its name (``rate_limit=``, ``concurrency=``) and on a key
computed from its arguments (``limit_key=`` with ``key_rate_limit=``,
``key_concurrency=``). The claim script enforces them (``jobs/claim.lua``): this module
turns the declaration into what the script reads, the job record's ``lim`` field, and
says on which queue shard a limited job lives (all the jobs sharing a limit live on one
shard, so that one single-slot script sees them all).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import attrs

from .._errors import ConfigError
from .._validate import is_int, is_number
from ._layout import shard_for

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["MAX_KEY", "RateLimit", "limit_key_of", "limit_shard", "limit_spec", "rate_limit"]

#: Characters of a limit key, at most (it is part of Redis key names).
MAX_KEY = 200

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([smhd])\s*\Z")


@attrs.frozen
class RateLimit:
    """At most ``count`` tries of a job started in any ``per`` seconds.

    Written as a string too: ``"100/s"``, ``"10/m"``, ``"5/h"``, ``"1000/d"``,
    ``"3/10s"`` (3 per 10 seconds).

    Attributes:
        count: tries started per window, at most.
        per: the window, in seconds (millisecond resolution, at least 1 ms).
    """

    count: int
    per: float

    def __attrs_post_init__(self) -> None:
        if not is_int(self.count) or self.count < 1:
            raise ConfigError("rate limit", f"count must be a positive integer, got {self.count!r}")
        if not is_number(self.per) or not 0.001 <= self.per < math.inf:
            raise ConfigError("rate limit", f"per must be at least 0.001 s, got {self.per!r}")

    @property
    def per_ms(self) -> int:
        """The window in milliseconds."""
        return math.ceil(self.per * 1000)

    def __str__(self) -> str:
        return f"{self.count}/{self.per:g}s"


def rate_limit(value: object) -> RateLimit | None:
    """A rate limit from a :class:`RateLimit`, a string such as ``"10/m"``, or ``None``.

    Error handling:
        :class:`~streamkit.ConfigError` for anything else.
    """
    if value is None or isinstance(value, RateLimit):
        return value
    if isinstance(value, str):
        match = _RATE.match(value)
        if match:
            count, number, unit = match.groups()
            return RateLimit(int(count), float(number or 1) * _UNITS[unit])
    raise ConfigError(
        "rate limit", f"must be a RateLimit or a string such as '10/s' or '3/5m', got {value!r}"
    )


def limit_spec(
    rate: RateLimit | None,
    concurrency: int | None,
    key_rate: RateLimit | None,
    key_concurrency: int | None,
) -> str:
    """The job record's ``lim`` field: ``"rate,window_ms,conc,key_rate,key_window_ms,
    key_conc"`` (0 for none); "" for a job without limits."""
    if rate is None and concurrency is None and key_rate is None and key_concurrency is None:
        return ""
    parts = [
        rate.count if rate else 0,
        rate.per_ms if rate else 0,
        concurrency or 0,
        key_rate.count if key_rate else 0,
        key_rate.per_ms if key_rate else 0,
        key_concurrency or 0,
    ]
    return ",".join(str(p) for p in parts)


def limit_key_of(
    name: str,
    limit_key: str | Callable[..., Any],
    bind: Callable[[Sequence[Any], Mapping[str, Any]], Mapping[str, Any]],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    option: str = "limit_key",
) -> str:
    """The limit key of one call of job ``name``: the value of the argument named
    ``limit_key``, or what ``limit_key(*args, **kwargs)`` returns, as text (``option``:
    the option it is the key of, for errors: ``limit_key``, or ``key`` for a debounce's
    or throttle's key).

    Error handling:
        :class:`~streamkit.ConfigError` for a key that is not a string or an integer,
        empty, or longer than :data:`MAX_KEY` characters.
    """
    if isinstance(limit_key, str):
        value = bind(args, kwargs).get(limit_key)
    else:
        value = limit_key(*args, **kwargs)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigError(option, f"job {name}: the key must be a str or an int, got {value!r}")
    key = str(value)
    if not key or len(key) > MAX_KEY:
        raise ConfigError(option, f"job {name}: the key must have 1 to {MAX_KEY} characters")
    return key


def limit_shard(name: str, key: str | None, by_name: bool, shards: int) -> int | None:
    """The shard a limited job lives on: its name's when a limit of its name applies,
    else its key's; ``None`` for a job without limits (or with one shard)."""
    if shards == 1:
        return None
    if by_name:
        return shard_for(f"limit:{name}", shards)
    if key is not None:
        return shard_for(f"limit:{name}:{key}", shards)
    return None
