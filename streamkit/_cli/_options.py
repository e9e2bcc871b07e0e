"""What several commands share: ``--redis-url``, and a group class with whole help."""

from __future__ import annotations

from typing import Any

import asyncclick as click

__all__ = ["WholeHelpGroup", "redis_url_option"]


def redis_url_option(function: Any) -> Any:
    """``--redis-url``, overriding the app's ``redis_url`` setting."""
    # No envvar here: STREAMKIT_REDIS_URL is read by the app's Settings, below the
    # App's own keyword arguments. Reading it here too would let the environment
    # override App(redis_url=...), unlike everywhere else.
    return click.option(
        "--redis-url",
        metavar="URL",
        help=(
            "Redis to use, overriding the app's redis_url (which comes from "
            "App(redis_url=...), else STREAMKIT_REDIS_URL, else redis://127.0.0.1:6379)."
        ),
    )(function)


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
