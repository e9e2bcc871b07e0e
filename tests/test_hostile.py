"""Hostile input: what producers, events and peers send must not crash, exhaust or slip by.

Anyone who can write to a stream or a queue can write anything: a compressed payload
that stands for gigabytes, JSON nested a million levels deep, a record larger than
Redis accepts, a partition of millions of entries under a freshly lowered cap. Each
case here sends such input to real parts (a real ``redis-server``, a real
``streamkit worker`` process) and checks that it is contained: the entry is refused
or dead-lettered with one clear line, memory and the work of each Redis call stay
bounded, and everything else goes on.

**The next feature that reads anything from outside adds its cases here**, one
section per kind of input, each test named for what it proves. (The Spark data
source's cases run in ``tests/test_spark.py``, beside its Spark session; the ACL roles
of ``docs/security.md`` are checked in ``tests/test_acl.py``.)
"""

from __future__ import annotations

import logging
import struct
import sys
import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lz4.frame
import orjson
import pytest
import trio
import xxhash
import zstandard

from streamkit import App, ConfigError, DecodeError, EncodeError, ProcessorKeys, Record, Settings
from streamkit._lua import script
from streamkit._wire import (
    DEFAULT_SEND_CHUNK_BYTES,
    TRIM_PROCESSED_STEP,
    TRIM_STEP,
    chunk_bounds,
    text,
)
from streamkit.lowlevel import codec_for
from streamkit.testing import RedisServer, wait_until
from tests.apps.scenario import SEEN, Numbered, make_app
from tests.scenarios import numbered_events, seen, tally
from tests.test_cli import streamkit
from tests.workers import WorkerProcess, start_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from streamkit import Redis

MiB = 2**20
ROOT = Path(__file__).resolve().parent.parent


class Blob(Record):
    key: str
    body: str


class Tagged(Record):
    tags: dict[str, int]


# ------------------------------------------------------------- compressed payloads

# What the report measured: 18 KB of zstd standing for 600 MB.
BOMB_SIZE = 600 * MiB


NUMBERED_HEAD = b'{"key":"k0","seq":1000000,"pad":"'


def padded_json(size: int, head: bytes = NUMBERED_HEAD) -> Iterator[bytes]:
    """A JSON object of exactly ``size`` bytes: ``head``, which opens its last string
    field, then ``a`` to the size. By default it decodes into a
    :class:`~tests.apps.scenario.Numbered` (its ``pad`` is ignored). In slices, so that
    the test process never holds it whole."""
    yield head
    left = size - len(head) - 2
    slice_ = b"a" * MiB
    while left > 0:
        yield slice_[:left]
        left -= len(slice_)
    yield b'"}'


def zstd_bomb(size: int, *, declare_size: bool = True, head: bytes = NUMBERED_HEAD) -> bytes:
    """A zstd frame of ``size`` bytes of JSON; streaming encoders leave the size out."""
    compressor = zstandard.ZstdCompressor(write_content_size=declare_size)
    stream = compressor.compressobj(size=size if declare_size else -1)
    parts = [stream.compress(part) for part in padded_json(size, head)]
    return b"".join([*parts, stream.flush()])


def lz4_bomb(size: int, *, declare_size: bool = True) -> bytes:
    """An lz4 frame of ``size`` bytes of JSON (lz4 compresses at most about 250:1)."""
    compressor = lz4.frame.LZ4FrameCompressor()
    parts = [compressor.begin(source_size=size if declare_size else 0)]
    parts += [compressor.compress(part) for part in padded_json(size)]
    return b"".join([*parts, compressor.flush()])


BOMBS = {"zstd": zstd_bomb, "lz4": lz4_bomb}


@pytest.mark.parametrize("declare_size", [True, False], ids=["size declared", "streamed"])
@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_a_decompression_bomb_is_undecodable_and_never_decompressed_whole(
    compression: str, declare_size: bool
) -> None:
    bomb = BOMBS[compression](64 * MiB, declare_size=declare_size)
    codec = codec_for(Numbered, max_decoded_size=MiB)
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as info:
            codec.decode({f"data:{compression}".encode(): bomb}, stream="numbered")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"the {compression} payload decompresses to more than max_decoded_size (1 MiB)" in (
        info.value.reason
    )
    # The output never grew far past the limit (a slice of output at most).
    assert peak < 4 * MiB, peak


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_a_payload_just_under_the_limit_still_decodes(compression: str) -> None:
    payload = BOMBS[compression](MiB)
    codec = codec_for(Numbered, max_decoded_size=MiB)
    decoded = codec.decode({f"data:{compression}".encode(): payload}, stream="numbered")
    assert decoded == Numbered(key="k0", seq=1000000)
    # The fast path (an entry's flat field list, as the fetcher hands it) too.
    decode = codec.entry_decoder(stream="numbered")
    assert decode([f"data:{compression}".encode(), payload], b"1-0") == decoded


