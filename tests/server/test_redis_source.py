"""Redis Streams in (SPEC B3), against a real redis-server: entries with their ids, exactly
the logged id ranges after a restart, trimmed entries named, dead letters with the reason,
splits read in tasks, retries while the server is away, bounded reads."""

import logging
import threading
import uuid

import pytest
import redis
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from batchline import StreamingContext
from batchline.errors import BatchFailedError, SourceError
from batchline.scheduler.retry import RetryPolicy
from batchline.sources.redis_streams import RedisStreamSource
from harness.servers import RedisServer
from tests.helpers import Collect, poll_until

SCHEMA = StructType([StructField("user", StringType(), False), StructField("amount", LongType(), True),
                     StructField("ts", TimestampType(), True)])


@pytest.fixture
def client(redis_server):
    return redis.Redis.from_url(redis_server.url)


def stream_name():
    return f"s-{uuid.uuid4().hex[:8]}"


def append(client, stream, count, start=0):
    return [client.xadd(stream, {"user": f"u{i % 3}", "amount": str(i), "ts": str(1_700_000_000_000 + i)}).decode()
            for i in range(start, start + count)]


def test_entries_come_with_their_stream_id_and_fields(spark, redis_server, client):
    orders, payments = stream_name(), stream_name()
    order_ids = append(client, orders, 5)
    payment_ids = [client.xadd(payments, {"x": "é"}).decode() for _ in range(3)]
    ssc = StreamingContext(spark, "200ms")
    collect = Collect()
    ssc.redis_stream(redis_server.url, [orders, payments], bounded=True).foreach_batch(collect)
    assert ssc.run_until_finished(60)
    rows = [row for batch in collect.batches.values() for row in batch]
    assert sorted((r["stream"], r["id"]) for r in rows) == sorted(
        [(orders, i) for i in order_ids] + [(payments, i) for i in payment_ids])
    first = next(r for r in rows if r["id"] == order_ids[0])
    assert first["fields"] == {"user": "u0", "amount": "0", "ts": "1700000000000"}
    assert next(r for r in rows if r["stream"] == payments)["fields"] == {"x": "é"}


def test_a_restart_reads_exactly_the_logged_id_ranges_again(spark, redis_server, client, tmp_path):
    stream = stream_name()
    ids = append(client, stream, 90)
    checkpoint = tmp_path / "checkpoint"

    def run(collect):
        ssc = StreamingContext(spark, "200ms", checkpoint=str(checkpoint), retry=RetryPolicy.never())
        ssc.redis_stream(redis_server.url, [stream], name="orders", max_records_per_batch=30, split_size=12,
                         schema=SCHEMA).foreach_batch(collect, name="out")
        return ssc

    first = Collect(fail_on_call=2)
    ssc = run(first)
    ssc.start()
    with pytest.raises(BatchFailedError, match="crash after reading"):
        ssc.await_termination(60)
    crashed = sorted(first.batches)[1]
    logged = ssc.checkpoint_manager.events.started(crashed)["orders"]
    # the batch's splits are id ranges of at most split_size entries, with their counts
    assert [(s["after"], s["to"], s["count"]) for s in logged["splits"]] == [
        (ids[29], ids[41], 12), (ids[41], ids[53], 12), (ids[53], ids[59], 6)]
    ids += append(client, stream, 20, start=90)  # more entries meanwhile: they must not join the re-run batch

    second = Collect()
    ssc = run(second)
    ssc.start()

    def seen(collect):
        return [r["id"] for t in sorted(collect.batches) for r in collect.batches[t]]

    poll_until(lambda: set(seen(first)) | set(seen(second)) == set(ids), 60, 0.2)
    ssc.stop()
    assert [r["id"] for r in first.batches[crashed]] == ids[30:60]
    assert [r["id"] for r in second.batches[crashed]] == ids[30:60]  # exactly the logged entries again
    assert len(seen(second)) == len(set(seen(second)))
    # what the first run did not commit, and only that, was read again
    assert set(seen(first)) & set(seen(second)) == set(ids[30:60])
    assert set(seen(first)) | set(seen(second)) == set(ids)


def test_entries_trimmed_past_a_logged_range_fail_naming_the_missing_ids(spark, redis_server, client, tmp_path):
    stream = stream_name()
    ids = append(client, stream, 40)
    checkpoint = tmp_path / "checkpoint"

    def context(collect):
        ssc = StreamingContext(spark, "200ms", checkpoint=str(checkpoint), retry=RetryPolicy.never())
        ssc.redis_stream(redis_server.url, [stream], name="orders", max_records_per_batch=20).foreach_batch(collect)
        return ssc

    ssc = context(Collect(fail_on_call=2))
    ssc.start()
    with pytest.raises(BatchFailedError):
        ssc.await_termination(60)
    client.xtrim(stream, minid=ids[25], approximate=False)  # the crashed batch held ids[20:40]; five of them are gone

    ssc = context(Collect())
    with pytest.raises(SourceError) as failure:  # the restart stops the pipeline with what is gone
        ssc.start()
        ssc.await_termination(60)
    message = str(failure.value)
    assert stream in message and f"after {ids[19]} up to {ids[39]}" in message
    assert "20 were logged, 15 are left" in message


def test_entries_trimmed_before_they_were_read_stop_the_pipeline(spark, redis_server, client):
    stream = stream_name()
    ids = append(client, stream, 10)
    source = RedisStreamSource(redis_server.url, [stream])
    first = source.plan(source.initial_position(), None)
    assert first.end["ids"] == {stream: ids[-1]}
    client.xtrim(stream, minid=ids[5], approximate=False)  # read already: nothing is lost
    newer = append(client, stream, 10, start=10)
    second = source.plan(first.end, None)
    client.xdel(stream, ids[6])  # read already, too
    newer += append(client, stream, 10, start=20)
    client.xtrim(stream, minid=newer[13], approximate=False)  # newer[10:13] were never read
    with pytest.raises(SourceError, match=f"^3 entries of Redis stream '{stream}' after id {newer[9]} .*"
                                          f"oldest entry left is {newer[13]}"):
        source.plan(second.end, None)


