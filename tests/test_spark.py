"""The Spark data source on a real local SparkSession (local[2]) and a real Redis.

One SparkSession serves the whole module (starting one takes seconds). Spark's Python
workers import the record classes by name, so they live in ``tests/spark/records.py``
and the repository root is put on the workers' ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import shutil
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest

pytest.importorskip("pyspark")
redis_py = pytest.importorskip("redis")

import trio  # noqa: E402

from streamkit import App, EncodeError, partition_for  # noqa: E402
from streamkit._worker import run_worker  # noqa: E402
from streamkit.lowlevel import codec_for  # noqa: E402
from streamkit.testing import wait_until  # noqa: E402
from tests.apps.scenario import SEEN, Numbered, make_app  # noqa: E402
from tests.spark.records import Line, Order, Reading, Status  # noqa: E402
from tests.test_hostile import zstd_bomb  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import DataFrame, SparkSession

    from streamkit.testing import RedisCluster, RedisServer

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
APP = "shop"
ORDER = "tests.spark.records:Order"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    from streamkit.spark import register

    # Spark's Python workers: this interpreter, able to import tests.spark.records.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) if not path else f"{ROOT}{os.pathsep}{path}"
    session = (
        SparkSession.builder.master("local[2, 3]")  # 2 threads; a failed task is retried
        .appName("streamkit-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def sync_client(url: str) -> Any:
    """redis-py's client of the server or, for a ``redis+cluster://`` URL, the cluster."""
    if url.startswith("redis+cluster://"):
        return redis_py.cluster.RedisCluster.from_url(url.replace("+cluster", "", 1))
    return redis_py.Redis.from_url(url)


@pytest.fixture
def url(redis_backend: str, request: pytest.FixtureRequest) -> str:
    """The session's Redis server, or for tests marked ``cluster`` also the session's
    cluster, flushed empty (a sync twin of ``redis_url``)."""
    if redis_backend == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        with sync_client(cluster.url) as client:
            client.flushall(target_nodes=redis_py.cluster.RedisCluster.PRIMARIES)
        return cluster.url
    server: RedisServer = request.getfixturevalue("redis_server")
    with sync_client(server.url) as client:
        client.flushall()
    return server.url


@pytest.fixture
def client(url: str) -> Iterator[Any]:
    with sync_client(url) as connection:
        yield connection


def orders(start: int, count: int) -> list[Order]:
    return [
        Order(
            order_id=i,
            customer=f"c{i % 37}",
            amount=i / 4,
            created_at=T0 + timedelta(seconds=i),
            status=Status.PAID if i % 2 else Status.NEW,
            day=(T0 + timedelta(days=i % 3)).date() if i % 5 else None,
            price=Decimal(i) / 100,
            lines=[Line(sku=f"s{i}", quantity=i % 4)],
            tags={"n": i},
        )
        for i in range(start, start + count)
    ]


def send(url: str, stream: str, records: list[Any], *, record: type = Order, **how: Any) -> None:
    async def run() -> None:
        app = App(APP, redis_url=url)
        target = app.stream(
            stream,
            record=record,
            partition_by=how.get("partition_by", "customer"),
            partition_count=how.get("partition_count", 4),
        )
        async with app:
            await target.send_many(records)

    trio.run(run)


def read(spark: SparkSession, url: str, stream: str, **options: str) -> DataFrame:
    reader = spark.read.format("streamkit").option("url", url).option("app", APP)
    reader = reader.option("stream", stream)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


