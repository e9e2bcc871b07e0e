"""streamkit streams as a PySpark data source and sink (the ``streamkit[spark]`` extra).

Register the data source once per session, then read and write streams by name::

    from streamkit.spark import register

    register(spark)
    orders = (
        spark.read.format("streamkit")
        .option("url", "redis://127.0.0.1:6379")
        .option("app", "orders_demo")
        .option("stream", "orders")
        .option("record", "examples.orders.app:Order")
        .load()
    )

See ``docs/spark.md`` for every option, the schema mapping and the guarantees.
"""

from __future__ import annotations

from ._schema import read_schema as _read_schema, record_schema as _record_schema
from ._source import (
    StreamkitDataSource as StreamkitDataSource,
    StreamNotFound as StreamNotFound,
    register as register,
)

__all__ = ["StreamNotFound", "StreamkitDataSource", "register", "spark_schema"]


def spark_schema(record: type, *, with_metadata: bool = True) -> object:
    """The Spark schema (a ``StructType``) a read with ``record`` produces.

    Args:
        record: a :class:`~streamkit.Record` subclass or other attrs class.
        with_metadata: include the ``partition``, ``entry_id`` and ``event_time``
            columns that every read starts with.

    Raises:
        ConfigError: a field's type has no Spark equivalent.
    """
    schema = _record_schema(record)
    return _read_schema(schema) if with_metadata else schema.struct
