"""Structured Streaming over the orders stream: new orders to Parquet, incrementally.

Each run of the query reads the orders sent since the previous run (its offsets, the
last entry id per partition, live in the checkpoint), in micro-batches of at most
``maxEventsPerTrigger`` orders, appends them to Parquet and stops
(``Trigger.AvailableNow``). The demo sends orders, runs the query, sends more and runs
it again: the second run reads only the new ones.

Run it on a private, throwaway Redis server::

    .venv/bin/python -m examples.spark_stream_orders

Needs the ``streamkit[spark]`` extra and Java 17 or later.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from examples.spark_orders import APP, send_demo_orders, spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def orders_to_parquet(spark: SparkSession, url: str, directory: Path) -> int:
    """Append the orders not seen yet to Parquet under ``directory``; return the total."""
    # docs: start stream
    query = (
        spark.readStream.format("streamkit")
        .option("url", url)
        .option("app", APP)
        .option("stream", "orders")
        .option("record", "examples.orders.app:Order")
        .option("maxEventsPerTrigger", "10000")
        .load()
        .writeStream.format("parquet")
        .option("path", str(directory / "orders"))
        .option("checkpointLocation", str(directory / "orders.checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    # docs: end stream
    query.awaitTermination()
    return spark.read.parquet(str(directory / "orders")).count()


def main() -> None:
    parser = argparse.ArgumentParser(description="Orders to Parquet with Structured Streaming.")
    parser.add_argument("--url", help="Redis URL (default: a private throwaway server)")
    parser.add_argument("--orders", type=int, default=3000, help="demo orders per round")
    args = parser.parse_args()

    from streamkit.testing import RedisServer

    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(RedisServer()).url
        directory = stack.enter_context(tempfile.TemporaryDirectory())
        spark = spark_session()
        try:
            for round_ in (1, 2):
                # Demo orders are numbered from 0 each time: the second round's are new
                # entries with the same contents.
                send_demo_orders(url, args.orders)
                total = orders_to_parquet(spark, url, Path(directory))
                print(f"round {round_}: {total:,} orders in Parquet", flush=True)
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