@pytest.mark.cluster
def test_batch_read_all_partitions_with_typed_columns(
    spark: SparkSession, url: str, client: Any
) -> None:
    sent = orders(0, 2000)
    send(url, "orders", sent)
    # A streamkit worker's consumer group, which reading must leave alone.
    client.xgroup_create("__strm:{shop.orders.0}", "workers", id="0")
    client.xreadgroup("workers", "w1", {"__strm:{shop.orders.0}": ">"}, count=5)
    groups_before = client.xinfo_groups("__strm:{shop.orders.0}")

    df = read(spark, url, "orders", record=ORDER)
    assert df.rdd.getNumPartitions() == 4  # one input partition per stream partition
    fields = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert fields == {
        "partition": "int",
        "entry_id": "string",
        "event_time": "timestamp",
        "order_id": "bigint",
        "customer": "string",
        "amount": "double",
        "created_at": "timestamp",
        "status": "string",
        "day": "date",
        "price": "decimal(38,18)",
        "lines": "array<struct<sku:string,quantity:bigint>>",
        "tags": "map<string,bigint>",
        "note": "string",
    }
    rows = df.collect()
    assert len(rows) == len(sent)
    by_id = {row.order_id: row for row in rows}
    assert sorted(by_id) == [o.order_id for o in sent]
    for order in sent[:50]:
        row = by_id[order.order_id]
        assert row.partition == partition_for(order.customer, 4)
        millis = int(row.entry_id.split("-")[0])
        assert row.event_time.replace(tzinfo=UTC) == datetime.fromtimestamp(millis / 1000, UTC)
        assert row.customer == order.customer
        assert row.amount == order.amount
        assert row.created_at.replace(tzinfo=UTC) == order.created_at
        assert row.status == order.status.value
        assert row.day == order.day
        assert row.price == order.price
        assert [(line.sku, line.quantity) for line in row.lines] == [
            (line.sku, line.quantity) for line in order.lines
        ]
        assert row.tags == order.tags
        assert row.note is None
    assert client.xinfo_groups("__strm:{shop.orders.0}") == groups_before


def test_a_decompression_bomb_is_undecodable_not_decompressed(
    spark: SparkSession, url: str, client: Any
) -> None:
    """Hostile input (see tests/test_hostile.py): between good orders, 20 KB of zstd
    standing for a 600 MB order, whose note is all "a"s. Decompressed whole, it took
    gigabytes of an executor's memory; now it does not decode, unread."""
    sent = orders(0, 40)
    send(url, "bombed", sent)
    good = orjson.loads(codec_for(Order).encode(orders(99, 1)[0])[b"data"])
    del good["note"]
    head = orjson.dumps(good)[:-1] + b',"note":"'
    bomb = zstd_bomb(600 * 2**20, head=head)
    assert len(bomb) < 100_000
    client.xadd("__strm:{shop.bombed.0}", {b"data:zstd": bomb})
    send(url, "bombed", orders(40, 40))

    skipped = read(spark, url, "bombed", record=ORDER, onDecodeError="skip")
    assert sorted(row.order_id for row in skipped.select("order_id").collect()) == list(range(80))
    with pytest.raises(Exception, match=r"max_decoded_size \(16 MiB\)"):
        read(spark, url, "bombed", record=ORDER).collect()
    # The option lowers the limit: now every order is too large.
    small = read(spark, url, "bombed", record=ORDER, onDecodeError="skip", maxDecodedSize="100")
    assert small.count() == 0


def order_plan(url: str, stream: str, columns: tuple[str, ...], **changes: Any) -> Any:
    """The write plan of Orders by customer to one partition of ``stream``."""
    from streamkit.spark._writer import WritePlan

    return WritePlan(
        url=url,
        app=APP,
        stream=stream,
        partition_count=1,
        record=ORDER,
        compression=None,
        key="customer",
        key_is_field=True,
        columns=columns,
        chunk_size=1000,
        marker_ttl=60,
        partition_size=1000,
        max_len=None,
        **changes,
    )


def test_writes_are_split_by_bytes_and_refuse_records_too_large(url: str, client: Any) -> None:
    """As send_many: each Lua call (one idempotency marker each) holds at most 1 MiB of
    rows, and a row over maxRecordSize fails the task before anything of it is sent."""
    from streamkit.spark._writer import write_rows

    columns = ("order_id", "customer", "amount", "created_at", "note")
    plan = order_plan(url, "large", columns, max_record_size=2**20)
    rows: Any = iter([(i, "c", 1.0, T0, "n" * 300_000) for i in range(12)])
    assert write_rows(plan, rows, "w", "b").appended == 12
    # 12 rows of 300 KB: 3 to a call of 1 MiB at most, so 4 calls.
    assert len(client.keys("__sprk:{shop.large.0}:*")) == 4
    too_large: Any = iter([(99, "c", 1.0, T0, "n" * 2**20)])
    with pytest.raises(EncodeError, match=r"more than max_record_size \(1 MiB\)"):
        write_rows(plan, too_large, "w", "c")
    assert client.xlen("__strm:{shop.large.0}") == 12


