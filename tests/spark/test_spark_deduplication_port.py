"""Spark's own streaming-deduplication tests, ported to batchline's ``drop_duplicates`` and
``drop_duplicates_within_watermark`` one batch at a time.

Sources: ``StreamingDeduplicationSuite`` and ``StreamingDeduplicationWithinWatermarkSuite``
(sql/core/src/test/scala/org/apache/spark/sql/streaming/). Each test's docstring names the
Spark suite and test. The mapping of ``testStream`` onto ``BatchHarness`` is in
tests/spark/test_spark_aggregation_port.py: a ``harness.batch([])`` after a batch that moved
the watermark is Spark's no-data batch.

Spark's ``assertNumStateRows(total, updated, droppedByWatermark, removed)`` sums the updated,
dropped and removed rows of the batches since the last check (a batch and its no-data batch)
and takes the total from the last: ``since(...)`` does the same with batchline's
``updated``, ``late_rows``, ``removed`` and ``state_keys``.
"""

import pytest
from pyspark.sql import functions as F

from batchline import StreamingContext, window
from batchline import aggregates as agg
from batchline.errors import ConfigurationError
from batchline.testing import BatchHarness
from tests.spark.test_spark_aggregation_port import INTS, event_time, ints, pairs, restarted, secs, starts

PAIRS = "_1 string, _2 long"


def harness(spark, tmp_path, build, schema=INTS):
    return BatchHarness(spark, build, schema, checkpoint=str(tmp_path / "checkpoint")).start()


class Metrics:
    """Spark's ``assertNumStateRows``: per operator, over the batches since the last check."""

    def __init__(self, h):
        self.h = h
        self.checked = 0

    def since(self, name):
        completed = self.h.recorder.completed
        batches = [info.state_operators[name] for info in completed[self.checked:]]
        return {"total": batches[-1].state_keys, "updated": sum(b.updated for b in batches),
                "dropped": sum(b.late_rows for b in batches), "removed": sum(b.removed for b in batches)}

    def check(self, **expected):
        """``expected``: per operator name, a dict of the metrics to compare."""
        got = {name: {k: self.since(name)[k] for k in want} for name, want in expected.items()}
        self.checked = len(self.h.recorder.completed)
        assert got == expected


def values(rows, column="value"):
    return sorted(r[column] for r in rows)


def all_columns(stream):
    """Spark's ``dropDuplicates()`` over ``value`` and ``eventTime``, after a 10 s watermark."""
    return event_time(stream).drop_duplicates("value", "eventTime", name="dedupe")


# --- StreamingDeduplicationSuite -----------------------------------------------------------


def test_deduplicate_with_all_columns(spark, tmp_path):
    """StreamingDeduplicationSuite: "deduplicate with all columns".

    batchline differs: ``drop_duplicates()`` without columns is refused at definition (Spark's
    means all columns); the columns are named. Not in the README's table (see the report)."""
    ssc = StreamingContext(spark, 1, checkpoint=str(tmp_path / "refused"))
    with pytest.raises(ConfigurationError, match="needs the columns"):
        ssc.queue_stream([], schema=INTS).drop_duplicates()

    h = harness(spark, tmp_path, lambda s: s.drop_duplicates("value", name="dedupe"), schema="value string")
    metrics = Metrics(h)
    try:
        assert values(h.batch([("a",)])) == ["a"]
        metrics.check(dedupe={"total": 1, "updated": 1})
        assert h.batch([("a",)]) == []
        metrics.check(dedupe={"total": 1, "updated": 0})
        assert values(h.batch([("b",)])) == ["b"]
        metrics.check(dedupe={"total": 2, "updated": 1})
    finally:
        h.stop()


