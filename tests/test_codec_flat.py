"""The flat-record fast path of the JSON codec gives exactly what cattrs gives."""

from __future__ import annotations

import enum
import functools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from streamkit import App, DecodeError, Record
from streamkit._produce import SendWindow, encode_window
from streamkit.lowlevel import codec_for


class Count(enum.IntEnum):
    """Ints of another type than ``int``."""

    ZERO, ONE, TWO, THREE, FOUR, FIVE, SIX, SEVEN = range(8)


class Flat(Record):
    name: str
    count: int
    price: float
    ok: bool


class WithDefault(Record):
    name: str
    count: int = 7


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=2),
)


def decoded(record: type[Any], payload: dict[str, Any]) -> object:
    decode = codec_for(record).entry_decoder(stream="s", partition=0)
    try:
        return decode([b"data", orjson.dumps(payload)], b"1-0")
    except DecodeError as exc:
        return ("error", exc.reason)


def reference(record: type[Any], payload: dict[str, Any]) -> object:
    """The converter alone: decode() from a dict of fields takes the same path."""
    codec = codec_for(record)
    try:
        return codec.decode({b"data:zstd": _zstd(orjson.dumps(payload))}, stream="s")
    except DecodeError as exc:
        return ("error", exc.reason)


def _zstd(data: bytes) -> bytes:
    # A compressed payload skips the flat path: decoding it is the converter's own.
    return codec_for(dict, compression="zstd").encode(orjson.loads(data))[b"data:zstd"]


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["name", "count", "price", "ok", "extra"]), JSON_VALUES, max_size=5
    )
)
def test_flat_path_equals_the_converter(payload: dict[str, Any]) -> None:
    assert decoded(Flat, payload) == reference(Flat, payload)
    assert decoded(WithDefault, payload) == reference(WithDefault, payload)


def test_flat_path_builds_records() -> None:
    record = decoded(Flat, {"name": "a", "count": 1, "price": 2, "ok": True})
    assert record == Flat(name="a", count=1, price=2.0, ok=True)
    assert type(record.price) is float
    assert decoded(WithDefault, {"name": "a"}) == WithDefault(name="a", count=7)


@pytest.mark.parametrize(
    "payload",
    [
        {"name": "a", "count": True, "price": 1.0, "ok": True},  # a bool is no int
        {"name": 1, "count": 1, "price": 1.0, "ok": True},
        {"name": "a", "count": 1, "price": "1", "ok": True},
        {"name": "a", "count": 1, "price": 1.0},
    ],
)
def test_flat_path_refuses_what_the_converter_refuses(payload: dict[str, Any]) -> None:
    result = decoded(Flat, payload)
    assert isinstance(result, tuple)
    assert result == reference(Flat, payload)


# --- batches: decoded at once (Delivery), encoded one entry at a time (producers) ---

MISSING = object()


class Nested(Record):
    name: str
    tags: list[str]


def one_by_one(record: type[Any], flats: list[list[bytes]]) -> list[object]:
    decode = codec_for(record).entry_decoder(stream="s", partition=0)
    out: list[object] = []
    for flat in flats:
        try:
            out.append(decode(flat, b"1-0"))
        except DecodeError:
            out.append(MISSING)
    return out


PAYLOADS = st.one_of(
    st.dictionaries(
        st.sampled_from(["name", "count", "price", "ok", "extra", "tags"]), JSON_VALUES, max_size=6
    ).map(orjson.dumps),
    st.binary(max_size=12),
    st.just(b"[1, 2]"),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PAYLOADS, max_size=8), st.sampled_from([Flat, WithDefault, Nested, dict]))
def test_a_batch_decodes_as_its_entries_one_by_one(
    payloads: list[bytes], record: type[Any]
) -> None:
    """What the batch decoding gives is each entry's record as decoded alone; what it
    misses (and only that) the entry decoder refuses."""
    flats = [[b"data", payload] for payload in payloads]
    expected = one_by_one(record, flats)
    codec = codec_for(record)
    by_payload = codec.payload_decoder(MISSING)
    assert by_payload is not None
    for records, missed in (codec.batch_decoder(MISSING)(flats), by_payload(payloads)):
        assert records == expected
        assert missed == sum(r is MISSING for r in expected)


def test_a_batch_of_other_layouts_decodes_entry_by_entry() -> None:
    codec = codec_for(Flat)
    good = codec.encode(Flat(name="a", count=1, price=1.5, ok=False))[b"data"]
    compressed = codec_for(Flat, compression="lz4").encode(
        Flat(name="z", count=2, price=0, ok=True)
    )
    flats = [
        [b"data", good],
        [b"data", good, b"extra", b"field"],
        [b"other", b"x"],
        [item for pair in compressed.items() for item in pair],
    ]
    records, missed = codec.batch_decoder(MISSING)(flats)
    assert records == one_by_one(Flat, flats)
    assert missed == 1
    assert records[3] == Flat(name="z", count=2, price=0.0, ok=True)


