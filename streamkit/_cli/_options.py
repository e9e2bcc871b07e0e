"""What the commands share: ``--redis-url``, the group classes (whole help; one line
for any error of streamkit's), and the progress bar on standard error."""

from __future__ import annotations

import os
import signal
import sys
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

import asyncclick as click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .._errors import ConfigError, StreamkitError
from .._nurseries import leaves
from .._settings import Settings
from ._exits import exit_code_of, fail, silence_stdout, stdout_gone

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "RootGroup",
    "WholeHelpGroup",
    "json_option",
    "key_argument",
    "limit_option",
    "progress_bar",
    "redis_url_option",
    "stderr",
    "stopping_notice",
    "yes_option",
]


stderr = Console(stderr=True)


def key_argument(text: str) -> str | bytes:
    """A partition key given on the command line: the text, or the argument's bytes
    where they are not text (``$'\\xff\\x01'`` in bash, for the bytes key that
    ``table list`` shows as ``\\xff\\x01``: Python hands such an argument over
    surrogate-escaped, which no key is)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return os.fsencode(text)
    return text


def progress_bar(label: str) -> Progress:
    """A progress bar on standard error (``with progress_bar("sending") as bar:``),
    shown on a terminal only and gone once done."""
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    )


def stopping_notice(progress: Progress, when: str) -> Callable[[int], None]:
    """A first-signal callback that says on ``progress``'s console that the command
    stops ``when`` (``SIGINT: stopping <when> (a second signal stops at once)``)."""

    def notice(signum: int) -> None:
        progress.console.print(
            f"{signal.Signals(signum).name}: stopping {when} (a second signal stops at once)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    return notice


def redis_url_option(function: Any) -> Any:
    """``--redis-url``, overriding the app's ``redis_url`` setting; checked as it is
    parsed, so that a bad URL is one line (exit code 2) before anything is imported."""
    # No envvar here: STREAMKIT_REDIS_URL is read by the app's Settings, below the
    # App's own keyword arguments. Reading it here too would let the environment
    # override App(redis_url=...), unlike everywhere else.
    return click.option(
        "--redis-url",
        metavar="URL",
        callback=_checked_url,
        help=(
            "Redis to use, overriding the app's redis_url (which comes from "
            "App(redis_url=...), else STREAMKIT_REDIS_URL, else redis://127.0.0.1:6379)."
        ),
    )(function)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
"""``--json`` (into ``as_json``), the same on every command that prints for scripts."""


limit_option = partial(
    click.option, "--limit", type=click.IntRange(min=1), default=100, show_default=True
)
"""``--limit`` (at least 1, default 100) of a listing: ``@limit_option(help=...)``; every
count of the CLI is at least 1 (``read --count``, ``sendmany --chunk-size``, ...), but
``tail -n``, which may be 0 (``tail -n 0 --follow``: only the new entries, as ``tail``
does)."""


yes_option = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
"""``--yes`` / ``-y``, the same on every command that asks before it acts."""


def _checked_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            Settings(redis_url=value)
        except ConfigError as exc:
            fail(f"--redis-url: {str(exc).removeprefix(f'{exc.setting}: ')}", 2)
        except ValueError as exc:  # what urllib refuses before streamkit's own checks
            fail(f"--redis-url: {value!r} is not a URL ({exc})", 2)
    return value


class WholeHelpGroup(click.Group):
    """A group whose command list shows each command's whole first sentence."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            rows.append((name, command.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class RootGroup(WholeHelpGroup):
    """The ``streamkit`` group: an error of streamkit's that no command caught is one
    line all the same (exit code 2 for a configuration error, else 1), never a
    traceback; a standard output whose reader went away (``| head``) ends the command
    quietly, exit code 0."""

    async def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return await super().parse_args(ctx, args)
        except BrokenPipeError as exc:  # the reader of --help or --version gone
            if not stdout_gone(exc):
                raise
            silence_stdout()
            raise click.exceptions.Exit(0) from None

    async def invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                result = await super().invoke(ctx)
                sys.stdout.flush()  # a reader gone shows here, not at exit
            except BaseException as exc:
                if not stdout_gone(exc):
                    raise
                # `... | head`: the reader wanted no more. Quietly, exit code 0 (see
                # streamkit._cli._exits).
                silence_stdout()
                return None
            return result
        except StreamkitError as exc:
            _fail_with(exc)
        except BaseExceptionGroup as group:
            found = leaves(group)
            if found and all(isinstance(leaf, StreamkitError) for leaf in found):
                _fail_with(found[0])
            raise


def _fail_with(exc: BaseException) -> NoReturn:
    fail(str(exc), exit_code_of(exc))
