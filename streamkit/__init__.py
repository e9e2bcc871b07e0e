"""streamkit: partitioned, ordered event processing on Redis Streams, for Trio."""

import contextlib
import typing

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
from ._errors import (
    BackendError as BackendError,
    ConfigError as ConfigError,
    DecodeError as DecodeError,
    EncodeError as EncodeError,
    GroupExists as GroupExists,
    LockLost as LockLost,
    LockNotAcquired as LockNotAcquired,
    MetadataMismatch as MetadataMismatch,
    NoSuchGroup as NoSuchGroup,
    NotConnected as NotConnected,
    NotLockOwner as NotLockOwner,
    OutcomeUnknown as OutcomeUnknown,
    ProcessorHalted as ProcessorHalted,
    RedisUnavailable as RedisUnavailable,
    ServerRefused as ServerRefused,
    StreamkitError as StreamkitError,
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
from ._worker import Worker as Worker, run_worker as run_worker

__version__ = "0.1.0"


def _fixup_module_metadata() -> None:
    """Make public names report ``streamkit`` as their module, as trio's do, so that
    tracebacks, reprs and docs show ``streamkit.LockLost``, not ``streamkit._errors``.

    Classes with annotations keep their home module: type hints are resolved there."""
    seen: set[int] = set()

    def fix(qualname: str, obj: object) -> None:
        if id(obj) in seen or not getattr(obj, "__module__", "").startswith("streamkit._"):
            return
        own = vars(obj).get("__annotations__") if isinstance(obj, type) else None
        if own:
            # typing.get_type_hints (cattrs, attrs) resolves a class's annotations in
            # the namespace of its __module__: resolve them at home first. (Where names
            # were imported for type checking only, they resolve nowhere anyway.)
            with contextlib.suppress(Exception):
                hints = typing.get_type_hints(obj, include_extras=True)
                obj.__annotations__ = {n: hints.get(n, v) for n, v in own.items()}
        seen.add(id(obj))
        obj.__module__ = __name__
        if isinstance(obj, type):
            for attr, value in vars(obj).items():
                if callable(value) and getattr(value, "__qualname__", "").startswith(qualname):
                    fix(f"{qualname}.{attr}", value)

    for name, value in list(globals().items()):
        if not name.startswith("_") and (isinstance(value, type) or callable(value)):
            fix(getattr(value, "__qualname__", name), value)


_fixup_module_metadata()
del _fixup_module_metadata
