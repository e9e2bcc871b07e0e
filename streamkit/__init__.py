"""streamkit: partitioned, ordered event processing on Redis Streams, for Trio."""

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

__version__ = "0.1.0"