def test_deduplicate_with_some_columns(spark, tmp_path):
    """StreamingDeduplicationSuite: "deduplicate with some columns"."""
    h = harness(spark, tmp_path, lambda s: s.drop_duplicates("_1", name="dedupe"), schema=PAIRS)
    metrics = Metrics(h)
    try:
        assert pairs(h.batch([("a", 1)]), "_1", "_2") == [("a", 1)]
        metrics.check(dedupe={"total": 1, "updated": 1, "dropped": 0})
        assert h.batch([("a", 2)]) == []
        metrics.check(dedupe={"total": 1, "updated": 0, "dropped": 0})
        assert pairs(h.batch([("b", 1)]), "_1", "_2") == [("b", 1)]
        metrics.check(dedupe={"total": 2, "updated": 1, "dropped": 0})
    finally:
        h.stop()


def test_multiple_deduplicates(spark, tmp_path):
    """StreamingDeduplicationSuite: "multiple deduplicates" (``dropDuplicates()`` then
    ``dropDuplicates("_1")``)."""
    h = harness(spark, tmp_path, lambda s: s.drop_duplicates("_1", "_2", name="all").drop_duplicates(
        "_1", name="first"), schema=PAIRS)
    metrics = Metrics(h)
    try:
        assert pairs(h.batch([("a", 1)]), "_1", "_2") == [("a", 1)]
        metrics.check(all={"total": 1, "updated": 1}, first={"total": 1, "updated": 1})
        assert h.batch([("a", 2)]) == []  # dropped by the second
        metrics.check(all={"total": 2, "updated": 1}, first={"total": 1, "updated": 0})
        assert pairs(h.batch([("b", 1)]), "_1", "_2") == [("b", 1)]
        metrics.check(all={"total": 3, "updated": 1}, first={"total": 2, "updated": 1})
    finally:
        h.stop()


def test_spark_35896_metrics_in_state_operator_progress(spark, tmp_path):
    """StreamingDeduplicationSuite: "SPARK-35896: metrics in StateOperatorProgress are output
    correctly" (total, updated, dropped by watermark, removed; Spark's last check, of the
    operator's name and state store instances, has no batchline equivalent)."""
    h = harness(spark, tmp_path, all_columns)
    metrics = Metrics(h)
    try:
        assert values(h.batch(ints(*[v for _ in range(5) for v in range(10, 16)]))) == list(range(10, 16))
        metrics.check(dedupe={"total": 6, "updated": 6, "dropped": 0, "removed": 0})
        assert values(h.batch(ints(25))) == [25]  # advances the watermark to 15 s
        assert h.batch([]) == []  # the no-data batch drops the keys at or before 15 s
        metrics.check(dedupe={"total": 1, "updated": 1, "dropped": 0, "removed": 6})
        assert h.batch(ints(10)) == []  # behind the watermark
        metrics.check(dedupe={"total": 1, "updated": 0, "dropped": 1, "removed": 0})
    finally:
        h.stop()


def test_deduplicate_with_watermark(spark, tmp_path):
    """StreamingDeduplicationSuite: "deduplicate with watermark"."""
    h = harness(spark, tmp_path, all_columns)
    metrics = Metrics(h)
    try:
        assert values(h.batch(ints(*[v for _ in range(5) for v in range(10, 16)]))) == list(range(10, 16))
        metrics.check(dedupe={"total": 6, "updated": 6})
        assert values(h.batch(ints(25))) == [25]
        assert h.batch([]) == []
        metrics.check(dedupe={"total": 1, "updated": 1})
        assert h.batch(ints(10)) == []
        metrics.check(dedupe={"total": 1, "updated": 0, "dropped": 1})
        assert values(h.batch(ints(45))) == [45]  # advances the watermark to 35 s
        assert h.batch([]) == []  # drops 25
        metrics.check(dedupe={"total": 1, "updated": 1})
    finally:
        h.stop()


