"""A small HTTP server for read-only endpoints (metrics, the dashboard), on Trio.

Hypercorn serves the ASGI application with its Trio worker inside the caller's
nursery, so the server stops when its task is cancelled, like every other piece.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

import trio

from ._errors import ConfigError

if TYPE_CHECKING:
    from hypercorn.typing import (
        ASGIFramework,
        ASGIReceiveCallable,
        ASGISendCallable,
        Scope,
    )

log = logging.getLogger("streamkit.http")


async def serve_asgi(
    app: ASGIFramework,
    *,
    host: str = "127.0.0.1",
    port: int,
    what: str = "HTTP",
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until cancelled.

    ``url = await nursery.start(serve_asgi, app, port=P)``.

    ``task_status.started()`` gets the URL the server listens on once it accepts
    connections (with the port chosen by the system when ``port`` is 0).

    Cancellation:
        Cancelling the task closes the listening socket and open connections.

    Error handling:
        :class:`ConfigError` from ``nursery.start()`` when the port cannot be bound
        (in use, or not allowed).
    """
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    # The listening socket is bound here, not by hypercorn, which leaves the socket
    # of a failed bind to the garbage collector; hypercorn takes over its descriptor.
    try:
        sock = await _bound_socket(host, port)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError("port", f"cannot serve {what} on {host}:{port}: {reason}") from exc
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("streamkit.http.server")
    config.graceful_timeout = 0.5
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(serve, _with_lifespan(app), config)
        url = binds[0]
        log.info("serving %s on %s", what, url)
        task_status.started(url)


async def _bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, not listening yet.

    Error handling:
        ``OSError`` when the address cannot be resolved or bound (the socket is closed).
    """
    family, kind, proto, _, address = (
        await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def _with_lifespan(app: ASGIFramework) -> ASGIFramework:
    """``app`` answering ASGI lifespan messages itself (apps such as prometheus-client's
    ignore them, which hypercorn reports as an error)."""

    async def wrapped(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    return wrapped
