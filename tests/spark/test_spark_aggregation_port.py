"""Spark's own streaming-aggregation and watermark tests, ported to batchline's built-in
aggregations (``KeyedStream.aggregate``) one batch at a time.

Sources: ``StreamingAggregationSuite`` and ``EventTimeWatermarkSuite``
(sql/core/src/test/scala/org/apache/spark/sql/streaming/). Each test's docstring names the
Spark suite and test.

How Spark's ``testStream`` maps onto ``BatchHarness``:

- ``AddData(...)`` then ``CheckLastBatch`` / ``CheckNewAnswer``: one ``harness.batch(rows)``.
- Spark runs a *no-data batch* after a batch that moved the watermark, and ``CheckNewAnswer``
  includes its rows. batchline runs a batch every interval; the port's ``harness.batch([])``
  right after is that no-data batch (the watermark of a batch comes from earlier batches in
  both engines).
- ``$"value".cast("timestamp")`` / ``timestamp_seconds($"value")``: the same Spark function in a
  ``with_column``; a window's ``start`` cast to long: ``secs(row["window_start"])``.
- ``StopStream`` / ``StartStream``: a second harness on the same checkpoint.
- Spark's ``numRowsTotal`` / ``numRowsUpdated`` / ``numRowsDroppedByWatermark`` / ``numOutputRows``
  are batchline's ``state_keys`` / ``updated`` / ``late_rows`` / ``output_rows`` in
  ``harness.info().state_operators[name]``.
"""

import datetime as dt

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from batchline import BatchFailedError, RetryPolicy, StreamingContext, window
from batchline import aggregates as agg
from batchline.errors import ConfigurationError
from batchline.testing import END, BatchHarness, CollectSink, list_stream

INTS = "value long"


def ints(*values):
    return [(v,) for v in values]


def secs(value: dt.datetime) -> int:
    """A timestamp out of Spark (naive, in the driver's local time) as epoch seconds."""
    return int(value.timestamp())


def event_time(stream, delay="10 seconds"):
    """Spark's ``.withColumn("eventTime", timestamp_seconds($"value")).withWatermark("eventTime", delay)``."""
    return stream.with_column("eventTime", F.timestamp_seconds("value")).with_watermark("eventTime", delay)


def windowed_count(mode, name="windowed"):
    """Spark's ``groupBy(window($"eventTime", "5 seconds")).agg(count("*"))`` after a 10 s watermark."""
    def build(stream):
        return event_time(stream).group_by_key(window("eventTime", "5 seconds")).aggregate(
            agg.count(), output_mode=mode, name=name)
    return build


def starts(rows):
    """``(window start in seconds, count)`` per row: Spark's ``select(window.start.cast("long"), count)``."""
    return sorted((secs(r["window_start"]), r["count"]) for r in rows)


def pairs(rows, *columns):
    return sorted(tuple(r[c] for c in columns) for r in rows)


def harness(spark, tmp_path, build, schema=INTS, **options):
    return BatchHarness(spark, build, schema, checkpoint=str(tmp_path / "checkpoint"), **options).start()


def restarted(spark, tmp_path, build, before, schema=INTS, **options):
    """A new driver on ``before``'s checkpoint, its next batch right after ``before``'s last."""
    again = BatchHarness(spark, build, schema, checkpoint=str(tmp_path / "checkpoint"),
                         start_ms=before.batch_time + 500, **options).start()
    again.batch_time = before.batch_time
    return again


def operator(h, name):
    return h.info().state_operators[name]


def count_by_value(stream):
    return stream.group_by_key("value").aggregate(agg.count(), name="counts")


# --- StreamingAggregationSuite -------------------------------------------------------------


def test_simple_count_update_mode(spark, tmp_path):
    """StreamingAggregationSuite: "simple count, update mode" (with the StopStream/StartStream
    in the middle: a restarted driver resumes the counts)."""
    h = harness(spark, tmp_path, count_by_value)
    try:
        assert pairs(h.batch(ints(3)), "value", "count") == [(3, 1)]
        assert pairs(h.batch(ints(3, 2)), "value", "count") == [(2, 1), (3, 2)]
    finally:
        h.stop()
    again = restarted(spark, tmp_path, count_by_value, h)
    try:
        assert pairs(again.batch(ints(3, 2, 1)), "value", "count") == [(1, 1), (2, 2), (3, 3)]
        assert pairs(again.batch(ints(4, 4, 4, 4)), "value", "count") == [(4, 4)]
    finally:
        again.stop()


