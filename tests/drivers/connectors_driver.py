"""A pipeline driver for the connector crash test: Redis Streams in, a stateful operator,
PostgreSQL out (append and upsert); and Kafka in, the same stateful operator, Kafka out;
checkpointed, one driver for both, so that every kill tests both.

    python tests/drivers/connectors_driver.py REDIS_URL DSN CHECKPOINT SUFFIX [--kafka BOOTSTRAP] [--bounded]

Reads stream ``events`` (fields user, seq, amount); per user, a running total and count,
emitted for every event in ``seq`` order: a row applied twice to the state, or not at all,
shows in every later row of that user. Writes every event's row to ``events_<SUFFIX>``
(append) and each user's latest total to ``totals_<SUFFIX>`` (upsert by user). With
``--kafka``, also reads topic ``events`` (JSON values of the same fields, keyed by user, so a
user's events keep their order in one partition) and writes every event's row, as JSON keyed
by user, to topic ``running_<SUFFIX>``.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql.types import LongType, StringType, StructField, StructType  # noqa: E402

from batchline import StreamingContext, StreamingListener  # noqa: E402
from batchline.spark import local_spark_session  # noqa: E402
from tests.helpers import wait_for_go  # noqa: E402

SCHEMA = StructType([StructField("user", StringType(), False), StructField("seq", LongType(), False),
                     StructField("amount", LongType(), False)])


class Progress(StreamingListener):
    def on_batch_completed(self, info):
        print(f"completed {info.batch_time} {info.num_records}", flush=True)


def running_total(user, rows, state):
    total, count = state.get() if state.exists else (0, 0)
    for row in sorted(rows, key=lambda r: r.seq):
        total, count = total + row.amount, count + 1
        yield (user, row.seq, row.amount, total, count)
    state.update((total, count))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("redis_url")
    parser.add_argument("dsn")
    parser.add_argument("checkpoint")
    parser.add_argument("suffix")
    parser.add_argument("--bounded", action="store_true")
    parser.add_argument("--kafka")
    parser.add_argument("--wait-for-go", action="store_true")  # tests.helpers.DriverProcess(warm=True)
    args = parser.parse_args()

    spark = local_spark_session("local[2]", "connectors-driver", shuffle_partitions=2)
    if args.wait_for_go:
        wait_for_go()
    ssc = StreamingContext(spark, "500ms", checkpoint=args.checkpoint, checkpoint_interval="1s")
    ssc.add_listener(Progress())
    events = ssc.redis_stream(args.redis_url, ["events"], name="events", schema=SCHEMA, max_records_per_batch=150,
                              split_size=60, bounded=args.bounded)
    running = events.group_by_key("user").flat_map_groups_with_state(
        running_total, state_schema="total long, count long",
        output_schema="user string, seq long, amount long, total long, count long", name="running",
        num_partitions=3)
    running.write_postgres(args.dsn, f"events_{args.suffix}", name="events")
    running.select("user", "total", "count").write_postgres(args.dsn, f"totals_{args.suffix}", mode="upsert",
                                                            key=["user"], name="totals")
    if args.kafka:
        kafka_events = ssc.kafka_stream(args.kafka, topics=["events"], name="kafka-events", schema=SCHEMA,
                                        max_records_per_batch=150, split_size=20, bounded=args.bounded)
        kafka_running = kafka_events.select("user", "seq", "amount").group_by_key("user").flat_map_groups_with_state(
            running_total, state_schema="total long, count long",
            output_schema="user string, seq long, amount long, total long, count long", name="kafka-running",
            num_partitions=3)
        kafka_running.write_kafka(args.kafka, f"running_{args.suffix}", key="user", name="kafka-out")
    print("started", flush=True)
    if args.bounded:
        ssc.run_until_finished()
    else:
        ssc.start()
        ssc.await_termination()


if __name__ == "__main__":
    main()
