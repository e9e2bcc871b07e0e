"""Settings: frozen attrs with defaults, overridable by ``STREAMKIT_*`` variables.

Precedence, lowest first: the defaults, environment variables, keyword arguments.
A setting that configures one component (``lease_ttl``, ``grace_period``,
``batch_size``, ...) defaults to that component's own default, so an app's worker and
the component used on its own agree: both take it from :mod:`streamkit._defaults`, at
the bottom of the import graph. A value is only ever replaced by one that was given; a
default of ``0`` or ``False`` is kept as it is.
"""

from __future__ import annotations

import difflib
import logging
import os
from typing import TYPE_CHECKING, Any

import attrs

from ._compression import valid_compression
from ._defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_COMMAND_GIVE_UP_AFTER,
    DEFAULT_CONNECT_GIVE_UP_AFTER,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_GRACE,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_JOB_LEASE_TTL,
    DEFAULT_JOB_MAX_BYTES,
    DEFAULT_LEASE_TTL,
    DEFAULT_MAX_DECODED_SIZE,
    DEFAULT_MAX_RECORD_SIZE,
    DEFAULT_METRICS_HOST,
    DEFAULT_METRICS_REFRESH_INTERVAL,
    DEFAULT_PARTITION_COUNT,
    DEFAULT_PARTITION_SIZE,
    DEFAULT_PREFETCH,
    DEFAULT_REDIS_URL,
    DEFAULT_SEND_CHUNK_SIZE,
    DEFAULT_SESSION_TIMEOUT,
    DEFAULT_STATE_CACHE_SIZE,
    DEFAULT_STATIC_GRACE,
)
from ._errors import ConfigError
from ._urls import check_redis_url, masked_repr
from ._validate import (
    non_negative_int,
    non_negative_number,
    port_number,
    positive_finite_number,
    positive_int,
    positive_number,
    valid_ttl,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["Settings", "check_setting_names"]

ENV_PREFIX = "STREAMKIT_"
#: ``STREAMKIT_*`` variables that are not settings but are read elsewhere.
OTHER_VARIABLES = frozenset(
    {
        # the project's own test sessions (nox -s reliability, compat)
        "STREAMKIT_RELIABILITY_REPORT",
        "STREAMKIT_CHURN_SOAK",
        "STREAMKIT_NET_SOAK",
        "STREAMKIT_TEST_SERVER",
        "STREAMKIT_WORKER_INDEX",
        # streamkit worker --processes N: its --redis-url and --metrics-token, for the
        # worker processes, and the descriptor of each worker's lifeline (the
        # supervisor's LIFELINE_VARIABLE)
        "STREAMKIT_WORKER_REDIS_URL",
        "STREAMKIT_SUPERVISOR_FD",
        "STREAMKIT_WORKER_METRICS_TOKEN",
        # streamkit worker --log-format, --log-level
        "STREAMKIT_LOG_FORMAT",
        "STREAMKIT_LOG_LEVEL",
    }
)

log = logging.getLogger("streamkit.settings")
# Unknown variables already warned about: each is named once per process.
_warned: set[str] = set()


def _url(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    check_redis_url(value, setting=attribute.name)


@attrs.frozen(kw_only=True)
class Settings:
    """Configuration shared by an :class:`~streamkit.App`, its streams and workers.

    Every field can be set by an environment variable named ``STREAMKIT_`` plus the
    field name in capitals (``STREAMKIT_REDIS_URL``, ``STREAMKIT_PARTITION_COUNT``) and
    by keyword arguments, which win. Unset a nullable setting from the environment
    with an empty value or ``none``.
    """

    #: Where Redis is: ``redis://[:password@]host[:port][/db]``, ``rediss://`` for TLS,
    #: ``redis+cluster://host:port`` (any node) for a Redis Cluster.
    redis_url: str = attrs.field(default=DEFAULT_REDIS_URL, validator=_url, repr=masked_repr)
    #: Partitions of a new stream (recorded in Redis on first use, then fixed).
    partition_count: int = attrs.field(default=DEFAULT_PARTITION_COUNT, validator=positive_int)
    #: Entries to keep per partition; older ones are trimmed once every consumer
    #: group has acknowledged them (never before).
    partition_size: int = attrs.field(default=DEFAULT_PARTITION_SIZE, validator=positive_int)
    #: A hard cap on a partition's length that trims even unprocessed entries (with a
    #: warning). Unset by default: nothing unprocessed is ever trimmed.
    max_len: int | None = attrs.field(default=None, validator=positive_int.or_none())
    #: Compress encoded records: ``"lz4"``, ``"zstd"`` or unset.
    compression: str | None = attrs.field(default=None, validator=valid_compression)
    #: Records sent per pipelined round trip by ``send_many``.
    send_chunk_size: int = attrs.field(default=DEFAULT_SEND_CHUNK_SIZE, validator=positive_int)
    #: The most bytes an encoded record (field names and values, after compression)
    #: may take: ``send`` refuses a larger one with an ``EncodeError`` before it
    #: reaches Redis (as it does one larger than the server accepts).
    max_record_size: int = attrs.field(default=DEFAULT_MAX_RECORD_SIZE, validator=positive_int)
    #: The most bytes an event's JSON payload may take once decompressed: a larger
    #: one is undecodable (dead-lettered under the default policy) and is never
    #: decompressed whole. Decoding takes up to about 30 times this in memory.
    max_decoded_size: int = attrs.field(default=DEFAULT_MAX_DECODED_SIZE, validator=positive_int)
    #: Seconds to wait for a TCP connection to Redis.
    connect_timeout: float = attrs.field(
        default=DEFAULT_CONNECT_TIMEOUT, validator=non_negative_number
    )
    #: Seconds to keep retrying an unreachable Redis when connecting (unset: forever).
    connect_give_up_after: float | None = attrs.field(
        default=DEFAULT_CONNECT_GIVE_UP_AFTER, validator=non_negative_number.or_none()
    )
    #: Seconds a one-shot command of the command line (``status``, ``send``, ``table
    #: get``, ``jobs info``, ...; not ``worker``, ``status --watch`` or ``dashboard``)
    #: keeps retrying an unreachable Redis before it says so, if less than
    #: ``connect_give_up_after``.
    command_give_up_after: float = attrs.field(
        default=DEFAULT_COMMAND_GIVE_UP_AFTER, validator=non_negative_number
    )

    #: Seconds a partition lease lives without renewal: how long a partition waits
    #: for a worker that died (renewed every third of it while alive).
    lease_ttl: float = attrs.field(default=DEFAULT_LEASE_TTL, validator=valid_ttl)
    #: Seconds between a worker's heartbeats.
    heartbeat_interval: float = attrs.field(
        default=DEFAULT_HEARTBEAT_INTERVAL, validator=positive_number
    )
    #: Seconds without a heartbeat after which a worker counts as dead and its
    #: partitions are reassigned.
    session_timeout: float = attrs.field(default=DEFAULT_SESSION_TIMEOUT, validator=positive_number)
    #: A stable id for this worker (static membership): if it leaves and returns
    #: within ``static_grace`` seconds (a rolling restart), nothing is reassigned.
    member_id: str | None = attrs.field(default=None)
    #: Seconds a static member's partitions wait for it to return.
    static_grace: float = attrs.field(default=DEFAULT_STATIC_GRACE, validator=positive_number)
    #: Seconds a processor gets to finish and acknowledge its current event when its
    #: partition moves or the worker shuts down, before it is cancelled.
    grace_period: float = attrs.field(default=DEFAULT_GRACE, validator=non_negative_number)
    #: Entries fetched per partition and round trip.
    batch_size: int = attrs.field(default=DEFAULT_BATCH_SIZE, validator=positive_int)
    #: Batches buffered per partition ahead of the processor (memory stays bounded
    #: by partitions x prefetch x batch_size entries, whatever the backlog).
    prefetch: int = attrs.field(default=DEFAULT_PREFETCH, validator=positive_int)
    #: Values a partition caches per table (state); uncommitted writes come on top.
    state_cache_size: int = attrs.field(default=DEFAULT_STATE_CACHE_SIZE, validator=positive_int)
    #: On Redis Cluster, replicas each master must acknowledge before the relay of
    #: emitted records moves on (``WAIT``), so that a failover neither repeats nor
    #: loses one; 0: do not wait (a failover may). See docs/state.md.
    state_replicas: int = attrs.field(default=0, validator=non_negative_int)
    #: Jobs a worker process runs at once (``streamkit worker --concurrency``).
    job_concurrency: int = attrs.field(default=32, validator=positive_int)
    #: Seconds after which a job whose worker stopped renewing its lease (killed,
    #: paused, cut off) is taken over by another worker.
    job_lease_ttl: float = attrs.field(default=DEFAULT_JOB_LEASE_TTL, validator=positive_number)
    #: Shards of the app's job queue; every producer and worker must agree on it.
    job_shards: int = attrs.field(default=1, validator=positive_int)
    #: Worker threads per process for jobs that are plain (not async) functions: as
    #: many as the jobs it runs at once by default, so that a busy thread never holds
    #: back the claim of an async job (a worker claims no more jobs than it has free
    #: threads, when it serves plain ones).
    job_threads: int = attrs.field(default=32, validator=positive_int)
    #: The largest encoded arguments, or result, of a job, in bytes: larger arguments
    #: are refused at enqueue, a job with a larger result ends dead. At most the
    #: server's ``proto-max-bulk-len``.
    job_max_bytes: int = attrs.field(default=DEFAULT_JOB_MAX_BYTES, validator=positive_int)
    #: Serve Prometheus metrics over HTTP on this port while a worker runs (``0``: any
    #: free port; unset: no endpoint). Needs the ``metrics`` extra. See
    #: ``streamkit worker --metrics-port``.
    metrics_port: int | None = attrs.field(default=None, validator=port_number.or_none())
    #: The address the metrics endpoint listens on: this machine only by default;
    #: ``0.0.0.0`` to be scraped from elsewhere (in a container, say).
    metrics_host: str = attrs.field(default=DEFAULT_METRICS_HOST)
    #: Seconds between two readings of lag, pending and job queue depths from Redis
    #: for the metrics (the counters are always current).
    metrics_refresh_interval: float = attrs.field(
        default=DEFAULT_METRICS_REFRESH_INTERVAL, validator=positive_finite_number
    )
    #: A token the metrics endpoint requires, as ``Authorization: Bearer TOKEN``
    #: (Prometheus's ``authorization`` scrape setting); unset: none. At least 16
    #: characters. See ``streamkit worker --metrics-token``.
    metrics_token: str | None = attrs.field(default=None, repr=False)
    #: The token ``streamkit dashboard`` requires (see its ``--token``): needed when it
    #: listens on an address other machines can reach. At least 16 characters.
    dashboard_token: str | None = attrs.field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from defaults, ``STREAMKIT_*`` variables and ``overrides``.

        Error handling:
            :class:`ConfigError` naming the setting (and the variable it came from)
            for an unknown keyword or a value that does not parse or validate.
        """
        environ = os.environ if environ is None else environ
        fields = attrs.fields_dict(cls)
        check_setting_names(overrides)
        _warn_unknown_variables(environ)
        values: dict[str, Any] = {}
        for name, field in fields.items():
            variable = ENV_PREFIX + name.upper()
            if variable in environ:
                values[name] = _parse(variable, environ[variable], field.type)
                try:
                    _Probe(**{name: values[name]})
                except ConfigError as exc:
                    raise ConfigError(variable, _message(exc)) from None
        values.update(overrides)
        return cls(**values)


def _message(exc: ConfigError) -> str:
    return str(exc).removeprefix(f"{exc.setting}: ")


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(close) + "?"
    return "known: " + ", ".join(known)


def check_setting_names(names: Mapping[str, object] | list[str], *, where: str = "") -> None:
    """Refuse names that are not :class:`Settings` fields, suggesting close ones.

    Error handling:
        :class:`ConfigError` naming the first unknown setting (``where`` says where
        it was given) and the known ones closest to it.
    """
    fields = list(attrs.fields_dict(Settings))
    unknown = sorted(set(names) - set(fields))
    if unknown:
        raise ConfigError(unknown[0], f"unknown setting{where}; {_suggest(unknown[0], fields)}")


def _warn_unknown_variables(environ: Mapping[str, str]) -> None:
    known = [ENV_PREFIX + name.upper() for name in attrs.fields_dict(Settings)]
    for variable in sorted(environ):
        if (
            variable.startswith(ENV_PREFIX)
            and variable not in known
            and variable not in OTHER_VARIABLES
            and variable not in _warned
        ):
            _warned.add(variable)
            log.warning(
                "ignoring the environment variable %s: it is not a streamkit setting; %s",
                variable,
                _suggest(variable, known),
            )


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


# Every field optional, with the same validators: checks one value alone. (Fields
# without a validator are here too, so that any variable can be probed.)
_Probe = attrs.make_class(
    "_Probe",
    {
        name: attrs.field(
            default=None,
            validator=None
            if field.validator is None
            else attrs.validators.optional(field.validator),
        )
        for name, field in attrs.fields_dict(Settings).items()
    },
    kw_only=True,
)