def test_a_row_of_the_wrong_types_fails_its_task_as_send_would(url: str, client: Any) -> None:
    """A null where the record declares an int (a nullable column), a number where it
    declares a string (a column of another type): refused with send's error, naming
    the stream and the field, and nothing of the task is sent (the decoder would have
    dead-lettered them)."""
    from streamkit.spark._writer import write_rows

    plan = order_plan(url, "typed", ("order_id", "customer", "amount", "created_at"))
    for bad, message in (
        ((None, "c", 1.0, T0), "typed: Order.order_id: expected int, got NoneType None"),
        ((2, 5, 1.0, T0), "typed: Order.customer: expected str, got int 5"),
    ):
        rows: Any = iter([(1, "c", 1.0, T0), bad])
        with pytest.raises(EncodeError) as caught:
            write_rows(plan, rows, "w", "b")
        assert str(caught.value) == message
    assert client.exists("__strm:{shop.typed.0}") == 0


def id_tuple(entry_id: str) -> tuple[int, int]:
    millis, seq = entry_id.split("-")
    return int(millis), int(seq)


def test_batch_read_bounds_primitive_and_raw(spark: SparkSession, url: str, client: Any) -> None:
    readings = [
        Reading(sensor=f"s{i % 5}", value=i / 2, at=T0 + timedelta(minutes=i)) for i in range(300)
    ]
    send(url, "readings", readings, record=Reading, partition_by="sensor", partition_count=2)
    ids = sorted(
        (
            entry_id.decode()
            for partition in range(2)
            for entry_id, _ in client.xrange(f"__strm:{{shop.readings.{partition}}}")
        ),
        key=id_tuple,
    )
    typed = read(spark, url, "readings", record="tests.spark.records:Reading")
    assert {f.name: f.dataType.simpleString() for f in typed.schema.fields[3:]} == {
        "sensor": "string",
        "value": "double",
        "at": "timestamp",
        "ok": "boolean",
    }
    assert typed.filter("ok").count() == 300
    total = typed.agg({"value": "sum"}).first()
    assert total is not None
    assert total[0] == sum(r.value for r in readings)

    # start inclusive, end exclusive, as entry ids, milliseconds or ISO times.
    low, high = id_tuple(ids[100]), id_tuple(ids[200])
    bounded = read(spark, url, "readings", start=ids[100], end=ids[200])
    assert sorted(r.entry_id for r in bounded.select("entry_id").collect()) == sorted(
        i for i in ids if low <= id_tuple(i) < high
    )
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert read(spark, url, "readings", start=future).count() == 0
    assert read(spark, url, "readings", end="1").count() == 0

    raw = read(spark, url, "readings").filter(f"entry_id = '{ids[0]}'").first()
    assert raw is not None
    assert raw.fields["sensor"] in {b"s0", b"s1", b"s2", b"s3", b"s4"}
    assert set(raw.fields) == {"sensor", "value", "at", "ok"}


def run_stream_read(
    spark: SparkSession, url: str, checkpoint: Path, output: Path, **options: str
) -> list[int]:
    """Copy the orders stream to Parquet with Trigger.AvailableNow; return batch sizes."""
    reader = spark.readStream.format("streamkit").option("url", url).option("app", APP)
    for name, value in {"stream": "orders", "record": ORDER, **options}.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .select("partition", "entry_id", "order_id")
        .writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]


@pytest.mark.cluster
def test_streaming_read_resumes_from_the_checkpoint(
    spark: SparkSession, url: str, tmp_path: Path
) -> None:
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    send(url, "orders", orders(0, 1000))
    first = run_stream_read(spark, url, checkpoint, output, maxEventsPerTrigger="300")
    assert sum(first) == 1000
    assert max(first) <= 300  # the per-trigger limit
    assert len(first) >= 4

    send(url, "orders", orders(1000, 500))
    second = run_stream_read(spark, url, checkpoint, output)
    assert sum(second) == 500  # only the new events

    seen = [row.order_id for row in spark.read.parquet(str(output)).collect()]
    assert len(seen) == 1500  # none twice
    assert sorted(seen) == list(range(1500))


