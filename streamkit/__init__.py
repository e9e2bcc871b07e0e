"""streamkit: partitioned, ordered event processing on Redis Streams, for Trio."""

from ._app import App as App
from ._assignment import (
    Assignment as Assignment,
    AssignmentDiff as AssignmentDiff,
    Assignor as Assignor,
    assign as assign,
    diff as diff,
)
from ._backoff import Backoff as Backoff
from ._codec import Codec as Codec, codec_for as codec_for
from ._commit import Changes as Changes
from ._errors import (
    BackendError as BackendError,
    ConfigError as ConfigError,
    DecodeError as DecodeError,
    EncodeError as EncodeError,
    GroupExists as GroupExists,
    LateEvent as LateEvent,
    LockLost as LockLost,
    LockNotAcquired as LockNotAcquired,
    MetadataMismatch as MetadataMismatch,
    NoSuchGroup as NoSuchGroup,
    NotConnected as NotConnected,
    NotLockOwner as NotLockOwner,
    NotPermitted as NotPermitted,
    NotReplicated as NotReplicated,
    OutcomeUnknown as OutcomeUnknown,
    ProcessorHalted as ProcessorHalted,
    RedisUnavailable as RedisUnavailable,
    ServerRefused as ServerRefused,
    StreamkitError as StreamkitError,
    WrongPartition as WrongPartition,
)
from ._events import (
    DivertHook as DivertHook,
    Event as Event,
    Events as Events,
    Middleware as Middleware,
    open_events as open_events,
)
from ._feed import Batch as Batch, FeedEnded as FeedEnded, PartitionFeed as PartitionFeed
from ._fetcher import (
    Fetcher as Fetcher,
    FetcherStatistics as FetcherStatistics,
    open_fetcher as open_fetcher,
)
from ._leadership import (
    LeaderElection as LeaderElection,
    open_leader_election as open_leader_election,
)
from ._locks import (
    HeldLease as HeldLease,
    Lease as Lease,
    LockInfo as LockInfo,
    LockManager as LockManager,
    LockManagerStatistics as LockManagerStatistics,
    open_lock_manager as open_lock_manager,
)
from ._logs import (
    ConsoleLogFormatter as ConsoleLogFormatter,
    JsonLogFormatter as JsonLogFormatter,
    LogContextFilter as LogContextFilter,
    configure_logging as configure_logging,
    log_context as log_context,
)
from ._membership import (
    Membership as Membership,
    MembershipStatistics as MembershipStatistics,
    open_membership as open_membership,
)
from ._membership_admin import (
    MembershipSnapshot as MembershipSnapshot,
    read_membership as read_membership,
    reset_membership as reset_membership,
)
from ._membership_settings import MembershipSettings as MembershipSettings
from ._membership_state import (
    MemberInfo as MemberInfo,
    MembershipKeys as MembershipKeys,
    membership_keys as membership_keys,
)
from ._partitioner import (
    Partitioner as Partitioner,
    canonical_key_bytes as canonical_key_bytes,
    partition_for as partition_for,
)
from ._policies import ExceptionPolicy as ExceptionPolicy, run_processor as run_processor
from ._public import fix_module_metadata as _fix_module_metadata
from ._rebalancer import (
    Claim as Claim,
    RebalancePlan as RebalancePlan,
    Rebalancer as Rebalancer,
    RebalancerSettings as RebalancerSettings,
    RebalancerStatistics as RebalancerStatistics,
    open_rebalancer as open_rebalancer,
    plan_rebalance as plan_rebalance,
)
from ._records import Record as Record, is_primitive as is_primitive
from ._redis import (
    Redis as Redis,
    RedisStatistics as RedisStatistics,
    call_once as call_once,
    open_redis as open_redis,
    redis_errors as redis_errors,
    redis_statistics as redis_statistics,
    retry_idempotent as retry_idempotent,
    run_blocking as run_blocking,
)
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

del _fix_module_metadata
