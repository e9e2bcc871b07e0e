"""Idempotent appends: a retried append with the same marker never appends twice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamkit import App, Record
from streamkit._idempotent import _APPEND, MARKER_TTL, append_once, marker_key
from streamkit._keys import stream_key
from streamkit._produce import append_reply

if TYPE_CHECKING:
    from streamkit import Redis


class Item(Record):
    key: str
    n: int


def test_marker_shares_the_hash_slot_of_the_stream() -> None:
    key = stream_key("app", "orders", 3)
    assert marker_key(key, "t1") == "__once:{app.orders.3}:t1"
    # An untagged key: the whole key becomes the tag, so the slot is the key's own.
    assert marker_key("plain", "t1") == "__once:{plain}:t1"


async def test_a_resent_append_returns_the_first_ids_and_appends_nothing(redis: Redis) -> None:
    script = _APPEND
    key = stream_key("app", "s", 0)
    marker = marker_key(key, "resent")
    args: list[Any] = [1000, 0, MARKER_TTL, 1, 1, b"f", b"v", 1, b"f", b"w"]
    first: Any = await script(redis, keys=[key, marker], args=args)
    # As if the reply to the first call was lost and the call was sent again.
    second: Any = await script(redis, keys=[key, marker], args=args)
    ids, _, before = append_reply(first)
    assert (len(ids), before) == (2, False)
    assert append_reply(second) == (ids, 0, True)
    assert await redis.xlen(key) == 2
    assert 0 < await redis.ttl(marker) <= MARKER_TTL


async def test_markers_of_finished_appends_are_deleted_by_the_next_append(
    redis: Redis,
) -> None:
    key = stream_key("app", "s", 0)
    for n in range(50):
        ids, dropped = await append_once(
            redis,
            key,
            keep=1000,
            cap=0,
            entries=[1, b"n", str(n).encode()],
        )
        assert len(ids) == 1
        assert dropped == 0
    assert await redis.xlen(key) == 50
    # Only the last append's marker is left (its reply arrived; the next append to
    # the partition would delete it).
    assert len([k async for k in redis.scan_iter("__once:*")]) == 1


async def test_send_appends_each_record_once_and_keeps_few_markers(redis_url: str) -> None:
    app = App("once", redis_url=redis_url)
    stream = app.stream("items", record=Item, partition_by="key", partition_count=4)
    async with app:
        for n in range(200):
            await stream.send(Item(key=f"k{n}", n=n))
        await stream.send_many([Item(key=f"k{n}", n=n) for n in range(200, 1200)], chunk_size=50)
        total = sum([await app.redis.xlen(k) for k in stream.partition_keys()])
        markers = [k async for k in app.redis.scan_iter("__once:*")]
    assert total == 1200
    assert len(markers) <= stream.partition_count