def test_malformed_entries_go_to_the_dead_letters_with_the_reason(spark, redis_server, client):
    stream = stream_name()
    good = client.xadd(stream, {"user": "a", "amount": "5", "ts": "2026-01-02T03:04:05Z"}).decode()
    client.xadd(stream, {"user": "b", "amount": "five"})
    client.xadd(stream, {"amount": "1"})
    client.xadd(stream, {"user": "c", "ts": "yesterday"})
    client.xadd(stream, {"user": "d", "amount": str(2**63)})
    ssc = StreamingContext(spark, "200ms")
    rows, dead = Collect(), Collect()
    orders = ssc.redis_stream(redis_server.url, [stream], schema=SCHEMA, bounded=True)
    orders.foreach_batch(rows, name="rows")
    orders.dead_letters.foreach_batch(dead, name="dead")
    assert ssc.run_until_finished(60)
    good_rows = [r for b in rows.batches.values() for r in b]
    assert [(r["id"], r["user"], r["amount"]) for r in good_rows] == [(good, "a", 5)]
    assert good_rows[0]["ts"].year == 2026
    reasons = sorted(r["reason"] for b in dead.batches.values() for r in b)
    assert reasons == ["field 'amount': 'five' is not a bigint",
                       "field 'amount': 9223372036854775808 does not fit a bigint",
                       "field 'ts': 'yesterday' is not a timestamp (ISO-8601 or epoch milliseconds)",
                       "field 'user' is missing"]
    raws = [r["raw_record"] for b in dead.batches.values() for r in b]
    assert any('"amount": "five"' in raw and stream in raw for raw in raws)


def test_large_ranges_are_read_in_spark_tasks_split_by_id(spark, redis_server, client):
    stream = stream_name()
    append(client, stream, 1000)
    partitions, counts = [], []

    def look(df, batch_time):
        if df.take(1):
            partitions.append(df.rdd.getNumPartitions())
            counts.append(df.count())

    ssc = StreamingContext(spark, "500ms")
    ssc.redis_stream(redis_server.url, [stream], split_size=100, bounded=True).foreach_batch(look)
    assert ssc.run_until_finished(60)
    assert partitions == [10] and counts == [1000]


def test_a_bounded_stream_ends_at_the_last_entry_present_at_the_first_start(spark, redis_server, client):
    stream = stream_name()
    ids = append(client, stream, 30)
    ssc = StreamingContext(spark, "200ms")
    collect = Collect()
    ssc.redis_stream(redis_server.url, [stream], max_records_per_batch=10, bounded=True).foreach_batch(collect)
    adding = threading.Thread(target=lambda: [append(client, stream, 1, start=100 + i) for i in range(50)])
    ssc.start()
    adding.start()
    assert ssc.await_termination(60)
    adding.join()
    assert [r["id"] for t in sorted(collect.batches) for r in collect.batches[t]] == ids


def test_connection_loss_is_retried_with_backoff_and_logged(tmp_path, caplog):
    server = RedisServer(tmp_path / "redis").start()
    try:
        client = redis.Redis.from_url(server.url)
        stream = stream_name()
        append(client, stream, 5)
        source = RedisStreamSource(server.url, [stream], retry_timeout_s=30)
        server.stop()
        restarted = threading.Timer(1.5, server.start)
        restarted.start()
        with caplog.at_level(logging.WARNING, logger="batchline.sources.redis_streams"):
            batch = source.plan(source.initial_position(), None)
        restarted.join()
        assert "retrying in" in caplog.text and "attempt 2" in caplog.text
        # the server came back empty (no persistence): the stream is gone, and the plan says so
        assert batch.splits == ()
        server.stop()
        impatient = RedisStreamSource(server.url, [stream], retry_timeout_s=0.5)
        with pytest.raises(SourceError, match="failed after .* attempts.*Check that the server is up"):
            impatient.plan(impatient.initial_position(), None)
    finally:
        server.stop()


def test_fields_are_found_by_name_whatever_their_order_in_each_entry(redis_server, client):
    """Entries are read as the server sends them (flat field/value lists): a page whose
    entries order their fields differently, or add fields the schema does not name, parses
    each column by name, not by place."""
    stream = stream_name()
    expected = []
    for i in range(40):
        fields = [("ts", str(1_700_000_000_000 + i)), ("user", f"u{i}"), ("amount", str(i))]
        if i % 3 == 0:
            fields.reverse()
        if i % 4 == 0:
            fields.insert(1, ("note", "extra"))
        entry_id = client.xadd(stream, dict(fields)).decode()
        expected.append((entry_id, f"u{i}", i, 1_700_000_000_000 + i))
    same_order = stream_name()  # one order for all, not the schema's, an extra field and no ts
    for i in range(5):
        client.xadd(same_order, {"amount": str(i), "note": "extra", "user": f"v{i}"})

    source = RedisStreamSource(redis_server.url, [stream, same_order], schema=SCHEMA, split_size=7)
    batch = source.plan(source.initial_position(), None)
    rows = [row for split in batch.splits for page in source.read(split) for row in page.to_pylist()]

    assert [(r["id"], r["user"], r["amount"], int(r["ts"].timestamp() * 1000)) for r in rows
            if r["stream"] == stream] == expected
    assert [(r["user"], r["amount"], r["ts"]) for r in rows if r["stream"] == same_order] == [
        (f"v{i}", i, None) for i in range(5)]
