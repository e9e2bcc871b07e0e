"""How a member behaves in its group: the settings of :func:`open_membership`.

The defaults are defined here once; the app-wide :class:`~streamkit.Settings` takes
its membership defaults from this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ._defaults import (
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_SESSION_TIMEOUT,
    DEFAULT_STATIC_GRACE,
)
from ._errors import ConfigError
from ._validate import is_int, positive_number

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_LEAVE_TIMEOUT",
    "DEFAULT_REFRESH_INTERVAL",
    "DEFAULT_SESSION_TIMEOUT",
    "DEFAULT_STATIC_GRACE",
    "MembershipSettings",
]

#: The longest a member goes without re-reading the state: the safety net behind the
#: control stream, every change of which makes it re-read the state at once.
DEFAULT_REFRESH_INTERVAL = 10.0
#: The longest leaving may take on exit.
DEFAULT_LEAVE_TIMEOUT = 2.0


def _partitions(value: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise ConfigError("partitions", f"must be a count or a sequence of ints, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError("partitions", f"must be at least 1, got {value!r}")
        return tuple(range(value))
    parts = tuple(sorted(set(value)))
    if not parts or not all(is_int(p) for p in parts):
        raise ConfigError("partitions", f"must be a non-empty sequence of ints, got {value!r}")
    return parts


@attrs.frozen(kw_only=True)
class MembershipSettings:
    """How a member behaves in its group. All times are in seconds.

    Attributes:
        partitions: the group's partitions (an int ``n`` means ``0 .. n-1``).
        heartbeat_interval: how often the member renews its heartbeat and looks for
            dead members.
        session_timeout: how long a heartbeat lasts; a member silent this long is
            reaped. Must exceed ``heartbeat_interval`` (keep it several times larger).
        static_grace: how long a static member's place is kept after it exits.
        refresh_interval: the longest the member goes without re-reading the state,
            as a safety net behind the control stream.
        leave_timeout: the longest leaving may take on exit.
    """

    partitions: tuple[int, ...] = attrs.field(converter=_partitions)
    heartbeat_interval: float = attrs.field(
        default=DEFAULT_HEARTBEAT_INTERVAL, validator=positive_number
    )
    session_timeout: float = attrs.field(default=DEFAULT_SESSION_TIMEOUT, validator=positive_number)
    static_grace: float = attrs.field(default=DEFAULT_STATIC_GRACE, validator=positive_number)
    refresh_interval: float = attrs.field(
        default=DEFAULT_REFRESH_INTERVAL, validator=positive_number
    )
    leave_timeout: float = attrs.field(default=DEFAULT_LEAVE_TIMEOUT, validator=positive_number)

    @session_timeout.validator
    def _longer_than_heartbeat(self, attribute: attrs.Attribute[float], value: float) -> None:
        if value <= self.heartbeat_interval:
            raise ConfigError(
                "session_timeout",
                f"must be longer than heartbeat_interval ({self.heartbeat_interval}), got {value}",
            )
