"""Settings: frozen attrs with defaults, overridable by ``STREAMKIT_*`` variables.

Precedence, lowest first: the defaults below, environment variables, keyword
arguments. A value is only ever replaced by one that was given; a default of ``0`` or
``False`` is kept as it is.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import attrs

from ._errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["Settings"]

ENV_PREFIX = "STREAMKIT_"

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"
DEFAULT_PARTITION_COUNT = 16
DEFAULT_PARTITION_SIZE = 100_000
DEFAULT_SEND_CHUNK_SIZE = 1_000
DEFAULT_CONNECT_TIMEOUT = 2.0
DEFAULT_CONNECT_GIVE_UP_AFTER = 30.0
DEFAULT_LEASE_TTL = 10.0
DEFAULT_HEARTBEAT_INTERVAL = 1.0
DEFAULT_SESSION_TIMEOUT = 10.0
DEFAULT_STATIC_GRACE = 60.0
DEFAULT_GRACE_PERIOD = 5.0
DEFAULT_BATCH_SIZE = 500
DEFAULT_PREFETCH = 2


def _positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(attribute.name, f"must be a positive integer, got {value!r}")


def _optional_positive_int(
    instance: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if value is not None:
        _positive_int(instance, attribute, value)


def _non_negative_number(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ConfigError(attribute.name, f"must be a number >= 0, got {value!r}")


def _optional_non_negative_number(
    instance: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if value is not None:
        _non_negative_number(instance, attribute, value)


def _positive_number(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ConfigError(attribute.name, f"must be a number > 0, got {value!r}")


def _compression(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in (None, "lz4", "zstd"):
        raise ConfigError(attribute.name, f"must be 'lz4', 'zstd' or unset, got {value!r}")


def _url(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or "://" not in value:
        raise ConfigError(attribute.name, f"must be a redis:// URL, got {value!r}")


@attrs.frozen(kw_only=True)
class Settings:
    """Configuration shared by an :class:`~streamkit.App`, its streams and workers.

    Every field can be set by an environment variable named ``STREAMKIT_`` plus the
    field name in capitals (``STREAMKIT_REDIS_URL``, ``STREAMKIT_PARTITION_COUNT``) and
    by keyword arguments, which win. Unset a nullable setting from the environment
    with an empty value or ``none``.
    """

    #: Where Redis is: ``redis://[:password@]host[:port][/db]``, ``rediss://`` for TLS.
    redis_url: str = attrs.field(default=DEFAULT_REDIS_URL, validator=_url)
    #: Partitions of a new stream (recorded in Redis on first use, then fixed).
    partition_count: int = attrs.field(default=DEFAULT_PARTITION_COUNT, validator=_positive_int)
    #: Entries to keep per partition; older ones are trimmed once every consumer
    #: group has acknowledged them (never before).
    partition_size: int = attrs.field(default=DEFAULT_PARTITION_SIZE, validator=_positive_int)
    #: A hard cap on a partition's length that trims even unprocessed entries (with a
    #: warning). Unset by default: nothing unprocessed is ever trimmed.
    max_len: int | None = attrs.field(default=None, validator=_optional_positive_int)
    #: Compress encoded records: ``"lz4"``, ``"zstd"`` or unset.
    compression: str | None = attrs.field(default=None, validator=_compression)
    #: Records sent per pipelined round trip by ``send_many``.
    send_chunk_size: int = attrs.field(default=DEFAULT_SEND_CHUNK_SIZE, validator=_positive_int)
    #: Seconds to wait for a TCP connection to Redis.
    connect_timeout: float = attrs.field(
        default=DEFAULT_CONNECT_TIMEOUT, validator=_non_negative_number
    )
    #: Seconds to keep retrying an unreachable Redis when connecting (unset: forever).
    connect_give_up_after: float | None = attrs.field(
        default=DEFAULT_CONNECT_GIVE_UP_AFTER, validator=_optional_non_negative_number
    )

    #: Seconds a partition lease lives without renewal: how long a partition waits
    #: for a worker that died (renewed every third of it while alive).
    lease_ttl: float = attrs.field(default=DEFAULT_LEASE_TTL, validator=_positive_number)
    #: Seconds between a worker's heartbeats.
    heartbeat_interval: float = attrs.field(
        default=DEFAULT_HEARTBEAT_INTERVAL, validator=_positive_number
    )
    #: Seconds without a heartbeat after which a worker counts as dead and its
    #: partitions are reassigned.
    session_timeout: float = attrs.field(
        default=DEFAULT_SESSION_TIMEOUT, validator=_positive_number
    )
    #: A stable id for this worker (static membership): if it leaves and returns
    #: within ``static_grace`` seconds (a rolling restart), nothing is reassigned.
    member_id: str | None = attrs.field(default=None)
    #: Seconds a static member's partitions wait for it to return.
    static_grace: float = attrs.field(default=DEFAULT_STATIC_GRACE, validator=_positive_number)
    #: Seconds a processor gets to finish and acknowledge its current event when its
    #: partition moves or the worker shuts down, before it is cancelled.
    grace_period: float = attrs.field(default=DEFAULT_GRACE_PERIOD, validator=_non_negative_number)
    #: Entries fetched per partition and round trip.
    batch_size: int = attrs.field(default=DEFAULT_BATCH_SIZE, validator=_positive_int)
    #: Batches buffered per partition ahead of the processor (memory stays bounded
    #: by partitions x prefetch x batch_size entries, whatever the backlog).
    prefetch: int = attrs.field(default=DEFAULT_PREFETCH, validator=_positive_int)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from defaults, ``STREAMKIT_*`` variables and ``overrides``.

        Error handling:
            :class:`ConfigError` naming the setting (and the variable it came from)
            for an unknown keyword or a value that does not parse or validate.
        """
        environ = os.environ if environ is None else environ
        fields = attrs.fields_dict(cls)
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ConfigError(unknown[0], f"unknown setting; known: {', '.join(fields)}")
        values: dict[str, Any] = {}
        for name, field in fields.items():
            variable = ENV_PREFIX + name.upper()
            if variable in environ:
                values[name] = _parse(variable, environ[variable], field.type)
        values.update(overrides)
        return cls(**values)


def _parse(variable: str, text: str, annotation: object) -> Any:
    kind = str(annotation)
    optional = "None" in kind
    if optional and text.strip().lower() in ("", "none", "null"):
        return None
    parser: Callable[[str], Any]
    if kind.startswith("int"):
        parser = int
    elif kind.startswith("float"):
        parser = float
    elif kind.startswith("bool"):
        parser = _parse_bool
    else:
        return text
    try:
        return parser(text.strip())
    except ValueError as exc:
        raise ConfigError(variable, f"cannot parse {text!r} as {kind}") from exc


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)