def test_count_distinct(spark, tmp_path):
    """StreamingAggregationSuite: "count distinct" (``explode``, then ``size(collect_set)`` per
    key: batchline's ``collect_set`` merged across batches, its size taken after)."""
    def build(stream):
        exploded = stream.transform(lambda df: df.select("_1", F.explode("_2").alias("value")))
        return exploded.group_by_key("_1").aggregate(agg.collect_set("value").alias("values"), name="distinct") \
            .select("_1", F.size("values").alias("distinct_values"))

    h = harness(spark, tmp_path, build, schema="_1 long, _2 array<long>")
    try:
        assert h.batch([(1, [1, 2])]) == [{"_1": 1, "distinct_values": 2}]
        assert h.batch([(1, [2, 3])]) == [{"_1": 1, "distinct_values": 3}]  # across batches
    finally:
        h.stop()


def test_simple_count_complete_mode(spark, tmp_path):
    """StreamingAggregationSuite: "simple count, complete mode".

    batchline differs: complete mode is refused at definition (README, "Coming from Structured
    Streaming": it rewrites every group every batch); update mode gives the changed groups.
    Spark's complete-mode tests ("sort after aggregate in complete mode", "prune results by
    current_time/current_date, complete mode", EventTimeWatermarkSuite "complete mode") are
    not ported for that reason; this test asserts the refusal once."""
    ssc = StreamingContext(spark, 1, checkpoint=str(tmp_path / "checkpoint"))
    stream = ssc.queue_stream([], schema=INTS)
    with pytest.raises(ConfigurationError, match="output_mode must be one of"):
        stream.group_by_key("value").aggregate(agg.count(), output_mode="complete")


def test_simple_count_append_mode(spark, tmp_path):
    """StreamingAggregationSuite: "simple count, append mode": an aggregation without a
    watermark cannot run in append mode (Spark: AnalysisException "append ... not supported")."""
    ssc = StreamingContext(spark, 1, checkpoint=str(tmp_path / "checkpoint"))
    stream = ssc.queue_stream([], schema=INTS)
    with pytest.raises(ConfigurationError, match="append.*needs a window and a watermark"):
        stream.group_by_key("value").aggregate(agg.count(), output_mode="append")


def test_state_metrics_append_mode(spark, tmp_path):
    """StreamingAggregationSuite: "state metrics - append mode" (numOutputRows,
    numRowsUpdated, numRowsTotal per batch, no-data batches included)."""
    h = harness(spark, tmp_path, windowed_count("append"))
    try:
        def check(rows, out, output_rows, updated, total):
            assert starts(h.batch(rows)) == out
            progress = operator(h, "windowed")
            assert (progress.output_rows, progress.updated, progress.state_keys) == (output_rows, updated, total)

        check(ints(15), [], 0, 1, 1)  # batch 0: watermark 0
        check([], [], 0, 0, 1)  # batch 1 without data: watermark 5
        check(ints(10, 12, 14), [], 0, 1, 2)  # batch 2: watermark 5
        check(ints(25), [], 0, 1, 3)  # batch 3: watermark 5
        check([], [(10, 3)], 1, 0, 2)  # batch 4 without data: watermark 15 closes [10, 15)
    finally:
        h.stop()


def test_state_metrics_update_mode(spark, tmp_path):
    """StreamingAggregationSuite: "state metrics - update/complete mode" (the update half;
    complete mode is refused, see test_simple_count_complete_mode)."""
    def build(stream):
        doubled = stream.transform(lambda df: df.select(F.explode(F.array("value", F.col("value") + 1)).alias("value")))
        return doubled.group_by_key("value").aggregate(agg.count(), name="counts")

    h = harness(spark, tmp_path, build)
    try:
        assert pairs(h.batch(ints(1)), "value", "count") == [(1, 1), (2, 1)]
        progress = operator(h, "counts")
        assert (progress.output_rows, progress.updated, progress.state_keys) == (2, 2, 2)
        assert pairs(h.batch(ints(2, 3)), "value", "count") == [(2, 2), (3, 2), (4, 1)]
        progress = operator(h, "counts")
        assert (progress.output_rows, progress.updated, progress.state_keys) == (3, 3, 4)
    finally:
        h.stop()


