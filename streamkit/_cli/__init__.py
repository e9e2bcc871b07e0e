"""The ``streamkit`` command line: the root group, and ``main`` for the console script.

One module per command group (``_cmd_send``, ``_cmd_worker``, ``_cmd_status``,
``_cmd_admin``, ``_cmd_deadletters``, ``_cmd_jobs``), each beside the modules only it
uses (``_sendmany``, ``_supervisor``, ``_fleet`` and its views, ``_admin``,
``_deadletters``); shared: exit codes (``_exits``), loading the user's code
(``_loading``), logging options (``_logging``), common options (``_options``) and
confirming (``_confirm``).
"""

from __future__ import annotations

import asyncclick as click

from ._cmd_admin import delete_stream, reset, resume
from ._cmd_deadletters import deadletters
from ._cmd_jobs import jobs
from ._cmd_send import send, sendmany
from ._cmd_status import dashboard, status
from ._cmd_worker import worker
from ._options import RootGroup

__all__ = ["cli", "main"]


@click.group(cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="streamkit")
def cli() -> None:
    """streamkit: partitioned, ordered event processing on Redis Streams.

    Streams and apps are named as MODULE:NAME, e.g. shop:orders (stream orders of shop.py),
    importable from the current directory.
    """


# In the order of the help's list (which click sorts by name anyway).
for _command in (
    send,
    sendmany,
    worker,
    status,
    dashboard,
    reset,
    resume,
    delete_stream,
    deadletters,
    jobs,
):
    cli.add_command(_command)


def main() -> None:
    """Entry point of the ``streamkit`` console script."""
    cli(_anyio_backend="trio")
