"""The checks behind every setting: one rule each, as attrs validators and on their own."""

from __future__ import annotations

import math

import attrs
import pytest

from streamkit import ConfigError
from streamkit._validate import (
    at_least,
    fraction,
    non_negative_int,
    non_negative_number,
    one_of,
    positive_finite_number,
    positive_int,
    positive_number,
)

CASES = [
    (positive_int, [1, 7], [0, -1, 1.0, True, "1", None]),
    (non_negative_int, [0, 3], [-1, 0.0, False, None]),
    (positive_number, [0.5, 1, math.inf], [0, -0.1, math.nan, True, "1", None]),
    (positive_finite_number, [0.5, 2], [0, math.inf, math.nan]),
    (non_negative_number, [0, 0.0, 2.5, math.inf], [-1, math.nan, False, None]),
    (at_least(0.001, finite=True), [0.001, 10], [0.0005, 0, math.inf, math.nan]),
    (fraction, [0, 0.2, 1], [-0.1, 1.1, math.nan]),
    (one_of("lz4", "zstd", None), ["lz4", None], ["gzip", "", "LZ4"]),
]


@pytest.mark.parametrize(("rule", "good", "bad"), CASES)
def test_rules_accept_and_refuse(rule: object, good: list[object], bad: list[object]) -> None:
    assert isinstance(rule, type(positive_int))
    for value in good:
        rule.check("setting", value)
    for value in bad:
        with pytest.raises(ConfigError, match=r"^setting: must be .*, got ") as info:
            rule.check("setting", value)
        assert info.value.setting == "setting"


def test_or_none_also_accepts_none() -> None:
    positive_int.or_none().check("max_len", None)
    with pytest.raises(ConfigError, match="a positive integer or None"):
        positive_int.or_none().check("max_len", 0)


def test_a_check_is_an_attrs_validator_naming_the_field() -> None:
    @attrs.frozen
    class Options:
        timeout: float = attrs.field(validator=positive_number)

    assert Options(timeout=1.5).timeout == 1.5
    with pytest.raises(ConfigError, match=r"^timeout: must be a number > 0, got 0$") as info:
        Options(timeout=0)
    assert info.value.setting == "timeout"
