"""runnel's README example on streamkit: orders, partitioned by customer.

Redis is taken from ``STREAMKIT_REDIS_URL`` (default ``redis://127.0.0.1:6379``).
Run workers with ``streamkit worker examples.orders.app:app``; send orders with
``streamkit sendmany examples.orders.app:orders orders.jsonl``.

The processor keeps a running total per customer. It also records, for the demo, how
many orders each worker processed and whether any customer's orders ever arrived out
of order (they never should: partitions are processed in order, one worker at a time).
"""

from __future__ import annotations

import os
import socket
from datetime import datetime

from streamkit import App, Events, Record

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
STATS = "orders_demo:stats"  # counters: processed by worker, out-of-order, repeated

# Applies a batch of orders atomically: totals, last order id per customer, counters.
RECORD_BATCH = """
local processed, out_of_order, repeated = 0, 0, 0
for i = 2, #ARGV, 3 do
  local customer, id, amount = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local last = tonumber(redis.call('HGET', KEYS[2], customer) or '-1')
  if id == last then
    repeated = repeated + 1
  elseif id < last then
    out_of_order = out_of_order + 1
  else
    redis.call('HSET', KEYS[2], customer, id)
    redis.call('HINCRBYFLOAT', KEYS[1], customer, amount)
  end
  processed = processed + 1
end
redis.call('HINCRBY', KEYS[3], 'processed by ' .. ARGV[1], processed)
redis.call('HINCRBY', KEYS[3], 'out of order', out_of_order)
redis.call('HINCRBY', KEYS[3], 'repeated', repeated)
return processed
"""


@app.processor(orders)
async def totals(events: Events[Order]) -> None:
    record_batch = app.redis.register_script(RECORD_BATCH)
    async for batch in events.take(200, within=0.05):
        args: list[str | int | float] = [WORKER]
        for order in batch:
            args.extend((order.customer, order.order_id, order.amount))
        await record_batch(keys=[TOTALS, LAST, STATS], args=args)
