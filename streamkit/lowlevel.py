"""streamkit.lowlevel: the helpers under the pieces, for those who build on them.

:mod:`streamkit` holds what an app author and a service author use: the app, records,
streams, the events and their policies, tables and windows, the pieces' ``open_*``
entry points and the objects they yield, and the errors to catch. This module holds
the rest, as ``trio.lowlevel`` does for Trio: talking to Redis directly
(:func:`redis_errors`, :func:`call_once`, :func:`retry_idempotent`,
:func:`run_blocking`), the pure decisions the pieces make (:func:`assign`,
:func:`diff`, :func:`plan_rebalance`), the feed protocol's batches, the codecs, the
pieces' settings and statistics objects, the membership's admin calls, log formatters,
and the errors that are finer than a caller needs to tell apart. See the API page of
the documentation for what is where, and why.
"""

from ._assignment import (
    Assignment as Assignment,
    AssignmentDiff as AssignmentDiff,
    Assignor as Assignor,
    assign as assign,
    diff as diff,
)
from ._codec import Codec as Codec, codec_for as codec_for
from ._commit import Changes as Changes
from ._errors import (
    GroupExists as GroupExists,
    NoSuchGroup as NoSuchGroup,
    NotPermitted as NotPermitted,
)
from ._event import DivertHook as DivertHook
from ._feed import Batch as Batch, FeedEnded as FeedEnded
from ._fetcher import FetcherStatistics as FetcherStatistics
from ._locks import LockInfo as LockInfo, LockManagerStatistics as LockManagerStatistics
from ._logs import (
    ConsoleLogFormatter as ConsoleLogFormatter,
    JsonLogFormatter as JsonLogFormatter,
    LogContextFilter as LogContextFilter,
)
from ._membership import MembershipStatistics as MembershipStatistics
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
from ._partitioner import canonical_key_bytes as canonical_key_bytes, key_text as key_text
from ._public import fix_module_metadata as _fix_module_metadata
from ._rebalancer import (
    Claim as Claim,
    RebalancePlan as RebalancePlan,
    RebalancerSettings as RebalancerSettings,
    RebalancerStatistics as RebalancerStatistics,
    plan_rebalance as plan_rebalance,
)
from ._records import is_primitive as is_primitive
from ._redis import (
    RedisStatistics as RedisStatistics,
    call_once as call_once,
    redis_errors as redis_errors,
    redis_statistics as redis_statistics,
    retry_idempotent as retry_idempotent,
    run_blocking as run_blocking,
)
from ._replay import (
    PartitionReplay as PartitionReplay,
    ResetIncomplete as ResetIncomplete,
    ResetPlan as ResetPlan,
    ResetRefused as ResetRefused,
)
from ._table_joins import GlobalTable as GlobalTable
from ._tables_versioned import VersionedTable as VersionedTable

__all__ = [
    "Assignment",
    "AssignmentDiff",
    "Assignor",
    "Batch",
    "Changes",
    "Claim",
    "Codec",
    "ConsoleLogFormatter",
    "DivertHook",
    "FeedEnded",
    "FetcherStatistics",
    "GlobalTable",
    "GroupExists",
    "JsonLogFormatter",
    "LockInfo",
    "LockManagerStatistics",
    "LogContextFilter",
    "MemberInfo",
    "MembershipKeys",
    "MembershipSettings",
    "MembershipSnapshot",
    "MembershipStatistics",
    "NoSuchGroup",
    "NotPermitted",
    "PartitionReplay",
    "RebalancePlan",
    "RebalancerSettings",
    "RebalancerStatistics",
    "RedisStatistics",
    "ResetIncomplete",
    "ResetPlan",
    "ResetRefused",
    "VersionedTable",
    "assign",
    "call_once",
    "canonical_key_bytes",
    "codec_for",
    "diff",
    "is_primitive",
    "key_text",
    "membership_keys",
    "plan_rebalance",
    "read_membership",
    "redis_errors",
    "redis_statistics",
    "reset_membership",
    "retry_idempotent",
    "run_blocking",
]

_fix_module_metadata(__name__, globals())
del _fix_module_metadata