def zstd_header_only(declared: int) -> bytes:
    """A zstd frame whose header declares ``declared`` bytes, holding five."""
    magic = struct.pack("<I", 0xFD2FB528)
    # Frame header descriptor: an 8-byte content size, single segment (no window).
    header = bytes([0b1110_0000]) + struct.pack("<Q", declared)
    block = (5 << 3 | 1).to_bytes(3, "little") + b"hello"  # last block, raw, 5 bytes
    return magic + header + block


def lz4_header_only(declared: int) -> bytes:
    """An lz4 frame whose header declares ``declared`` bytes, holding one."""
    frame: bytes = lz4.frame.compress(b"x", store_size=True)
    # Magic (4 bytes), FLG, BD, the 8-byte content size, then the header checksum.
    descriptor = frame[4:6] + struct.pack("<Q", declared)
    checksum = (xxhash.xxh32_intdigest(descriptor) >> 8) & 0xFF
    return frame[:4] + descriptor + bytes([checksum]) + frame[15:]


@pytest.mark.parametrize(
    ("compression", "frame"),
    [("zstd", zstd_header_only(2**40)), ("lz4", lz4_header_only(2**40))],
)
def test_a_frame_header_declaring_a_huge_size_is_refused_unread(
    compression: str, frame: bytes
) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as info:
            codec_for(Numbered).decode({f"data:{compression}".encode(): frame}, stream="s")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.reason == (
        f"the {compression} payload decompresses to more than max_decoded_size (16 MiB): "
        f"its frame header declares {2**40} bytes"
    )
    assert peak < MiB, peak


# ------------------------------------------------------------------- JSON payloads


def test_an_uncompressed_payload_over_the_limit_is_undecodable() -> None:
    # The limit bounds what the JSON parser sees, compressed or not: parsing takes many
    # times the payload's size in memory (see the next test).
    payload = b"".join(padded_json(2 * MiB))
    with pytest.raises(DecodeError) as info:
        codec_for(Numbered, max_decoded_size=MiB).decode({b"data": payload}, stream="numbered")
    assert info.value.reason == "the JSON payload is 2 MiB, more than max_decoded_size (1 MiB)"


def test_json_nested_deeper_than_the_parser_allows_is_undecodable() -> None:
    deep = b'{"key":"k","seq":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(DecodeError, match="depth limit exceeded"):
        codec_for(Numbered).decode({b"data": deep}, stream="numbered")
    # A dict record returns the JSON as it is: it is refused just the same.
    with pytest.raises(DecodeError, match="depth limit exceeded"):
        codec_for(dict).decode({b"data": deep}, stream="numbered")


def test_an_entry_with_huge_field_names_gets_a_short_one_line_reason() -> None:
    # The reason goes to the dead letter, the log and the terminal: it must not carry
    # what the producer wrote, whole.
    fields = {b"x" * MiB: b"1", b"line\nbreak": b"2"}
    with pytest.raises(DecodeError) as info:
        codec_for(Numbered).decode(fields, stream="numbered")
    assert len(str(info.value)) < 300
    assert "\n" not in str(info.value)
    # A key of a dict field, quoted in the path of a wrong value, likewise.
    with pytest.raises(DecodeError) as info:
        codec_for(Tagged).decode({b"data": b'{"tags": {"' + b"k" * MiB + b'": "x"}}'}, stream="s")
    assert len(str(info.value)) < 600
    assert info.value.reason.endswith("...")


def test_a_record_whose_json_consumers_would_refuse_is_not_encoded() -> None:
    # Compressed, it would be small enough to send, but no consumer would decode it.
    codec = codec_for(Blob, compression="zstd", max_decoded_size=MiB)
    with pytest.raises(EncodeError) as info:
        codec.encode(Blob(key="k", body="a" * (2 * MiB)))
    assert str(info.value) == (
        "the Blob is 2.0 MiB of JSON, more than max_decoded_size (1 MiB), which consumers refuse"
    )


@pytest.mark.parametrize("setting", ["max_decoded_size", "max_record_size"])
@pytest.mark.parametrize("value", [0, -1, 1.5, "16MiB", True])
def test_the_limits_are_validated(setting: str, value: object) -> None:
    given: dict[str, Any] = {setting: value}
    with pytest.raises(ConfigError, match=f"^{setting}: must be a positive integer"):
        Settings(**given)


