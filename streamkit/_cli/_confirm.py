"""Asking before acting: a yes/no question whose refusal ends the command."""

from __future__ import annotations

import asyncclick as click

from ._exits import fail

__all__ = ["confirm"]


def confirm(question: str, *, refused: str) -> None:
    """Ask ``question``; unless the answer is yes (no input counts as no), fail."""
    try:
        if click.confirm(question, default=False, err=True):
            return
    except click.Abort:
        click.echo(err=True)
    fail(refused)
