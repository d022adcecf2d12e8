"""One side of ``benchmarks/kafka.py``, in a process of its own: a topic of JSON records,
parsed, filtered and projected, into another topic exactly once, from process start to exit.

    python -m benchmarks.kafka_run SIDE BOOTSTRAP IN_TOPIC OUT_TOPIC CHECKPOINT RECORDS_PER_BATCH [EXTRA]

- ``batchline``: ``kafka_stream(..., schema=..., bounded=True, max_records_per_batch=n)`` →
  ``filter("amount > 10")`` → ``select("id", "user", "amount")`` → ``write_kafka(out, key="user")``
  under ``run_until_finished()``; the sink's steps are timed from outside (the engine is not
  changed: its methods are wrapped in this process) and printed as ``step`` lines.
- ``bare``: one Python thread with confluent-kafka, a real exactly-once
  consume-transform-produce loop: a read_committed consumer, ``json.loads``, the same filter and
  projection, ``json.dumps``, a transactional producer, one transaction per ``n`` records read
  with ``send_offsets_to_transaction``.
- ``structured``: Spark Structured Streaming's Kafka source and sink (``EXTRA``: the
  connector's jars, comma-separated), ``from_json`` → the same filter → ``to_json``,
  ``maxOffsetsPerTrigger=n``, ``trigger(availableNow=True)``. Its sink writes from the tasks,
  at least once (Spark's Kafka sink has no transactions).
- ``steady``: batchline, unbounded, 1 s batches, for ``EXTRA`` seconds while the measuring
  process produces into the input; one ``batch`` line per batch.

Each side prints ``mark <what> <epoch s>`` lines and ends with one ``result <json>`` line.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

STARTED = time.time()

from benchmarks.bounded_run import emit, mark  # noqa: E402 - after the start time is taken

SCHEMA_DDL = "id long, user string, amount double, ts timestamp"
FILTER = "amount > 10"
COLUMNS = ("id", "user", "amount")



# ------------------------------------------------------------------ batchline
def _time_sink_steps() -> None:
    """``step <name> <batch_time> <seconds> <records>`` lines for the Kafka sink's parts:
    ``tasks`` (the Spark job: read, parse, filter, encode, and the Arrow tables collected to
    the driver), ``produce`` (the driver's produce loop), ``commit_transaction`` (waiting for
    the brokers to take the batch and commit), ``commit`` (all of the driver's commit)."""
    import batchline.sinks.kafka as kafka_sink
    from batchline.sinks.exactly_once import ExactlyOnceSink

    commit = kafka_sink.KafkaSink.commit
    produce, commit_transaction = kafka_sink._produce, kafka_sink.KafkaSink._commit_transaction  # noqa: SLF001
    current: dict[str, Any] = {}

    def timed_write(self: Any, df: Any, batch: Any) -> Any:
        began = time.perf_counter()
        pending = ExactlyOnceSink.write(self, self._encoded(df), batch)  # noqa: SLF001 (KafkaSink.write's body)
        emit(f"step tasks {int(batch.batch_time)} {time.perf_counter() - began:.4f} 0")
        return pending

    def timed_commit(self: Any, messages: list[Any], attempt: Any) -> None:
        current["batch"] = int(attempt.batch.batch_time)
        began = time.perf_counter()
        commit(self, messages, attempt)
        records = sum(t.num_rows for t in messages)
        emit(f"step commit {int(attempt.batch.batch_time)} {time.perf_counter() - began:.4f} {records}")

    def timed_produce(producer: Any, topic: str, table: Any) -> int:
        began = time.perf_counter()
        records = produce(producer, topic, table)
        emit(f"step produce {current.get('batch', 0)} {time.perf_counter() - began:.4f} {records}")
        return records

    def timed_commit_transaction(self: Any, producer: Any) -> None:
        began = time.perf_counter()
        commit_transaction(self, producer)
        emit(f"step commit_transaction {current.get('batch', 0)} {time.perf_counter() - began:.4f} 0")

    kafka_sink.KafkaSink.write = timed_write
    kafka_sink.KafkaSink.commit = timed_commit
    kafka_sink._produce = timed_produce  # noqa: SLF001
    kafka_sink.KafkaSink._commit_transaction = timed_commit_transaction  # noqa: SLF001


def _print_batches(ssc: Any) -> None:
    from batchline import StreamingListener

    class Batches(StreamingListener):
        def on_batch_completed(self, info: Any) -> None:
            if info.failure is not None:
                emit(f"failed {info.batch_time} {info.failure}")
                return
            emit(f"batch {info.batch_time} {info.num_records} {info.processing_start_time} "
                 f"{info.processing_end_time} {info.scheduling_delay_ms}")

    ssc.add_listener(Batches())


def _batchline_pipeline(bootstrap: str, in_topic: str, out_topic: str, checkpoint: str, bounded: bool,
                        records_per_batch: int | None) -> tuple[Any, Any]:
    from batchline import StreamingContext
    from batchline.spark import local_spark_session

    mark("imported")
    _time_sink_steps()
    spark = local_spark_session("local[2]", "bench-kafka-batchline", shuffle_partitions=2)
    mark("spark")
    ssc = StreamingContext(spark, "1s", checkpoint=checkpoint)
    _print_batches(ssc)
    (ssc.kafka_stream(bootstrap, topics=[in_topic], schema=SCHEMA_DDL, bounded=bounded,
                      max_records_per_batch=records_per_batch, name="records")
     .filter(FILTER).select(*COLUMNS)
     .write_kafka(bootstrap, out_topic, key="user", name="out"))
    return spark, ssc


def run_batchline(bootstrap: str, in_topic: str, out_topic: str, checkpoint: str, records_per_batch: int,
                  extra: str) -> None:
    spark, ssc = _batchline_pipeline(bootstrap, in_topic, out_topic, checkpoint, True, records_per_batch)
    if not ssc.run_until_finished(1200):
        raise SystemExit("batchline did not finish within 1200 s")
    mark("finished")
    spark.stop()
    mark("spark_stopped")
    emit("result {}")


def run_steady(bootstrap: str, in_topic: str, out_topic: str, checkpoint: str, records_per_batch: int,
               extra: str) -> None:
    spark, ssc = _batchline_pipeline(bootstrap, in_topic, out_topic, checkpoint, False, records_per_batch or None)
    ssc.start()
    mark("started")
    time.sleep(float(extra))
    mark("stopping")
    ssc.stop(graceful=False)
    mark("finished")
    spark.stop()
    mark("spark_stopped")
    emit("result {}")


# ------------------------------------------------------------------ bare Python
def run_bare(bootstrap: str, in_topic: str, out_topic: str, checkpoint: str, records_per_batch: int,
             extra: str) -> None:
    """A consume-transform-produce loop on one core, exactly once (KIP-98 style)."""
    import json as json_module
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

    mark("imported")
    group = f"bare-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "enable.partition.eof": True, "fetch.max.bytes": 64 << 20})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": group, "enable.idempotence": True,
                         "linger.ms": 5})
    partitions = sorted(consumer.list_topics(in_topic, timeout=30).topics[in_topic].partitions)
    ends = {p: consumer.get_watermark_offsets(TopicPartition(in_topic, p), timeout=30)[1] for p in partitions}
    pending = {p for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(in_topic, p, OFFSET_BEGINNING) for p in partitions])
    producer.init_transactions(30)
    mark("ready")
    loads, dumps, produce, poll = json_module.loads, json_module.dumps, producer.produce, producer.poll
    eof = KafkaError._PARTITION_EOF  # noqa: SLF001
    read = written = in_transaction = transactions = 0
    commit_s = 0.0
    producer.begin_transaction()
    while pending:
        messages = consumer.consume(10_000, 1.0)
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != eof:
                    raise RuntimeError(error.str())
                continue
            record = loads(message.value())
            if record["amount"] > 10:
                user = record["user"]
                value = dumps({"id": record["id"], "user": user, "amount": record["amount"]},
                              separators=(",", ":")).encode()
                while True:
                    try:
                        produce(out_topic, value, user.encode())
                        break
                    except BufferError:
                        poll(0.05)
                written += 1
            read += 1
            in_transaction += 1
            partition = message.partition()
            if message.offset() + 1 >= ends[partition]:
                pending.discard(partition)
        poll(0)
        if in_transaction >= records_per_batch or (not pending and in_transaction):
            began = time.perf_counter()
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(60)
            commit_s += time.perf_counter() - began
            transactions += 1
            in_transaction = 0
            if pending:
                producer.begin_transaction()
    mark("finished")
    consumer.close()
    emit("result " + json.dumps({"read": read, "written": written, "transactions": transactions,
                                 "commit_transaction_s": round(commit_s, 3)}))


