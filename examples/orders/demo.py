"""The README demo: the orders example on a private, throwaway Redis server.

Run it with ``./dev demo`` (or ``python -m examples.orders.demo`` inside .venv).
"""

from __future__ import annotations

import os
import random
import time
from datetime import UTC, datetime, timedelta
from typing import cast

import trio
from rich.console import Console
from rich.table import Table

from streamkit import partition_for
from streamkit.testing import RedisServer

console = Console()

ORDERS = 20_000
CUSTOMERS = [f"customer-{n:03d}" for n in range(100)]


async def produce_and_inspect() -> None:
    # Imported here: the app reads STREAMKIT_REDIS_URL when it is created.
    from examples.orders.app import Order, app, orders

    start = datetime(2026, 1, 1, tzinfo=UTC)
    rng = random.Random(7)
    batch = [
        Order(
            order_id=i,
            customer=rng.choice(CUSTOMERS),
            amount=round(rng.uniform(1, 500), 2),
            created_at=start + timedelta(seconds=i),
        )
        for i in range(ORDERS)
    ]
    async with app:
        began = time.perf_counter()
        await orders.send_many(batch)
        elapsed = time.perf_counter() - began
        console.print(
            f"sent [bold]{ORDERS:,}[/] orders in {elapsed:.2f}s "
            f"([bold]{ORDERS / elapsed:,.0f}[/] orders/s)\n"
        )

        table = Table(title=f"stream {app.name}.{orders.name}")
        table.add_column("partition", justify="right")
        table.add_column("redis key")
        table.add_column("entries", justify="right")
        table.add_column("customers", justify="right")
        for partition in range(orders.partition_count):
            customers = [
                c for c in CUSTOMERS if partition_for(c, orders.partition_count) == partition
            ]
            table.add_row(
                str(partition),
                orders.key(partition),
                f"{await app.redis.xlen(orders.key(partition)):,}",
                str(len(customers)),
            )
        console.print(table)

        first = batch[0]
        partition = orders.partition_of(first)
        [entry] = await app.redis.xrange(orders.key(partition), count=1)
        console.print(f"\nthe first entry of partition {partition}, as redis-cli shows it:")
        fields = cast("dict[bytes, bytes]", entry.field_values)
        for name, value in fields.items():
            console.print(f"  {name.decode()} = {value.decode()}")
        decoded = orders.codec.decode(
            fields, stream=orders.name, partition=partition, entry_id=entry.identifier
        )
        console.print(f"decoded: {decoded!r}")


def main() -> None:
    with RedisServer() as server:
        console.print(f"private Redis at [bold]{server.url}[/] (deleted when the demo ends)\n")
        os.environ["STREAMKIT_REDIS_URL"] = server.url
        trio.run(produce_and_inspect)


if __name__ == "__main__":
    main()
