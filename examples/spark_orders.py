"""A PySpark pipeline over the orders stream: totals per customer per hour.

Reads the ``orders`` stream of the ``orders_demo`` app (``examples/orders/app.py``) with
the ``streamkit`` data source, sums each customer's orders per hour of ``created_at``,
and writes the totals to the ``customer_totals`` stream (which streamkit workers could
process like any other) and, with ``--parquet DIR``, to Parquet.

Run it on a private, throwaway Redis server filled with 20,000 demo orders::

    .venv/bin/python -m examples.spark_orders

or against your own server, whose ``orders`` stream the demo or workers fill::

    .venv/bin/python -m examples.spark_orders --url redis://127.0.0.1:6379 --parquet /tmp/totals

Needs the ``streamkit[spark]`` extra and Java 17 or later.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from streamkit import Record

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROOT = Path(__file__).resolve().parent.parent
APP = "orders_demo"
RESULTS = "customer_totals"


class CustomerTotal(Record):
    """One customer's orders in one hour."""

    customer: str
    window_start: datetime
    orders: int
    total: float


def totals_per_customer_per_hour(orders: DataFrame) -> DataFrame:
    """The pipeline itself: a plain Spark aggregation over the typed orders columns."""
    from pyspark.sql import functions as F

    return (
        orders.groupBy("customer", F.window("created_at", "1 hour").alias("window"))
        .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("total"))
        .select("customer", F.col("window.start").alias("window_start"), "orders", "total")
    )


def run(spark: SparkSession, url: str, parquet: str | None = None) -> DataFrame:
    """Read the orders, write the totals to the results stream (and Parquet); return them.

    Writes with ``writeId=customer-totals``, so running the pipeline again over the same
    orders adds no duplicate totals to the results stream.
    """
    # docs: start read
    orders = (
        spark.read.format("streamkit")
        .option("url", url)
        .option("app", APP)
        .option("stream", "orders")
        .option("record", "examples.orders.app:Order")
        .load()
    )
    # docs: end read
    totals = totals_per_customer_per_hour(orders).cache()
    # docs: start write
    (
        totals.write.format("streamkit")
        .mode("append")
        .option("url", url)
        .option("app", APP)
        .option("stream", RESULTS)
        .option("record", "examples.spark_orders:CustomerTotal")
        .option("partitionCount", "4")
        .option("key", "customer")
        .option("writeId", "customer-totals")
        .save()
    )
    # docs: end write
    if parquet is not None:
        totals.write.mode("overwrite").parquet(parquet)
    return totals


def send_demo_orders(url: str, count: int) -> None:
    """Fill the orders stream with ``count`` orders over a few hours, as the demo does."""
    import trio

    from examples.orders.app import Order
    from streamkit import App

    async def produce() -> None:
        app = App(APP, redis_url=url)
        stream = app.stream("orders", record=Order, partition_by="customer", partition_count=8)
        rng = random.Random(7)
        start = datetime(2026, 1, 1, tzinfo=UTC)
        async with app:
            await stream.send_many(
                Order(
                    order_id=i,
                    customer=f"customer-{rng.randrange(100):03d}",
                    amount=round(rng.uniform(1, 500), 2),
                    created_at=start + timedelta(seconds=i),
                )
                for i in range(count)
            )

    trio.run(produce)


def spark_session() -> SparkSession:
    """A local session whose Python workers are this interpreter and see this project."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    # docs: start session
    from pyspark.sql import SparkSession

    from streamkit.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("streamkit-orders")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    # docs: end session
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description="Totals per customer per hour, with Spark.")
    parser.add_argument("--url", help="Redis URL (default: a private throwaway server)")
    parser.add_argument("--parquet", help="also write the totals to this Parquet directory")
    parser.add_argument("--orders", type=int, default=20_000, help="demo orders to send")
    args = parser.parse_args()

    from streamkit.testing import RedisServer

    server = None
    url = args.url
    if url is None:
        server = RedisServer()
        server.start()
        url = server.url
        send_demo_orders(url, args.orders)
    spark = spark_session()
    try:
        totals = run(spark, url, args.parquet)
        print(f"{totals.count():,} customer-hour totals written to {APP}.{RESULTS}")
        totals.orderBy("total", ascending=False).show(10, truncate=False)
    finally:
        spark.stop()
        if server is not None:
            server.close()


if __name__ == "__main__":
    main()
