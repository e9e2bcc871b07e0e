"""runnel's README example on streamkit: orders, partitioned by customer.

Redis is taken from ``STREAMKIT_REDIS_URL`` (default ``redis://127.0.0.1:6379``).
From the root of a clone of the repository (``examples`` is not installed with
streamkit), run workers with ``streamkit worker examples.orders.app:app`` and send
orders with ``streamkit sendmany examples.orders.app:orders FILE.jsonl``; ``./dev demo``
does all of it on a private Redis (``examples/orders/demo.py``).

The processor keeps a running total per customer. It also records, for the demo, how
many orders each worker processed, how many it saw again (redeliveries: after a worker
is killed, its successor processes the orders it had not acknowledged once more) and
whether any customer's orders ever arrived out of order, that is an order never seen
before arriving after a later one of the same customer (they never should: partitions
are processed in order, one worker at a time).
"""

from __future__ import annotations

import os
import socket
from datetime import datetime
from typing import TYPE_CHECKING

from streamkit import App, Events, Record

if TYPE_CHECKING:
    from collections.abc import Sequence

    from streamkit import Redis

app = App("orders_demo")


class Order(Record):
    order_id: int
    customer: str
    amount: float
    created_at: datetime


orders = app.stream("orders", record=Order, partition_by="customer", partition_count=8)

WORKER = f"{socket.gethostname()}:{os.getpid()}"
TOTALS = "orders_demo:totals"  # customer -> total amount
LAST = "orders_demo:last"  # customer -> last order id seen
STATS = "orders_demo:stats"  # counters: processed by worker, out of order, redelivered
SEEN = "orders_demo:seen"  # "customer order-id" of every order processed

# Applies a batch of orders atomically: totals, last order id per customer, counters.
# An order seen before is a redelivery (after a worker was killed, its successor
# processes the unacknowledged orders again): counted as such, not added again. An
# order never seen whose id is lower than its customer's last one is a true reorder.
RECORD_BATCH = """
local processed, out_of_order, redelivered = 0, 0, 0
for i = 2, #ARGV, 3 do
  local customer, id, amount = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  if redis.call('SADD', KEYS[4], customer .. ' ' .. id) == 0 then
    redelivered = redelivered + 1
  else
    local last = tonumber(redis.call('HGET', KEYS[2], customer) or '-1')
    if id < last then
      out_of_order = out_of_order + 1
    else
      redis.call('HSET', KEYS[2], customer, id)
    end
    redis.call('HINCRBYFLOAT', KEYS[1], customer, amount)
  end
  processed = processed + 1
end
redis.call('HINCRBY', KEYS[3], 'processed by ' .. ARGV[1], processed)
redis.call('HINCRBY', KEYS[3], 'out of order', out_of_order)
redis.call('HINCRBY', KEYS[3], 'redelivered', redelivered)
return processed
"""


async def record_batch(redis: Redis, worker: str, batch: Sequence[Order]) -> None:
    """Apply a batch of orders processed by ``worker`` (totals, last ids, counters)."""
    args: list[str | int | float] = [worker]
    for order in batch:
        args.extend((order.customer, order.order_id, order.amount))
    await redis.register_script(RECORD_BATCH)(keys=[TOTALS, LAST, STATS, SEEN], args=args)


@app.processor(orders)
async def totals(events: Events[Order]) -> None:
    async for batch in events.take(200, within=0.05):
        await record_batch(app.redis, WORKER, batch)
