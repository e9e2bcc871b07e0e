"""streamkit: partitioned, ordered event processing on Redis Streams, for Trio.

What an app author and a service author use is here; the helpers under the pieces are
in :mod:`streamkit.lowlevel`, the job queue in :mod:`streamkit.jobs`, the clients for
code without a Trio loop in :mod:`streamkit.clients`.
"""

from typing import TYPE_CHECKING

# As trio.lowlevel: reachable as streamkit.lowlevel once streamkit is imported.
from . import lowlevel as lowlevel
from ._app import App as App
from ._backoff import Backoff as Backoff
from ._errors import (
    BackendError as BackendError,
    ConfigError as ConfigError,
    DecodeError as DecodeError,
    EncodeError as EncodeError,
    LateEvent as LateEvent,
    LockLost as LockLost,
    LockNotAcquired as LockNotAcquired,
    MetadataMismatch as MetadataMismatch,
    NotConnected as NotConnected,
    NotLockOwner as NotLockOwner,
    NotReplicated as NotReplicated,
    OutcomeUnknown as OutcomeUnknown,
    ProcessorHalted as ProcessorHalted,
    RedisUnavailable as RedisUnavailable,
    ServerRefused as ServerRefused,
    StreamkitError as StreamkitError,
    WrongPartition as WrongPartition,
)
from ._events import (
    Event as Event,
    Events as Events,
    Middleware as Middleware,
    open_events as open_events,
)
from ._feed import PartitionFeed as PartitionFeed
from ._fetcher import Fetcher as Fetcher, open_fetcher as open_fetcher
from ._joins import StreamJoin as StreamJoin
from ._leadership import (
    LeaderElection as LeaderElection,
    open_leader_election as open_leader_election,
)
from ._locks import (
    HeldLease as HeldLease,
    Lease as Lease,
    LockManager as LockManager,
    open_lock_manager as open_lock_manager,
)
from ._logs import configure_logging as configure_logging, log_context as log_context
from ._membership import Membership as Membership, open_membership as open_membership
from ._partitioner import Partitioner as Partitioner, partition_for as partition_for
from ._policies import ExceptionPolicy as ExceptionPolicy, run_processor as run_processor
from ._public import fix_module_metadata as _fix_module_metadata, moved as _moved
from ._rebalancer import Rebalancer as Rebalancer, open_rebalancer as open_rebalancer
from ._records import Record as Record
from ._redis import Redis as Redis, open_redis as open_redis
from ._settings import Settings as Settings
from ._spec import ProcessorKeys as ProcessorKeys, StreamSpec as StreamSpec
from ._streams import Stream as Stream
from ._tables import Table as Table
from ._tables_windowed import WindowedTable as WindowedTable
from ._windows import (
    Window as Window,
    hopping as hopping,
    session as session,
    tumbling as tumbling,
)
from ._worker import Worker as Worker, run_worker as run_worker

__version__ = "0.1.0"


_fix_module_metadata(__name__, globals())

if not TYPE_CHECKING:
    # The names that moved to streamkit.lowlevel stay importable from here for a
    # while, with a DeprecationWarning (type checkers see only the new place).
    __getattr__ = _moved(__name__, "streamkit.lowlevel")

del TYPE_CHECKING, _fix_module_metadata, _moved