def numbered_frame(spark: SparkSession, count: int, keys: int) -> DataFrame:
    rows = [(f"k{n % keys}", n // keys) for n in range(count)]
    # Two Spark partitions, each key's events in order inside one of them.
    return (
        spark.createDataFrame(rows, "key string, seq long")
        .repartition(2, "key")
        .sortWithinPartitions("seq")
    )


def write_numbered(df: DataFrame, url: str, **options: str) -> None:
    writer = df.write.format("streamkit").mode("append").option("url", url)
    writer = writer.option("app", "scenario").option("stream", "numbered")
    writer = writer.option("record", "tests.apps.scenario:Numbered")
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


@pytest.mark.cluster
def test_batch_write_is_processed_by_a_streamkit_worker(
    spark: SparkSession, url: str, client: Any, redis_backend: str
) -> None:
    count, keys = 2000, 40
    frame = numbered_frame(spark, count, keys)
    write_numbered(frame, url, partitionCount="8", key="key", writeId="w1", chunkSize="100")
    # The same write again: every chunk's marker (in its partition's slot) is found.
    write_numbered(frame, url, key="key", writeId="w1", chunkSize="100")
    assert stream_length(client, "scenario", "numbered", 8) == count

    codec = codec_for(Numbered)
    assert client.hget("__meta:{scenario.numbered}", "partition_count") == b"8"
    for partition in range(8):
        for _, fields in client.xrange(f"__strm:{{scenario.numbered.{partition}}}"):
            record = codec.decode(fields, stream="numbered")
            assert partition_for(record.key, 8) == partition
            assert fields == codec.encode(record)  # byte for byte what send() appends

    async def process() -> list[bytes]:
        app, _ = make_app(
            redis_url=url, worker="w", lease_ttl=1.0, heartbeat_interval=0.1, grace_period=1.0
        )
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)

            async def processed() -> bool:
                return await app.redis.llen(SEEN) >= count

            await wait_until(processed, what=f"{count} processings", within=60, interval=0.05)
            items: list[bytes] = await app.redis.lrange(SEEN, 0, -1)
            await worker.stop()
        return items

    seen = [item.decode().rsplit(":", 1)[0] for item in trio.run(process)]
    assert len(seen) == count
    assert len(set(seen)) == count
    for key in range(keys):
        seqs = [int(s.split(":")[1]) for s in seen if s.split(":")[0] == f"k{key}"]
        assert seqs == sorted(seqs)  # each key's order kept


def stream_length(client: Any, app: str, stream: str, partitions: int) -> int:
    return sum(int(client.xlen(f"__strm:{{{app}.{stream}.{p}}}")) for p in range(partitions))


def test_replayed_writes_add_no_duplicates(
    spark: SparkSession, url: str, client: Any, tmp_path: Path
) -> None:
    from pyspark import TaskContext
    from pyspark.sql.functions import udf

    df = numbered_frame(spark, 1000, 10)
    options = {"partitionCount": "4", "key": "key", "writeId": "backfill-1", "chunkSize": "50"}
    write_numbered(df, url, **options)
    write_numbered(df, url, **options)  # the same job re-run: nothing added
    assert stream_length(client, "scenario", "numbered", 4) == 1000

    # A task that fails after having written some chunks is retried by Spark; the retry
    # skips the chunks its first attempt wrote.
    def fail_first_attempt(seq: int) -> int:
        context = TaskContext.get()
        if seq == 90 and context is not None and context.attemptNumber() == 0:
            raise RuntimeError("injected failure")
        return seq

    flaky = df.withColumn("seq", udf(fail_first_attempt, "long", useArrow=False)("seq"))
    write_numbered(flaky, url, partitionCount="4", key="key", chunkSize="50")
    assert stream_length(client, "scenario", "numbered", 4) == 2000

    # A streaming micro-batch replayed after a failure: Spark re-runs a batch whose
    # commit is missing from the checkpoint, with the same query and batch ids.
    send(url, "orders", orders(0, 500))
    checkpoint = tmp_path / "checkpoint"

    def copy() -> None:
        query = (
            spark.readStream.format("streamkit")
            .option("url", url)
            .option("app", APP)
            .option("stream", "orders")
            .option("record", ORDER)
            .load()
            .drop("partition", "entry_id", "event_time")
            .writeStream.format("streamkit")
            .option("url", url)
            .option("app", APP)
            .option("stream", "copy")
            .option("record", ORDER)
            .option("partitionCount", "3")
            .option("key", "customer")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    copy()
    assert stream_length(client, APP, "copy", 3) == 500
    for commit in (checkpoint / "commits").iterdir():
        commit.unlink()  # as if the query died after writing, before committing
    copy()
    assert stream_length(client, APP, "copy", 3) == 500
    send(url, "orders", orders(500, 100))
    copy()
    assert stream_length(client, APP, "copy", 3) == 600
    shutil.rmtree(checkpoint)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": "nope"}, r"stream 'nope' of app 'shop' does not exist"),
        ({"record": "tests.spark.records:Other"}, r"created with record=Order\(.*record=Other"),
        ({"record": "tests.spark.records:Missing"}, r"has no 'Missing'"),
        ({"record": "no_such_module:Order"}, r"cannot import module 'no_such_module'"),
        ({"url": "redis://127.0.0.1:1"}, r"Redis at redis://127.0.0.1:1 is unavailable"),
        (
            {"url": "redis+cluster://127.0.0.1:1"},
            r"Redis at redis\+cluster://127.0.0.1:1 is unavailable",
        ),
        ({"start": "yesterday"}, r"start: expected an entry id"),
        ({"app": "bad.name"}, r"app: must be letters"),
    ],
)
def test_bad_read_options_fail_clearly(
    spark: SparkSession, url: str, options: dict[str, str], message: str
) -> None:
    send(url, "orders", orders(0, 10))
    merged = {"record": ORDER, "stream": "orders", **options}
    reader = spark.read.format("streamkit").option("app", APP).option("url", url)
    for name, value in merged.items():
        reader = reader.option(name, value)
    with pytest.raises(Exception, match=message):
        reader.load().collect()


