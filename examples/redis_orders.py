"""Orders from a Redis stream, parsed, with a running total per customer; bad entries kept.

    batchline run examples/redis_orders.py -- REDIS_URL OUT_DIR [SECONDS]

Reads stream ``orders`` (fields customer, amount, at) from REDIS_URL (redis://host:6379/0)
from its first entry. Every order lands in OUT_DIR/orders (Parquet, one directory per
batch), the per-customer running totals in OUT_DIR/totals, and entries that do not parse in
OUT_DIR/dead_letters with the reason. It runs for SECONDS, or until Ctrl-C, which stops it
gracefully. Stop it and start it again: with the checkpoint in OUT_DIR/checkpoint it resumes
after the last entry it committed, reading no entry twice.

Try it:  redis-cli XADD orders '*' customer alice amount 12.50 at 2026-11-23T10:00:00Z
"""

import sys

from pyspark.sql.types import DecimalType, StringType, StructField, StructType, TimestampType

from batchline import StreamingContext
from batchline.spark import local_spark_session

args = [a for a in sys.argv[1:] if a != "--"]
redis_url, out_dir = args[0], args[1]
seconds = float(args[2]) if len(args) > 2 else None

ORDER = StructType([
    StructField("customer", StringType(), False),
    StructField("amount", DecimalType(12, 2), False),
    StructField("at", TimestampType(), True),
])


def running_total(customer, orders, state):
    total = state.get()[0] if state.exists else 0
    for order in orders:
        total += order.amount
    state.update((total,))
    yield (customer, total)


spark = local_spark_session()
ssc = StreamingContext(spark, batch_interval="1s", checkpoint=f"{out_dir}/checkpoint")
orders = ssc.redis_stream(redis_url, ["orders"], name="orders", schema=ORDER, max_records_per_batch=50_000)
orders.write_files(f"{out_dir}/orders")
orders.dead_letters.write_files(f"{out_dir}/dead_letters", format="json")
totals = orders.group_by_key("customer").flat_map_groups_with_state(
    running_total, state_schema="total decimal(14,2)", output_schema="customer string, total decimal(14,2)",
    name="totals")
totals.write_files(f"{out_dir}/totals")
ssc.start()
if not ssc.await_termination(seconds):  # SECONDS passed; Ctrl-C stops it gracefully before that
    ssc.stop(graceful=True)
