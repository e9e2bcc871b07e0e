"""Turning exception groups back into the one exception a user should see.

Every ``open_*`` context manager runs background tasks in a nursery, so errors can
arrive wrapped in exception groups; users get a single meaningful exception instead
(STYLE: no exception-group soup).
"""

from __future__ import annotations

import trio

__all__ = ["leaves", "meaningful_leaf", "pick_exception"]


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


def meaningful_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The exception worth raising from ``group``: its first leaf that is not a
    ``Cancelled`` (the others were usually caused by it), else its first leaf."""
    found = leaves(group)
    for leaf in found:
        if not isinstance(leaf, trio.Cancelled):
            return leaf
    return found[0] if found else group


def pick_exception(
    body_exc: BaseException | None, task_exc: BaseException | None
) -> BaseException | None:
    """Which exception leaves a context manager whose block ran beside a task.

    The block's own exception wins, unless it is merely the ``Cancelled`` that a
    crashing background task caused: then the task's error is the real story.
    """
    task_crashed = task_exc is not None and not isinstance(task_exc, trio.Cancelled)
    if task_crashed and (body_exc is None or isinstance(body_exc, trio.Cancelled)):
        return task_exc
    return body_exc if body_exc is not None else task_exc
