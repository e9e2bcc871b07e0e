"""Cron ticks in a named timezone, daylight-saving transitions handled (pure).

A crontab expression names wall-clock times in its timezone; croniter enumerates
them (on naive local times) and this module maps them to instants, by the rule
Debian's cron follows (Vixie cron's):

- a **fixed-time** expression (neither its minute nor its hour field starts with
  ``*``, and not ``@hourly``) ticks once per matching wall time: a time that the
  clocks skip (spring forward) ticks at the moment they jump, and a time that they
  repeat (fall back) ticks at its first occurrence only;
- any other expression follows the clock: the times skipped do not happen, and the
  times repeated happen twice (every 15 minutes stays every 15 minutes of real time).

UTC (or no timezone) has no transitions: there croniter's ticks are the instants.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo

__all__ = ["fixed_time", "next_tick", "ticks_between"]

_DAY = timedelta(days=1)
_SECOND = timedelta(seconds=1)
#: Longer than any shift of a timezone's offset at one transition.
_SHIFT = timedelta(hours=3)
_TINY = timedelta(microseconds=1)


def fixed_time(expression: str) -> bool:
    """Whether ``expression`` names fixed times of day (see the module)."""
    fields = expression.split()
    if not fields:
        return False
    if fields[0].startswith("@"):
        return fields[0] not in ("@hourly", "@reboot")
    return len(fields) >= 2 and not fields[0].startswith("*") and not fields[1].startswith("*")


def _offset(tz: tzinfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(tz).utcoffset()
    assert offset is not None
    return offset


def _wall(instant: datetime, offset: timedelta) -> datetime:
    return (instant + offset).replace(tzinfo=None)


def _first_change(tz: tzinfo, start: datetime, end: datetime) -> datetime | None:
    """The first instant in ``(start, end]`` (to the second) where ``tz``'s offset
    differs from its offset at ``start``; ``None`` if there is none."""
    base = _offset(tz, start)
    low, probe = start, start
    while True:
        probe = min(probe + _DAY, end)
        if _offset(tz, probe) != base:
            break
        if probe >= end:
            return None
        low = probe
    # the offset changes in (low, probe]: bisect to the second
    high = probe
    while high - low > _SECOND:
        middle = low + (high - low) / 2
        if _offset(tz, middle) == base:
            low = middle
        else:
            high = middle
    # transitions fall on whole seconds: the first second after low with the new offset
    second = (low + _SECOND).replace(microsecond=0)
    return second if second <= high and _offset(tz, second) != base else high


def _repeated(tz: tzinfo, instant: datetime) -> bool:
    """Whether the wall time ``instant`` shows in ``tz`` showed before, in the hour
    or so the clocks went back."""
    offset = _offset(tz, instant)
    earlier = _offset(tz, instant - _SHIFT)
    if earlier <= offset:
        return False
    first = _wall(instant, offset).replace(tzinfo=UTC) - earlier
    return first < instant and _offset(tz, first) == earlier


def _croniter_next(expression: str, after: datetime) -> datetime:
    from croniter import croniter

    nxt: datetime = croniter(expression, after).get_next(datetime)
    return nxt


def next_tick(expression: str, tz: tzinfo | None, after: datetime) -> datetime:
    """The first tick of ``expression`` in ``tz`` strictly after the instant ``after``
    (timezone-aware), as a UTC datetime. See the module for the rule at transitions."""
    after = after.astimezone(UTC)
    if tz is None or tz is UTC:
        return _croniter_next(expression, after).astimezone(UTC)
    fixed = fixed_time(expression)
    start, inclusive = after, False
    while True:
        offset = _offset(tz, start)
        wall = _wall(start, offset)
        matched = _croniter_next(expression, wall - _TINY if inclusive else wall)
        candidate = matched.replace(tzinfo=UTC) - offset
        change = _first_change(tz, start, candidate)
        if change is None:
            if fixed and _repeated(tz, candidate):
                start, inclusive = candidate, False
                continue
            return candidate
        later = _offset(tz, change)
        if fixed and later > offset and matched < _wall(change, later):
            # a fixed time the clocks skipped: it ticks when they jump
            return change
        start, inclusive = change, True


def ticks_between(
    expression: str, tz: tzinfo | None, after: datetime, until: datetime
) -> list[datetime]:
    """The ticks in ``(after, until]``, oldest first."""
    found: list[datetime] = []
    tick = next_tick(expression, tz, after)
    while tick <= until:
        found.append(tick)
        tick = next_tick(expression, tz, tick)
    return found
