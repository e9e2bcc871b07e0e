"""Asking before acting, and acting on many things in steps that a signal can stop.

:func:`confirm` asks a yes/no question whose refusal ends the command.
:func:`confirm_and_act` is the one flow of the bulk commands (replaying and purging
dead letters and dead jobs): say what will be done, ask, then act one step (one
round trip) at a time with a progress bar, and account for every step.

Stopping midway: the first SIGINT or SIGTERM lets the step in flight finish and
stops before the next, so what was done is known exactly and nothing is lost (each
step leaves every item either done or untouched); the command says how many were
done, with exit code 128 + the signal's number. A second signal stops at once: the
step in flight may then be done or not, which the message says.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeAlias

import asyncclick as click
import attrs
import trio

from .._errors import StreamkitError
from ._exits import fail
from ._options import progress_bar, stderr, stopping_notice, yes_option

__all__ = ["BulkAction", "OnProgress", "bulk_options", "confirm", "confirm_and_act"]

#: Called after each step with how many items the step went through and how many it
#: acted on (an item may be skipped: no longer dead, say).
OnProgress: TypeAlias = Callable[[int, int], None]


def confirm(question: str, *, refused: str) -> None:
    """Ask ``question``; unless the answer is yes (no input counts as no), fail."""
    try:
        if click.confirm(question, default=False, err=True):
            return
    except click.Abort:
        click.echo(err=True)
    fail(refused)


@attrs.frozen(kw_only=True)
class BulkAction:
    """A bulk action, as the command names it in its messages.

    Attributes:
        verb: ``"replay"`` or ``"purge"``.
        things: what it acts on, counted: ``"dead letter(s)"``, ``"dead job(s)"``.
        owner: whose they are: ``"of handle"``, ``"of queue jobbing"``.
    """

    verb: Literal["replay", "purge"]
    things: str
    owner: str

    @property
    def done(self) -> str:
        """``"replayed"`` or ``"purged"``."""
        return f"{self.verb}ed" if self.verb.endswith("y") else f"{self.verb}d"

    @property
    def nothing(self) -> str:
        """``"nothing was replayed"``."""
        return f"nothing was {self.done}"


def bulk_options(verb: Literal["replay", "purge"]) -> Callable[[Any], Any]:
    """``--id`` and ``--yes``, the options of a bulk command (replay or purge)."""

    def decorate(function: Any) -> Any:
        function = yes_option(function)
        return click.option(
            "--id",
            "ids",
            multiple=True,
            metavar="ID",
            help=f"{verb.capitalize()} only these (repeatable).",
        )(function)

    return decorate


class _StopBetweenSteps(Exception):
    """Raised by the progress callback after a step, once a signal asked to stop."""


@attrs.define
class _Tally:
    through: int = 0
    done: int = 0
    signum: int | None = None
    at_once: bool = False


async def confirm_and_act(
    action: BulkAction,
    act: Callable[[OnProgress], Awaitable[object]],
    *,
    total: int,
    question: str,
    yes: bool,
) -> int:
    """Ask ``question`` (unless ``yes``), then run ``act(on_progress)``: return how
    many items it acted on.

    ``act`` must call ``on_progress(through, done)`` after each step, between two
    round trips; an exception that ``on_progress`` raises is how a signal stops
    ``act`` between steps, so ``act`` must let it through. ``total`` is how many
    items it should go through (for the progress bar and the messages).

    Error handling:
        A refusal ends the command (exit code 1, nothing done). A signal ends it with
        exit code 128 + its number and says how many were done; a
        :class:`~streamkit.StreamkitError` ends it with exit code 1 and says how many
        were done before it.
    """
    if not yes:
        confirm(question, refused=action.nothing)
    tally = _Tally()
    stderr.print(
        f"{action.verb[:-1] if action.verb.endswith('e') else action.verb}ing {total:,} "
        f"{action.things} {action.owner} (Ctrl-C stops after the step in flight)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    with progress_bar(action.verb) as progress:
        bar = progress.add_task(action.verb, total=total)

        def on_progress(through: int, done: int) -> None:
            tally.through += through
            tally.done += done
            progress.update(bar, advance=through)
            if tally.signum is not None and tally.through < total:
                raise _StopBetweenSteps

        on_first_signal = stopping_notice(progress, "after the step in flight")

        error = await _run_until_signal(act, on_progress, tally, on_first_signal)
    counted = f"{tally.done:,} of {total:,} {action.things} {action.owner}"
    if error is not None:
        if tally.done:
            fail(f"{error}\n{action.done} {counted} before it")
        fail(str(error))
    if tally.signum is not None:
        name = signal.Signals(tally.signum).name
        if tally.at_once:
            fail(
                f"stopped at once by a second {name}: {action.done} at least {counted}; "
                f"the step in flight may be done too; the others are untouched",
                128 + tally.signum,
            )
        if tally.through < total:
            fail(
                f"stopped by {name}: {action.done} {counted}; the others are untouched "
                f"(run the command again for them)",
                128 + tally.signum,
            )
    return tally.done


async def _run_until_signal(
    act: Callable[[OnProgress], Awaitable[object]],
    on_progress: OnProgress,
    tally: _Tally,
    on_first_signal: Callable[[int], None],
) -> StreamkitError | None:
    """Run ``act`` with SIGINT and SIGTERM caught: the first stops it between two
    steps (through ``on_progress``), a second cancels it. Returns its error, if any."""
    error: StreamkitError | None = None
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

            async def watch_signals() -> None:
                async for signum in signals:
                    if tally.signum is None:
                        tally.signum = signum
                        on_first_signal(signum)
                    else:
                        tally.at_once = True
                        acting.cancel("a second signal")

            nursery.start_soon(watch_signals)
            with trio.CancelScope() as acting:
                try:
                    await act(on_progress)
                except _StopBetweenSteps:
                    pass
                except StreamkitError as exc:
                    error = exc
            nursery.cancel_scope.cancel()
    return error
