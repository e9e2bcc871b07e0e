"""What a stream is, as a pure value: names, keys, codec, partitioner and metadata.

A :class:`StreamSpec` does no I/O and holds no connection. The producer
(:class:`~streamkit.Stream`, bound to an app), the fetcher, the dead-letter tools, the
command line and the Spark data source all take their facts about a stream from it::

    orders = StreamSpec(app="shop", name="orders", record=Order,
                        partition_by="customer", partition_count=8)
    orders.key(3)                          # '__strm:{shop.orders.3}'
    printer = orders.processor("printer")  # the keys of one processor of the stream
    printer.group, printer.dead_letter_key, printer.lock_name(3)
"""

from __future__ import annotations

import types
import typing
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import attrs

from . import _keys
from ._codec import Codec, codec_for
from ._errors import ConfigError
from ._partitioner import Partitioner
from ._records import is_primitive
from ._wire import (
    DEFAULT_MAX_DECODED_SIZE,
    DEFAULT_MAX_RECORD_SIZE,
    METADATA_VERSION,
    OPTIONAL_MARK,
    SCHEMA_SEPARATOR,
)

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "HasSpec",
    "ProcessorKeys",
    "StreamSpec",
    "processor_keys",
    "record_metadata",
    "record_schema",
    "spec_of",
]

R = TypeVar("R")


def record_metadata(record: type[Any]) -> dict[str, str]:
    """The metadata fields that describe a stream's record type.

    ``record`` (the class's name), ``format`` and ``schema``: the fields as
    ``name:type`` separated by ``;``, each marked ``?`` when it has a default, e.g.
    ``customer:str;amount:int;?note:str | None``. Types are written by name
    (``list[Line]``, ``int | None``), nested records by their class name.
    """
    return {
        "record": record.__qualname__,
        "format": "primitive" if is_primitive(record) else "json",
        "schema": record_schema(record),
    }


def record_schema(record: type[Any]) -> str:
    """The ``schema`` metadata of ``record`` (empty for ``dict`` and non-attrs classes)."""
    if not attrs.has(record):
        return ""
    try:
        hints = typing.get_type_hints(record)
    except (NameError, TypeError):
        hints = {}
    items = []
    for field in attrs.fields(record):
        if not field.init:
            continue  # derived from the others, never stored
        annotation = hints.get(field.name, field.type)
        optional = OPTIONAL_MARK if field.default is not attrs.NOTHING else ""
        items.append(f"{optional}{field.name}:{_type_text(annotation)}")
    return SCHEMA_SEPARATOR.join(items)


def _type_text(annotation: object) -> str:
    if annotation is None or annotation is type(None):
        return "None"
    if isinstance(annotation, str):
        return annotation  # an annotation that could not be resolved
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(arg) for arg in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(arg) for arg in args)}]"
    if origin is not None:
        inner = ", ".join("..." if arg is Ellipsis else _type_text(arg) for arg in args)
        return f"{_type_text(origin)}[{inner}]"
    if isinstance(annotation, type):
        return annotation.__qualname__
    return repr(annotation).removeprefix("typing.")


def _name(kind: str) -> Callable[[object, attrs.Attribute[Any], str], None]:
    def check(_: object, __: attrs.Attribute[Any], value: str) -> None:
        _keys.validate_name(kind, value)

    return check


