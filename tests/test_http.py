"""serve_asgi: a read-only HTTP endpoint on hypercorn's Trio worker."""

from __future__ import annotations

import functools
import socket
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import pytest
import trio

from streamkit import ConfigError
from streamkit._http import serve_asgi

if TYPE_CHECKING:
    from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

pytestmark = pytest.mark.timeout(30)


async def hello(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    assert scope["type"] == "http"
    body = f"hello from {scope['path']}".encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain")],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def get(url: str) -> str:
    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            body: bytes = response.read()
        return body.decode()

    return await trio.to_thread.run_sync(fetch)


async def test_serves_on_a_free_port_until_cancelled() -> None:
    async with trio.open_nursery() as nursery:
        url = await nursery.start(functools.partial(serve_asgi, hello, port=0, what="a test"))
        assert url.startswith("http://127.0.0.1:")
        assert not url.endswith(":0")
        assert await get(f"{url}/some/path") == "hello from /some/path"
        nursery.cancel_scope.cancel()
    # Cancelled: the socket is closed.
    with pytest.raises(urllib.error.URLError):
        await get(url)


async def test_a_port_in_use_is_a_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with trio.open_nursery() as nursery:
            with pytest.raises(ConfigError) as caught:
                await nursery.start(functools.partial(serve_asgi, hello, port=port, what="a test"))
    assert str(caught.value).startswith(f"port: cannot serve a test on 127.0.0.1:{port}: ")