def test_the_batch_decoders_are_made_once_per_codec() -> None:
    codec = codec_for(Flat)
    assert codec.batch_decoder(MISSING) is codec.batch_decoder(MISSING)
    assert codec.payload_decoder(MISSING) is codec.payload_decoder(MISSING)
    assert codec.entry_encoder() is codec.entry_encoder()


FIELD_VALUES = st.one_of(
    st.text(max_size=4),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.booleans(),
    st.none(),
    st.binary(max_size=3),
)


def encoded(record: object, encode: Any) -> object:
    try:
        return encode(record)
    except Exception as exc:
        return (type(exc), str(exc))


@settings(max_examples=400, deadline=None)
@given(FIELD_VALUES, FIELD_VALUES, FIELD_VALUES, FIELD_VALUES)
def test_an_entry_encodes_as_encode_says(name: Any, count: Any, price: Any, ok: Any) -> None:
    """The generated entry encoder lays out exactly what encode() gives, and raises its
    errors, whatever the fields hold (NaN, huge ints, wrong types)."""
    record = Flat(name=name, count=count, price=price, ok=ok)
    codec = codec_for(Flat, max_record_size=60)

    def reference(value: object) -> tuple[list[bytes | int], int]:
        fields = codec.encode(value)  # type: ignore[arg-type]
        entry: list[bytes | int] = [len(fields)]
        for field, raw in fields.items():
            entry += [field, raw]
        return entry, sum(len(f) + len(r) for f, r in fields.items())

    got = encoded(record, codec.entry_encoder())
    want = encoded(record, reference)
    if isinstance(got, tuple) and len(got) == 2 and not isinstance(got[0], type):
        assert (list(got[0]), got[1]) == want
    else:
        assert got == want


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(FIELD_VALUES, FIELD_VALUES, FIELD_VALUES, FIELD_VALUES), max_size=6))
def test_a_window_of_records_encodes_as_each_one_does(fields: list[tuple[Any, ...]]) -> None:
    """A producer's window (the batch payload encoder, the entry encoder for what it
    leaves) gives each record exactly its own entry, and refuses the first record that
    encode() refuses, with encode()'s error."""
    stream = App("flat").stream("flat", record=Flat, partition_by="name", partition_count=3)
    codec = stream.spec.codec
    records = [Flat(name=str(n), count=c, price=p, ok=o) for n, c, p, o in fields]
    refused = [encoded(r, codec.encode) for r in records]
    refused = [error for error in refused if isinstance(error, tuple)]
    window = encoded(records, functools.partial(encode_window, stream.spec))
    if refused:
        assert window == refused[0]
        return
    assert isinstance(window, SendWindow)
    entry = codec.entry_encoder()
    for partition, positions in window.positions.items():
        for index, position in enumerate(positions):
            want, size = entry(records[position])
            assert entries_of(window.arguments(partition, index, index + 1)) == [list(want)]
            assert window.sizes[partition][index] == size
        # A partition's records in one call are its records' entries, in order.
        whole = window.arguments(partition, 0, len(positions))
        assert entries_of(whole) == [list(entry(records[p])[0]) for p in positions]


def entries_of(arguments: list[bytes | int]) -> list[list[bytes | int]]:
    """The entries the append script makes of ``arguments``, as field count, then
    field names and values (as the script reads them: see lib/append.lua)."""
    entries, i = [], 0
    while i < len(arguments):
        count = int(arguments[i])
        if count > 0:
            entries.append([count, *arguments[i + 1 : i + 1 + 2 * count]])
            i += 1 + 2 * count
        else:
            field = arguments[i + 1]
            entries += [[1, field, value] for value in arguments[i + 2 : i + 2 - count]]
            i += 2 - count
    return entries


def test_the_window_encoder_is_made_once_per_codec() -> None:
    codec = codec_for(Flat)
    assert codec.payloads_encoder() is codec.payloads_encoder()
    assert codec_for(dict).payloads_encoder()[2] == -1  # no fast path: every one by one


def test_a_partition_mixing_plain_records_and_others_keeps_their_order() -> None:
    """Records the batch encoder leaves (here an int enum where an int is declared: valid,
    and written as its int, but not of the exact type) go as entries of their own
    between the runs of the others, each record where it was."""
    stream = App("flat").stream("flat", record=Flat, partition_by="name", partition_count=1)
    records = [
        Flat(name="a", count=Count(i) if i in (0, 3, 4, 7) else i, price=0.5, ok=True)
        for i in range(8)
    ]
    window = encode_window(stream.spec, records)
    assert window.mixed == {0}
    entry = stream.spec.codec.entry_encoder()
    arguments = window.arguments(0, 0, 8)
    assert entries_of(arguments) == [list(entry(r)[0]) for r in records]
    assert arguments.count(b"data") == 6  # entries 0, 3, 4, 7; runs 1-2 and 5-6
    assert entries_of(window.arguments(0, 2, 6)) == [list(entry(r)[0]) for r in records[2:6]]