def test_deduplicate_with_aggregate_append_mode(spark, tmp_path):
    """StreamingDeduplicationSuite: "deduplicate with aggregate - append mode"."""
    def build(stream):
        return all_columns(stream).group_by_key(window("eventTime", "5 seconds")).aggregate(
            agg.count(), output_mode="append", name="windowed")

    h = harness(spark, tmp_path, build)
    metrics = Metrics(h)
    try:
        assert h.batch(ints(*[v for _ in range(5) for v in range(10, 16)])) == []
        # windows [10, 15) and [15, 20); keys 10 to 15
        metrics.check(windowed={"total": 2, "updated": 2}, dedupe={"total": 6, "updated": 6})
        assert h.batch(ints(25)) == []  # advances the watermark to 15 s
        assert starts(h.batch([])) == [(10, 5)]  # 5 rows (10 to 14) after deduplication
        metrics.check(windowed={"total": 2, "updated": 1}, dedupe={"total": 1, "updated": 1})
        assert h.batch(ints(10)) == []  # behind the watermark
        metrics.check(windowed={"total": 2, "updated": 0, "dropped": 0},
                      dedupe={"total": 1, "updated": 0, "dropped": 1})
        assert h.batch(ints(40)) == []  # advances the watermark to 30 s
        assert starts(h.batch([])) == [(15, 1), (25, 1)]
        metrics.check(windowed={"total": 1, "updated": 1}, dedupe={"total": 1, "updated": 1})
    finally:
        h.stop()


def test_deduplicate_with_aggregate_append_mode_a_dropped_duplicate_moves_the_watermark(spark, tmp_path):
    """StreamingDeduplicationSuite: "deduplicate with aggregate - append mode", a variant (not a
    Spark test of its own): Spark's watermark is global, from every row its withWatermark sees,
    so a duplicate carrying the newest event time moves it for the aggregation downstream too.
    (Spark pushes a filter that does not read the event time below withWatermark, so a filter
    before an aggregation does not show this difference; a deduplication does.)"""
    def build(stream):
        timed = stream.with_column("eventTime", F.timestamp_seconds("_2")).with_watermark("eventTime", "10 seconds")
        return timed.drop_duplicates_within_watermark("_1", name="dedupe").group_by_key(
            window("eventTime", "5 seconds")).aggregate(agg.count(), output_mode="append", name="windowed")

    h = harness(spark, tmp_path, build, schema=PAIRS)
    try:
        assert h.batch([("a", 10)]) == []
        assert h.batch([("a", 40)]) == []  # a duplicate of "a" (kept until 20 s): dropped; watermark 30 s next
        assert starts(h.batch([])) == [(10, 1)]
    finally:
        h.stop()


def test_deduplicate_with_aggregate_update_mode(spark, tmp_path):
    """StreamingDeduplicationSuite: "deduplicate with aggregate - update mode"."""
    def build(stream):
        return stream.select(F.col("_1").alias("str"), F.col("_2").alias("num")).drop_duplicates(
            "str", "num", name="dedupe").group_by_key("str").aggregate(agg.sum("num"), name="sums")

    h = harness(spark, tmp_path, build, schema=PAIRS)
    metrics = Metrics(h)
    try:
        assert pairs(h.batch([("a", 1)]), "str", "sum_num") == [("a", 1)]
        metrics.check(sums={"total": 1, "updated": 1}, dedupe={"total": 1, "updated": 1})
        assert h.batch([("a", 1)]) == []  # dropped
        metrics.check(sums={"total": 1, "updated": 0}, dedupe={"total": 1, "updated": 0})
        assert pairs(h.batch([("a", 2)]), "str", "sum_num") == [("a", 3)]
        metrics.check(sums={"total": 1, "updated": 1}, dedupe={"total": 2, "updated": 1})
        assert pairs(h.batch([("b", 1)]), "str", "sum_num") == [("b", 1)]
        metrics.check(sums={"total": 2, "updated": 1}, dedupe={"total": 3, "updated": 1})
    finally:
        h.stop()


