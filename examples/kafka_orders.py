"""Orders from a Kafka topic, counted per customer and minute of their own time, to another topic.

    batchline run examples/kafka_orders.py -- BOOTSTRAP_SERVERS OUT_DIR [SECONDS]

Reads topic ``orders`` (JSON values {customer, amount, ts}) at BOOTSTRAP_SERVERS from its first
offset. Per customer and 1-minute window of ``ts``, the count and total of the orders go to
topic ``order_counts`` (JSON, keyed by customer) once the window closes (a watermark 30 s
behind the newest order), each window exactly once: one Kafka transaction per batch, seen
by read_committed consumers all at once. Records that do not parse land in
OUT_DIR/dead_letters with the reason. It runs for SECONDS, or until Ctrl-C, which stops it
gracefully; with the checkpoint in OUT_DIR/checkpoint a restart goes on where it stopped.

Try it:
    kafka-topics.sh --bootstrap-server localhost:9092 --create --topic orders --partitions 3
    kafka-topics.sh --bootstrap-server localhost:9092 --create --topic order_counts --partitions 3
    echo '{"customer": "alice", "amount": 12.5, "ts": "2026-11-23T10:00:00"}' | \\
        kafka-console-producer.sh --bootstrap-server localhost:9092 --topic orders
"""

import sys

from batchline import StreamingContext, aggregates, window
from batchline.spark import local_spark_session

args = [a for a in sys.argv[1:] if a != "--"]
bootstrap, out_dir = args[0], args[1]
seconds = float(args[2]) if len(args) > 2 else None

spark = local_spark_session()
ssc = StreamingContext(spark, batch_interval="1s", checkpoint=f"{out_dir}/checkpoint", name="kafka-orders")
orders = ssc.kafka_stream(bootstrap, topics=["orders"], name="orders", max_records_per_batch=100_000,
                          schema="customer string not null, amount double, ts timestamp not null")
orders.dead_letters.write_files(f"{out_dir}/dead_letters", format="json")
counts = (orders.with_watermark("ts", "30 seconds")
          .group_by_key(window("ts", "1 minute"), "customer")
          .aggregate(aggregates.count().alias("orders"), aggregates.sum("amount").alias("total"),
                     output_mode="append"))
counts.write_kafka(bootstrap, "order_counts", key="customer")
ssc.start()
if not ssc.await_termination(seconds):  # SECONDS passed; Ctrl-C stops it gracefully before that
    ssc.stop(graceful=True)
