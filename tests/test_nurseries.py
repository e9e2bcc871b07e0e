"""One exception out of a component's nursery, never a group: the rule and its helper."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from streamkit._nurseries import meaningful_leaf, open_service_nursery, pick_exception

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

pytestmark = pytest.mark.timeout(10)


class Crash(Exception):
    pass


def cancelled() -> trio.Cancelled:
    # Cancelled has no public constructor; only its type matters to the rule.
    return trio.Cancelled._create()


def test_the_rule() -> None:
    body, task, stop = ValueError("body"), Crash("task"), cancelled()
    assert meaningful_leaf(BaseExceptionGroup("", [stop, task]), body) is task
    assert meaningful_leaf(BaseExceptionGroup("", [task, body]), body) is body
    assert meaningful_leaf(BaseExceptionGroup("", [stop, BaseExceptionGroup("", [task])])) is task
    assert meaningful_leaf(BaseExceptionGroup("", [stop, task]), stop) is task
    assert meaningful_leaf(BaseExceptionGroup("", [stop])) is stop
    assert pick_exception(body, task) is body
    assert pick_exception(stop, task) is task
    assert pick_exception(stop, None) is stop
    assert pick_exception(None, None) is None


async def start_and_raise(nursery: trio.Nursery, task: Callable[[], Awaitable[None]]) -> None:
    nursery.start_soon(task)
    await trio.testing.wait_all_tasks_blocked()
    raise KeyError("boom")


async def test_the_blocks_own_exception_leaves_as_itself() -> None:
    stopped = trio.Event()

    async def background() -> None:
        try:
            await trio.sleep_forever()
        finally:
            stopped.set()

    with pytest.raises(KeyError, match="boom") as info:
        async with open_service_nursery() as nursery:
            await start_and_raise(nursery, background)
    assert not isinstance(info.value, BaseExceptionGroup)
    assert stopped.is_set()


async def test_a_crashing_task_cancels_the_block_and_leaves_as_itself() -> None:
    async def crash() -> None:
        raise Crash("task")

    async def start_and_wait(nursery: trio.Nursery) -> None:
        nursery.start_soon(crash)
        await trio.sleep_forever()

    with pytest.raises(Crash, match="task"):
        async with open_service_nursery() as nursery:
            await start_and_wait(nursery)


async def test_leaving_the_block_cancels_the_tasks_with_the_reason() -> None:
    reasons: list[str | None] = []

    async def background() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled as exc:
            reasons.append(exc.reason)
            raise

    async with open_service_nursery(reason="thing closing") as nursery:
        nursery.start_soon(background)
        await trio.testing.wait_all_tasks_blocked()
    assert reasons == ["thing closing"]


async def test_an_outer_cancellation_reaches_its_scope() -> None:
    with trio.move_on_after(0.01) as outer:
        async with open_service_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            await trio.sleep_forever()
    assert outer.cancelled_caught


async def test_the_block_wins_over_a_task_that_fails_as_it_is_cancelled() -> None:
    async def fails_on_cancel() -> None:
        try:
            await trio.sleep_forever()
        finally:
            raise Crash("while stopping")

    with pytest.raises(KeyError):
        async with open_service_nursery() as nursery:
            await start_and_raise(nursery, fails_on_cancel)