def test_multiple_keys(spark, tmp_path):
    """StreamingAggregationSuite: "multiple keys" (``groupBy($"value", $"value" + 1)``: the
    computed key added with ``with_column`` first)."""
    def build(stream):
        return stream.with_column("next", F.col("value") + 1).group_by_key("value", "next").aggregate(
            agg.count(), name="counts")

    h = harness(spark, tmp_path, build)
    try:
        assert pairs(h.batch(ints(1, 2)), "value", "next", "count") == [(1, 2, 1), (2, 3, 1)]
        assert pairs(h.batch(ints(1, 2)), "value", "next", "count") == [(1, 2, 2), (2, 3, 2)]
    finally:
        h.stop()


def _union_with_counts(stream):
    """Spark's ``input1.select(value, value + 1) union input2.groupBy(value).agg(count(*))``:
    one input, its rows split by ``side``; batchline's union matches columns by name."""
    plain = stream.filter("side = 1").select(F.col("value"), (F.col("value") + 1).alias("count"))
    counted = stream.filter("side = 2").group_by_key("value").aggregate(agg.count(), name="union_counts")
    return plain.union(counted)


def test_spark_29438_union_does_not_shift_the_aggregations_partitions(spark, tmp_path):
    """StreamingAggregationSuite: "SPARK-29438: ensure UNION doesn't lead streaming aggregation
    to use shifted partition IDs" (restarted with the other side of the union split into
    more partitions: the aggregation still finds its state)."""
    schema = "side int, value long"
    h = harness(spark, tmp_path, _union_with_counts, schema=schema)
    try:
        assert pairs(h.batch([(1, 11), (1, 12), (2, 21), (2, 22)]), "value", "count") == [
            (11, 12), (12, 13), (21, 1), (22, 1)]
    finally:
        h.stop()

    def wider(stream):
        return _union_with_counts(stream.transform(lambda df: df.repartition(3)))

    again = restarted(spark, tmp_path, wider, h, schema=schema)
    try:
        assert pairs(again.batch([(1, 13), (1, 14), (2, 22), (2, 23)]), "value", "count") == [
            (13, 14), (14, 15), (22, 2), (23, 1)]
    finally:
        again.stop()


def test_midbatch_failure(spark, tmp_path):
    """StreamingAggregationSuite: "midbatch failure": a task fails once mid-batch; the failed
    batch commits nothing, and after the restart the counts are as if it never ran.

    As Spark's ``ExpectFailure`` then ``StartStream``: retries are off, so the pipeline stops
    at the failure and a new driver starts. Spark's MemoryStream replays the failed batch's
    data; batchline's test queue does not replay, so the port adds the rows again."""
    marker = tmp_path / "failed-once"

    def fail_once(value):
        if value == 4 and not marker.exists():
            marker.write_text("injected failure")
            raise RuntimeError("injected failure")
        return value

    def build(stream):
        checked = stream.with_column("value", F.udf(fail_once, LongType())("value"))
        return count_by_value(checked)

    h = harness(spark, tmp_path, build, retry=RetryPolicy(max_attempts=1))
    h.input.push(spark.createDataFrame(ints(1, 2, 3, 4), INTS))
    h.clock.advance(h.interval_ms)
    with pytest.raises(BatchFailedError, match="failed in operator 'counts': PythonException"):
        h.ssc.await_termination(120)
    failed_batch = h.batch_time + h.interval_ms
    h.stop()
    assert marker.exists()  # the failure was the injected one

    again = BatchHarness(spark, build, INTS, checkpoint=str(tmp_path / "checkpoint"), start_ms=failed_batch).start()
    try:
        again.batch_time = failed_batch
        again.recorder.wait_for_batch(failed_batch)  # the failed batch runs again, its rows gone with the queue
        assert pairs(again.batch(ints(1, 2, 3, 4)), "value", "count") == [(1, 1), (2, 1), (3, 1), (4, 1)]
    finally:
        again.stop()


