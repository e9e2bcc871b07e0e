"""The middleware pump: runs a partition's middleware chain in a task of its own.

Middleware (``m(iterator) -> iterator`` over :class:`~streamkit.Event` objects) may
wait, drop events or hold state between them, so the chain runs in a pump task of the
nursery that :func:`~streamkit.open_events` opens in the partition's own task, and
hands the events it yields over a channel of capacity 0: the chain never runs ahead of
the processor by more than the event it is handing over. Nothing of a partition
outlives the ``async with`` block.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from ._event import Event
from ._events_delivery import Stop

if TYPE_CHECKING:
    from ._events_delivery import Delivery

__all__ = ["MiddlewarePump"]

R = TypeVar("R")

#: Closing a middleware chain (its ``aclose``) may take at most this long.
MIDDLEWARE_CLOSE_TIMEOUT = 1.0


class _PumpError:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class MiddlewarePump(Generic[R]):
    """A running middleware chain over a delivery's fetched events."""

    def __init__(self, delivery: Delivery[R], nursery: trio.Nursery) -> None:
        self._delivery = delivery
        delivery.ledger.start_dispatching()
        stages: list[AsyncIterator[Event[Any]]] = [_Fetched(delivery)]
        for middleware in delivery.middleware:
            stages.append(middleware(stages[-1]))
        send, self._receive = trio.open_memory_channel[Event[R] | _PumpError](0)
        self._scope = trio.CancelScope()
        nursery.start_soon(self._run, stages, send)

    async def next(self, deadline: float) -> Event[R] | None:
        """The next event the chain yields; ``None`` once ``deadline`` passed.

        Raises:
            Stop: the chain ended, or draining began.
            Exception: what the chain raised (the events it had taken are handed
                out again by the next chain).
        """
        delivery = self._delivery
        if delivery.draining:
            raise Stop
        if delivery.ledger.done_count():
            # The pump may be waiting for new events already: what the processor
            # moved past since must not wait with it.
            delivery.commit_soon()
        with delivery.wait_scope(deadline) as scope:
            try:
                item = await self._receive.receive()
            except trio.EndOfChannel:
                raise Stop from None
            finally:
                delivery.end_wait()
        if scope.cancelled_caught:
            if delivery.draining:
                raise Stop
            return None
        if isinstance(item, _PumpError):
            delivery.stop_pump()
            delivery.ledger.requeue_dispatched()
            raise item.error
        return item

    def stop(self) -> None:
        """Stop the chain's task (it closes its stages on the way out)."""
        self._scope.cancel()

    async def _run(
        self,
        stages: list[AsyncIterator[Event[R]]],
        send: trio.MemorySendChannel[Event[R] | _PumpError],
    ) -> None:
        with self._scope, send:
            try:
                async for event in stages[-1]:
                    await send.send(event)
            except Exception as exc:
                await send.send(_PumpError(exc))
            finally:
                # Close every stage, outermost first, here and now: an inner one
                # left suspended would be finalized later, outside the partition.
                with trio.move_on_after(MIDDLEWARE_CLOSE_TIMEOUT) as closing:
                    closing.shield = True
                    for stage in reversed(stages):
                        aclose = getattr(stage, "aclose", None)
                        if aclose is not None:
                            with contextlib.suppress(Exception):
                                await aclose()


class _Fetched(AsyncIterator["Event[R]"]):
    """The fetched events, as the first middleware sees them (runs in the pump)."""

    def __init__(self, delivery: Delivery[R]) -> None:
        self._delivery = delivery

    async def __anext__(self) -> Event[R]:
        delivery = self._delivery
        event = await delivery.next_fetched(math.inf, wake=False)
        assert event is not None
        delivery.ledger.dispatch(event)
        return event