@attrs.frozen(kw_only=True, repr=False)
class StreamSpec(Generic[R]):
    """A partitioned stream's description: everything but a connection.

    Attributes:
        app: the app (namespace) the stream belongs to.
        name: the stream's name.
        record: the record type of its events.
        partition_by: a field name of ``record``, or a function of a record returning
            its partition key.
        partition_count: the number of partitions.
        compression: ``"lz4"``, ``"zstd"`` or ``None``: how the producer compresses
            JSON payloads (consumers read every format).
        max_decoded_size: the most bytes a JSON payload may take once decompressed;
            larger entries are undecodable (the ``max_decoded_size`` setting).
        max_record_size: the most bytes an encoded record may take (the
            ``max_record_size`` setting).
        codec: the record codec (derived).
        partitioner: the partitioner (derived).

    Error handling:
        :class:`~streamkit.ConfigError` for a bad name, record type, partition key or
        count, or compression.
    """

    app: str = attrs.field(validator=_name("app name"))
    name: str = attrs.field(validator=_name("stream"))
    record: type[R]
    partition_by: str | Callable[[R], object]
    partition_count: int
    compression: str | None = None
    max_decoded_size: int = DEFAULT_MAX_DECODED_SIZE
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE
    codec: Codec[R] = attrs.field(init=False, eq=False)
    partitioner: Partitioner[R] = attrs.field(init=False, eq=False)

    def __attrs_post_init__(self) -> None:
        codec = codec_for(
            self.record,
            compression=self.compression,
            max_decoded_size=self.max_decoded_size,
            max_record_size=self.max_record_size,
            stream=self.name,
        )
        object.__setattr__(self, "codec", codec)
        object.__setattr__(
            self,
            "partitioner",
            Partitioner(
                partition_by=self.partition_by,
                partition_count=self.partition_count,
                record=self.record,
            ),
        )

    def key(self, partition: int) -> str:
        """The Redis key of ``partition``."""
        return _keys.stream_key(self.app, self.name, partition)

    def partition_keys(self) -> list[str]:
        """The Redis keys of all partitions, in partition order."""
        return [self.key(p) for p in range(self.partition_count)]

    @property
    def meta_key(self) -> str:
        """The Redis hash recording the stream's metadata."""
        return _keys.meta_key(self.app, self.name)

    def partition_of(self, record: R) -> int:
        """The partition ``record`` belongs to."""
        return self.partitioner.partition_of(record)

    def metadata(self) -> dict[str, str]:
        """What this process believes about the stream, as recorded in Redis."""
        return {
            "version": METADATA_VERSION,
            "partition_count": str(self.partition_count),
            **record_metadata(self.record),
            "partition_by": self.partition_by if isinstance(self.partition_by, str) else "",
        }

    def processor(self, name: str) -> ProcessorKeys:
        """The keys of processor ``name`` of this stream (its group, locks, dead letters).

        Error handling:
            :class:`~streamkit.ConfigError` for a name that is not letters, digits,
            ``_`` and ``-``.
        """
        return ProcessorKeys(app=self.app, stream=self.name, processor=name)

    def __repr__(self) -> str:
        return (
            f"<StreamSpec {self.app}.{self.name} record={self.record.__qualname__} "
            f"partitions={self.partition_count}>"
        )


@attrs.frozen(kw_only=True)
class ProcessorKeys:
    """The Redis names of one processor of a stream.

    Get one from :meth:`StreamSpec.processor`.

    Attributes:
        app: the app's name.
        stream: the stream's name.
        processor: the processor's name.
    """

    app: str = attrs.field(validator=_name("app name"))
    stream: str = attrs.field(validator=_name("stream"))
    processor: str = attrs.field(validator=_name("processor name"))

    @property
    def group(self) -> str:
        """The processor's consumer group, also its membership group."""
        return _keys.processor_group(self.app, self.stream, self.processor)

    @property
    def dead_letter_key(self) -> str:
        """The Redis stream collecting the processor's dead letters."""
        return _keys.dead_letter_key(self.app, self.stream, self.processor)

    def lock_name(self, partition: int) -> str:
        """The lock name (for :class:`~streamkit.LockManager`) of the processor's
        lease on ``partition``: it shares the partition's Redis Cluster slot, so reads
        and acknowledgements can be fenced by it in one script."""
        return _keys.partition_lock_name(self.app, self.stream, self.processor, partition)


class HasSpec(Protocol[R]):
    """Anything that carries a stream's description, such as a bound
    :class:`~streamkit.Stream`."""

    @property
    def spec(self) -> StreamSpec[R]: ...


def spec_of(stream: StreamSpec[R] | HasSpec[R]) -> StreamSpec[R]:
    """The :class:`StreamSpec` of ``stream``: itself, or what it carries."""
    if isinstance(stream, StreamSpec):
        return stream
    spec = getattr(stream, "spec", None)
    if not isinstance(spec, StreamSpec):
        raise ConfigError("stream", f"expected a StreamSpec or a Stream, got {stream!r}")
    return spec


def processor_keys(stream: StreamSpec[Any], group: str | ProcessorKeys) -> ProcessorKeys:
    """``group`` as the keys of a processor of ``stream``.

    Error handling:
        :class:`~streamkit.ConfigError` if ``group`` is not a processor of ``stream``
        (a consumer group name is ``app.stream.processor``).
    """
    if isinstance(group, ProcessorKeys):
        if (group.app, group.stream) != (stream.app, stream.name):
            raise ConfigError("group", f"{group.group!r} is not a group of {stream!r}")
        return group
    prefix = f"{stream.app}.{stream.name}."
    if not (isinstance(group, str) and group.startswith(prefix)):
        raise ConfigError(
            "group",
            f"expected {prefix}<processor> or stream.processor(name), got {group!r}",
        )
    return stream.processor(group[len(prefix) :])