def test_typed_aggregators(spark, tmp_path):
    """StreamingAggregationSuite: "typed aggregators" (``groupByKey(_._1).agg(typed.sumLong(_._2))``)."""
    h = harness(spark, tmp_path, lambda s: s.group_by_key("_1").aggregate(agg.sum("_2"), name="sums"),
                schema="_1 string, _2 long")
    try:
        out = h.batch([("a", 10), ("a", 20), ("b", 1), ("b", 2), ("c", 1)])
        assert pairs(out, "_1", "sum__2") == [("a", 30), ("b", 3), ("c", 1)]
    finally:
        h.stop()


def test_spark_19690_batch_aggregation_in_a_streaming_query_stays_batch(spark, tmp_path):
    """StreamingAggregationSuite: "SPARK-19690: do not convert batch aggregation in streaming
    query to streaming": a stream joined with a static aggregated DataFrame gets the same
    static answer every batch."""
    static = spark.createDataFrame(ints(1, 2, 3, 4, 5), INTS).withColumn("parity", F.col("value") % 2) \
        .groupBy("parity").agg(F.count("*").alias("joinValue"))

    def build(stream):
        return stream.transform(lambda df: df.join(static, df["value"] == static["parity"]))

    h = harness(spark, tmp_path, build)
    try:
        for _ in range(2):
            assert pairs(h.batch(ints(0, 1, 2, 3)), "value", "parity", "joinValue") == [(0, 0, 2), (1, 1, 3)]
    finally:
        h.stop()


def test_spark_21977_a_global_aggregation_keeps_its_state_over_empty_batches(spark, tmp_path):
    """StreamingAggregationSuite: "SPARK-21977: coalesce(1) with 0 partition RDD should be
    repartitioned to 1" (and "... should still be repartitioned when it has non-empty grouping
    keys"): after ``coalesce(1)``, a batch without rows must not lose the total.

    batchline differs: Spark's test runs in complete mode, which batchline refuses (README);
    in update mode a batch without rows emits nothing, and the total carries on."""
    def build(stream):
        return stream.transform(lambda df: df.coalesce(1)).aggregate(agg.count(), name="total")

    h = harness(spark, tmp_path, build)
    try:
        assert h.batch(ints(1)) == [{"count": 1}]
        assert h.batch([]) == []
        assert h.batch(ints(2, 3)) == [{"count": 3}]
        assert h.batch([]) == []
        assert operator(h, "total").state_keys == 1
    finally:
        h.stop()


def test_spark_22230_last_should_change_with_new_batches(spark, tmp_path):
    """StreamingAggregationSuite: "SPARK-22230: last should change with new batches".

    batchline differs: ``last`` is the row with the latest event time, not the last to arrive
    (README: so a batch that runs again after a crash gives the same answer), and it needs a
    watermark. With event time = value, batches 1,2,3 then 4,5,6 give 3 then 6, as in Spark;
    a later 0 (event time 0) leaves 6 where Spark gives 0. Complete mode is refused, so a batch
    without rows emits nothing."""
    def build(stream):
        return event_time(stream, "1 hour").aggregate(agg.last("value"), name="last")

    h = harness(spark, tmp_path, build)
    try:
        assert h.batch(ints(1, 2, 3)) == [{"last_value": 3}]
        assert h.batch(ints(4, 5, 6)) == [{"last_value": 6}]
        assert h.batch([]) == []
        assert h.batch(ints(0)) == [{"last_value": 6}]  # Spark: 0
    finally:
        h.stop()


def test_spark_23004_collect_list_over_128_rows_in_one_partition(spark, tmp_path):
    """StreamingAggregationSuite: "SPARK-23004: Ensure that TypedImperativeAggregate functions
    do not throw errors" (``collect_list`` with 128 rows in one post-shuffle partition, the
    threshold where Spark's ObjectHashAggregateExec falls back to sort-based aggregation)."""
    def build(stream):
        return stream.with_column("group", F.col("value")).group_by_key("group").aggregate(
            agg.collect_list("value"), name="lists", num_partitions=1)

    h = harness(spark, tmp_path, build)
    try:
        out = h.batch(ints(*range(1, 129)))
        assert sorted((r["group"], r["collect_list_value"]) for r in out) == [(i, [i]) for i in range(1, 129)]
    finally:
        h.stop()


