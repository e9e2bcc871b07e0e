"""Waiting for replicas after a write: ``WAIT`` sent on the node that ran the command.

Inside :func:`replicated`, every command runs on a dedicated connection (see
:mod:`._routing`) and is followed there by ``WAIT replicas timeout``, so on a
cluster by the master that took the write, after any redirection. coredis's own check
raises without the count; :class:`CountingReplicas` keeps it, and the error
translation turns it into :class:`~streamkit.NotReplicated`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast

import coredis.exceptions
from coredis.client import Client
from coredis.commands.constants import CommandName
from coredis.globals import READONLY_COMMANDS

from ._routing import own
from ._translate import TooFewReplicas

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coredis.commands import CommandRequest
    from coredis.connection import BaseConnection

    from ._routing import Redis

__all__ = ["CountingReplicas", "replicated"]

# Reads wrote nothing to wait for; nor did SCRIPT LOAD (a script's first call on a server).
_NOTHING_TO_WAIT_FOR = READONLY_COMMANDS | {CommandName.SCRIPT_LOAD}
# How a replica refuses WAIT.
_WAIT_ON_A_REPLICA = "WAIT cannot be used with replica instances"


class CountingReplicas(Client[bytes]):
    """The dedicated half of a client: counts the replicas of :func:`replicated`'s ``WAIT``."""

    async def _ensure_wait_and_persist(
        self, command: CommandRequest[Any], connection: BaseConnection
    ) -> None:
        wait = self._waitcontext.get()
        if not wait or wait[0] <= 0 or command.name in _NOTHING_TO_WAIT_FOR:
            return
        try:
            reply = await connection.create_request(CommandName.WAIT, *wait, decode=False)
        except coredis.exceptions.ResponseError as exc:
            if _WAIT_ON_A_REPLICA not in str(exc):
                raise
            # The node became a replica between the command and its WAIT (a failover):
            # the command ran while it was the master, and no replica is known to have
            # it. Too few replicas (none counted), not an error of the command's own.
            raise TooFewReplicas(command.name, wait[0], wait[1], 0) from exc
        acknowledged = int(cast("int", reply))
        if acknowledged < wait[0]:
            raise TooFewReplicas(command.name, wait[0], wait[1], acknowledged)


@contextlib.contextmanager
def replicated(redis: Redis, replicas: int, timeout: float) -> Iterator[None]:
    """Make every command sent through ``redis`` in the block wait for ``replicas``.

    Each command (from this task and tasks it starts in the block) runs on a dedicated
    connection and is followed on it by ``WAIT replicas timeout``, so on a cluster
    by the master that ran it.

    Error handling:
        :class:`NotReplicated` (from :func:`redis_errors`) when fewer replicas
        acknowledged a command within ``timeout`` seconds: the command ran on the
        master. :class:`ConfigError` for a client not from :func:`open_redis`.
    """
    client = own(redis, "replicas=")
    with client._dedicated.ensure_replication(replicas, max(1, round(timeout * 1000))):
        yield
