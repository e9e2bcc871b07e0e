"""A fetched batch's entries, laid end to end or one list each: the values of a field."""

from __future__ import annotations

from streamkit.lowlevel import Batch


def test_values_of_a_one_field_span_however_the_batch_is_laid_out() -> None:
    ids = [b"1-0", b"2-0", b"3-0"]
    flat = Batch.from_flat(ids, [b"j", b"a", b"j", b"b", b"x", b"c"], 2)
    listed = Batch(ids, [[b"j", b"a"], [b"j", b"b"], [b"x", b"c"]])
    mixed = Batch.from_flat(ids, [b"j", b"a", b"j", b"b", b"y", b"c", b"z"], [2, 2, 3])
    for batch in (flat, listed, mixed):
        assert batch.values_of(b"j", 0, 2) == [b"a", b"b"]
        assert batch.values_of(b"j", 1, 2) == [b"b"]
        assert batch.values_of(b"j", 0, 3) is None  # the last entry has another field
        assert batch.values_of(b"x", 2, 3) == ([b"c"] if batch is not mixed else None)