def test_changing_schema_of_state_when_restarting_query(spark, tmp_path):
    """StreamingAggregationSuite: "changing schema of state when restarting query": the same
    aggregation name restarted with other aggregates (``max`` becomes ``collect_list``), so
    another state schema, must fail rather than read the old state as the new."""
    def first(stream):
        return stream.with_column("id", F.col("value") % 10).group_by_key("id").aggregate(
            agg.sum("value").alias("sum_value"), agg.avg("value").alias("avg_value"),
            agg.max("value").alias("max_value"), name="by_id")

    def second(stream):
        return stream.with_column("id", F.col("value") % 10).group_by_key("id").aggregate(
            agg.sum("value").alias("sum_value"), agg.avg("value").alias("avg_value"),
            agg.collect_list("value").alias("values"), name="by_id")

    h = harness(spark, tmp_path, first)
    try:
        assert pairs(h.batch(ints(1, 11)), "id", "sum_value", "avg_value", "max_value") == [(1, 12, 6.0, 11)]
    finally:
        h.stop()
    message = _expect_refusal(spark, tmp_path, second, "is now defined with state", row=(21,),
                              start_ms=h.batch_time + 500)
    assert "another name=" in message


# --- EventTimeWatermarkSuite ---------------------------------------------------------------


def _expect_refusal(spark, tmp_path, build, match, schema=INTS, row=(1,), start_ms=100_000):
    """The pipeline is refused at definition, or fails as its first batch is built or run (no
    retry), with ``match`` in the message; returns the message. ``start_ms``: after the
    batches of an earlier run on the same checkpoint."""
    try:
        h = BatchHarness(spark, build, schema, checkpoint=str(tmp_path / "checkpoint"),
                         retry=RetryPolicy(max_attempts=1), start_ms=start_ms)
    except ConfigurationError as refused:
        assert match in str(refused)
        return str(refused)
    h.start()
    try:
        h.input.push(spark.createDataFrame([row], schema))
        h.clock.advance(h.interval_ms)
        with pytest.raises(Exception, match=match) as failed:
            h.ssc.await_termination(120)
        return str(failed.value)
    finally:
        h.stop()


def test_error_on_bad_column(spark, tmp_path):
    """EventTimeWatermarkSuite: "error on bad column".

    batchline differs: Spark refuses at ``withWatermark``; batchline when the first batch is
    built (Spark's AnalysisException, naming the column), as a stream's columns are known only
    then. Not in the README's table."""
    _expect_refusal(spark, tmp_path, lambda s: s.with_watermark("badColumn", "1 minute").drop_duplicates(
        "value", name="dedup"), "badColumn")


def test_error_on_wrong_type(spark, tmp_path):
    """EventTimeWatermarkSuite: "error on wrong type" (a watermark on a long column is refused,
    the message naming the column and saying it must be a timestamp; batchline may refuse
    when the first batch is built, as for "error on bad column")."""
    message = _expect_refusal(spark, tmp_path, lambda s: s.with_watermark("value", "1 minute").drop_duplicates(
        "value", name="dedup"), "value")
    first_line = message.splitlines()[0]
    assert "StateFunctionError" not in first_line and "timestamp" in first_line.lower(), first_line


def test_event_time_and_watermark_metrics_without_a_watermark(spark, tmp_path):
    """EventTimeWatermarkSuite: "event time and watermark metrics", its first half: a
    windowed count without a watermark (Spark keeps every window; no watermark is reported).
    In update mode, as complete mode is refused."""
    h = harness(spark, tmp_path, lambda s: s.with_column("eventTime", F.timestamp_seconds("value")).group_by_key(
        window("eventTime", "5 seconds")).aggregate(agg.count(), name="windowed"))
    try:
        assert starts(h.batch(ints(15))) == [(15, 1)]
        assert operator(h, "windowed").watermark_ms is None
        assert starts(h.batch(ints(10, 12, 14))) == [(10, 3)]
        assert operator(h, "windowed").watermark_ms is None
    finally:
        h.stop()


def test_event_time_and_watermark_metrics(spark, tmp_path):
    """EventTimeWatermarkSuite: "event time and watermark metrics", its second half: the
    watermark each batch runs with (batchline's progress has no event-time min/max/avg; the
    first half is test_event_time_and_watermark_metrics_without_a_watermark).

    batchline differs: before any event time was seen the progress's watermark is None where
    Spark reports 1970-01-01 (0); not in the README's table."""
    h = harness(spark, tmp_path, windowed_count("append"))
    try:
        assert h.batch(ints(15)) == []
        assert operator(h, "windowed").watermark_ms is None  # Spark: 0
        assert h.batch(ints(10, 12, 14)) == []
        assert operator(h, "windowed").watermark_ms == 5_000
        assert h.batch(ints(25)) == []
        assert operator(h, "windowed").watermark_ms == 5_000
        assert starts(h.batch([])) == [(10, 3)]  # the no-data batch
        assert operator(h, "windowed").watermark_ms == 15_000
    finally:
        h.stop()