def test_deduplicate_with_file_sink(spark, tmp_path):
    """StreamingDeduplicationSuite: "deduplicate with file sink"."""
    output = str(tmp_path / "output")

    def build(stream):
        deduplicated = stream.drop_duplicates("value", name="dedupe")
        deduplicated.write_files(output, format="parquet", name="files")
        return deduplicated

    h = harness(spark, tmp_path, build, schema="value string")
    try:
        def written():
            return sorted(r["value"] for r in spark.read.parquet(output).collect())

        h.batch([("a",)])
        assert written() == ["a"]
        h.batch([("a",)])  # dropped
        assert written() == ["a"]
        h.batch([("b",)])
        assert written() == ["a", "b"]
    finally:
        h.stop()


def test_spark_19841_watermark_predicate_should_filter_based_on_keys(spark, tmp_path):
    """StreamingDeduplicationSuite: "SPARK-19841: watermarkPredicate should filter based on
    keys" (keys ``id, time``, the columns in another order than the input's)."""
    def build(stream):
        timed = stream.with_column("time", F.timestamp_seconds("time")).with_watermark("time", "1 second")
        return timed.drop_duplicates("id", "time", name="dedupe")

    h = harness(spark, tmp_path, build, schema="time long, id long")
    try:
        assert values(h.batch([(1, 1), (1, 1), (1, 2)]), "id") == [1, 2]
        assert values(h.batch([(1, 1), (2, 3), (2, 4)]), "id") == [3, 4]
        assert values(h.batch([(1, 0), (1, 1), (3, 5), (3, 6)]), "id") == [5, 6]  # time 1 is late
        assert values(h.batch([(1, 0), (4, 7)]), "id") == [7]
    finally:
        h.stop()


def test_spark_21546_drop_duplicates_should_ignore_watermark_when_its_not_a_key(spark, tmp_path):
    """StreamingDeduplicationSuite: "SPARK-21546: dropDuplicates should ignore watermark when
    it's not a key" (the first row of id 1, (1, 1), is also its earliest, so both engines
    pass it)."""
    def build(stream):
        timed = stream.with_column("time", F.timestamp_seconds("time")).with_watermark("time", "1 second")
        return timed.drop_duplicates("id", name="dedupe")

    h = harness(spark, tmp_path, build, schema="id long, time long")
    try:
        out = h.batch([(1, 1), (1, 2), (2, 2)])
        assert sorted((r["id"], secs(r["time"])) for r in out) == [(1, 1), (2, 2)]
    finally:
        h.stop()


def test_no_data_flag(spark, tmp_path):
    """StreamingDeduplicationSuite: "test no-data flag".

    batchline differs: there is no flag; a batch runs every interval, with or without rows,
    so it behaves as Spark with ``noDataMicroBatches.enabled`` true: the keys at or before
    the new watermark go in the batch after the one that moved it."""
    h = harness(spark, tmp_path, all_columns)
    metrics = Metrics(h)
    try:
        assert values(h.batch(ints(10, 11, 12, 13, 14, 15))) == [10, 11, 12, 13, 14, 15]
        metrics.check(dedupe={"total": 6, "updated": 6})
        assert values(h.batch(ints(25))) == [25]
        assert h.batch([]) == []
        metrics.check(dedupe={"total": 1, "updated": 1})
    finally:
        h.stop()


def _union_with_dedup(stream):
    """Spark's ``input1.select(value) union input2.dropDuplicates("value")``: one input, its
    rows split by ``side``."""
    return stream.filter("side = 1").select("value").union(
        stream.filter("side = 2").select("value").drop_duplicates("value", name="dedupe"))


def test_spark_29438_union_does_not_shift_the_deduplications_partitions(spark, tmp_path):
    """StreamingDeduplicationSuite: "SPARK-29438: ensure UNION doesn't lead streaming
    deduplication to use shifted partition IDs" (restarted with the other side of the union
    split into more partitions: the deduplication still finds its keys)."""
    schema = "side int, value long"
    h = harness(spark, tmp_path, _union_with_dedup, schema=schema)
    try:
        assert values(h.batch([(1, 11), (1, 12), (2, 21), (2, 22)])) == [11, 12, 21, 22]
    finally:
        h.stop()
    again = restarted(spark, tmp_path, lambda s: _union_with_dedup(s.transform(lambda df: df.repartition(3))), h,
                      schema=schema)
    try:
        assert values(again.batch([(1, 13), (1, 14), (2, 22), (2, 23)])) == [13, 14, 23]
    finally:
        again.stop()


