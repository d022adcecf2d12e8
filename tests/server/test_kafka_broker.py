"""The harness's Apache Kafka broker (harness/servers.py ``KafkaBroker``), and the behaviour of
Kafka 4.4 and librdkafka (confluent-kafka) that a Kafka source of the engine builds on, pinned
against the real broker: transactions seen through read_committed, where a consumer's position
and end-of-partition event fall around control markers, which end of the log each watermark
call reports while a transaction is open, a restart on the same port, and records deleted
before they were read."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.helpers import wait_for

TIMEOUT_S = 30


def _topic(kafka_broker, partitions: int = 1) -> str:
    name = f"harness-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(name, partitions)
    return name


def _consumer(kafka_broker, isolation: str = "read_committed", **extra: Any) -> Consumer:
    return Consumer(kafka_broker.client_config(**{
        "group.id": f"harness-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "isolation.level": isolation, "enable.partition.eof": True, **extra}))


def _read_to_end(consumer: Consumer, topic: str, partitions: int) -> list[tuple[int, int, bytes]]:
    """Every record from offset 0 until each partition's end-of-partition event."""
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: list[tuple[int, int, bytes]] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + TIMEOUT_S
    while len(at_end) < partitions:
        assert time.monotonic() < deadline, f"no end of partition for {set(range(partitions)) - at_end}"
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
            at_end.add(message.partition())
            continue
        records.append((message.partition(), message.offset(), message.value()))
    return records


def _wait_stable(kafka_broker, topic: str, end: int, partition: int = 0) -> None:
    # commit_transaction() returns once the coordinator has logged the commit; the markers reach
    # the partitions just after, and until then the last stable offset is short of the end.
    wait_for(lambda: kafka_broker.watermarks(topic, read_committed=True)[partition][1] >= end,
             f"last stable offset {end} in {topic} [{partition}]", timeout_s=TIMEOUT_S, step_s=0.05)


def _transactional(kafka_broker) -> Producer:
    producer = Producer(kafka_broker.client_config(**{"transactional.id": f"harness-{uuid.uuid4().hex[:8]}"}))
    producer.init_transactions(TIMEOUT_S)
    return producer


def test_read_committed_sees_committed_transactions_only(kafka_broker):
    topic = _topic(kafka_broker, 3)
    producer = _transactional(kafka_broker)
    for outcome in ("committed", "aborted"):
        producer.begin_transaction()
        for partition in range(3):
            for index in range(4):
                producer.produce(topic, value=f"{outcome}-{partition}-{index}".encode(), partition=partition)
        if outcome == "committed":
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.flush(TIMEOUT_S)
            producer.abort_transaction(TIMEOUT_S)
    for partition in range(3):  # 4 committed, their marker, 4 aborted, their marker
        _wait_stable(kafka_broker, topic, 10, partition)

    committed = _consumer(kafka_broker)
    seen = _read_to_end(committed, topic, 3)
    committed.close()
    assert sorted(value for _, _, value in seen) == sorted(
        f"committed-{p}-{i}".encode() for p in range(3) for i in range(4))
    assert {offset for _, offset, _ in seen} == {0, 1, 2, 3}

    uncommitted = _consumer(kafka_broker, "read_uncommitted")
    everything = _read_to_end(uncommitted, topic, 3)
    uncommitted.close()
    assert len(everything) == 24  # the aborted records too, at offsets 5 to 8
    assert {offset for _, offset, value in everything if value.startswith(b"aborted")} == {5, 6, 7, 8}


def test_position_steps_over_a_commit_marker_only_at_the_end_of_partition_event(kafka_broker):
    """After the last record of a committed transaction the position is just past that record;
    the end-of-partition event comes at the end offset, past the marker, and the position moves
    there with it. So "position == end offset" is reached, but only after the EOF event."""
    topic = _topic(kafka_broker)
    producer = _transactional(kafka_broker)
    producer.begin_transaction()
    for index in range(3):
        producer.produce(topic, value=f"r{index}".encode())
    producer.commit_transaction(TIMEOUT_S)
    _wait_stable(kafka_broker, topic, 4)  # records 0..2, the commit marker at 3
    assert kafka_broker.watermarks(topic) == {0: (0, 4)}

    consumer = _consumer(kafka_broker)
    consumer.assign([TopicPartition(topic, 0, 0)])
    partition = [TopicPartition(topic, 0)]
    events: list[tuple[str, int, int]] = []
    deadline = time.monotonic() + TIMEOUT_S
    while not events or events[-1][0] != "eof":
        assert time.monotonic() < deadline, events
        message = consumer.poll(0.5)
        if message is None:
            continue
        kind = "eof" if message.error() and message.error().code() == KafkaError._PARTITION_EOF else "record"
        assert kind == "eof" or not message.error(), message.error()
        events.append((kind, message.offset(), consumer.position(partition)[0].offset))
    consumer.close()
    assert events == [("record", 0, 1), ("record", 1, 2), ("record", 2, 3), ("eof", 4, 4)]


