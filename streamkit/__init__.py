"""streamkit: partitioned, ordered event processing on Redis Streams, for Trio."""

from ._app import App as App, NotConnected as NotConnected
from ._assignment import (
    Assignment as Assignment,
    AssignmentDiff as AssignmentDiff,
    Assignor as Assignor,
    assign as assign,
    diff as diff,
)
from ._codec import Codec as Codec, codec_for as codec_for
from ._errors import (
    BackendError as BackendError,
    ConfigError as ConfigError,
    DecodeError as DecodeError,
    EncodeError as EncodeError,
    LockLost as LockLost,
    LockNotAcquired as LockNotAcquired,
    MetadataMismatch as MetadataMismatch,
    NotLockOwner as NotLockOwner,
    RedisUnavailable as RedisUnavailable,
    StreamkitError as StreamkitError,
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
from ._membership import (
    MemberInfo as MemberInfo,
    Membership as Membership,
    MembershipSnapshot as MembershipSnapshot,
    MembershipKeys as MembershipKeys,
    MembershipSettings as MembershipSettings,
    MembershipStatistics as MembershipStatistics,
    membership_keys as membership_keys,
    reset_membership as reset_membership,
    open_membership as open_membership,
    read_membership as read_membership,
)
from ._partitioner import (
    Partitioner as Partitioner,
    canonical_key_bytes as canonical_key_bytes,
    partition_for as partition_for,
)
from ._records import Record as Record, is_primitive as is_primitive
from ._redis import Redis as Redis, open_redis as open_redis, redis_errors as redis_errors
from ._settings import Settings as Settings
from ._streams import Stream as Stream

__version__ = "0.1.0"
