"""The defaults of every setting, in one place at the bottom of the import graph.

A setting that configures one component defaults to that component's own default, so
an app's worker and the component used on its own agree: each component and
:class:`~streamkit.Settings` import the default from here. Pure constants, nothing
else.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_COMMAND_GIVE_UP_AFTER",
    "DEFAULT_CONNECT_GIVE_UP_AFTER",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_GRACE",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_JOB_LEASE_TTL",
    "DEFAULT_JOB_MAX_BYTES",
    "DEFAULT_JOB_MAX_DELIVERIES",
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_DECODED_SIZE",
    "DEFAULT_MAX_RECORD_SIZE",
    "DEFAULT_METRICS_HOST",
    "DEFAULT_METRICS_REFRESH_INTERVAL",
    "DEFAULT_PARTITION_COUNT",
    "DEFAULT_PARTITION_SIZE",
    "DEFAULT_PREFETCH",
    "DEFAULT_REDIS_URL",
    "DEFAULT_SEND_CHUNK_SIZE",
    "DEFAULT_SESSION_TIMEOUT",
    "DEFAULT_STATE_CACHE_SIZE",
    "DEFAULT_STATIC_GRACE",
    "MINIMUM_TTL",
]

# --- connecting -----------------------------------------------------------------------

#: Where Redis is unless told otherwise.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"
#: Seconds one connection attempt may take.
DEFAULT_CONNECT_TIMEOUT = 2.0
#: Seconds an app keeps retrying an unreachable server before it gives up.
DEFAULT_CONNECT_GIVE_UP_AFTER = 30.0
#: Seconds a one-shot command (``streamkit status``, ``send``, ``table get``, ...) keeps
#: retrying an unreachable server: it was asked a question, and answers soon.
DEFAULT_COMMAND_GIVE_UP_AFTER = 3.0

# --- streams --------------------------------------------------------------------------

#: Partitions of a stream unless the stream says otherwise.
DEFAULT_PARTITION_COUNT = 16
#: Entries a partition keeps before appends trim it (never past unprocessed entries).
DEFAULT_PARTITION_SIZE = 100_000
#: Entries appended per script call by the producer and the Spark writer.
DEFAULT_SEND_CHUNK_SIZE = 1_000
#: The most bytes an encoded record (its field names and values) may take: the
#: ``max_record_size`` setting's default.
DEFAULT_MAX_RECORD_SIZE = 16 * 2**20
#: The most bytes a JSON payload may take once decompressed (``max_decoded_size``):
#: decoding it takes up to about 30 times as much memory (tiny nested values), and a
#: compressed payload of a few kilobytes can stand for gigabytes.
DEFAULT_MAX_DECODED_SIZE = 16 * 2**20

# --- leases, membership, rebalancing --------------------------------------------------

#: The shortest lease TTL: Redis expires keys with millisecond precision.
MINIMUM_TTL = 0.001
#: How long a partition's lease lasts unless renewed: how long a partition of a
#: member that died (``kill -9``) stays locked after the group reassigned it.
DEFAULT_LEASE_TTL = 10.0
#: How long a moving partition's processor has to finish and acknowledge the event or
#: batch in hand.
DEFAULT_GRACE = 5.0
#: Seconds between heartbeats (and looks for dead members): under a third of the
#: session, so a member survives three missed beats (7 s without one, more than the 6.7 s
#: its leases survive), and a fleet's heartbeats cost Redis a third of what one a second
#: did (they were about two fifths of an idle fleet's calls; see docs/performance.md).
DEFAULT_HEARTBEAT_INTERVAL = 3.0
#: Seconds a heartbeat lasts: how long a silent member stays in the group.
DEFAULT_SESSION_TIMEOUT = 10.0
#: Seconds a static member's place is kept after it exits.
DEFAULT_STATIC_GRACE = 60.0

# --- fetching and state ---------------------------------------------------------------

#: Entries fetched per partition and round trip.
DEFAULT_BATCH_SIZE = 500
#: Batches buffered per partition ahead of the processor.
DEFAULT_PREFETCH = 2
#: Values a partition caches per table, at most (uncommitted writes come on top).
DEFAULT_STATE_CACHE_SIZE = 10_000

# --- jobs -----------------------------------------------------------------------------

#: The most bytes a job's encoded arguments, or its result, may take: 1 MiB is the
#: smallest ``proto-max-bulk-len`` Redis accepts, so the default fits any server.
DEFAULT_JOB_MAX_BYTES = 2**20
#: A running job's lease: a worker that stops renewing it (killed, paused, cut off)
#: loses its jobs to another worker after this many seconds: the ``job_lease_ttl``
#: setting.
DEFAULT_JOB_LEASE_TTL = 5.0
#: Times a job may lose its worker (the worker died while running it) before it is
#: considered to be what kills the workers, and goes to the dead-letter queue.
DEFAULT_JOB_MAX_DELIVERIES = 3

# --- metrics --------------------------------------------------------------------------

#: Seconds between two readings from Redis of what the pieces cannot count themselves
#: (lag, pending, job queue depths): the ``metrics_refresh_interval`` setting.
DEFAULT_METRICS_REFRESH_INTERVAL = 5.0
#: Where the metrics endpoint listens unless told otherwise.
DEFAULT_METRICS_HOST = "127.0.0.1"
