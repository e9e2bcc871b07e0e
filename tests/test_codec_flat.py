"""The flat-record fast path of the JSON codec gives exactly what cattrs gives."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from streamkit import DecodeError, Record, codec_for


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