def test_event_time_and_watermark_metrics_with_trigger_once(spark, tmp_path):
    """EventTimeWatermarkSuite: "event time and watermark metrics with Trigger.Once
    (SPARK-24699)": each Trigger.Once run uses the watermark the one before left, and runs no
    no-data batch; after the five runs Spark has emitted (10, 3), (15, 1), (25, 1) and keeps
    the window of 50 open.

    batchline differs: a bounded input's end moves the watermark to the end of time (README),
    so the run over the same five batches emits every window, [50, 55) included."""
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "checkpoint"))
    sink = CollectSink()
    rows = list_stream(ssc, [ints(15), ints(10, 12, 14), ints(25), ints(50), ints(50), END], INTS, bounded=True)
    windowed_count("append")(rows).foreach_batch(sink, name="collect")
    assert ssc.run_until_finished(timeout=120)
    assert starts(sink.all_rows()) == [(10, 3), (15, 1), (25, 1), (50, 2)]


def test_append_mode(spark, tmp_path):
    """EventTimeWatermarkSuite: "append mode"."""
    h = harness(spark, tmp_path, windowed_count("append"))
    try:
        assert h.batch(ints(10, 11, 12, 13, 14, 15)) == []
        assert h.batch(ints(25)) == []  # advances the watermark to 15 s for the next batch
        assert starts(h.batch([])) == [(10, 5)]
        assert operator(h, "windowed").state_keys == 2
        assert operator(h, "windowed").late_rows == 0
        assert h.batch(ints(10)) == []  # behind the watermark
        assert (operator(h, "windowed").state_keys, operator(h, "windowed").late_rows) == (2, 1)
    finally:
        h.stop()


def test_update_mode(spark, tmp_path):
    """EventTimeWatermarkSuite: "update mode"."""
    h = harness(spark, tmp_path, windowed_count("update"))
    try:
        assert starts(h.batch(ints(10, 11, 12, 13, 14, 15))) == [(10, 5), (15, 1)]
        assert starts(h.batch(ints(25))) == [(25, 1)]  # advances the watermark to 15 s
        assert h.batch([]) == []  # the no-data batch forgets [10, 15)
        assert (operator(h, "windowed").state_keys, operator(h, "windowed").late_rows) == (2, 0)
        assert starts(h.batch(ints(10, 25))) == [(25, 2)]  # 10 is behind the watermark
        assert (operator(h, "windowed").state_keys, operator(h, "windowed").late_rows) == (2, 1)
        assert h.batch(ints(10)) == []
        assert (operator(h, "windowed").state_keys, operator(h, "windowed").late_rows) == (2, 1)
    finally:
        h.stop()


def test_delay_in_months_and_years_handled_correctly(spark, tmp_path):
    """EventTimeWatermarkSuite: "delay in months and years handled correctly": a delay of
    "2 years 5 months" is 29 months of 31 days, as Spark counts them."""
    now = int(dt.datetime.now(dt.UTC).timestamp())
    h = harness(spark, tmp_path, lambda s: event_time(s, "2 years 5 months").group_by_key(
        window("eventTime", "5 seconds")).aggregate(agg.count(), output_mode="append", name="windowed"))
    try:
        h.batch(ints(now))
        h.batch(ints(now))
        assert operator(h, "windowed").watermark_ms == now * 1000 - 29 * 31 * 86_400_000
    finally:
        h.stop()


