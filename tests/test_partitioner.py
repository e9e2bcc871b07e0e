"""The partitioner: canonical key bytes, stable partitions, spread, and the Partitioner."""

from __future__ import annotations

import collections
import enum
import os
import subprocess
import sys
import uuid
from typing import Any

import attrs
import orjson
import pytest
import xxhash
from hypothesis import given, strategies as st

from streamkit._errors import ConfigError
from streamkit._partitioner import Partitioner, canonical_key_bytes, key_text, partition_for


class Colour(enum.Enum):
    RED = "red"
    BLUE = 7


class Level(enum.IntEnum):
    HIGH = 3


class Region(enum.StrEnum):
    EU = "eu"


@attrs.define
class Order:
    order_id: int
    customer: str
    amount: float


# --- canonical key bytes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("order-1", b"order-1"),
        ("ünï", "ünï".encode()),
        ("", b""),
        (b"\x00\xff", b"\x00\xff"),
        (bytearray(b"ab"), b"ab"),
        (memoryview(b"ab"), b"ab"),
        (0, b"0"),
        (42, b"42"),
        (-12, b"-12"),
        (2**70, b"1180591620717411303424"),
        (True, b"true"),
        (False, b"false"),
        (
            uuid.UUID("12345678-1234-5678-1234-56781234ABCD"),
            b"12345678-1234-5678-1234-56781234abcd",
        ),
        (Colour.RED, b"red"),
        (Colour.BLUE, b"7"),
        (Level.HIGH, b"3"),
        (Region.EU, b"eu"),
    ],
)
def test_canonical_key_bytes(key: object, expected: bytes) -> None:
    assert canonical_key_bytes(key) == expected


def test_an_int_and_its_decimal_string_are_the_same_key() -> None:
    assert partition_for(5, 1000) == partition_for("5", 1000) == partition_for(b"5", 1000)


def test_bools_are_not_ints() -> None:
    assert canonical_key_bytes(True) != canonical_key_bytes(1)


@pytest.mark.parametrize(
    ("key", "words"),
    [
        (1.5, "float"),
        (1.0, "float"),
        (None, "None"),
        (("a", 1), "tuple"),
        (object(), "object"),
    ],
)
def test_unpartitionable_keys_are_refused(key: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        canonical_key_bytes(key)
    assert info.value.setting == "key"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (5, "5"),
        (b"5", "5"),
        ("café", "café"),
        (b"\x00\xff", "\x00\\xff"),  # (NUL is UTF-8; 0xff is not, written \xff)
        (b"caf\xc3\xa9\xff\xfe", "café\\xff\\xfe"),
        (bytes([0xFF, 1]), "\\xff\x01"),
    ],
)
def test_key_text_is_utf_8_with_the_bytes_that_are_not_escaped(key: object, expected: str) -> None:
    assert key_text(canonical_key_bytes(key)) == expected


@given(st.binary())
def test_key_text_of_any_bytes_is_text_json_carries(key: bytes) -> None:
    text = key_text(key)
    assert orjson.loads(orjson.dumps(text)) == text  # (no lone surrogates in it)
    try:
        assert text == key.decode()
    except UnicodeDecodeError:
        assert text == key.decode("utf-8", "backslashreplace")


# --- stability ----------------------------------------------------------------------------

GOLDEN_COUNTS = (1, 2, 7, 16, 1000, 2**31)

# Computed once and written down: if any of these change, keys move between partitions
# for every existing stream, which must never happen silently.
GOLDEN: list[tuple[object, list[int]]] = [
    ("", [0, 1, 6, 9, 921, 1373170073]),
    ("a", [0, 1, 6, 11, 955, 697069147]),
    ("order-1", [0, 1, 1, 13, 701, 709075117]),
    ("ünïcødé", [0, 1, 6, 9, 977, 693262649]),
    (b"", [0, 1, 6, 9, 921, 1373170073]),
    (b"\x00\xff", [0, 1, 0, 13, 981, 51584381]),
    (0, [0, 0, 1, 12, 28, 306491372]),
    (1, [0, 0, 3, 4, 420, 906323156]),
    (-1, [0, 0, 2, 8, 128, 665248472]),
    (42, [0, 1, 3, 9, 401, 1993818809]),
    (2**64, [0, 1, 5, 11, 291, 770131355]),
    (True, [0, 0, 3, 10, 594, 1209282122]),
    (False, [0, 0, 3, 10, 818, 1086339706]),
    (uuid.UUID("12345678-1234-5678-1234-567812345678"), [0, 0, 6, 10, 218, 1894516186]),
]


@pytest.mark.parametrize(("key", "expected"), GOLDEN, ids=[repr(key) for key, _ in GOLDEN])
def test_golden_partitions(key: object, expected: list[int]) -> None:
    assert [partition_for(key, count) for count in GOLDEN_COUNTS] == expected


