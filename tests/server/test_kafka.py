"""Kafka in and out (SPEC B3, C2), against a real Apache Kafka broker (KRaft, one node):
records with their coordinates, read_committed (aborted transactions never appear), exactly
the logged offset ranges after a restart, new partitions from their first offset, records
deleted by retention named or counted, JSON values with dead letters, and a Kafka output
that a read_committed consumer sees exactly once, a batch at a time."""

import json
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer

from batchline import StreamingContext
from batchline.checkpoint.lease import FencedError
from batchline.errors import BatchFailedError, ConfigurationError, SourceError
from batchline.scheduler.retry import RetryPolicy
from batchline.sinks.kafka import KafkaSink
from batchline.sinks.sink import BatchContext, SinkContext
from tests.helpers import Collect, poll_until


def topic_name(prefix="t"):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def read_committed(broker, topic, expected=None, timeout_s=20.0):
    """Every record of ``topic`` a read_committed consumer sees (waits for ``expected`` of them)."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    found, deadline, quiet_since = [], time.monotonic() + timeout_s, time.monotonic()
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error():
                if expected is None and found and time.monotonic() - quiet_since > 2:
                    break
                if expected is not None and len(found) >= expected and time.monotonic() - quiet_since > 1:
                    break
                continue
            quiet_since = time.monotonic()
            found.append(message)
    finally:
        consumer.close()
    return found


def test_records_come_with_their_coordinates_and_aborted_transactions_never_appear(spark, kafka_broker):
    topic = topic_name()
    kafka_broker.create_topic(topic, partitions=2)
    plain = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    plain.produce(topic, b"plain-0", b"k0", partition=0, headers=[("h", b"v"), ("empty", None)])
    plain.produce(topic, b"plain-1", None, partition=1)
    plain.flush(30)
    txn = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "transactional.id": topic_name("txn")})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(3):
        txn.produce(topic, f"committed-{i}".encode(), partition=i % 2)
    txn.commit_transaction(30)
    txn.begin_transaction()
    aborted_offsets = []
    for i in range(2):
        txn.produce(topic, f"aborted-{i}".encode(), partition=i % 2,
                    on_delivery=lambda error, message: aborted_offsets.append(message.offset()))
    txn.flush(30)
    txn.abort_transaction(30)
    plain.produce(topic, b"after", partition=0)
    plain.flush(30)

    ssc = StreamingContext(spark, "200ms")
    collect = Collect()
    ssc.kafka_stream(kafka_broker.bootstrap_servers, topics=[topic], bounded=True).foreach_batch(collect)
    assert ssc.run_until_finished(60)
    rows = collect.rows()
    assert sorted(r["value"] for r in rows) == sorted(
        [b"plain-0", b"plain-1", b"committed-0", b"committed-1", b"committed-2", b"after"])
    first = next(r for r in rows if r["value"] == b"plain-0")
    assert (first["key"], first["topic"], first["partition"], first["offset"]) == (b"k0", topic, 0, 0)
    assert first["headers"] == [{"key": "h", "value": b"v"}, {"key": "empty", "value": None}]
    assert first["timestamp"] is not None
    assert next(r for r in rows if r["value"] == b"plain-1")["key"] is None
    # the aborted records' offsets and the control records are gaps: "after" is past them
    print(sorted((r["partition"], r["offset"], r["value"]) for r in rows))
    assert next(r for r in rows if r["value"] == b"after")["offset"] > 3


def test_json_values_are_parsed_and_bad_ones_go_to_the_dead_letters_with_the_reason(spark, kafka_broker):
    topic = topic_name()
    kafka_broker.create_topic(topic)
    values = [b'{"n": 1, "user": "a", "ts": "2026-01-01T00:00:00"}', b"not json", b'{"n": "two", "user": "b"}',
              b'{"user": "c"}', b'[1, 2]', None, b'{"n": 7, "extra": true}']
    kafka_broker.produce(topic, [(f"k{i}".encode(), v) for i, v in enumerate(values)])
    ssc = StreamingContext(spark, "200ms")
    good, bad = Collect(), Collect()
    orders = ssc.kafka_stream(kafka_broker.bootstrap_servers, topics=[topic], bounded=True,
                              schema="n long not null, user string, ts timestamp")
    orders.foreach_batch(good)
    orders.dead_letters.foreach_batch(bad)
    assert ssc.run_until_finished(60)
    rows = good.rows()
    assert [(r["n"], r["user"]) for r in rows] == [(1, "a"), (7, None)]
    assert rows[0]["kafka"]["offset"] == 0 and rows[0]["kafka"]["key"] == b"k0" and rows[0]["kafka"]["topic"] == topic
    assert rows[1]["kafka"]["offset"] == 6
    reasons = {json.loads(r["raw_record"])["offset"]: r["reason"] for r in bad.rows()}
    assert set(reasons) == {1, 2, 3, 4, 5}
    assert reasons[1].startswith("malformed JSON")
    assert "field 'n'" in reasons[2]
    assert reasons[3] == "field 'n' is required but missing or null"
    assert "not an object" in reasons[4]
    assert "tombstone" in reasons[5]


def test_a_restart_reads_exactly_the_logged_offset_ranges_again(spark, kafka_broker, tmp_path):
    topic = topic_name()
    kafka_broker.create_topic(topic)
    kafka_broker.produce(topic, [f"r{i}" for i in range(90)])
    checkpoint = tmp_path / "checkpoint"

    def run(collect):
        ssc = StreamingContext(spark, "200ms", checkpoint=str(checkpoint), retry=RetryPolicy.never())
        ssc.kafka_stream(kafka_broker.bootstrap_servers, topics=[topic], name="orders", max_records_per_batch=30,
                         split_size=12).foreach_batch(collect, name="out")
        return ssc

    first = Collect(fail_on_call=2)
    ssc = run(first)
    ssc.start()
    with pytest.raises(BatchFailedError, match="crash after reading"):
        ssc.await_termination(60)
    crashed = sorted(first.batches)[1]
    # the first batch took 30 of 90: 60 waited beyond it
    assert [i.lag for p in ssc.recent_progress for i in p.inputs if i.records][0] == 60
    logged = ssc.checkpoint_manager.events.started(crashed)["orders"]
    # 30 records in tasks of at most split_size (12): three of 10
    assert [s["ranges"] for s in logged["splits"]] == [[[topic, 0, 30, 40]], [[topic, 0, 40, 50]],
                                                      [[topic, 0, 50, 60]]]
    kafka_broker.produce(topic, [f"r{i}" for i in range(90, 110)])  # must not join the re-run batch

    second = Collect()
    ssc = run(second)
    ssc.start()

    def seen(collect):
        return [r["offset"] for r in collect.rows()]

    poll_until(lambda: set(seen(first)) | set(seen(second)) == set(range(110)), 60, 0.2)
    ssc.stop()
    assert [r["offset"] for r in second.batches[crashed]] == list(range(30, 60))  # the logged range again
    assert len(seen(second)) == len(set(seen(second)))
    assert set(seen(first)) & set(seen(second)) == set(range(30, 60))
    # the consumer group got the committed batches' end offsets, for lag tools
    group = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": f"batchline-{topic}"})
    try:
        from confluent_kafka import TopicPartition

        committed = group.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        group.close()
    assert committed == 110


def test_partitions_added_and_topics_matching_the_pattern_are_read_from_their_first_offset(spark, kafka_broker):
    prefix = topic_name("p")
    first_topic = f"{prefix}-a"
    kafka_broker.create_topic(first_topic)
    kafka_broker.produce(first_topic, ["a0", "a1"])
    ssc = StreamingContext(spark, "200ms")
    collect = Collect()
    ssc.kafka_stream(kafka_broker.bootstrap_servers, pattern=f"{prefix}-.*").foreach_batch(collect)
    ssc.start()
    try:
        poll_until(lambda: len(collect.rows()) == 2, 60, 0.1)
        kafka_broker.add_partitions(first_topic, 3)
        kafka_broker.produce(first_topic, ["a2"], partition=2)
        second_topic = f"{prefix}-b"
        kafka_broker.create_topic(second_topic, partitions=2)
        kafka_broker.produce(second_topic, ["b0", "b1"], partition=1)
        poll_until(lambda: len(collect.rows()) == 5, 60, 0.1)
    finally:
        ssc.stop()
    assert sorted(r["value"] for r in collect.rows()) == [b"a0", b"a1", b"a2", b"b0", b"b1"]
    assert {(r["topic"], r["partition"], r["offset"]) for r in collect.rows() if r["value"] == b"a2"} == {
        (first_topic, 2, 0)}


def test_records_deleted_before_they_were_read_fail_the_batch_naming_them(spark, kafka_broker):
    topic = topic_name()
    kafka_broker.create_topic(topic)
    kafka_broker.produce(topic, [f"r{i}" for i in range(50)])
    kafka_broker.delete_records(topic, {0: 20})
    ssc = StreamingContext(spark, "200ms", retry=RetryPolicy.never())
    ssc.kafka_stream(kafka_broker.bootstrap_servers, topics=[topic], starting_offsets={topic: {0: 5}},
                     bounded=True).foreach_batch(Collect())
    with pytest.raises((SourceError, BatchFailedError)) as failure:
        ssc.start()
        ssc.await_termination(60)
    message = str(failure.value)
    assert f"{topic}/0 at offsets 5 to 19" in message and "fail_on_data_loss=False" in message


def test_records_deleted_before_they_were_read_are_counted_without_fail_on_data_loss(spark, kafka_broker):
    topic = topic_name()
    kafka_broker.create_topic(topic)
    kafka_broker.produce(topic, [f"r{i}" for i in range(50)])
    kafka_broker.delete_records(topic, {0: 20})
    ssc = StreamingContext(spark, "200ms")
    collect = Collect()
    ssc.kafka_stream(kafka_broker.bootstrap_servers, topics=[topic], starting_offsets={topic: {0: 5}},
                     bounded=True, fail_on_data_loss=False).foreach_batch(collect)
    assert ssc.run_until_finished(60)
    assert [r["offset"] for r in collect.rows()] == list(range(20, 50))
    taken = [i for p in ssc.recent_progress for i in p.inputs if i.records]
    assert [(i.position["records_lost"], i.position["offsets"], i.lag) for i in taken] == [
        (15, {f"{topic}/0": [20, 50]}, 0)]


def test_kafka_out_is_exactly_once_across_a_failed_batch_and_a_restart(spark, kafka_broker, tmp_path):
    source, sink = topic_name("in"), topic_name("out")
    kafka_broker.create_topic(source, partitions=3)
    kafka_broker.create_topic(sink, partitions=2)
    kafka_broker.produce(source, [json.dumps({"n": i, "user": f"u{i % 5}"}) for i in range(300)])
    checkpoint = tmp_path / "checkpoint"

    def run(collect):
        ssc = StreamingContext(spark, "200ms", checkpoint=str(checkpoint), retry=RetryPolicy.never())
        orders = ssc.kafka_stream(kafka_broker.bootstrap_servers, topics=[source], name="orders",
                                  schema="n long, user string", max_records_per_batch=100, bounded=True)
        # the Kafka output is written first, then the collecting output fails the batch: the
        # restart runs the batch again and must find it committed
        orders.select("n", "user").write_kafka(kafka_broker.bootstrap_servers, sink, key="user", headers=["user"],
                                              name="out")
        orders.foreach_batch(collect, name="after")
        return ssc

    ssc = run(Collect(fail_on_call=2))
    ssc.start()
    with pytest.raises(BatchFailedError, match="crash after reading"):
        ssc.await_termination(60)
    ssc = run(Collect())
    assert ssc.run_until_finished(60)
    records = read_committed(kafka_broker, sink, expected=300)
    values = sorted(json.loads(m.value())["n"] for m in records)
    assert values == list(range(300))  # each once
    one = next(m for m in records if json.loads(m.value())["n"] == 7)
    assert one.key() == b"u2" and one.headers() == [("user", b"u2")]
    # the same key always lands on the same partition (murmur2, as Java producers place it)
    assert len({(m.key(), m.partition()) for m in records}) == 5


def test_a_driver_with_an_older_lease_token_cannot_commit_and_the_topic_must_exist(spark, kafka_broker, tmp_path):
    sink_topic = topic_name("out")
    kafka_broker.create_topic(sink_topic)
    context = SinkContext(pipeline=str(tmp_path), output="out")
    rows = spark.createDataFrame([(1, "a")], "n long, user string")
    newer = KafkaSink(kafka_broker.bootstrap_servers, sink_topic)
    newer.open(context)
    pending = newer.write(rows, BatchContext(1_000, "out", context.pipeline, fencing_token=5))
    pending.commit()
    older = KafkaSink(kafka_broker.bootstrap_servers, sink_topic)
    older.open(context)
    assert older.is_committed(BatchContext(1_000, "out", context.pipeline, fencing_token=3))
    pending = older.write(rows, BatchContext(2_000, "out", context.pipeline, fencing_token=3))
    with pytest.raises(FencedError, match="token 3 is older than token 5"):
        pending.commit()
    # the first sink's producer was fenced by the second's: it cannot commit either
    pending = newer.write(rows, BatchContext(3_000, "out", context.pipeline, fencing_token=5))
    with pytest.raises(FencedError, match="another driver took over"):
        pending.commit()
    assert len(read_committed(kafka_broker, sink_topic, expected=1)) == 1

    missing = KafkaSink(kafka_broker.bootstrap_servers, topic_name("missing"))
    with pytest.raises(ConfigurationError, match="does not exist"):
        missing.open(context)


def test_the_broker_stopped_mid_batch_fails_the_batch_which_is_retried_and_commits_once(spark, kafka_broker,
                                                                                          tmp_path, caplog):
    source, sink = topic_name("in"), topic_name("out")
    kafka_broker.create_topic(source, partitions=2)
    kafka_broker.create_topic(sink)
    kafka_broker.produce(source, [json.dumps({"n": i}) for i in range(200)])
    restarted = threading.Event()

    def stop_the_broker_once(df, batch_time):
        if not restarted.is_set() and df.count():
            restarted.set()
            kafka_broker.stop_broker(kill=True)
            threading.Timer(12.0, kafka_broker.start_again).start()  # longer than a commit waits

    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "checkpoint"),
                           retry=RetryPolicy(max_attempts=6, initial_backoff="2s", max_backoff="5s"))
    orders = ssc.kafka_stream(kafka_broker.bootstrap_servers, topics=[source], schema="n long", bounded=True,
                              max_records_per_batch=100)
    orders.foreach_batch(stop_the_broker_once, name="stopper")
    orders.write_kafka(kafka_broker.bootstrap_servers, sink, name="out", timeout="2s")
    assert ssc.run_until_finished(120)
    retried = [r.getMessage() for r in caplog.records if "failed in output 'out' (attempt 1 of 6)" in r.getMessage()]
    assert retried and "Kafka topic" in retried[0]  # the batch failed while the broker was away
    values = sorted(json.loads(m.value())["n"] for m in read_committed(kafka_broker, sink, expected=200))
    assert values == list(range(200))


def test_a_partition_that_disappears_is_named(spark, kafka_broker):
    prefix = topic_name("gone")
    kafka_broker.create_topic(f"{prefix}-a", partitions=2)
    kafka_broker.produce(f"{prefix}-a", ["a0"])
    collect = Collect()
    ssc = StreamingContext(spark, "200ms", retry=RetryPolicy.never())
    ssc.kafka_stream(kafka_broker.bootstrap_servers, pattern=f"{prefix}-.*").foreach_batch(collect)
    ssc.start()
    try:
        poll_until(lambda: len(collect.rows()) == 1, 60, 0.1)
        kafka_broker.admin().delete_topics([f"{prefix}-a"])[f"{prefix}-a"].result(30)
        with pytest.raises((SourceError, BatchFailedError)) as failure:
            ssc.await_termination(60)
    finally:
        ssc.stop()
    message = str(failure.value)
    assert f"{prefix}-a/0, {prefix}-a/1 no longer exist" in message and "fail_on_data_loss=False" in message
