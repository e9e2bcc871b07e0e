"""The ``streamkit`` command line: the root group, and ``main`` for the console script.

One module per command group, each beside the modules only it uses:

- ``_cmd_send``: ``send``, ``sendmany`` (``_sendmany``: checking and accounting);
- ``_cmd_read``: ``read``, ``tail`` (a stream's entries, partitions merged);
- ``_cmd_worker``: ``worker`` (``_supervisor``: ``--processes N``);
- ``_cmd_status``: ``status``, ``dashboard`` (``_fleet``: the snapshot;
  ``_fleet_view``: its terminal views; ``_watch``: ``--watch``; ``_dashboard``: the
  web view);
- ``_cmd_admin``: ``reset``, ``resume``, ``delete-stream`` (``_admin``);
- ``_cmd_deadletters``: ``deadletters`` (``_deadletters``);
- ``_cmd_jobs``: ``jobs`` (``_jobs_view``: its terminal views);
- ``_cmd_tables``: ``table get``, ``table list`` (committed state).

Shared: exit codes (``_exits``), loading the user's code (``_loading``), the logging
options (``_logging``), ``--redis-url``, the group classes and the progress bar
(``_options``), and asking before acting in steps a signal can stop (``_confirm``).
Text from Redis goes through :mod:`streamkit._literal` wherever it is shown.
"""

from __future__ import annotations

import asyncclick as click

from ._cmd_admin import delete_stream, reset, resume
from ._cmd_deadletters import deadletters
from ._cmd_jobs import jobs
from ._cmd_jobs_control import jobs_pause as _registers_on_jobs  # noqa: F401 (its commands)
from ._cmd_read import read, tail
from ._cmd_send import send, sendmany
from ._cmd_status import dashboard, status
from ._cmd_tables import table
from ._cmd_worker import worker
from ._options import RootGroup

__all__ = ["cli", "main"]


@click.group(cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="streamkit")
def cli() -> None:
    """streamkit: partitioned, ordered event processing and a job queue, on Redis.

    Run an app's processors and jobs (worker), send events (send, sendmany), look
    at a stream (read, tail), watch it (status, dashboard) and look after it (jobs,
    deadletters, resume, reset).
    Streams and apps are named as MODULE:NAME, e.g. shop:orders (stream orders of
    shop.py), importable from the current directory.
    """


# In the order of the help's list (which click sorts by name anyway).
for _command in (
    send,
    sendmany,
    read,
    tail,
    worker,
    status,
    dashboard,
    reset,
    resume,
    delete_stream,
    deadletters,
    jobs,
    table,
):
    cli.add_command(_command)


def main() -> None:
    """Entry point of the ``streamkit`` console script."""
    cli(_anyio_backend="trio")