def test_spark_35880_dropped_duplicate_rows(spark, tmp_path):
    """StreamingDeduplicationSuite: "SPARK-35880: custom metric numDroppedDuplicateRows in state
    operator progress": batchline has no such metric, but its input, late and output rows
    give it (input - late - output)."""
    def dropped(h):
        progress = h.info().state_operators["dedupe"]
        return progress.input_rows - progress.late_rows - progress.output_rows

    h = harness(spark, tmp_path, lambda s: s.drop_duplicates("_1", name="dedupe"), schema=PAIRS)
    try:
        assert pairs(h.batch([("a", 1)]), "_1", "_2") == [("a", 1)]
        assert dropped(h) == 0
        assert pairs(h.batch([("a", 2), ("b", 3)]), "_1", "_2") == [("b", 3)]
        assert dropped(h) == 1
        assert pairs(h.batch([("a", 5), ("b", 2), ("c", 9)]), "_1", "_2") == [("c", 9)]
        assert dropped(h) == 2
    finally:
        h.stop()

    w = harness(spark, tmp_path / "watermarked", all_columns)
    try:
        assert values(w.batch(ints(*[v for _ in range(5) for v in range(10, 16)]))) == list(range(10, 16))
        assert dropped(w) == 24
        assert w.batch(ints(14)) == []
        assert dropped(w) == 1
        assert values(w.batch(ints(25))) == [25]
        assert dropped(w) == 0
        assert w.batch([]) == []
        assert w.batch(ints(10)) == []  # late, not a duplicate
        assert dropped(w) == 0
        assert values(w.batch(ints(26, 26))) == [26]
        assert dropped(w) == 1
    finally:
        w.stop()


def test_spark_39650_duplicate_with_specific_keys_should_allow_input_to_change_schema(spark, tmp_path):
    """StreamingDeduplicationSuite: "SPARK-39650: duplicate with specific keys should allow
    input to change schema" (restarted with a third column: the keys of ``_1`` stay)."""
    def build(stream):
        return stream.drop_duplicates("_1", name="dedupe")

    _keys_stay_when_the_input_gains_a_column(spark, tmp_path, build)


# --- StreamingDeduplicationWithinWatermarkSuite --------------------------------------------


def test_within_watermark_deduplicate_without_event_time_column_should_result_in_error(spark, tmp_path):
    """StreamingDeduplicationWithinWatermarkSuite: "deduplicate without event time column
    should result in error" (the first two cases; the third, a join whose other side has the
    watermark, has no batchline equivalent)."""
    ssc = StreamingContext(spark, 1, checkpoint=str(tmp_path / "checkpoint"))
    stream = ssc.queue_stream([], schema="value string")
    with pytest.raises(ConfigurationError, match="needs a watermark"):
        stream.drop_duplicates_within_watermark("value")
    with pytest.raises(ConfigurationError, match="needs a watermark"):
        stream.with_column("newcol", F.col("value")).drop_duplicates_within_watermark("newcol")