def test_the_limits_come_from_the_environment() -> None:
    settings = Settings.from_env(
        {"STREAMKIT_MAX_DECODED_SIZE": "1048576", "STREAMKIT_MAX_RECORD_SIZE": "65536"}
    )
    assert (settings.max_decoded_size, settings.max_record_size) == (MiB, 65536)
    app = App("shop", settings=settings)
    codec = app.stream("blobs", record=Blob, partition_by="key").codec
    assert (codec.max_decoded_size, codec.max_record_size) == (MiB, 65536)


# -------------------------------------------------------- a bomb in a real partition


def peak_rss(pid: int) -> int:
    """The peak resident memory of process ``pid`` so far, in bytes (``VmHWM``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.close()


@pytest.mark.timeout(180)
async def test_bombs_in_a_partition_are_dead_lettered_by_a_worker_that_stays_small(
    redis_url: str, redis: Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # Two bombs of 600 MB each (as reported: a worker peaked at 2.9 GB) between good
    # events of the same partition, under the default settings and exception policy.
    app, stream = make_app(redis_url=redis_url)
    before = numbered_events(keys=4, per_key=20)
    after = numbered_events(keys=4, per_key=20, start=20)
    bombs = [zstd_bomb(BOMB_SIZE), zstd_bomb(BOMB_SIZE, declare_size=False)]
    assert max(len(b) for b in bombs) < 100_000
    partition = stream.partition_of(Numbered(key="k0", seq=0))
    async with app:
        await stream.send_many(before)
        bomb_ids = [
            text(await redis.xadd(stream.key(partition), {b"data:zstd": bomb})) for bomb in bombs
        ]
        await stream.send_many(after)

    worker = start_worker(redis_url, tmp_path)
    workers.append(worker)
    dead_letters = ProcessorKeys(app="scenario", stream="numbered", processor="record")

    async def all_processed() -> bool:
        return await redis.llen(SEEN) >= len(before) + len(after)

    async def both_dead_lettered() -> bool:
        return await redis.xlen(dead_letters.dead_letter_key) == 2

    await wait_until(all_processed, what="every good event processed", within=60)
    await wait_until(both_dead_lettered, what="both bombs dead-lettered", within=30)
    peak = peak_rss(worker.pid)

    result = tally(before + after, await seen(redis))
    assert (result.lost, result.duplicated, result.order_violations) == (0, 0, 0)
    letters = await redis.xrange(dead_letters.dead_letter_key)
    assert [text(letter.field_values[b"dl.entry_id"]) for letter in letters] == bomb_ids
    for fields in (letter.field_values for letter in letters):
        assert fields[b"dl.reason"] == b"undecodable"
        assert b"decompresses to more than max_decoded_size (16 MiB)" in fields[b"dl.error"]
        assert fields[b"data:zstd"] in bombs  # kept as it came, for inspection
    # A worker runs in about 80 MiB; decoding a payload may take 16 MiB more (and a
    # window as large). Decompressed whole, each bomb took 600 MB, twice over as text.
    assert peak < 200 * MiB, f"the worker's memory peaked at {peak / MiB:.0f} MiB"
    assert "Traceback" not in worker.log()


# ------------------------------------------------------------------ record sizes


async def test_a_record_over_max_record_size_is_refused_before_it_reaches_redis(
    redis_url: str, redis: Redis
) -> None:
    async with App("shop", redis_url=redis_url, max_record_size=MiB) as app:
        blobs = app.stream("blobs", record=Blob, partition_by="key", partition_count=2)
        big = Blob(key="k", body="a" * (2 * MiB))
        with pytest.raises(EncodeError) as info:
            await blobs.send(Blob(key="j", body="small"), big)
        assert str(info.value) == "the encoded Blob is 2.0 MiB, more than max_record_size (1 MiB)"
        with pytest.raises(EncodeError):
            await blobs.send_many([big])
        # Nothing of the send went out, not even the small record beside it.
        assert [await redis.xlen(blobs.key(p)) for p in range(2)] == [0, 0]


@pytest.fixture
async def small_server() -> AsyncIterator[RedisServer]:
    """A server that accepts no string longer than 1 MiB (Redis's least setting)."""
    async with trio.open_nursery() as nursery:
        server: RedisServer = await nursery.start(
            RedisServer(extra_args=("--proto-max-bulk-len", "1mb")).run
        )
        yield server
        nursery.cancel_scope.cancel()


async def test_a_record_larger_than_the_server_accepts_is_refused_before_it_is_sent(
    small_server: RedisServer,
) -> None:
    # max_record_size is 16 MiB by default; the server takes at most 1 MiB. Sent, the
    # record would make Redis drop the connection ("invalid bulk length"), and with it
    # every command in flight on it.
    with trio.fail_after(30):
        async with App("shop", redis_url=small_server.url) as app:
            blobs = app.stream("blobs", record=Blob, partition_by="key", partition_count=1)
            with pytest.raises(EncodeError) as info:
                await blobs.send(Blob(key="k", body="a" * (2 * MiB)))
            assert str(info.value) == (
                "the encoded Blob has a field of 2.0 MiB, more than Redis accepts (its "
                "proto-max-bulk-len is 1 MiB): lower max_record_size to at most that, or "
                "raise the server's proto-max-bulk-len"
            )
            assert await app.redis.xlen(blobs.key(0)) == 0
            # The connection is fine: the next send goes through.
            await blobs.send(Blob(key="k", body="a" * 1000))
            assert await app.redis.xlen(blobs.key(0)) == 1


async def script_calls(redis: Redis) -> int:
    stats: Any = await redis.info("commandstats")
    calls = stats.get("cmdstat_evalsha", {})
    return int(calls.get("calls", 0)) if isinstance(calls, dict) else 0


async def test_send_many_splits_its_appends_by_bytes(small_server: RedisServer) -> None:
    # 24 records of 300 KB for one partition: one call by count (1,000 per call), but
    # 7 MB in one command, which Redis would hold and run without a pause.
    records = [Blob(key="k", body=f"{i:06d}" + "a" * 300_000) for i in range(24)]
    async with App("shop", redis_url=small_server.url) as app:
        blobs = app.stream("blobs", record=Blob, partition_by="key", partition_count=1)
        await blobs.send(Blob(key="k", body="warm-up: the script is loaded"))
        size = sum(len(k) + len(v) for k, v in blobs.codec.encode(records[0]).items())
        expected = list(chunk_bounds([size] * 24, 1000, DEFAULT_SEND_CHUNK_BYTES))
        assert len(expected) == 8
        calls = await script_calls(app.redis)
        await blobs.send_many(records)
        assert await script_calls(app.redis) - calls == len(expected)
        stored = await app.redis.xrange(blobs.key(0), count=100)
        bodies = [orjson.loads(e.field_values[b"data"])["body"][:6] for e in stored[1:]]
        assert bodies == [f"{i:06d}" for i in range(24)]


def test_chunks_are_cut_by_count_and_by_bytes() -> None:
    assert list(chunk_bounds([1] * 5, 2, 100)) == [(0, 2), (2, 4), (4, 5)]
    assert list(chunk_bounds([40, 40, 40, 40], 10, 100)) == [(0, 2), (2, 4)]
    # An entry larger than the byte budget goes alone; none is ever left out.
    assert list(chunk_bounds([10, 500, 10, 10], 10, 100)) == [(0, 1), (1, 2), (2, 4)]
    assert list(chunk_bounds([], 10, 100)) == []


async def test_the_send_command_refuses_a_record_too_large_in_one_line(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    order = {
        "order_id": 1,
        "customer": "c" * 5000,
        "amount": 1.5,
        "created_at": "2026-01-01T00:00:00+00:00",
    }
    monkeypatch.setenv("STREAMKIT_MAX_RECORD_SIZE", "1000")
    result = await streamkit(
        "send", "examples.orders.app:orders", orjson.dumps(order).decode(), redis_url=redis_url
    )
    assert result.code != 0
    assert "Traceback" not in result.err
    assert result.err.splitlines()[0].endswith("more than max_record_size (1000 bytes)"), result.err


# ------------------------------------------------------------------------- trimming


async def fill(redis: Redis, key: str, entries: int) -> None:
    """Append ``entries`` small entries to ``key``, pipelined, as another producer could."""
    for start in range(0, entries, 5_000):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(entries, start + 5_000)):
                pipe.xadd(key, {b"data": b'{"key":"k","body":"%d"}' % i})


@pytest.mark.timeout(120)
async def test_a_hard_cap_on_a_long_partition_comes_down_over_bounded_calls(
    redis_url: str, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # A cap set on a partition of 10,000 unprocessed entries: each append removes at
    # most what it appended plus TRIM_STEP, and reports what it dropped.
    async with App("shop", redis_url=redis_url) as app:
        blobs = app.stream("blobs", record=Blob, partition_by="key", partition_count=1, max_len=100)
        key = blobs.key(0)
        await fill(redis, key, 10_000)
        caplog.set_level(logging.WARNING, "streamkit.streams")
        await blobs.send(Blob(key="k", body="first"))
        assert await redis.xlen(key) == 10_001 - (1 + TRIM_STEP)
        sends = 1
        while await redis.xlen(key) > 100:
            [last] = await blobs.send(Blob(key="k", body="more"))
            sends += 1
        assert sends == -(-(10_001 - 100) // (1 + TRIM_STEP))
        assert await redis.xlen(key) == 100
        newest = await redis.xrevrange(key, count=1)
        assert text(newest[0].identifier) == last
    dropped = [
        int(r.getMessage().split(" dropped ")[1].split()[0])
        for r in caplog.records
        if "dropped" in r.getMessage()
    ]
    # No group reads the stream: every entry the cap removed counts as unprocessed.
    assert dropped[0] == 1 + TRIM_STEP
    assert sum(dropped) == 10_000 + sends - 100


@pytest.mark.parametrize(("read", "dropped"), [(25, 0), (15, 6), (0, 21)])
async def test_the_hard_cap_counts_only_unprocessed_entries_as_dropped(
    redis_url: str, redis: Redis, caplog: pytest.LogCaptureFixture, read: int, dropped: int
) -> None:
    async with App("shop", redis_url=redis_url) as app:
        blobs = app.stream("blobs", record=Blob, partition_by="key", partition_count=1, max_len=10)
        key = blobs.key(0)
        await fill(redis, key, 30)
        # A group has read (and so processed) the first `read` entries.
        ids = [entry.identifier for entry in await redis.xrange(key)]
        await redis.xgroup_create(key, "shop.blobs.reader", ids[read - 1] if read else "0")
        caplog.set_level(logging.WARNING, "streamkit.streams")
        await blobs.send(Blob(key="k", body="one more"))
        # The 21 oldest went, of which those the group had not read count as dropped.
        assert [entry.identifier for entry in await redis.xrange(key)][:9] == ids[21:]
    warnings = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    if dropped:
        assert warnings == [
            f"max_len=10 dropped {dropped} unprocessed entries from blobs partition 0"
        ]
    else:
        assert warnings == []


@pytest.mark.timeout(120)
async def test_trimming_a_processed_backlog_is_bounded_per_call(
    redis_url: str, redis: Redis
) -> None:
    # 120,000 entries every group has processed, and partition_size 100: each append,
    # and each acknowledgement, trims at most what it added or acknowledged plus
    # TRIM_PROCESSED_STEP (whole nodes of ~100 entries: approximate trimming).
    async with App("shop", redis_url=redis_url) as app:
        blobs = app.stream(
            "blobs", record=Blob, partition_by="key", partition_count=1, partition_size=100
        )
        key = blobs.key(0)
        await fill(redis, key, 120_000)
        await redis.xgroup_create(key, "shop.blobs.reader", "$")
        await blobs.send(Blob(key="k", body="first"))
        length = await redis.xlen(key)
        assert 120_001 - (1 + TRIM_PROCESSED_STEP) <= length <= 120_001 - TRIM_PROCESSED_STEP // 2
        # The fenced acknowledgement trims the same way.
        lock = "__lock:{shop.blobs.0}.reader"
        await redis.set(lock, "me")
        ack = app.redis.register_script(script("commit/ack").text)
        await ack(keys=[key, lock], args=["me", "shop.blobs.reader", 100, 1, "0-1"])
        after_ack = await redis.xlen(key)
        assert length - (1 + TRIM_PROCESSED_STEP) <= after_ack <= length - TRIM_PROCESSED_STEP // 2
        sends = 0
        while await redis.xlen(key) > 200:
            await blobs.send(Blob(key="k", body="more"))
            sends += 1
        assert sends == 1
        # Never below the partition size.
        assert await redis.xlen(key) >= 100


@pytest.mark.timeout(120)
async def test_the_worst_case_measurement_runs() -> None:
    # docs/streams.md quotes its figures for 2,000,000 entries; a small run keeps it
    # working.
    script = ROOT / "tests" / "benchmarks" / "trim_worst_case.py"
    done = await trio.run_process(
        [sys.executable, str(script), "--entries", "3000"],
        capture_stdout=True,
        capture_stderr=True,
    )
    lines = done.stdout.decode().splitlines()
    assert [line.split()[0] for line in lines[1:]] == [
        "hard",
        "processed",
        "acknowledgement",
        "large",
    ]
