"""The job worker's pure decisions, without Redis: what a try's end makes of its job
(ok, retry or dead, and after how long: :func:`streamkit.jobs._outcome.decide`), and
how a batch is cut into script calls."""

from __future__ import annotations

import orjson
import pytest

from streamkit import Backoff
from streamkit.jobs import JobOptions
from streamkit.jobs._batches import chunks
from streamkit.jobs._outcome import Failure, Verdict, decide, retry_delay, type_name

EXACT = Backoff(initial=0.5, maximum=3.0, factor=2.0, jitter=0)


# ---------------------------------------------------------------------- the verdict


def test_a_try_that_succeeded_is_ok_whatever_its_number() -> None:
    options = JobOptions(retries=0)
    assert decide(options, 1, None, 0.5) == Verdict("ok")
    assert decide(options, 7, None, 0.5) == Verdict("ok")


def test_a_failed_try_is_retried_while_tries_are_left_then_the_job_is_dead() -> None:
    options = JobOptions(retries=2, backoff=EXACT)
    failure = Failure("ValueError", "no luck")
    assert [decide(options, tries, failure, 0.0) for tries in (1, 2, 3)] == [
        Verdict("retry", 500),
        Verdict("retry", 1000),
        Verdict("dead"),
    ]


def test_no_retries_means_dead_at_the_first_failure() -> None:
    assert decide(JobOptions(retries=0), 1, Failure("X", "y"), 0.0) == Verdict("dead")


def test_a_failure_that_is_never_retried_is_dead_with_tries_left() -> None:
    options = JobOptions(retries=5)
    for failure in [
        Failure("KeyError", "'a'", unretried="not in retry_on"),
        Failure("BadInput", "bad arguments: ...", unretried="bad input"),
    ]:
        assert decide(options, 1, failure, 0.0) == Verdict("dead")


def test_a_try_past_the_last_one_is_dead_too() -> None:
    # A try taken over after its worker died counts: a job may be past max_tries.
    assert decide(JobOptions(retries=1), 5, Failure("X", "y"), 0.0) == Verdict("dead")


# ---------------------------------------------------------------------- retry delays


def test_retry_delays_grow_exponentially_up_to_the_maximum() -> None:
    assert [retry_delay(EXACT, tries, 0.7) for tries in range(1, 7)] == [
        500,
        1000,
        2000,
        3000,
        3000,
        3000,
    ]


def test_the_first_retry_waits_the_initial_delay() -> None:
    backoff = Backoff(initial=0.01, jitter=0)
    assert retry_delay(backoff, 1, 0.3) == 10
    assert retry_delay(backoff, 0, 0.3) == 10


@pytest.mark.parametrize(("draw", "expected"), [(0.0, 3000), (0.5, 2250), (0.9999, 1501)])
def test_jitter_cuts_each_delay_by_up_to_its_fraction(draw: float, expected: int) -> None:
    backoff = Backoff(initial=1.0, maximum=60.0, factor=3.0, jitter=0.5)
    assert retry_delay(backoff, 2, draw) == expected


def test_a_retry_delay_is_at_least_a_millisecond() -> None:
    assert retry_delay(Backoff(initial=1e-6, jitter=0), 1, 0.0) == 1


# ---------------------------------------------------------------------- the error kept


class Custom(Exception):
    pass


def test_a_failure_of_an_exception_keeps_its_type_message_and_traceback() -> None:
    try:
        raise Custom("it broke")
    except Custom as exc:
        failure = Failure.of(exc, unretried="not in retry_on")
    assert failure.type == f"{__name__}.Custom"
    assert failure.message == "it broke"
    assert failure.unretried == "not in retry_on"
    assert 'raise Custom("it broke")' in failure.traceback
    assert failure.why == f"{__name__}.Custom: it broke"
    assert orjson.loads(failure.encode()) == {
        "type": f"{__name__}.Custom",
        "message": "it broke",
        "traceback": failure.traceback,
    }


def test_builtin_types_are_named_without_their_module() -> None:
    assert type_name(ValueError()) == "ValueError"
    assert type_name(Custom()) == f"{__name__}.Custom"


# ---------------------------------------------------------------------- batches


def test_a_batch_is_cut_by_count() -> None:
    assert list(chunks([1] * 7, max_cost=3)) == [range(3), range(3, 6), range(6, 7)]


def test_a_batch_is_cut_by_bytes_and_a_large_item_goes_alone() -> None:
    sizes = [400, 400, 400, 5000, 10, 10]
    assert list(chunks(sizes, max_cost=100, max_bytes=1000)) == [
        range(2),
        range(2, 3),
        range(3, 4),
        range(4, 6),
    ]


def test_a_batch_is_cut_by_cost_and_a_costly_item_goes_alone() -> None:
    costs = [1, 1, 50, 1, 1]
    assert list(chunks([1] * 5, max_cost=10, costs=costs)) == [
        range(2),
        range(2, 3),
        range(3, 5),
    ]


def test_an_empty_batch_makes_no_call() -> None:
    assert list(chunks([], max_cost=10)) == []
