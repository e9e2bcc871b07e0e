"""What a worker's writer (of progress, of streamed chunks) writes in its next round:
the tries that reported since its last one, added from the event loop or from the
threads of plain ``def`` jobs.

A thread cannot set a Trio event (that reschedules the waiting task, which only the
event loop may do): it hands the wake-up to the loop through the loop's token, once
per round at most, so reporting per item of a long loop stays cheap.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

import trio

__all__ = ["Due"]

T = TypeVar("T")


class Due(Generic[T]):
    """The items (tries) due for a writer's next round, by identity.

    ``guard`` (a thread lock) is held around :meth:`add` and :meth:`discard`, and
    around whatever the caller changes with them (the try's value), so that a round
    takes each change whole.
    """

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self._items: dict[int, T] = {}
        self._wanted = trio.Event()
        # Set while a wake-up is on its way (or the writer is to find items anyway).
        self._waking = False
        self._token: trio.lowlevel.TrioToken | None = (
            trio.lowlevel.current_trio_token() if trio.lowlevel.in_trio_run() else None
        )

    def add(self, item: T) -> None:
        """Make ``item`` due; wake the writer. Call with :attr:`guard` held, from the
        event loop or any thread."""
        self._items[id(item)] = item
        if self._waking:
            return
        self._waking = True
        if trio.lowlevel.in_trio_run():
            self._wanted.set()
        elif self._token is not None:
            self._token.run_sync_soon(self._wake)
        # (else the writer has not started: it finds the item as it does)

    def discard(self, item: T) -> bool:
        """Take ``item`` out of the next round; whether it was due. Call with
        :attr:`guard` held."""
        return self._items.pop(id(item), None) is not None

    def _wake(self) -> None:
        self._wanted.set()

    async def wait_taken(self) -> dict[int, T]:
        """Wait until items are due, and take them all (the next round)."""
        if self._token is None:
            self._token = trio.lowlevel.current_trio_token()
        while True:
            with self.guard:
                if self._items:
                    items, self._items = self._items, {}
                    self._waking = False
                    return items
                self._waking = False
                if self._wanted.is_set():
                    self._wanted = trio.Event()
                wanted = self._wanted
            await wanted.wait()