def test_within_watermark_deduplicate_with_all_columns_with_event_time_column(spark, tmp_path):
    """StreamingDeduplicationWithinWatermarkSuite: "deduplicate with all columns with event
    time column in DataFrame" (the columns named: ``value`` and ``eventTime``)."""
    h = harness(spark, tmp_path, lambda s: event_time(s).drop_duplicates_within_watermark(
        "value", "eventTime", name="dedupe"))
    metrics = Metrics(h)
    try:
        # watermark 5 s next: no key expires (each at its event time + 10 s)
        assert values(h.batch(ints(*[v for _ in range(5) for v in range(10, 16)]))) == list(range(10, 16))
        metrics.check(dedupe={"total": 6, "updated": 6})
        assert values(h.batch(ints(*range(13, 18)))) == [16, 17]  # 13 to 15 are duplicates; watermark 7 s next
        metrics.check(dedupe={"total": 8, "updated": 2})
        assert h.batch(ints(5)) == []  # behind the watermark
        metrics.check(dedupe={"total": 8, "updated": 0, "dropped": 1})
        assert values(h.batch(ints(35))) == [35]  # watermark 25 s next
        assert h.batch([]) == []  # drops the keys expiring at or before 25 s
        metrics.check(dedupe={"total": 3, "updated": 1})
        assert values(h.batch(ints(55))) == [55]  # watermark 45 s next
        assert h.batch([]) == []
        metrics.check(dedupe={"total": 1, "updated": 1})
    finally:
        h.stop()


def test_within_watermark_subset_of_columns_without_the_event_time_column(spark, tmp_path):
    """StreamingDeduplicationWithinWatermarkSuite: "deduplicate with subset of columns which
    event time column is not in subset"."""
    def build(stream):
        timed = stream.with_column("eventTime", F.timestamp_seconds("_2")).with_watermark("eventTime", "2 seconds")
        return timed.drop_duplicates_within_watermark("_1", name="dedupe")

    h = harness(spark, tmp_path, build, schema=PAIRS)
    metrics = Metrics(h)
    try:
        assert pairs(h.batch([("a", 17)]), "_1", "_2") == [("a", 17)]  # expires at 19; watermark 15 next
        assert h.batch([]) == []
        metrics.check(dedupe={"total": 1, "updated": 1})
        assert h.batch([("a", 16)]) == []
        metrics.check(dedupe={"total": 1, "updated": 0})
        assert h.batch([("a", 13)]) == []  # behind the watermark
        metrics.check(dedupe={"total": 1, "updated": 0, "dropped": 1})
        assert pairs(h.batch([("b", 22), ("c", 21)]), "_1", "_2") == [("b", 22), ("c", 21)]  # watermark 20 next
        assert h.batch([]) == []  # drops a (19)
        metrics.check(dedupe={"total": 2, "updated": 2})
        assert pairs(h.batch([("a", 21)]), "_1", "_2") == [("a", 21)]  # a new event again; expires at 23
        metrics.check(dedupe={"total": 3, "updated": 1})
        assert pairs(h.batch([("d", 25)]), "_1", "_2") == [("d", 25)]  # watermark 23 next
        assert h.batch([]) == []  # drops a (23) and c (23)
        metrics.check(dedupe={"total": 2, "updated": 1})
    finally:
        h.stop()


def test_within_watermark_spark_39650_input_may_change_schema(spark, tmp_path):
    """StreamingDeduplicationWithinWatermarkSuite: "SPARK-39650: duplicate with specific keys
    should allow input to change schema"."""
    def build(stream):
        timed = stream.with_column("eventTime", F.timestamp_seconds("_2")).with_watermark("eventTime", "10 seconds")
        return timed.drop_duplicates_within_watermark("_1", name="dedupe")

    _keys_stay_when_the_input_gains_a_column(spark, tmp_path, build)


def _keys_stay_when_the_input_gains_a_column(spark, tmp_path, build):
    """Keys of ``_1`` seen before a restart with a third input column still drop their duplicates."""
    h = harness(spark, tmp_path, build, schema=PAIRS)
    try:
        assert pairs(h.batch([("a", 1)]), "_1", "_2") == [("a", 1)]
        assert pairs(h.batch([("a", 2), ("b", 3)]), "_1", "_2") == [("b", 3)]
    finally:
        h.stop()
    again = restarted(spark, tmp_path, build, h, schema="_1 string, _2 long, _3 string")
    try:
        assert pairs(again.batch([("a", 5, "a"), ("b", 2, "b"), ("c", 9, "c")]), "_1", "_2", "_3") == [("c", 9, "c")]
    finally:
        again.stop()
