"""``streamkit status --watch``: the status view, refreshed until Ctrl-C.

Three ways to show it, chosen by where standard output goes: on a terminal, a rich
``Live`` view redrawn in place and cut to the terminal's size; elsewhere (a pipe, a
file), one plain snapshot after another, without escape codes; with ``--json``, one
JSON document per line (JSON lines). SIGINT or SIGTERM ends it with exit code 0.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import orjson
import trio
from rich.live import Live

from .._literal import printable
from .._nurseries import open_service_nursery
from ._exits import StdoutConsole
from ._fleet import fleet_json, fleet_samples
from ._fleet_view import fleet_view

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from rich.console import Console

    from .._app import App
    from ._fleet import FleetSample

__all__ = ["until_signal", "watch_status"]


async def watch_status(app: App, *, interval: float, as_json: bool) -> None:
    """Show ``app``'s status every ``interval`` seconds until SIGINT or SIGTERM.

    Cancellation:
        A signal cancels the view; the last frame stays on the screen.

    Error handling:
        :class:`~streamkit.RedisUnavailable` if Redis cannot be reached at the
        start; a reading that fails later is shown (or, with JSON, said on standard
        error) and the next one tries again.
    """
    console = StdoutConsole(highlight=False)
    if as_json:
        show = _json_lines
    elif console.is_terminal:
        show = _live
    else:
        show = _plain
    # A reader gone (`... | head`) ends the command quietly: see streamkit._cli._exits.
    async with until_signal(), app:
        await show(app, console, interval)


@contextlib.asynccontextmanager
async def until_signal() -> AsyncIterator[None]:
    """Run the block until SIGINT or SIGTERM, which cancels it: a command that runs
    until Ctrl-C ends cleanly (exit code 0), without a KeyboardInterrupt.

    Cancellation:
        The first signal cancels the block; the block's clean-up runs as usual.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_service_nursery(reason="stopped by a signal") as nursery:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel("stopped by a signal")
                    return

            nursery.start_soon(stop_on_signal)
            yield


def _footer(interval: float) -> str:
    return f"every {interval:g}s · Ctrl-C quits"


async def _live(app: App, console: Console, interval: float) -> None:
    with Live(
        console=console,
        auto_refresh=False,
        redirect_stdout=False,
        redirect_stderr=False,
        vertical_overflow="crop",
    ) as live:
        async with contextlib.aclosing(fleet_samples(app, interval=interval)) as samples:
            async for sample in samples:
                # One line less than the terminal: the cursor rests on the last one.
                view = fleet_view(
                    sample,
                    width=console.width,
                    height=max(1, console.height - 1),
                    now=datetime.now(UTC),
                    footer=_footer(interval),
                )
                live.update(view, refresh=True)


async def _plain(app: App, console: Console, interval: float) -> None:
    async with contextlib.aclosing(fleet_samples(app, interval=interval)) as samples:
        async for sample in samples:
            view = fleet_view(sample, width=console.width, height=None, now=datetime.now(UTC))
            console.print(view)
            console.print()
            sys.stdout.flush()


async def _json_lines(app: App, console: Console, interval: float) -> None:
    async with contextlib.aclosing(fleet_samples(app, interval=interval)) as samples:
        async for sample in samples:
            _write_json(sample)


def _write_json(sample: FleetSample) -> None:
    if sample.error is not None or sample.snapshot is None:
        print(
            f"reading failed: {printable(sample.error)}; trying again", file=sys.stderr, flush=True
        )
        return
    sys.stdout.buffer.write(orjson.dumps(fleet_json(sample.snapshot, sample.rates)) + b"\n")
    sys.stdout.buffer.flush()