def test_a_server_url_naming_a_cluster_node_fails_clearly(redis_cluster: RedisCluster) -> None:
    from streamkit import ConfigError
    from streamkit.spark._client import connect, read_metadata

    node = redis_cluster.nodes[0]
    with sync_client(redis_cluster.url) as cluster:
        # A stream whose metadata hash another master serves: the node answers MOVED.
        stream = next(
            f"s{n}"
            for n in range(100)
            if cluster.get_node_from_key(f"__meta:{{{APP}.s{n}}}").port != node.port
        )
    with connect(node.url) as client, pytest.raises(ConfigError) as caught:
        read_metadata(client, node.url, APP, stream)
    assert "names a node of a Redis Cluster" in str(caught.value)
    assert f"write redis+cluster://127.0.0.1:{node.port}" in str(caught.value)


def test_option_reprs_do_not_show_the_password() -> None:
    from streamkit.spark._options import ReadOptions, WriteOptions
    from streamkit.spark._writer import WritePlan

    url = "redis://:s3cret@h:1?pass%77ord=s3cret"
    options = {"url": url, "app": APP, "stream": "orders"}
    plan = WritePlan(
        url=url, app=APP, stream="orders", partition_count=4, record=None, compression=None,
        key="id", key_is_field=False, columns=("id",), chunk_size=1, marker_ttl=1,
        partition_size=1, max_len=None,
    )  # fmt: skip
    for parsed in (ReadOptions.parse(options), WriteOptions.parse(options), plan):
        assert "s3cret" not in repr(parsed)
        assert "redis://:***@h:1" in repr(parsed)
        assert parsed.url == url


def test_bad_write_options_fail_clearly(spark: SparkSession, url: str) -> None:
    df = numbered_frame(spark, 10, 2)
    with pytest.raises(Exception, match=r"give the record, partitionCount and key options"):
        write_numbered(df, url)
    write_numbered(df, url, partitionCount="2", key="key")
    with pytest.raises(Exception, match=r"created with partition_count=2 .* partition_count=3"):
        write_numbered(df, url, partitionCount="3")
    with pytest.raises(Exception, match=r"append-only"):
        df.write.format("streamkit").mode("overwrite").option("url", url).option(
            "app", "scenario"
        ).option("stream", "numbered").save()
    with pytest.raises(Exception, match=r"Numbered needs the columns seq"):
        write_numbered(df.drop("seq"), url)