def test_watermarks_while_a_transaction_is_open(kafka_broker):
    """With read_committed, ``get_watermark_offsets`` asked of the broker answers the last stable
    offset (where the open transaction begins); the cached one, from fetch responses, is the
    high watermark, past the open transaction's records. The EOF event comes at the stable end."""
    topic = _topic(kafka_broker)
    producer = _transactional(kafka_broker)
    producer.begin_transaction()
    producer.produce(topic, value=b"c0")
    producer.produce(topic, value=b"c1")
    producer.commit_transaction(TIMEOUT_S)
    _wait_stable(kafka_broker, topic, 3)  # c0, c1, commit marker
    producer.begin_transaction()
    producer.produce(topic, value=b"open0")
    producer.produce(topic, value=b"open1")
    producer.flush(TIMEOUT_S)  # at 3 and 4, not committed
    tp = TopicPartition(topic, 0)
    assert kafka_broker.watermarks(topic) == {0: (0, 5)}
    assert kafka_broker.watermarks(topic, read_committed=True) == {0: (0, 3)}

    committed = _consumer(kafka_broker)
    assert committed.get_watermark_offsets(tp, timeout=TIMEOUT_S) == (0, 3)  # the last stable offset
    uncommitted = _consumer(kafka_broker, "read_uncommitted")
    assert uncommitted.get_watermark_offsets(tp, timeout=TIMEOUT_S) == (0, 5)  # the high watermark
    uncommitted.close()

    seen = _read_to_end(committed, topic, 1)
    assert [value for _, _, value in seen] == [b"c0", b"c1"]
    assert committed.position([tp])[0].offset == 3  # stopped at the open transaction
    assert committed.get_watermark_offsets(tp, cached=True) == (0, 5)  # the high watermark, not the LSO

    producer.abort_transaction(TIMEOUT_S)
    _wait_stable(kafka_broker, topic, 6)
    assert committed.get_watermark_offsets(tp, timeout=TIMEOUT_S) == (0, 6)
    committed.close()


def test_stop_and_start_again_keep_the_data_and_the_port(kafka_broker):
    topic = _topic(kafka_broker, 2)
    assert kafka_broker.produce(topic, [b"before-0", (b"key", b"before-1")], partition=1) == [(1, 0), (1, 1)]
    port = kafka_broker.port
    kafka_broker.stop_broker()
    kafka_broker.start_again()
    assert kafka_broker.port == port and kafka_broker.bootstrap_servers == f"127.0.0.1:{port}"
    assert kafka_broker.produce(topic, [b"after-0"], partition=1) == [(1, 2)]
    producer = _transactional(kafka_broker)  # the transaction coordinator is back too
    producer.begin_transaction()
    producer.produce(topic, value=b"after-txn", partition=0)
    producer.commit_transaction(TIMEOUT_S)
    _wait_stable(kafka_broker, topic, 2, partition=0)
    consumer = _consumer(kafka_broker)
    seen = _read_to_end(consumer, topic, 2)
    consumer.close()
    assert sorted(value for _, _, value in seen) == [b"after-0", b"after-txn", b"before-0", b"before-1"]


def test_start_again_after_a_crash(kafka_broker):
    topic = _topic(kafka_broker)
    kafka_broker.produce(topic, [b"a", b"b"])
    kafka_broker.stop_broker(kill=True)  # SIGKILL: the logs are recovered at the next start
    kafka_broker.start_again()
    assert kafka_broker.watermarks(topic) == {0: (0, 2)}
    assert kafka_broker.produce(topic, [b"c"]) == [(0, 2)]


def test_add_partitions(kafka_broker):
    topic = _topic(kafka_broker)
    kafka_broker.add_partitions(topic, 3)
    assert kafka_broker.produce(topic, [b"x"], partition=2) == [(2, 0)]
    assert kafka_broker.watermarks(topic) == {0: (0, 0), 1: (0, 0), 2: (0, 1)}


def test_records_deleted_before_they_were_read(kafka_broker):
    """``delete_records`` moves the log start offset at once. A consumer assigned below it with
    ``auto.offset.reset: error`` gets one error event, _AUTO_OFFSET_RESET (not fatal), carrying
    the partition and the offset it asked for, and reads nothing; with ``earliest`` it moves to
    the new log start silently."""
    topic = _topic(kafka_broker)
    kafka_broker.produce(topic, [f"r{index}".encode() for index in range(10)])
    assert kafka_broker.delete_records(topic, {0: 6}) == {0: 6}
    assert kafka_broker.watermarks(topic) == {0: (6, 10)}

    strict = _consumer(kafka_broker, **{"auto.offset.reset": "error"})
    strict.assign([TopicPartition(topic, 0, 2)])
    error = None
    deadline = time.monotonic() + TIMEOUT_S
    while error is None:
        assert time.monotonic() < deadline, "no error for an offset below the log start"
        message = strict.poll(0.5)
        if message is not None:
            assert message.error(), f"read {message.offset()} below the log start"
            error = message
    assert error.error().code() == KafkaError._AUTO_OFFSET_RESET
    assert not error.error().fatal()
    assert "Offset out of range" in error.error().str()
    assert (error.topic(), error.partition(), error.offset()) == (topic, 0, 2)
    assert strict.poll(1.0) is None  # nothing more: the partition does not fetch on
    strict.close()

    lenient = _consumer(kafka_broker, **{"auto.offset.reset": "earliest"})
    lenient.assign([TopicPartition(topic, 0, 2)])
    seen = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(seen) < 4:
        assert time.monotonic() < deadline, seen
        message = lenient.poll(0.5)
        if message is not None and not message.error():
            seen.append(message.offset())
    lenient.close()
    assert seen == [6, 7, 8, 9]