def test_hash_is_standard_xxh64_with_seed_zero() -> None:
    # Published xxHash64 test vector: other languages must reproduce these numbers.
    assert xxhash.xxh64_intdigest(b"", 0) == 0xEF46DB3751D8E999
    assert partition_for("", 2**64 - 1) == 0xEF46DB3751D8E999 % (2**64 - 1)


def test_partitions_do_not_depend_on_the_hash_seed_of_the_process() -> None:
    keys = ["order-1", "order-2", "ünï", "x" * 100]
    script = (
        "from streamkit._partitioner import partition_for\n"
        f"print([partition_for(key, 16) for key in {keys!r}])\n"
        f"print(hash({keys[0]!r}))\n"
    )
    outputs = []
    for seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        outputs.append(result.stdout.splitlines())
    # The salted builtin hash does change, so the subprocesses really differ...
    assert outputs[0][1] != outputs[1][1]
    # ...but partitions are the same in both, and the same as in this process.
    expected = str([partition_for(key, 16) for key in keys])
    assert outputs[0][0] == outputs[1][0] == expected


keys = st.one_of(st.text(), st.binary(), st.integers(), st.booleans(), st.uuids())


@given(key=keys, partition_count=st.integers(min_value=1, max_value=10_000))
def test_partition_is_in_range_and_deterministic(key: object, partition_count: int) -> None:
    partition = partition_for(key, partition_count)
    assert 0 <= partition < partition_count
    assert partition_for(key, partition_count) == partition
    # The partition depends on the canonical bytes only.
    assert partition_for(canonical_key_bytes(key), partition_count) == partition


@given(number=st.integers())
def test_ints_partition_like_their_decimal_strings(number: int) -> None:
    assert partition_for(number, 97) == partition_for(str(number), 97)


@pytest.mark.parametrize(
    "key_set",
    [
        [f"order-{i}" for i in range(10_000)],
        list(range(10_000)),
        [uuid.UUID(int=i * 7919) for i in range(10_000)],
    ],
    ids=["strings", "ints", "uuids"],
)
def test_keys_spread_evenly(key_set: list[object]) -> None:
    partition_count = 16
    counts = collections.Counter(partition_for(key, partition_count) for key in key_set)
    mean = len(key_set) / partition_count
    assert len(counts) == partition_count
    assert all(0.8 * mean <= count <= 1.2 * mean for count in counts.values()), counts


@pytest.mark.parametrize("partition_count", [0, -1, True, 1.5, "8"])
def test_partition_count_must_be_a_positive_int(partition_count: Any) -> None:
    with pytest.raises(ConfigError) as info:
        partition_for("a", partition_count)
    assert info.value.setting == "partition_count"


# --- Partitioner --------------------------------------------------------------------------


def test_partitioner_by_field() -> None:
    partitioner = Partitioner(partition_by="customer", partition_count=16, record=Order)
    order = Order(order_id=1, customer="ada", amount=2.0)
    assert partitioner.partition_of(order) == partition_for("ada", 16)


def test_partitioner_by_field_without_a_record_type() -> None:
    partitioner: Partitioner[Order] = Partitioner(partition_by="order_id", partition_count=16)
    order = Order(order_id=99, customer="ada", amount=2.0)
    assert partitioner.partition_of(order) == partition_for(99, 16)


def test_partitioner_by_function() -> None:
    partitioner: Partitioner[Order] = Partitioner(
        partition_by=lambda order: f"{order.customer}/{order.order_id}", partition_count=16
    )
    order = Order(order_id=3, customer="ada", amount=2.0)
    assert partitioner.partition_of(order) == partition_for("ada/3", 16)


def test_partitioner_refuses_an_unknown_field() -> None:
    with pytest.raises(ConfigError, match="no field 'customer_id'") as info:
        Partitioner(partition_by="customer_id", partition_count=16, record=Order)
    assert info.value.setting == "partition_by"


def test_partitioner_refuses_a_float_field() -> None:
    with pytest.raises(ConfigError, match="float") as info:
        Partitioner(partition_by="amount", partition_count=16, record=Order)
    assert info.value.setting == "partition_by"


def test_partitioner_refuses_a_float_key_at_runtime() -> None:
    partitioner: Partitioner[Order] = Partitioner(partition_by="amount", partition_count=16)
    with pytest.raises(ConfigError, match="float"):
        partitioner.partition_of(Order(order_id=1, customer="ada", amount=2.0))


def test_partitioner_refuses_a_bad_partition_by() -> None:
    with pytest.raises(ConfigError) as info:
        Partitioner(partition_by=5, partition_count=16)  # type: ignore[arg-type]
    assert info.value.setting == "partition_by"


def test_partitioner_refuses_a_bad_partition_count() -> None:
    with pytest.raises(ConfigError) as info:
        Partitioner(partition_by="order_id", partition_count=0, record=Order)
    assert info.value.setting == "partition_count"


def test_examples_in_the_docs() -> None:
    assert partition_for("customer-42", 8) == 7
    assert canonical_key_bytes("café") == bytes.fromhex("636166c3a9")
