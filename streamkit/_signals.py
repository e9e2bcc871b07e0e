"""Plain Python signal handlers put in place for a block, and the previous ones back after it."""

from __future__ import annotations

import contextlib
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from types import FrameType

__all__ = ["signal_handlers"]


@contextlib.contextmanager
def signal_handlers(
    signums: Iterable[int], handle: Callable[[int, FrameType | None], object]
) -> Iterator[None]:
    """While the block runs, ``handle`` is the handler of each signal in ``signums``;
    each previous handler (the default one where Python had none) is restored after."""
    previous = {signum: signal.signal(signum, handle) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
