"""streamkit.clients: send events, enqueue jobs and read tables without a Trio loop.

Blocking code (Flask and Django views, scripts, notebooks) and asyncio code (FastAPI,
aiohttp) reach an app's streams, job queue and tables through the same app module the
workers run, with the Trio API's surface and the Trio side's wire format::

    with app.blocking() as client:
        client.send(orders, Order(customer="ada", amount=5))
        handle = client.enqueue(send_email, "ada@example.com")

    async with app.asyncio() as client:
        await client.send(orders, Order(customer="ada", amount=5))

See the "Sending from any app" guide in the documentation.
"""

from .._public import fix_module_metadata as _fix_module_metadata
from ._asyncio import AsyncioClient as AsyncioClient, AsyncioJobHandle as AsyncioJobHandle
from ._blocking import BlockingClient as BlockingClient, BlockingJobHandle as BlockingJobHandle

__all__ = ["AsyncioClient", "AsyncioJobHandle", "BlockingClient", "BlockingJobHandle"]

_fix_module_metadata(__name__, globals())
del _fix_module_metadata