# ------------------------------------------------------------------ Structured Streaming
def run_structured(bootstrap: str, in_topic: str, out_topic: str, checkpoint: str, records_per_batch: int,
                   extra: str) -> None:
    from pyspark.sql import functions as F

    from batchline.spark import local_spark_session

    mark("imported")
    spark = local_spark_session("local[2]", "bench-kafka-structured", shuffle_partitions=2,
                                conf={"spark.jars": extra})
    mark("spark")
    records = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
               .option("subscribe", in_topic).option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", records_per_batch).option("kafka.isolation.level", "read_committed")
               .load())
    rows = (records.select(F.from_json(F.col("value").cast("string"), SCHEMA_DDL).alias("r")).select("r.*")
            .where(FILTER).select(*COLUMNS))
    out = rows.select(F.col("user").cast("binary").alias("key"),
                      F.to_json(F.struct(*[F.col(c) for c in COLUMNS])).cast("binary").alias("value"))
    query = (out.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", out_topic)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    mark("query_started")
    query.awaitTermination()
    mark("finished")
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    progress = [{"batch": p["batchId"], "rows": p["numInputRows"],
                 "ms": p["durationMs"].get("triggerExecution", 0)} for p in query.recentProgress]
    spark.stop()
    mark("spark_stopped")
    emit("result " + json.dumps({"progress": progress}))


if __name__ == "__main__":
    side, bootstrap, in_topic, out_topic, checkpoint, per_batch = sys.argv[1:7]
    extra = sys.argv[7] if len(sys.argv) > 7 else ""
    mark("python", STARTED)
    runner = {"batchline": run_batchline, "bare": run_bare, "structured": run_structured, "steady": run_steady}[side]
    runner(bootstrap, in_topic, out_topic, checkpoint, int(per_batch), extra)