def test_recovery(spark, tmp_path):
    """EventTimeWatermarkSuite: "recovery": a restarted driver resumes the watermark (late
    rows stay late) and the open windows. Spark's test also purges the last commit to make a
    batch run again; BatchHarness restarts after a clean stop only."""
    build = windowed_count("append")
    h = harness(spark, tmp_path, build)
    try:
        assert h.batch(ints(10, 11, 12, 13, 14, 15)) == []
        assert h.batch(ints(25)) == []  # watermark 15 s for the next batch
        assert starts(h.batch([])) == [(10, 5)]
    finally:
        h.stop()
    again = restarted(spark, tmp_path, build, h)
    try:
        assert again.batch(ints(10, 27, 30)) == []  # 10 is behind the recovered watermark
        assert operator(again, "windowed").late_rows == 1
        assert starts(again.batch([])) == [(15, 1)]  # watermark 20 s
    finally:
        again.stop()
    third = restarted(spark, tmp_path, build, again)
    try:
        assert third.batch(ints(17)) == []  # watermark still 20 s: 17 is late
        assert operator(third, "windowed").late_rows == 1
        assert third.batch(ints(40)) == []
        assert starts(third.batch([])) == [(25, 2)]  # watermark 30 s
    finally:
        third.stop()


def _two_watermarks(stream):
    """One input split by ``side`` into two streams with their own watermarks (10 s and 5 s),
    unioned again and summed per 5 s window."""
    timed = stream.with_column("eventTime", F.timestamp_seconds("value"))
    first = timed.filter("side = 1").with_watermark("eventTime", "10 seconds").select("value", "eventTime")
    second = timed.filter("side = 2").with_watermark("eventTime", "5 seconds").select("value", "eventTime")
    return first.union(second).group_by_key(window("eventTime", "5 seconds")).aggregate(
        agg.sum("value"), name="union_sum")


def _watermark_after(h, first=(), second=()):
    """Each side's rows in a batch, then the watermark of the batch after (Spark's dummy batch)."""
    h.batch([(1, v) for v in first] + [(2, v) for v in second])
    h.batch([])
    return operator(h, "union_sum").watermark_ms


def test_watermark_with_2_streams(spark, tmp_path):
    """EventTimeWatermarkSuite: "watermark with 2 streams": a union of two streams with their
    own watermarks (10 s and 5 s) has one watermark, the lower of the two (Spark's default
    ``multipleWatermarkPolicy`` "min"), and 0 until both have seen data. (Also covers
    "MultipleWatermarkPolicy: min".) The two streams are one input split by ``side``; each
    step reads the watermark of the batch after its data, as Spark's dummy batch does."""
    h = harness(spark, tmp_path, _two_watermarks, schema="side int, value long")
    try:
        def watermark_after(first=(), second=()):
            return _watermark_after(h, first, second)

        assert watermark_after(first=[11]) == 0  # 0 until both sides have data
        assert watermark_after(second=[6]) == 1_000
        assert watermark_after(second=[8]) == 1_000  # stays at the second's 1 s while the first's is 1 s
        assert watermark_after(first=[21]) == 3_000  # now the second's (8 - 5) is the lower
        assert watermark_after(second=[17, 28, 39]) == 11_000  # back to the first's (21 - 10)
    finally:
        h.stop()


def test_watermark_with_2_streams_after_a_restart(spark, tmp_path):
    """batchline's own: a restarted driver resumes each side's newest event time, not only the
    newest of both (from which the second's row at 5 s would be late)."""
    schema = "side int, value long"
    h = harness(spark, tmp_path, _two_watermarks, schema=schema)
    try:
        assert _watermark_after(h, first=[11]) == 0
        assert _watermark_after(h, first=[21], second=[8]) == 3_000
    finally:
        h.stop()
    again = restarted(spark, tmp_path, _two_watermarks, h, schema=schema)
    try:
        again.batch([(2, 5)])
        assert operator(again, "union_sum").late_rows == 0  # watermark 3 s: [5, 10) is open
        again.batch([])
        assert operator(again, "union_sum").watermark_ms == 3_000
        assert _watermark_after(again, second=[30]) == 11_000  # the first's 21 - 10 again
    finally:
        again.stop()


def test_group_by_on_raw_timestamp(spark, tmp_path):
    """EventTimeWatermarkSuite: "group by on raw timestamp" (append mode, grouped by the
    event-time column itself rather than a window).

    batchline differs: append mode needs a window (README, "Output modes"), so grouping by the
    raw event-time column in append mode is refused at definition; not in the README's
    table."""
    ssc = StreamingContext(spark, 1, checkpoint=str(tmp_path / "checkpoint"))
    stream = event_time(ssc.queue_stream([], schema=INTS))
    with pytest.raises(ConfigurationError, match="needs a window and a watermark"):
        stream.group_by_key("eventTime").aggregate(agg.count(), output_mode="append")


