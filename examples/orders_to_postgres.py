"""Generated orders into PostgreSQL, exactly once: every order appended, each user's latest
order upserted.

    batchline run examples/orders_to_postgres.py -- DSN [SECONDS [CHECKPOINT]]

DSN is a PostgreSQL connection string (postgresql://user:password@host:5432/db); the
example creates its two tables if they are missing, appends every generated order to
``orders`` and upserts each user's latest order into ``latest_order`` (at most 50 rows). It
runs for SECONDS, or until Ctrl-C, which stops it gracefully. The checkpoint is kept in
CHECKPOINT (default: ``batchline-orders-to-postgres`` in the system's temporary folder). Kill
it at any moment (kill -9) and start it again with the same CHECKPOINT: each batch lands once,
in one transaction with its row of ``batchline_progress``. The password never appears in logs
or in the checkpoint.
"""

import sys
import tempfile

import psycopg
from pyspark.sql import functions as F

from batchline import StreamingContext
from batchline.spark import local_spark_session

args = [a for a in sys.argv[1:] if a != "--"]
dsn = args[0]
seconds = float(args[1]) if len(args) > 1 else None
checkpoint = args[2] if len(args) > 2 else f"{tempfile.gettempdir()}/batchline-orders-to-postgres"

with psycopg.connect(dsn) as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id integer, data text, ts timestamptz, amount bigint)")
    conn.execute("CREATE TABLE IF NOT EXISTS latest_order (id integer PRIMARY KEY, data text, ts timestamptz)")

spark = local_spark_session()
ssc = StreamingContext(spark, batch_interval="1s", checkpoint=checkpoint)
events = ssc.generator_stream(rate=200, users=50)
orders = events.select("id", "data", "ts", (F.length("data") * 10).cast("long").alias("amount"))
orders.write_postgres(dsn, "orders", name="orders")
orders.select("id", "data", "ts").write_postgres(dsn, "latest_order", mode="upsert", key=["id"], name="latest")
ssc.start()
if not ssc.await_termination(seconds):  # SECONDS passed; Ctrl-C stops it gracefully before that
    ssc.stop(graceful=True)
