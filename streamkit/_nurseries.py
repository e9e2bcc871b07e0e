"""Service nurseries, and the one exception a user should see out of exception groups.

Every ``open_*`` context manager runs background tasks in a nursery, so errors can
arrive wrapped in exception groups; users get a single meaningful exception instead
(STYLE: no exception-group soup). One rule decides which, everywhere:

1. the block's own exception, unless it is a ``trio.Cancelled``;
2. else the first exception that is not a ``Cancelled``: a background task crashed,
   and the ``Cancelled`` around it were caused by that crash;
3. else the first ``Cancelled``, for the cancelled scope outside to catch.

:func:`open_service_nursery` applies it to a component's nursery.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Sequence

__all__ = ["exception_chain", "leaves", "meaningful_leaf", "open_service_nursery", "pick_exception"]


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the leaves of an exception group, and their causes and contexts, each
    once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)


def leaves(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc`` (``[exc]`` itself if it is no group)."""
    found: list[BaseException] = []
    pending = [exc]
    while pending:
        current = pending.pop()
        if isinstance(current, BaseExceptionGroup):
            pending.extend(reversed(current.exceptions))
        else:
            found.append(current)
    return found


def _choose(candidates: Sequence[BaseException], body_exc: BaseException | None) -> BaseException:
    # The module docstring's rule; ``candidates`` is never empty.
    if not isinstance(body_exc, trio.Cancelled | None) and any(
        candidate is body_exc for candidate in candidates
    ):
        return body_exc
    for candidate in candidates:
        if not isinstance(candidate, trio.Cancelled):
            return candidate
    return candidates[0]


def meaningful_leaf(
    group: BaseExceptionGroup[BaseException], body_exc: BaseException | None = None
) -> BaseException:
    """The exception worth raising from ``group``, by the rule above.

    Args:
        group: what a nursery raised.
        body_exc: the exception the ``async with`` block raised into the nursery, if
            any; it wins if it is in ``group`` and is not a ``Cancelled``.
    """
    found = leaves(group)
    return _choose(found, body_exc) if found else group


def pick_exception(
    body_exc: BaseException | None, task_exc: BaseException | None
) -> BaseException | None:
    """Which exception leaves a context manager whose block ran beside a task.

    The same rule, for code that kept the block's exception aside instead of letting
    it into the nursery: the block's own exception wins, unless it is merely the
    ``Cancelled`` that a crashing background task caused.
    """
    candidates = [exc for exc in (body_exc, task_exc) if exc is not None]
    return _choose(candidates, body_exc) if candidates else None


@asynccontextmanager
async def open_service_nursery(*, reason: str = "the block ended") -> AsyncIterator[trio.Nursery]:
    """Yield a nursery for a component's background tasks, for the length of a block.

    The component's ``open_*`` function starts its tasks in the nursery and yields to
    its caller inside this block::

        async with open_service_nursery(reason="fetcher closing") as nursery:
            nursery.start_soon(fetcher._run)
            yield fetcher

    When the block ends, however it ends, the nursery is cancelled with ``reason``,
    so the background tasks end with it; a task that crashes cancels the block.

    Cancellation:
        A ``Cancelled`` of the nursery's own scope (a task crashed, or the component
        cancelled its nursery) ends here; one from an outer scope propagates.

    Error handling:
        One exception leaves the block, never an exception group, chosen by the
        rule in this module's docstring: the block's own exception first, else the
        crashed task's. Other exceptions of the same group are dropped; they were
        usually caused by the one raised.
    """
    body_exc: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            try:
                yield nursery
            except BaseException as exc:
                # Into the nursery, so that a Cancelled meets the scope it belongs to.
                body_exc = exc
                raise
            finally:
                nursery.cancel_scope.cancel(reason)
    except BaseExceptionGroup as group:
        to_raise = meaningful_leaf(group, body_exc)
    else:
        return
    # Raised outside the except clause, so that it is not chained to the group.
    raise to_raise