def test_delay_threshold_should_not_be_negative(spark, tmp_path):
    """EventTimeWatermarkSuite: "delay threshold should not be negative."."""
    ssc = StreamingContext(spark, 1, checkpoint=str(tmp_path / "checkpoint"))
    stream = ssc.queue_stream([], schema=INTS)
    for delay in ("-1 year", "1 year -13 months", "1 month -40 days", "-10 seconds"):
        with pytest.raises(ConfigurationError):
            stream.with_watermark("value", delay)


def test_overriding_watermark_should_not_be_allowed_by_default(spark, tmp_path):
    """EventTimeWatermarkSuite: "overriding watermark should not be allowed by default": a
    second ``withWatermark`` downstream of a first is refused ("Redefining watermark is
    disallowed")."""
    def build(stream):
        timed = stream.with_column("first", F.timestamp_seconds("_1")).with_column(
            "second", F.timestamp_seconds("_2"))
        return timed.with_watermark("first", "1 minute").select("*").with_watermark("second", "2 minutes") \
            .group_by_key(window("second", "1 minute")).aggregate(agg.count(), name="windowed")

    ssc = StreamingContext(spark, 1, checkpoint=str(tmp_path / "checkpoint"))
    with pytest.raises(ConfigurationError, match="watermark"):
        build(ssc.queue_stream([], schema="_1 long, _2 long"))


def test_no_data_flag(spark, tmp_path):
    """EventTimeWatermarkSuite: "test no-data flag".

    batchline differs: there is no flag; a batch runs every interval, with or without rows,
    so it behaves as Spark with ``noDataMicroBatches.enabled`` true (the window closes in the
    batch after the one that moved the watermark)."""
    h = harness(spark, tmp_path, windowed_count("append"))
    try:
        assert h.batch(ints(10, 11, 12, 13, 14, 15)) == []
        assert h.batch(ints(25)) == []
        assert starts(h.batch([])) == [(10, 5)]
    finally:
        h.stop()


def test_spark_35815_ansi_intervals_for_delay_threshold(spark, tmp_path):
    """EventTimeWatermarkSuite: "SPARK-35815: Support ANSI intervals for delay threshold"
    (each form of a delay gives the same milliseconds, a month of 31 days; malformed ones are
    refused)."""
    day, hour, minute, second = 86_400_000, 3_600_000, 60_000, 1000
    valid = [
        (["3 days", "Interval 3 day", "inTerval '3' day"], 3 * day),
        ([" 5 hours", "INTERVAL 5 hour", "interval '5' hour"], 5 * hour),
        (["\t8 minutes", "interval 8 minute", "interval '8' minute"], 8 * minute),
        (["10 seconds", "interval 10 second", "interval '10' second"], 10 * second),
        (["1 years", "interval 1 year", "interval '1' year"], 12 * 31 * day),
        (["1 months", "interval 1 month", "interval '1' month"], 31 * day),
        (["1 day 2 hours 3 minutes 4 seconds", " interval 1 day 2 hours 3 minutes 4 seconds",
          "\tinterval '1' day '2' hours '3' minutes '4' seconds", "interval '1 2:3:4' day to second"],
         day + 2 * hour + 3 * minute + 4 * second),
        ([" 1 year 2 months", "interval 1 year 2 month", "interval '1' year '2' month",
          "\tinterval '1-2' year to month"], (12 * 31 + 2 * 31) * day),
    ]
    invalid = ["1 foo", "interva 2 day", "intrval '3' day", "interval 4 foo", "interval '5' foo",
               "interval '1 2:3:4' day to hour", "interval '1 2' year to month"]
    ssc = StreamingContext(spark, 1, checkpoint=str(tmp_path / "checkpoint"))
    stream = ssc.queue_stream([], schema=INTS).with_column("eventTime", F.timestamp_seconds("value"))
    wrong = {}
    for forms, expected in valid:
        for delay in forms:
            try:
                got = stream.with_watermark("eventTime", delay).node.watermark().delay_ms
            except ConfigurationError as refused:
                got = f"refused: {refused}"
            if got != expected:
                wrong[delay] = got
    assert wrong == {}
    for delay in invalid:
        with pytest.raises(ConfigurationError):
            stream.with_watermark("eventTime", delay)
