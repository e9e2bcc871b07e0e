"""The job queue's pure parts: statuses, options and calls, argument checks, and the
keys (the retry decision is in test_jobs_outcome.py)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any, cast

import pytest

from streamkit import ConfigError
from streamkit.jobs import Job, JobCall, JobOptions, JobStatus
from streamkit.jobs._layout import ShardKeys, shard_for
from streamkit.jobs._plan import MAX_WAIT, Placement, plan_enqueue


def _job(fn: Any, name: str = "work") -> Job[Any, Any]:
    return Job(name, fn, JobOptions(), None, lambda: cast("Any", None))


# ---------------------------------------------------------------------- statuses


def test_exactly_success_dead_aborted_and_expired_are_final() -> None:
    final = {status for status in JobStatus if status.final}
    assert final == {JobStatus.SUCCESS, JobStatus.DEAD, JobStatus.ABORTED, JobStatus.EXPIRED}


def test_statuses_are_the_strings_stored_in_redis() -> None:
    assert [s.value for s in JobStatus] == [
        "scheduled",
        "waiting",
        "held",
        "sent",
        "executing",
        "retry",
        "success",
        "dead",
        "aborted",
        "expired",
    ]
    assert JobStatus("retry") is JobStatus.RETRY
    assert f"{JobStatus.DEAD}" == "dead"


# ---------------------------------------------------------------------- options and calls


def test_job_options_defaults() -> None:
    options = JobOptions()
    assert options.retries == 3
    assert options.timeout is None
    assert options.retry_on == (Exception,)
    assert options.priority == "normal"
    assert options.keep_result is True
    assert options.expires is None


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("retries", -1, "retries"),
        ("retries", 1.5, "retries"),
        ("retries", True, "retries"),
        ("timeout", 0, "timeout"),
        ("timeout", -1.0, "timeout"),
        ("retry_on", ValueError, "retry_on: must be a tuple"),
        ("retry_on", (ValueError, "KeyError"), "retry_on: must be a tuple"),
        ("retry_on", (int,), "retry_on: must be a tuple"),
        ("priority", "urgent", "priority: must be 'high', 'normal' or 'low'"),
        ("result_ttl", 0, "result_ttl"),
        ("expires", 0, "expires"),
        ("dedupe_window", 0, "dedupe_window"),
        ("backoff", 5, "backoff: must be a streamkit.Backoff .*got 5"),
        ("backoff", "fast", "backoff: must be a streamkit.Backoff .*got 'fast'"),
        ("backoff", None, "backoff: must be a streamkit.Backoff .*got None"),
    ],
)
def test_bad_job_options_are_refused(option: str, value: object, message: str) -> None:
    options: dict[str, Any] = {option: value}
    with pytest.raises(ConfigError, match=message):
        JobOptions(**options)


def test_the_dedupe_window_is_rounded_up_to_whole_seconds() -> None:
    assert JobOptions(dedupe_window=1.2).dedupe_window == 2
    assert JobOptions(dedupe_window=3).dedupe_window == 3


def test_a_job_call_refuses_an_unknown_priority() -> None:
    with pytest.raises(ConfigError, match="priority"):
        JobCall(priority="urgent")  # type: ignore[arg-type]
    assert JobCall(priority="low").priority == "low"
    assert JobCall().kwargs == {}


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("delay", 1e300, r"^delay: must be at most a century"),
        ("delay", math.inf, r"^delay: must be at most a century"),
        ("expires", timedelta(days=365 * 101), r"^expires: must be at most a century"),
        ("delay", -1, r"^delay: must be a number >= 0, got -1"),
        # (within no time at all: refused, as the job option is; it read as no expiry)
        ("expires", 0, r"^expires: must be a number > 0, got 0"),
        ("expires", timedelta(0), r"^expires: must be a number > 0"),
        ("at", datetime(2030, 1, 1), r"^at: must be a timezone-aware datetime"),
    ],
)
def test_a_call_the_queue_cannot_schedule_is_refused_before_anything_is_sent(
    option: str, value: object, message: str
) -> None:
    # Refused while planning (no Redis), as a ConfigError naming the option.
    call = JobCall(args=(1,), **{option: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        plan_enqueue(_job(lambda n: n), [call], Placement(1, lambda: "id"), queue="q")
    # delay=0 is accepted (no delay: now), as the message says
    assert (
        plan_enqueue(
            _job(lambda n: n), [JobCall(args=(1,), delay=0)], Placement(1, lambda: "id"), queue="q"
        ).per_shard[0][2]
        == b'{"d":0}'
    )  # (the script runs a job of delay 0 now)
    plan = plan_enqueue(
        _job(lambda n: n),
        [JobCall(args=(1,), delay=MAX_WAIT)],
        Placement(1, lambda: "id"),
        queue="q",
    )
    assert len(plan.placed) == 1


# ---------------------------------------------------------------------- declarations


def test_a_generator_is_not_a_job() -> None:
    def numbers() -> Any:
        yield 1

    async def anumbers() -> Any:
        yield 1

    with pytest.raises(ConfigError, match="not a generator"):
        _job(numbers)
    with pytest.raises(ConfigError, match="not a generator"):
        _job(anumbers)


def test_a_job_name_must_be_usable_in_keys() -> None:
    with pytest.raises(ConfigError, match="job name"):
        _job(lambda: None, name="a.b")


def test_a_job_knows_whether_it_is_async_and_stays_callable() -> None:
    async def fetch(x: int) -> int:
        return x

    def resize(x: int) -> int:
        return x * 2

    assert _job(fetch).is_async
    assert not _job(resize).is_async
    assert _job(resize)(21) == 42


# ---------------------------------------------------------------------- argument checks


def _resize(path: str, width: int, height: int = 0, *, fmt: str = "png") -> None:
    pass


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("a.png", 10), {}),
        (("a.png", 10, 20), {}),
        (("a.png",), {"width": 10}),
        ((), {"path": "a.png", "width": 10, "fmt": "jpg"}),
        (("a.png", 10, 20), {"fmt": "jpg"}),
    ],
)
def test_arguments_the_function_accepts_pass(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _job(_resize, "resize").check_arguments(args, kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("a.png",), {}, "missing a required argument: 'width'"),
        (("a.png", 1, 2, 3), {}, "too many positional arguments"),
        (("a.png", 1), {"colour": "red"}, "unexpected keyword argument 'colour'"),
        (("a.png", 1), {"width": 2}, "multiple values for argument 'width'"),
        ((), {}, "missing a required argument: 'path'"),
    ],
)
def test_arguments_the_function_refuses_raise_type_error_naming_the_job(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=rf"^job resize: .*{message}"):
        _job(_resize, "resize").check_arguments(args, kwargs)


def test_a_required_keyword_only_argument_is_checked_even_with_positionals() -> None:
    def send(to: str, *, subject: str) -> None:
        pass

    job = _job(send, "send")
    with pytest.raises(TypeError, match="subject"):
        job.check_arguments(("a@b",), {})
    job.check_arguments(("a@b",), {"subject": "hi"})


def test_var_positional_and_var_keyword_accept_anything() -> None:
    def anything(*args: Any, **kwargs: Any) -> None:
        pass

    job = _job(anything, "anything")
    job.check_arguments((), {})
    job.check_arguments(tuple(range(50)), {"x": 1, "y": 2})


# ---------------------------------------------------------------------- keys


def test_every_key_of_a_shard_shares_its_hash_tag() -> None:
    keys = ShardKeys("mail", 3)
    assert keys.base == "__jobs:{mail.3}"
    assert keys.keys == (
        "__jobs:{mail.3}:q0",
        "__jobs:{mail.3}:q1",
        "__jobs:{mail.3}:q2",
        "__jobs:{mail.3}:sched",
        "__jobs:{mail.3}:dead",
        "__jobs:{mail.3}:done",
        "__jobs:{mail.3}:counts",
    )
    assert [keys.ready(p) for p in range(3)] == list(keys.keys[:3])
    assert keys.schedule == keys.keys[3]
    assert keys.dead == keys.keys[4]
    assert keys.done == keys.keys[5]
    assert keys.counts == keys.keys[6]
    assert keys.job("abc") == "__jobs:{mail.3}:job:abc"
    for key in (*keys.keys, keys.job("x")):
        assert key[key.index("{") : key.index("}") + 1] == "{mail.3}"


def test_shards_of_one_queue_have_distinct_hash_tags() -> None:
    tags = {ShardKeys("mail", s).base for s in range(8)}
    assert len(tags) == 8


@pytest.mark.parametrize("name", ["a.b.c", "a{b}", "", "a b", "a:b", "a.", ".b"])
def test_a_queue_name_that_would_break_the_keys_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="queue name"):
        ShardKeys(name, 0)


def test_an_apps_named_queue_is_app_dot_name() -> None:
    assert ShardKeys("shop.gpu", 2).base == "__jobs:{shop.gpu.2}"


def test_a_job_id_always_maps_to_the_same_shard() -> None:
    ids = [f"job-{i}" for i in range(200)]
    first = [shard_for(job_id, 5) for job_id in ids]
    assert first == [shard_for(job_id, 5) for job_id in ids]
    assert set(first) == set(range(5))
    assert {shard_for(job_id, 1) for job_id in ids} == {0}
