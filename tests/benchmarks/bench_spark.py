"""Spark batch write and read throughput against bare redis-py loops, side by side.

Run with ``.venv/bin/python tests/benchmarks/bench_spark.py`` (``--events`` to change
the default of 1,000,000). Everything runs on one private redis-server:

* Spark write: ``df.write.format("streamkit")`` of ``Tick`` rows (local[2]), against a
  redis-py loop appending the same, pre-encoded entries with pipelined ``XADD``.
* Spark read: ``spark.read.format("streamkit")`` with the record class, every row
  materialised (``noop`` sink), against a redis-py ``XRANGE`` paging loop that only
  fetches the entries (no decoding).

One warm-up job runs first, so that the figures do not include starting Spark's
Python workers; each Spark figure does include job planning and scheduling.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from streamkit import Record

ROOT = Path(__file__).resolve().parents[2]
APP = "bench"


class Tick(Record):
    symbol: str
    price: float
    volume: int


def bare_write(url: str, n: int, partitions: int) -> float:
    import redis

    from streamkit import partition_for
    from streamkit.lowlevel import codec_for

    encode = codec_for(Tick).encode
    entries = [
        (
            partition_for(f"S{i % 500}", partitions),
            encode(Tick(symbol=f"S{i % 500}", price=i / 100, volume=i)),
        )
        for i in range(n)
    ]
    with redis.Redis.from_url(url) as client:
        began = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for count, (partition, fields) in enumerate(entries, 1):
            pipe.xadd(f"__strm:{{{APP}.bare.{partition}}}", fields)  # type: ignore[arg-type, unused-ignore]
            if count % 1000 == 0:
                pipe.execute()
        pipe.execute()
        return n / (time.perf_counter() - began)


def bare_read(url: str, n: int, partitions: int) -> float:
    import redis

    read = 0
    with redis.Redis.from_url(url) as client:
        began = time.perf_counter()
        for partition in range(partitions):
            low = "-"
            while True:
                entries = client.xrange(f"__strm:{{{APP}.ticks.{partition}}}", low, "+", 5000)
                read += len(entries)
                if len(entries) < 5000:
                    break
                low = "(" + entries[-1][0].decode()
        elapsed = time.perf_counter() - began
    assert read == n, (read, n)
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    n, partitions = args.events, args.partitions

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    from pyspark.sql import SparkSession

    from streamkit.spark import register
    from streamkit.testing import RedisServer

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    with RedisServer() as server:

        def writer(stream: str) -> object:
            return (
                spark.range(n, numPartitions=2)
                .selectExpr(
                    "concat('S', cast(id % 500 as string)) as symbol",
                    "id / 100.0D as price",
                    "id as volume",
                )
                .write.format("streamkit")
                .mode("append")
                .option("url", server.url)
                .option("app", APP)
                .option("stream", stream)
                .option("record", "tests.benchmarks.bench_spark:Tick")
                .option("partitionCount", str(partitions))
                .option("key", "symbol")
                .option("partitionSize", str(n * 2))  # measure appends, not trimming
            )

        def reader(stream: str) -> object:
            return (
                spark.read.format("streamkit")
                .option("url", server.url)
                .option("app", APP)
                .option("stream", stream)
                .option("record", "tests.benchmarks.bench_spark:Tick")
                .load()
            )

        # Warm-up: start the Python workers.
        writer("warmup").save()  # type: ignore[attr-defined]
        reader("warmup").write.format("noop").mode("overwrite").save()  # type: ignore[attr-defined]

        began = time.perf_counter()
        writer("ticks").save()  # type: ignore[attr-defined]
        spark_write = n / (time.perf_counter() - began)
        write_baseline = bare_write(server.url, n, partitions)

        began = time.perf_counter()
        reader("ticks").write.format("noop").mode("overwrite").save()  # type: ignore[attr-defined]
        spark_read = n / (time.perf_counter() - began)
        read_baseline = bare_read(server.url, n, partitions)
    spark.stop()

    print(f"{n:,} Tick events, {partitions} partitions, Spark local[2]")
    print(f"{'':28}{'events/s':>12}")
    print(f"{'spark batch write':28}{spark_write:>12,.0f}")
    print(f"{'redis-py pipelined XADD':28}{write_baseline:>12,.0f}")
    print(f"{'  ratio':28}{spark_write / write_baseline:>12.2f}")
    print(f"{'spark batch read':28}{spark_read:>12,.0f}")
    print(f"{'redis-py XRANGE paging':28}{read_baseline:>12,.0f}")
    print(f"{'  ratio':28}{spark_read / read_baseline:>12.2f}")


if __name__ == "__main__":
    main()