def test_example_pipeline_writes_totals(
    spark: SparkSession, url: str, client: Any, tmp_path: Path
) -> None:
    from examples import spark_orders
    from examples.spark_orders import CustomerTotal

    spark_orders.send_demo_orders(url, 5000)  # 5000 seconds: parts of two hours
    parquet = str(tmp_path / "totals")
    totals = spark_orders.run(spark, url, parquet).collect()
    assert sum(row.orders for row in totals) == 5000
    assert spark.read.parquet(parquet).count() == len(totals)

    codec = codec_for(CustomerTotal)
    written = [
        codec.decode(fields, stream=spark_orders.RESULTS)
        for partition in range(4)
        for _, fields in client.xrange(f"__strm:{{orders_demo.customer_totals.{partition}}}")
    ]
    assert len(written) == len(totals)
    assert sum(t.orders for t in written) == 5000
    assert {t.window_start for t in written} == {T0, T0 + timedelta(hours=1)}
    spark_orders.run(spark, url)  # again: the fixed writeId adds nothing
    assert stream_length(client, "orders_demo", "customer_totals", 4) == len(totals)


def test_a_table_reads_as_a_snapshot(spark: SparkSession, url: str) -> None:
    from streamkit import ConfigError
    from streamkit.spark import StreamkitDataSource
    from tests.apps.stateful import WINDOW, Number, make_app as stateful_app

    numbers = [Number(key=f"k{n % 5}", n=n) for n in range(1, 301)]

    async def process() -> None:
        stateful = stateful_app(
            redis_url=url, delay=0, lease_ttl=1.0, heartbeat_interval=0.1, grace_period=1.0
        )
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, stateful.app)
            await stateful.numbers.send_many(numbers)

            async def counted() -> bool:
                return sum(await stateful.counts.read_many([f"k{k}" for k in range(5)])) == 300

            await wait_until(counted, what="300 events counted", within=30)
            await worker.stop()

    trio.run(process)
    base = spark.read.format("streamkit").option("url", url).option("app", "stateful")
    base = base.option("stream", "numbers")
    counts = base.option("table", "counts").load()
    assert counts.columns == ["partition", "key", "value"]
    assert {(r.key, int(r.value)) for r in counts.collect()} == {(f"k{k}", 60) for k in range(5)}
    for row in counts.collect():
        assert row.partition == partition_for(row.key, 8)
    windows = base.option("table", "tens").load()
    assert windows.columns == ["partition", "key", "window_start", "window_end", "closed", "value"]
    rows = windows.collect()
    assert rows  # the last windows are still open (nothing advanced past them)
    expected: dict[tuple[str, int], int] = {}
    for number in numbers:
        start = number.n - number.n % WINDOW
        expected[number.key, start] = expected.get((number.key, start), 0) + number.n
    for row in rows:
        start = round(row.window_start.timestamp() * 1000)
        assert round(row.window_end.timestamp() * 1000) - start == WINDOW
        assert int(row.value) == expected[row.key, start]
    source = StreamkitDataSource(
        {"url": url, "app": "stateful", "stream": "numbers", "table": "counts"}
    )
    with pytest.raises(ConfigError, match="batch snapshot"):
        source.streamReader(source.schema())


def test_a_derived_table_and_a_global_table_read_as_snapshots(
    spark: SparkSession, url: str
) -> None:
    from streamkit import Events, Record, Table
    from tests.test_table_joins import Profile, Status, accounts_app

    class Rate(Record):
        currency: str
        rate: float

    app, users, statuses, _ = accounts_app(url)
    rates_stream = app.stream("rate_updates", record=Rate, partition_by="currency")
    rates: Table[float] = app.global_table("rates", value=float)

    @app.processor(rates_stream, tables=[rates])
    async def keep_rates(events: Events[Rate]) -> None:
        async for rate in events.records():
            rates.set(rate.currency, rate.rate)

    async def process() -> None:
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(run_worker, app)
            await users.send_many([Profile(user=f"u{n}", city="Oslo") for n in range(6)])
            await statuses.send_many([Status(user=f"u{n}", status="active") for n in range(3)])
            await rates_stream.send_many(
                [Rate(currency="EUR", rate=1.1), Rate(currency="NOK", rate=0.09)]
            )

            async def done() -> bool:
                both = app.tables["both"]
                return sum(await both.sizes()) == 3 and sum(await rates.sizes()) == 2

            await wait_until(done, what="the derived and global tables", within=30)
            await worker.stop()

    trio.run(process)
    base = spark.read.format("streamkit").option("url", url).option("app", "accounts")
    both = base.option("stream", "both__changes").option("table", "both").load().collect()
    assert {row.key for row in both} == {"u0", "u1", "u2"}
    applied = base.option("stream", "rates__global").option("table", "rates").load().collect()
    assert {(row.key, float(row.value)) for row in applied} == {("EUR", 1.1), ("NOK", 0.09)}
