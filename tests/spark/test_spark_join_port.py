"""Spark's own stream-stream join tests, ported to batchline's ``Stream.join`` one batch at a time.

Source: ``StreamingJoinSuite.scala`` (sql/core/src/test/scala/org/apache/spark/sql/streaming/):
``StreamingInnerJoinSuite``, ``StreamingOuterJoinSuite``, ``StreamingFullOuterJoinSuite`` and
``StreamingLeftSemiJoinSuite``. Each test's docstring names the Spark suite and test. The
mapping of ``testStream`` onto ``BatchHarness`` is in tests/spark/test_spark_aggregation_port.py;
here ``harness.batch(left_rows, right_rows)`` is one batch of both streams (Spark's
``MultiAddData``), a ``harness.batch()`` after a batch that moved the watermark is Spark's
no-data batch (``CheckNewAnswer`` includes its rows), and ``StopStream`` / ``StartStream`` is a
second harness on the same checkpoint (``restarted``; where Spark restarts several times in one
test, the port restarts once).

How the joins are written:

- Spark's ``expr("leftKey = rightKey AND leftTime BETWEEN rightTime - a AND rightTime + b")`` is
  ``join(right, [("leftKey", "rightKey")], within=("leftTime", "rightTime", -b, a))``: the
  right time lies in ``[leftTime - b, leftTime + a]``. A strict inequality on whole seconds is
  the bound plus one millisecond (batchline's bounds are inclusive); a missing bound is 3650
  days.
- Spark's windowed joins (``join(..., Seq("key", "window"))`` after ``window(time, "10 second")``)
  rely on the watermark reaching the window, a join key ("case 1" of Spark's state eviction),
  which batchline does not have: state goes only via ``within=``. The ports write window
  equality as a zero-width range on the windows' ends, ``within=("leftEnd", "rightEnd", "0
  seconds", "0 seconds")`` with the watermark on the window's end (same 10 s delay). The
  watermark then follows the newest window end rather than the newest event time (20 s where
  Spark's is 11 s after rows at 21 s and 22 s), so it reaches the same windows in these tests and
  the outputs are Spark's; where the numbers differ, the test says so.
- Spark's ``assertNumStateRows(total, updated)`` counts buffered rows; batchline's
  ``state_operators["join"]`` counts keys (``state_keys``, ``updated``, ``removed``). The ports
  check the rows each side buffers with ``read_state`` (``state_rows``: (key, time) per side,
  their number is Spark's total) and ``droppedByWatermark`` with ``late_rows`` (rows, as
  Spark's). Spark's ``updated`` (rows added) has no batchline counterpart and is not checked;
  where the state rows are checked, the rows added can be read off them.
- Output columns: Spark's ``select(..., $"leftTime".cast("int"))`` is ``unix_seconds``; keys
  named alike on both sides appear once (a right-only row of a full outer join shows its key, as
  Spark's coalesced ``USING`` key).

Not ported (with the reason):

- StreamingInnerJoinSuite "locality preferences of StateStoreAwareZippedRDD": Spark's RDD
  internals, no batchline counterpart.
- StreamingInnerJoinSuite and StreamingOuterJoinSuite "SPARK-26187 restore the stream-stream
  inner/outer join query from Spark 2.4": restore Spark 2.4 checkpoint files, which batchline
  cannot read.
- StreamingOuterJoinSuite "left outer early state exclusion on left/right", "right outer early
  state exclusion on left/right", "left outer join with non-key condition violated",
  StreamingFullOuterJoinSuite "full outer early state exclusion on left/right" and
  StreamingLeftSemiJoinSuite "left semi early state exclusion on left/right": their conditions
  hold a predicate on one side's values (``leftValue > 4``, ``rightValue < 300 OR rightValue >
  1000``) besides key equality and the time range; batchline's join has no other conditions,
  and filtering before the join is not the same for an outer join (the row must still come
  out with nulls).
"""

import datetime as dt

import pytest
from pyspark.sql import functions as F

from batchline import StreamingContext
from batchline.errors import ConfigurationError
from batchline.state import read_state
from batchline.testing import BatchHarness
from tests.spark.test_spark_aggregation_port import ints, restarted
from tests.spark.test_spark_deduplication_port import Metrics

INTS = ["value long", "value long"]
"""Two ``MemoryStream[Int]``."""
PAIRS = ["_1 long, _2 long", "_1 long, _2 long"]
"""Two ``MemoryStream[(Int, Int)]``."""
EVENTS = "eventTime timestamp, id string, comment string"
"""``MemoryStream[(Timestamp, String, String)]`` after ``selectExpr("_1 as eventTime", ...)``."""
TIME = "__batchline_time_ms"
"""A buffered row's time in the join's state (join.py)."""
FOREVER = "3650 days"
"""The bound of a range Spark leaves open."""


def harness(spark, tmp_path, build, schema=INTS, checkpoint="checkpoint"):
    return BatchHarness(spark, build, schema, checkpoint=str(tmp_path / checkpoint)).start()


def _order(row):
    """Sorts rows holding ``None``: a null after every value."""
    return tuple((v is None, 0 if v is None else v) for v in row)


def answer(out, *columns):
    """A batch's rows as tuples of ``columns``, sorted (``None`` last)."""
    return sorted((tuple(r[c] for c in columns) for r in out), key=_order)


def expected(*rows):
    return sorted(rows, key=_order)


def state_rows(spark, tmp_path, name="join", checkpoint="checkpoint"):
    """The rows join ``name`` buffers per side, as (first key, time in seconds): Spark's
    ``numRowsTotal`` is their number (batchline's ``state_keys`` counts keys)."""
    found = {"left": [], "right": []}
    for row in read_state(spark, str(tmp_path / checkpoint), name).collect():
        for side, rows in found.items():
            rows.extend((row[0], stored[TIME] // 1000) for stored in row[side] or ())
    return {side: sorted(rows) for side, rows in found.items()}


def late(h, batches=1, name="join"):
    """Spark's ``numRowsDroppedByWatermark`` over the last ``batches`` batches."""
    return sum(info.state_operators[name].late_rows for info in h.recorder.completed[-batches:])


def seconds(column):
    """Spark's ``$"column".cast("int")`` of a timestamp."""
    return F.unix_seconds(F.col(column)).alias(column)


def window_end(column):
    """The end of ``window(timestamp_seconds(column), "10 second")``."""
    return F.window(F.timestamp_seconds(column), "10 seconds")["end"]


def setup_stream(stream, prefix, multiplier):
    """Spark's ``setupStream(prefix, multiplier)``: key, ``<prefix>Time`` (10 s watermark),
    ``<prefix>Value``."""
    return stream.select(F.col("value").alias("key"), F.timestamp_seconds("value").alias(f"{prefix}Time"),
                         (F.col("value") * multiplier).alias(f"{prefix}Value")) \
        .with_watermark(f"{prefix}Time", "10 seconds")


def windowed_side(stream, prefix, multiplier, watermark=True):
    """``setupStream`` then ``select(key, window(<prefix>Time, "10 second"), <prefix>Value)``,
    the window as its end ``<prefix>End``, the watermark on it (see the module docstring)."""
    side = stream.select(F.col("value").alias("key"), window_end("value").alias(f"{prefix}End"),
                         (F.col("value") * multiplier).alias(f"{prefix}Value"))
    return side.with_watermark(f"{prefix}End", "10 seconds") if watermark else side


WINDOWS = ("leftEnd", "rightEnd", "0 seconds", "0 seconds")
"""Window equality as a range: the right window's end equals the left's."""


def windowed_join(how, right_watermark=True):
    """Spark's ``setupWindowedJoin(joinType)``: (key, window end in seconds, leftValue,
    rightValue), or (key, end, leftValue) for the semi join."""
    def build(a, b):
        joined = windowed_side(a, "left", 2).join(windowed_side(b, "right", 3, right_watermark), "key", how=how,
                                                  within=WINDOWS)
        end = F.unix_seconds(F.coalesce("leftEnd", "rightEnd") if how != "left_semi" else F.col("leftEnd"))
        values = ("leftValue",) if how == "left_semi" else ("leftValue", "rightValue")
        return joined.select("key", end.alias("end"), *values)
    return build


WINDOWED = ("key", "end", "leftValue", "rightValue")


def range_join(how, watermark="10 seconds", bound="5 seconds"):
    """Spark's ``setupJoinWithRangeCondition(joinType, watermark, bound, bound)``: ``leftTime
    BETWEEN rightTime - bound AND rightTime + bound``; (leftKey, rightKey, leftTime, rightTime),
    or (leftKey, leftTime) for the semi join."""
    def build(a, b):
        left = a.select(F.col("_1").alias("leftKey"), F.timestamp_seconds("_2").alias("leftTime"),
                        (F.col("_1") * 2).alias("leftValue")).with_watermark("leftTime", watermark)
        right = b.select(F.col("_1").alias("rightKey"), F.timestamp_seconds("_2").alias("rightTime"),
                         (F.col("_1") * 3).alias("rightValue")).with_watermark("rightTime", watermark)
        joined = left.join(right, [("leftKey", "rightKey")], how=how,
                           within=("leftTime", "rightTime", f"-{bound}", bound))
        if how == "left_semi":
            return joined.select("leftKey", seconds("leftTime"))
        return joined.select("leftKey", "rightKey", seconds("leftTime"), seconds("rightTime"))
    return build


RANGE = ("leftKey", "rightKey", "leftTime", "rightTime")


def self_join(how):
    """Spark's ``setupSelfJoin(joinType)``: one input of (value, time); the right side only its
    even values; ``rightTime BETWEEN leftTime AND leftTime + 5 seconds``, 5 s watermarks."""
    def build(stream):
        df = stream.select(F.col("_1").alias("value"), F.timestamp_seconds("_2").alias("timestamp"))
        left = df.select(F.col("value").alias("leftId"), F.col("timestamp").alias("leftTime"))
        right = df.where(F.col("value") % 2 == 0).select(F.col("value").alias("rightId"),
                                                          F.col("timestamp").alias("rightTime"))
        joined = left.with_watermark("leftTime", "5 seconds").join(
            right.with_watermark("rightTime", "5 seconds"), [("leftId", "rightId")], how=how,
            within=("leftTime", "rightTime", "0 seconds", "5 seconds"))
        if how == "left_semi":
            return joined.select("leftId", seconds("leftTime"))
        return joined.select("leftId", seconds("leftTime"), "rightId", seconds("rightTime"))
    return build


SELF = ("leftId", "leftTime", "rightId", "rightTime")


def timed(*values):
    """Rows of ``MemoryStream[(Int, Long)]`` whose time is the value: (v, v)."""
    return [(v, v) for v in values]


# --- StreamingInnerJoinSuite ---------------------------------------------------------------


def _on_key(a, b):
    left = a.select(F.col("value").alias("key"), (F.col("value") * 2).alias("leftValue"))
    right = b.select(F.col("value").alias("key"), (F.col("value") * 3).alias("rightValue"))
    return left.join(right, "key")


KEYED = ("key", "leftValue", "rightValue")


def test_stream_stream_inner_join_on_non_time_column(spark, tmp_path):
    """StreamingInnerJoinSuite: "stream stream inner join on non-time column" (restarted once
    where Spark restarts twice)."""
    h = harness(spark, tmp_path, _on_key)
    try:
        assert h.batch(ints(1)) == []
        assert answer(h.batch([], ints(1, 10)), *KEYED) == [(1, 2, 3)]  # 1 arrived on the left first
        assert answer(h.batch(ints(10)), *KEYED) == [(10, 20, 30)]  # 10 arrived on the right first
        assert answer(h.batch([], ints(1)), *KEYED) == [(1, 2, 3)]  # another right 1 meets left 1
    finally:
        h.stop()
    again = restarted(spark, tmp_path, _on_key, h, schema=INTS)
    try:
        # the two right 1s are kept in the state across the restart
        assert answer(again.batch(ints(1)), *KEYED) == [(1, 2, 3), (1, 2, 3)]
        assert answer(again.batch(ints(100), ints(100)), *KEYED) == [(100, 200, 300)]
    finally:
        again.stop()


def _windows_without_watermark(a, b):
    def side(stream, prefix, multiplier):
        return stream.select(F.col("value").alias("key"), window_end("value").alias("end"),
                             (F.col("value") * multiplier).alias(f"{prefix}Value"))
    return side(a, "left", 2).join(side(b, "right", 3), ["key", "end"]).select(
        "key", F.unix_seconds("end").alias("end"), "leftValue", "rightValue")


def test_stream_stream_inner_join_on_windows_without_watermark(spark, tmp_path):
    """StreamingInnerJoinSuite: "stream stream inner join on windows - without watermark"
    (the window as its end, a key column; restarted once where Spark restarts three times)."""
    h = harness(spark, tmp_path, _windows_without_watermark)
    try:
        assert h.batch(ints(1)) == []
        assert answer(h.batch([], ints(1)), *WINDOWED) == [(1, 10, 2, 3)]
    finally:
        h.stop()
    again = restarted(spark, tmp_path, _windows_without_watermark, h, schema=INTS)
    try:
        assert again.batch(ints(25)) == []
        assert answer(again.batch([], ints(25)), *WINDOWED) == [(25, 30, 50, 75)]
        assert answer(again.batch(ints(1)), *WINDOWED) == [(1, 10, 2, 3)]  # right 1 still there: no watermark
        assert again.batch(ints(5)) == []
        assert answer(again.batch([], ints(5)), *WINDOWED) == [(5, 10, 10, 15)]  # no filter by any watermark
    finally:
        again.stop()


def test_stream_stream_inner_join_on_windows_with_watermark(spark, tmp_path):
    """StreamingInnerJoinSuite: "stream stream inner join on windows - with watermark" (only the
    left stream has a watermark; without the restart in the middle).

    batchline differs: Spark drops both sides' rows of window [0, 10) once the watermark passes
    it (the window is in the join key: "case 1"). batchline drops a side's rows only via within=
    and the other stream's watermark (join.py; a warning at definition says the left rows stay
    for ever): the right rows go, the left rows stay. So a right 1 arriving after the watermark
    (the right stream has none, so it is not late) still meets left 1, where Spark's output has
    nothing; a left 5 is late in both. State: left 1 and 25 (Spark: 25 only)."""
    h = harness(spark, tmp_path, windowed_join("inner", right_watermark=False))
    try:
        assert h.batch(ints(1)) == []
        assert answer(h.batch([], ints(1)), *WINDOWED) == [(1, 10, 2, 3)]
        assert state_rows(spark, tmp_path) == {"left": [(1, 10)], "right": [(1, 10)]}  # Spark: total 2
        assert h.batch(ints(25)) == []  # the watermark (on window ends) moves to 20 s
        assert h.batch() == []  # the no-data batch drops right 1 (Spark: left 1 too)
        assert state_rows(spark, tmp_path) == {"left": [(1, 10), (25, 30)], "right": []}  # Spark: total 1
        assert answer(h.batch([], ints(25)), *WINDOWED) == [(25, 30, 50, 75)]
        assert answer(h.batch([], ints(1)), *WINDOWED) == [(1, 10, 2, 3)]  # Spark: nothing (left 1 gone)
        assert late(h) == 0
        assert h.batch(ints(5)) == []
        assert late(h) == 1  # as Spark's droppedByWatermark = 1
        assert state_rows(spark, tmp_path) == {"left": [(1, 10), (25, 30)], "right": [(25, 30)]}  # Spark: total 2
    finally:
        h.stop()


def test_stream_stream_inner_join_with_time_range_one_side_condition(spark, tmp_path):
    """StreamingInnerJoinSuite: "stream stream inner join with time range - with watermark - one
    side condition" (``leftTime < rightTime - interval 5 seconds``: the right time at least 5 s
    + 1 ms after the left, no upper bound)."""
    def build(a, b):
        left = a.select(F.col("_1").alias("leftKey"), F.timestamp_seconds("_2").alias("leftTime"),
                        (F.col("_1") * 2).alias("leftValue")).with_watermark("leftTime", "10 seconds")
        right = b.select(F.col("_1").alias("rightKey"), F.timestamp_seconds("_2").alias("rightTime"),
                         (F.col("_1") * 3).alias("rightValue")).with_watermark("rightTime", "10 seconds")
        return left.join(right, [("leftKey", "rightKey")], within=("leftTime", "rightTime", "5001 ms", FOREVER)) \
            .select("leftKey", seconds("leftTime"), seconds("rightTime"))

    columns = ("leftKey", "leftTime", "rightTime")
    h = harness(spark, tmp_path, build, schema=PAIRS)
    try:
        assert h.batch([(1, 5)]) == []
        assert answer(h.batch([], [(1, 11)]), *columns) == [(1, 5, 11)]
        assert h.batch([], [(1, 10)]) == []  # 5 is not < 10 - 5
        assert state_rows(spark, tmp_path) == {"left": [(1, 5)], "right": [(1, 10), (1, 11)]}  # total 3
        assert answer(h.batch([(1, 3), (1, 30)]), *columns) == [(1, 3, 10), (1, 3, 11)]
        assert h.batch([], [(0, 30)]) == []  # the watermark moves to 20 s
        assert h.batch() == []  # right rows at or before 25 s go (no right row to come can meet them)
        assert state_rows(spark, tmp_path) == {"left": [(1, 3), (1, 5), (1, 30)], "right": [(0, 30)]}  # total 4
        # 20 is late; 21 meets 3 and 5 and goes at once (at or before 25); 28 stays
        assert answer(h.batch([], [(1, 20), (1, 21), (1, 28)]), *columns) == [
            (1, 3, 21), (1, 3, 28), (1, 5, 21), (1, 5, 28)]
        assert late(h) == 1
        assert state_rows(spark, tmp_path)["right"] == [(0, 30), (1, 28)]  # total 5
        assert answer(h.batch([(1, 20), (1, 21)]), *columns) == [(1, 21, 28)]  # left 20 is late
        assert late(h) == 1
        assert state_rows(spark, tmp_path)["left"] == [(1, 3), (1, 5), (1, 21), (1, 30)]  # total 6
    finally:
        h.stop()


def test_stream_stream_inner_join_with_time_range_two_side_conditions(spark, tmp_path):
    """StreamingInnerJoinSuite: "stream stream inner join with time range - with watermark - two
    side conditions" (``leftTime BETWEEN rightTime - 10 s AND rightTime + 5 s``; watermarks 20 s
    on the left, 30 s on the right)."""
    def build(a, b):
        left = a.select(F.col("_1").alias("leftKey"), F.timestamp_seconds("_2").alias("leftTime"),
                        (F.col("_1") * 2).alias("leftValue")).with_watermark("leftTime", "20 seconds")
        right = b.select(F.col("_1").alias("rightKey"), F.timestamp_seconds("_2").alias("rightTime"),
                         (F.col("_1") * 3).alias("rightValue")).with_watermark("rightTime", "30 seconds")
        return left.join(right, [("leftKey", "rightKey")], within=("leftTime", "rightTime", "-5 seconds",
                                                                   "10 seconds")) \
            .select("leftKey", seconds("leftTime"), seconds("rightTime"))

    columns = ("leftKey", "leftTime", "rightTime")
    h = harness(spark, tmp_path, build, schema=PAIRS)
    try:
        assert h.batch([(1, 20)]) == []  # meets right times [15, 30]
        assert answer(h.batch([], [(1, t) for t in (14, 15, 25, 26, 30, 31)]), *columns) == [
            (1, 20, 15), (1, 20, 25), (1, 20, 26), (1, 20, 30)]
        assert h.batch([], [(1, 60)]) == []  # meets left times [50, 65]: none yet
        assert answer(h.batch([(1, t) for t in (49, 50, 65, 66)]), *columns) == [(1, 50, 60), (1, 65, 60)]
        # watermark min(66 - 20, 60 - 30) = 30: right rows before 25 go (14, 15), left rows before 20 (none)
        assert h.batch() == []
        assert state_rows(spark, tmp_path) == {  # total 10
            "left": [(1, 20), (1, 49), (1, 50), (1, 65), (1, 66)],
            "right": [(1, 25), (1, 26), (1, 30), (1, 31), (1, 60)]}
        assert answer(h.batch([(1, 30), (1, 31)]), *columns) == [(1, 31, 26), (1, 31, 30), (1, 31, 31)]
        assert late(h) == 1  # left 30
        assert h.batch([], [(1, 80)]) == []
        # watermark min(66 - 20, 80 - 30) = 46: left rows before 36 go, right rows before 41
        assert h.batch() == []
        assert state_rows(spark, tmp_path) == {  # total 6
            "left": [(1, 49), (1, 50), (1, 65), (1, 66)], "right": [(1, 60), (1, 80)]}
        assert answer(h.batch([], [(1, 46), (1, 50)]), *columns) == [(1, 49, 50), (1, 50, 50)]
        assert late(h) == 1  # right 46
        assert len(state_rows(spark, tmp_path)["right"]) == 3  # total 7: right 50 added
    finally:
        h.stop()


def test_stream_stream_inner_join_without_equality_predicate(spark, tmp_path):
    """StreamingInnerJoinSuite: "stream stream inner join without equality predicate": a join
    without key columns is refused at definition (Spark: at start)."""
    ssc = StreamingContext(spark, 1, checkpoint=str(tmp_path / "checkpoint"))
    left = ssc.queue_stream([], schema="value long").select(F.col("value").alias("leftKey"))
    right = ssc.queue_stream([], schema="value long").select(F.col("value").alias("rightKey"))
    with pytest.raises(ConfigurationError, match="join needs on="):
        left.join(right, [])


def test_stream_stream_self_join(spark, tmp_path):
    """StreamingInnerJoinSuite: "stream stream self join" (``value % 5`` as the key, both sides
    of one input; the right's value renamed, as batchline refuses two columns of one name)."""
    def build(stream):
        df = stream.select((F.col("value") % 5).alias("key"), "value")
        return df.join(df.select("key", F.col("value").alias("other")), "key")

    columns = ("key", "value", "other")
    h = harness(spark, tmp_path, build, schema="value long")
    try:
        assert answer(h.batch(ints(1, 2)), *columns) == [(1, 1, 1), (2, 2, 2)]
    finally:
        h.stop()
    again = restarted(spark, tmp_path, build, h, schema="value long")
    try:
        # Spark's CheckAnswer holds every row so far; the new ones:
        assert answer(again.batch(ints(3, 6)), *columns) == expected((3, 3, 3), (1, 1, 6), (1, 6, 1), (1, 6, 6))
    finally:
        again.stop()


def test_join_between_three_streams(spark, tmp_path):
    """StreamingInnerJoinSuite: "join between three streams" (two joins, one after the other)."""
    def build(a, b, c):
        left = a.select(F.col("value").alias("leftKey"), (F.col("value") * 2).alias("leftValue"))
        middle = b.select(F.col("value").alias("middleKey"), (F.col("value") * 3).alias("middleValue"))
        right = c.select(F.col("value").alias("rightKey"), (F.col("value") * 5).alias("rightValue"))
        return left.join(middle, [("leftKey", "middleKey")]).join(right, [("middleKey", "rightKey")], name="join2")

    columns = ("leftKey", "leftValue", "middleKey", "middleValue", "rightKey", "rightValue")
    h = harness(spark, tmp_path, build, schema=["value long"] * 3)
    try:
        assert answer(h.batch(ints(1, 5), ints(1, 5, 10), ints(5, 10)), *columns) == [(5, 10, 5, 15, 5, 25)]
    finally:
        h.stop()


def test_streaming_join_should_require_stateful_op_clustered_distribution_from_children(spark, tmp_path):
    """StreamingInnerJoinSuite: "streaming join should require StatefulOpClusteredDistribution
    from children" (the right side repartitioned by ``b`` first; every row still meets its
    match. Spark's check of the physical plan's shuffles has no batchline counterpart: the join
    always shuffles its union of both sides by the key into its state partitions)."""
    def build(a, b):
        left = a.select(F.col("value").alias("a"), (F.col("value") * 2).alias("b"))
        right = b.select(F.col("value").alias("a"), (F.col("value") * 2).alias("b")) \
            .transform(lambda df: df.repartition("b"), keeps_empty=True)
        return left.join(right, ["a", "b"]).select("a")

    h = harness(spark, tmp_path, build)
    try:
        out = h.batch(ints(*range(1, 1001)), ints(*range(1, 1001)))
        assert sorted(r["a"] for r in out) == list(range(1, 1001))
    finally:
        h.stop()


def _named_self_join(names_in_key=False, names_in_value=False):
    """The query of Spark's SPARK-48687 tests: ``setupSelfJoin``'s inner join over (value, time,
    name), the name in the join key or in both sides' columns, or neither (the stored query)."""
    def build(stream):
        df = stream.select(F.col("_1").alias("value"), F.timestamp_seconds("_2").alias("timestamp"),
                           F.col("_3").alias("name"))
        names = names_in_key or names_in_value
        left = df.select(F.col("value").alias("leftId"), F.col("timestamp").alias("leftTime"),
                         *([F.col("name").alias("leftName")] if names else []))
        right = df.where(F.col("value") % 2 == 0).select(
            F.col("value").alias("rightId"), F.col("timestamp").alias("rightTime"),
            *([F.col("name").alias("rightName")] if names else []))
        on = [("leftId", "rightId"), *([("leftName", "rightName")] if names_in_key else [])]
        return left.with_watermark("leftTime", "5 seconds").join(
            right.with_watermark("rightTime", "5 seconds"), on, within=("leftTime", "rightTime", "0 seconds",
                                                                       "5 seconds")) \
            .select("leftId", seconds("leftTime"), "rightId", seconds("rightTime"))
    return build


NAMED = "_1 long, _2 long, _3 string"


def _failure(error):
    """An error's message with its causes'."""
    messages = []
    while error is not None:
        messages.append(str(error))
        error = error.__cause__ or error.__context__
    return "\n".join(messages)


def _restart_refused(spark, tmp_path, stored, changed, match):
    """Runs ``stored`` for a batch, then restarts on its checkpoint with ``changed``: the
    restarted pipeline fails at its first batch, naming the change."""
    h = harness(spark, tmp_path, stored, schema=NAMED)
    try:
        assert answer(h.batch([(v, v, n) for v, n in zip(range(1, 6), "abcde", strict=True)]), *SELF) == [
            (2, 2, 2, 2), (4, 4, 4, 4)]
    finally:
        h.stop()
    again = BatchHarness(spark, changed, NAMED, checkpoint=str(tmp_path / "checkpoint"),
                         start_ms=h.batch_time + 500)
    try:
        again.start()
        again.inputs[0].push(spark.createDataFrame([(v, v, "a") for v in range(6, 11)], NAMED))
        again.clock.advance(again.interval_ms)
        with pytest.raises(Exception) as raised:  # the message is checked below, with its causes
            again.ssc.await_termination(60)
        assert match in _failure(raised.value)
    finally:
        again.stop()


def test_spark_48687_changing_the_join_condition_key_schema_should_fail_the_query(spark, tmp_path):
    """StreamingInnerJoinSuite: "SPARK-48687 - restore the stream-stream inner join query from
    Spark 3.5 and changing the join condition (key schema) should fail the query" (the stored
    query is run first, by batchline, where Spark restores a checkpoint of Spark 3.5. Its sides
    already carry the name, so that only the key changes when the name joins it: the buffered
    rows hold every column of their side, so a new key column alone would change the state
    first, as in the next test)."""
    _restart_refused(spark, tmp_path, _named_self_join(names_in_value=True), _named_self_join(names_in_key=True),
                     "keys cannot change type")


def test_spark_48687_changing_the_value_schema_should_fail_the_query(spark, tmp_path):
    """StreamingInnerJoinSuite: "SPARK-48687 - restore the stream-stream inner join query from
    Spark 3.5 and changing the value schema should fail the query" (as the previous test, the
    stored query without the name; the name becomes a column of both sides, so of the rows each
    side buffers: the state's ``left`` and ``right`` fields change type)."""
    _restart_refused(spark, tmp_path, _named_self_join(), _named_self_join(names_in_value=True),
                     "but is now defined with state")


def test_spark_35896_metrics_in_state_operator_progress(spark, tmp_path):
    """StreamingInnerJoinSuite: "SPARK-35896: metrics in StateOperatorProgress are output
    correctly" (the windowed join of "inner join on windows - with watermark": only the left
    stream has a watermark).

    batchline differs: its metrics count keys, and it keeps left 1 (see that test): after the
    watermark passes window [0, 10), Spark has total 1 row, updated 1, removed 2; batchline has
    2 keys (1: left 1 still; 25), 2 keys updated (25 added; key 1's right row dropped, so its
    state rewritten) and none removed. Spark's operator name and state store instances have no
    batchline counterpart."""
    h = harness(spark, tmp_path, windowed_join("inner", right_watermark=False))
    metrics = Metrics(h)
    try:
        assert h.batch(ints(1)) == []
        assert answer(h.batch([], ints(1)), *WINDOWED) == [(1, 10, 2, 3)]
        metrics.check(join={"total": 1, "updated": 2, "dropped": 0, "removed": 0})  # Spark: 2 rows, updated 1
        assert h.batch(ints(25)) == []
        assert h.batch() == []
        metrics.check(join={"total": 2, "updated": 2, "dropped": 0, "removed": 0})  # Spark: 1, 1, 0, 2
        assert answer(h.batch([], ints(25)), *WINDOWED) == [(25, 30, 50, 75)]
        metrics.check(join={"total": 2, "updated": 1, "dropped": 0, "removed": 0})  # Spark: 2, 1, 0, 0
    finally:
        h.stop()


def _key_nullability(a, b):
    """Spark's ``testForJoinKeyNullability``: ``leftKey <=> rightKey``, written as key equality
    (batchline has no null-safe equality)."""
    left = a.select(F.col("value").alias("leftKey"), (F.col("value") * 2).alias("leftValue"))
    right = b.select(F.col("value").alias("rightKey"), (F.col("value") * 3).alias("rightValue"))
    return left.join(right, [("leftKey", "rightKey")]).select("leftKey", "rightKey", "leftValue", "rightValue")


NULLABLE = ("leftKey", "rightKey", "leftValue", "rightValue")


def test_joining_non_nullable_left_join_key_with_nullable_right_join_key(spark, tmp_path):
    """StreamingInnerJoinSuite: "joining non-nullable left join key with nullable right join key"
    (batchline's input columns are all nullable; the left's rows hold no null)."""
    h = harness(spark, tmp_path, _key_nullability)
    try:
        assert answer(h.batch(ints(1, 5), ints(1, 5, 10, None)), *NULLABLE) == [(1, 1, 2, 3), (5, 5, 10, 15)]
    finally:
        h.stop()


def test_joining_nullable_left_join_key_with_non_nullable_right_join_key(spark, tmp_path):
    """StreamingInnerJoinSuite: "joining nullable left join key with non-nullable right join key"."""
    h = harness(spark, tmp_path, _key_nullability)
    try:
        assert answer(h.batch(ints(1, 5, 10, None), ints(1, 5)), *NULLABLE) == [(1, 1, 2, 3), (5, 5, 10, 15)]
    finally:
        h.stop()


def test_joining_nullable_left_join_key_with_nullable_right_join_key(spark, tmp_path):
    """StreamingInnerJoinSuite: "joining nullable left join key with nullable right join key".

    batchline differs: Spark's ``<=>`` pairs the null keys, (null, null, null, null); batchline
    joins on equality, where a null key meets nothing (join.py, as SQL's ``=``)."""
    h = harness(spark, tmp_path, _key_nullability)
    try:
        assert answer(h.batch(ints(1, 5, 10, None), ints(1, 5, None)), *NULLABLE) == [
            (1, 1, 2, 3), (5, 5, 10, 15)]  # Spark: also (None, None, None, None)
    finally:
        h.stop()


# --- StreamingOuterJoinSuite ---------------------------------------------------------------


def test_windowed_left_outer_join(spark, tmp_path):
    """StreamingOuterJoinSuite: "windowed left outer join" (window equality as a range on the
    windows' ends, see the module docstring)."""
    h = harness(spark, tmp_path, windowed_join("left"))
    try:
        assert answer(h.batch(ints(1, 2, 3, 4, 5), ints(3, 4, 5, 6, 7)), *WINDOWED) == [
            (3, 10, 6, 9), (4, 10, 8, 12), (5, 10, 10, 15)]
        assert h.batch(ints(21), ints(22)) == []  # the watermark passes window [0, 10)
        assert answer(h.batch(), *WINDOWED) == [(1, 10, 2, None), (2, 10, 4, None)]
        assert state_rows(spark, tmp_path) == {"left": [(21, 30)], "right": [(22, 30)]}  # total 2
        assert answer(h.batch(ints(22)), *WINDOWED) == [(22, 30, 44, 66)]
        assert state_rows(spark, tmp_path)["left"] == [(21, 30), (22, 30)]  # total 3
    finally:
        h.stop()


def test_windowed_right_outer_join(spark, tmp_path):
    """StreamingOuterJoinSuite: "windowed right outer join" (as the left outer one)."""
    h = harness(spark, tmp_path, windowed_join("right"))
    try:
        assert answer(h.batch(ints(1, 2, 3, 4, 5), ints(3, 4, 5, 6, 7)), *WINDOWED) == [
            (3, 10, 6, 9), (4, 10, 8, 12), (5, 10, 10, 15)]
        assert h.batch(ints(21), ints(22)) == []
        assert answer(h.batch(), *WINDOWED) == [(6, 10, None, 18), (7, 10, None, 21)]
        assert state_rows(spark, tmp_path) == {"left": [(21, 30)], "right": [(22, 30)]}  # total 2
        assert answer(h.batch(ints(22)), *WINDOWED) == [(22, 30, 44, 66)]
    finally:
        h.stop()


@pytest.mark.parametrize(("how", "outer_result"), [("left", (3, None, 5, None)), ("right", (None, 2, None, 5))])
def test_outer_join_with_watermark_range_condition(spark, tmp_path, how, outer_result):
    """StreamingOuterJoinSuite: "left outer with watermark range condition" and "right outer
    with watermark range condition" (the second part runs once, with a 10 minutes watermark and
    bounds of 3 minutes 30 seconds; Spark runs it twice, the bound spelt as ``interval 3
    minutes 30 seconds`` and ``interval '3:30' minute to second``: the same 210 s)."""
    h = harness(spark, tmp_path, range_join(how), schema=PAIRS)
    try:
        assert h.batch([(1, 5), (3, 5)]) == []
        assert answer(h.batch([], [(1, 10), (2, 5)]), *RANGE) == [(1, 1, 5, 10)]
        assert h.batch([], [(1, 11)]) == []  # left time too low
        assert state_rows(spark, tmp_path) == {"left": [(1, 5), (3, 5)], "right": [(1, 10), (1, 11), (2, 5)]}
        assert answer(h.batch([(1, 7), (1, 30)]), *RANGE) == [(1, 1, 7, 10), (1, 1, 7, 11)]  # total 7
        assert h.batch([], [(0, 30)]) == []  # the watermark moves to 20 s
        assert answer(h.batch(), *RANGE) == [outer_result]  # the no-data batch
        assert state_rows(spark, tmp_path) == {"left": [(1, 30)], "right": [(0, 30)]}  # total 2
    finally:
        h.stop()

    h = harness(spark, tmp_path, range_join(how, "10 minutes", "3 minutes 30 seconds"), schema=PAIRS,
                checkpoint="minutes")
    try:
        assert h.batch([(1, 210), (3, 5)]) == []
        assert answer(h.batch([], [(1, 300), (2, 5)]), *RANGE) == [(1, 1, 210, 300)]
        assert h.batch([], [(1, 450)]) == []
        assert answer(h.batch([(1, 260), (1, 1800)]), *RANGE) == [(1, 1, 260, 300), (1, 1, 260, 450)]
        assert h.batch([], [(0, 1800)]) == []
        assert answer(h.batch(), *RANGE) == [outer_result]
        assert state_rows(spark, tmp_path, checkpoint="minutes") == {"left": [(1, 1800)], "right": [(0, 1800)]}
    finally:
        h.stop()


def _self_outer_answers(h, spark, tmp_path, unmatched):
    """The three batches of Spark's SPARK-26187 self outer joins and their state totals."""
    assert answer(h.batch(timed(1, 2, 3, 4, 5)), *SELF) == [(2, 2, 2, 2), (4, 4, 4, 4)]
    rows = state_rows(spark, tmp_path)
    assert len(rows["left"]) + len(rows["right"]) == 7
    assert answer(h.batch(timed(6, 7, 8, 9, 10)), *SELF) == [(6, 6, 6, 6), (8, 8, 8, 8), (10, 10, 10, 10)]
    assert h.batch() == []  # watermark 5
    rows = state_rows(spark, tmp_path)
    assert len(rows["left"]) + len(rows["right"]) == 13
    out = h.batch(timed(11, 12, 13, 14, 15))
    out += h.batch()  # watermark 9
    assert answer(out, *SELF) == expected((12, 12, 12, 12), (14, 14, 14, 14), *unmatched)
    rows = state_rows(spark, tmp_path)
    assert len(rows["left"]) + len(rows["right"]) == 15


def test_spark_26187_self_left_outer_join_should_not_return_outer_nulls_for_already_matched_rows(spark, tmp_path):
    """StreamingOuterJoinSuite: "SPARK-26187 self left outer join should not return outer nulls
    for already matched rows"."""
    h = harness(spark, tmp_path, self_join("left"), schema="_1 long, _2 long")
    try:
        _self_outer_answers(h, spark, tmp_path, [(1, 1, None, None), (3, 3, None, None)])
    finally:
        h.stop()


def test_spark_26187_self_right_outer_join_should_not_return_outer_nulls_for_already_matched_rows(spark, tmp_path):
    """StreamingOuterJoinSuite: "SPARK-26187 self right outer join should not return outer nulls
    for already matched rows" (left and right of the left outer one swapped: ``leftTime BETWEEN
    rightTime AND rightTime + 5 seconds``)."""
    def build(stream):
        df = stream.select(F.col("_1").alias("value"), F.timestamp_seconds("_2").alias("timestamp"))
        left = df.where(F.col("value") % 2 == 0).select(F.col("value").alias("leftId"),
                                                         F.col("timestamp").alias("leftTime"))
        right = df.select(F.col("value").alias("rightId"), F.col("timestamp").alias("rightTime"))
        return left.with_watermark("leftTime", "5 seconds").join(
            right.with_watermark("rightTime", "5 seconds"), [("leftId", "rightId")], how="right",
            within=("leftTime", "rightTime", "-5 seconds", "0 seconds")) \
            .select("leftId", seconds("leftTime"), "rightId", seconds("rightTime"))

    h = harness(spark, tmp_path, build, schema="_1 long, _2 long")
    try:
        _self_outer_answers(h, spark, tmp_path, [(None, None, 1, 1), (None, None, 3, 3)])
    finally:
        h.stop()


def _union_with_join(a, b, c):
    """Spark's ``constructUnionDf``: input1's (key, leftValue, rightValue) union the join of
    ``setupStream("left", 2)`` and ``setupStream("right", 3)`` on key and equal times."""
    plain = a.select(F.col("value").alias("key"), F.col("value").alias("leftValue"),
                     F.col("value").alias("rightValue"))
    joined = setup_stream(b, "left", 2).join(setup_stream(c, "right", 3), "key",
                                              within=("leftTime", "rightTime", "0 seconds", "0 seconds"))
    return plain.union(joined.select("key", "leftValue", "rightValue"))


def test_spark_29438_union_does_not_shift_the_joins_partitions(spark, tmp_path):
    """StreamingOuterJoinSuite: "SPARK-29438: ensure UNION doesn't lead stream-stream join to use
    shifted partition IDs" (restarted with the other side of the union split into 3 partitions:
    the join still finds its state; Spark's second run re-adds the first run's data to line the
    memory streams' offsets up, which batchline's restarted inputs do not need)."""
    schema = ["value long"] * 3
    columns = ("key", "leftValue", "rightValue")
    h = harness(spark, tmp_path, _union_with_join, schema=schema)
    try:
        assert answer(h.batch(ints(11, 12, 13), ints(11, 12, 13, 14, 15), ints(13, 14, 15, 16, 17)), *columns) == [
            (11, 11, 11), (12, 12, 12), (13, 13, 13), (13, 26, 39), (14, 28, 42), (15, 30, 45)]
    finally:
        h.stop()

    def wider(a, b, c):
        return _union_with_join(a.transform(lambda df: df.repartition(3)), b, c)

    again = restarted(spark, tmp_path, wider, h, schema=schema)
    try:
        assert answer(again.batch(ints(21, 22, 23), ints(21, 22, 23, 24, 25), ints(23, 24, 25, 26, 27)),
                      *columns) == [(21, 21, 21), (22, 22, 22), (23, 23, 23), (23, 46, 69), (24, 48, 72),
                                    (25, 50, 75)]
    finally:
        again.stop()


def _events(stream, time, comment, delay):
    return stream.select(F.col("eventTime").alias(time), "id", F.col("comment").alias(comment)) \
        .with_watermark(time, delay)


def _at(text):
    return dt.datetime.fromisoformat(text)


EVENT_COLUMNS = ("id", "leftTime", "comment", "rightTime", "rightComment")


def test_spark_32148_stream_stream_join_regression_on_spark_3_0_0(spark, tmp_path):
    """StreamingOuterJoinSuite: "SPARK-32148 stream-stream join regression on Spark 3.0.0"
    (``left.eventTime BETWEEN right.eventTime - 30 s AND right.eventTime + 30 s``, watermarks 2
    and 4 minutes; the sides' columns renamed, as batchline refuses two columns of one name, the
    id once). The unmatched left row comes out in the no-data batch, as in Spark."""
    def build(a, b):
        return _events(a, "leftTime", "comment", "2 minutes").join(
            _events(b, "rightTime", "rightComment", "4 minutes"), "id", how="left",
            within=("leftTime", "rightTime", "-30 seconds", "30 seconds"))

    h = harness(spark, tmp_path, build, schema=[EVENTS, EVENTS])
    try:
        out = h.batch([(_at("2020-01-01 00:00:00"), "abc", "has no join partner"),
                       (_at("2020-01-02 00:00:00"), "abc", "joined with A"),
                       (_at("2020-01-02 01:00:00"), "abc", "joined with B")],
                      [(_at("2020-01-02 00:00:10"), "abc", "A"),
                       (_at("2020-01-02 00:59:59"), "abc", "B"),
                       (_at("2020-01-02 02:00:00"), "abc", "C")])
        out += h.batch()  # watermark min(01:00 - 2 min, 02:00 - 4 min) = 00:58
        assert answer(out, *EVENT_COLUMNS) == expected(
            ("abc", _at("2020-01-01 00:00:00"), "has no join partner", None, None),
            ("abc", _at("2020-01-02 00:00:00"), "joined with A", _at("2020-01-02 00:00:10"), "A"),
            ("abc", _at("2020-01-02 01:00:00"), "joined with B", _at("2020-01-02 00:59:59"), "B"))
    finally:
        h.stop()


def _left_outer_key_nullability(a, b):
    """Spark's ``testForLeftOuterJoinKeyNullability``: ``leftKey1 <=> rightKey1 AND leftKey2 =
    rightKey2 AND leftWindow = rightWindow``, left outer; the ``<=>`` as equality (batchline has
    no null-safe equality), the windows as ranges on their ends."""
    def side(stream, prefix, multiplier):
        return stream.select(F.col("_1").alias(f"{prefix}Key1"), F.col("_2").alias(f"{prefix}Key2"),
                             window_end("_2").alias(f"{prefix}End"),
                             (F.col("_2") * multiplier).alias(f"{prefix}Value")) \
            .with_watermark(f"{prefix}End", "10 seconds")
    return side(a, "left", 2).join(side(b, "right", 3), [("leftKey1", "rightKey1"), ("leftKey2", "rightKey2")],
                                   how="left", within=WINDOWS) \
        .select("leftKey1", "rightKey1", "leftKey2", "rightKey2", F.unix_seconds("leftEnd").alias("end"),
                "leftValue", "rightValue")


OUTER_NULLABLE = ("leftKey1", "rightKey1", "leftKey2", "rightKey2", "end", "leftValue", "rightValue")


def test_left_outer_joining_non_nullable_left_join_key_with_nullable_right_join_key(spark, tmp_path):
    """StreamingOuterJoinSuite: "left-outer: joining non-nullable left join key with nullable
    right join key"."""
    h = harness(spark, tmp_path, _left_outer_key_nullability, schema=PAIRS)
    try:
        assert answer(h.batch([(1, t) for t in (1, 2, 3, 4, 5)], [(1, t) for t in (3, 4, 5, 6)]),
                      *OUTER_NULLABLE) == [(1, 1, 3, 3, 10, 6, 9), (1, 1, 4, 4, 10, 8, 12), (1, 1, 5, 5, 10, 10, 15)]
        assert h.batch([(1, 21)], [(1, 22)]) == []
        assert answer(h.batch(), *OUTER_NULLABLE) == [(1, None, 1, None, 10, 2, None),
                                                      (1, None, 2, None, 10, 4, None)]
    finally:
        h.stop()


def test_left_outer_joining_nullable_left_join_key_with_non_nullable_right_join_key(spark, tmp_path):
    """StreamingOuterJoinSuite: "left-outer: joining nullable left join key with non-nullable
    right join key".

    batchline differs in when the left row with a null key comes out: at once, in the batch it
    arrives in (join.py: a null key meets nothing, so its outer row need not wait), where Spark
    emits it with the other unmatched rows once the watermark passes its window."""
    h = harness(spark, tmp_path, _left_outer_key_nullability, schema=PAIRS)
    try:
        out = h.batch([(1, 1), (None, 2), (1, 3), (1, 4), (1, 5)], [(1, t) for t in (3, 4, 5, 6)])
        assert answer(out, *OUTER_NULLABLE) == expected(
            (1, 1, 3, 3, 10, 6, 9), (1, 1, 4, 4, 10, 8, 12), (1, 1, 5, 5, 10, 10, 15),
            (None, None, 2, None, 10, 4, None))  # Spark: in the last batch
        assert h.batch([(1, 21)], [(1, 22)]) == []
        assert answer(h.batch(), *OUTER_NULLABLE) == [(1, None, 1, None, 10, 2, None)]
    finally:
        h.stop()


def test_left_outer_joining_nullable_left_join_key_with_nullable_right_join_key(spark, tmp_path):
    """StreamingOuterJoinSuite: "left-outer: joining nullable left join key with nullable right
    join key".

    batchline differs: Spark's ``<=>`` pairs left (null, 4) with right (null, 4); batchline's
    equality does not (a null key meets nothing), so both left rows with a null key come out
    with nulls, at once (see the previous test), and right (null, 4) is dropped."""
    h = harness(spark, tmp_path, _left_outer_key_nullability, schema=PAIRS)
    try:
        out = h.batch([(1, 1), (None, 2), (1, 3), (None, 4), (1, 5)], [(1, 3), (None, 4), (1, 5), (1, 6)])
        assert answer(out, *OUTER_NULLABLE) == expected(
            (1, 1, 3, 3, 10, 6, 9), (1, 1, 5, 5, 10, 10, 15),
            (None, None, 4, None, 10, 8, None),  # Spark: (None, None, 4, 4, 10, 8, 12)
            (None, None, 2, None, 10, 4, None))  # Spark: in the last batch
        assert h.batch([(1, 21)], [(1, 22)]) == []
        assert answer(h.batch(), *OUTER_NULLABLE) == [(1, None, 1, None, 10, 2, None)]
    finally:
        h.stop()


def test_spark_38684_outer_join_processing_and_evicting_one_key_in_one_batch(spark, tmp_path):
    """StreamingOuterJoinSuite: "SPARK-38684: outer join works correctly even if processing input
    rows and evicting state rows for same grouping key happens in the same micro-batch" (Spark
    turns no-data batches off: the port runs no empty batch; RocksDB has no counterpart)."""
    def build(a, b):
        return _events(a, "leftTime", "comment", "0 seconds").join(
            _events(b, "rightTime", "rightComment", "0 seconds"), "id", how="left",
            within=("leftTime", "rightTime", "-30 seconds", "30 seconds"))

    h = harness(spark, tmp_path, build, schema=[EVENTS, EVENTS])
    try:
        assert h.batch([(_at("2020-01-02 00:00:00"), "abc", "left in batch 1")],
                       [(_at("2020-01-02 00:01:00"), "abc", "right in batch 1")]) == []
        assert h.batch([(_at("2020-01-02 01:00:00"), "abc", "left in batch 2")],
                       [(_at("2020-01-02 01:01:00"), "abc", "right in batch 2")]) == []
        # watermark 01:00
        assert answer(h.batch([(_at("2020-01-02 01:30:00"), "abc", "left in batch 3")]), *EVENT_COLUMNS) == [
            ("abc", _at("2020-01-02 00:00:00"), "left in batch 1", None, None)]
        # watermark 01:01: "left in batch 2" goes, "left in batch 3" meets the new right row
        assert answer(h.batch([], [(_at("2020-01-02 01:30:10"), "abc", "match with left in batch 3")]),
                      *EVENT_COLUMNS) == expected(
            ("abc", _at("2020-01-02 01:00:00"), "left in batch 2", None, None),
            ("abc", _at("2020-01-02 01:30:00"), "left in batch 3", _at("2020-01-02 01:30:10"),
             "match with left in batch 3"))
    finally:
        h.stop()


# --- StreamingFullOuterJoinSuite -----------------------------------------------------------


def test_windowed_full_outer_join(spark, tmp_path):
    """StreamingFullOuterJoinSuite: "windowed full outer join" (window equality as a range on
    the windows' ends; the watermark after the restart is 20 s where Spark's is 12 s: rows of
    window [0, 10) are late in both)."""
    build = windowed_join("full")
    h = harness(spark, tmp_path, build)
    try:
        assert answer(h.batch(ints(1, 2, 3, 4, 5), ints(3, 4, 5, 6, 7)), *WINDOWED) == [
            (3, 10, 6, 9), (4, 10, 8, 12), (5, 10, 10, 15)]
        rows = state_rows(spark, tmp_path)
        assert (len(rows["left"]), len(rows["right"])) == (5, 5)  # total 10
        assert h.batch(ints(21), ints(22)) == []
        assert answer(h.batch(), *WINDOWED) == [(1, 10, 2, None), (2, 10, 4, None), (6, 10, None, 18),
                                                (7, 10, None, 21)]
        assert state_rows(spark, tmp_path) == {"left": [(21, 30)], "right": [(22, 30)]}  # total 2
        assert answer(h.batch(ints(22)), *WINDOWED) == [(22, 30, 44, 66)]
    finally:
        h.stop()
    again = restarted(spark, tmp_path, build, h, schema=INTS)
    try:
        assert again.batch(ints(1)) == []
        assert late(again) == 1
        assert again.batch([], ints(5)) == []
        assert late(again) == 1
        assert state_rows(spark, tmp_path) == {"left": [(21, 30), (22, 30)], "right": [(22, 30)]}  # total 3
    finally:
        again.stop()


def test_full_outer_join_with_watermark_range_condition(spark, tmp_path):
    """StreamingFullOuterJoinSuite: "full outer join with watermark range condition"."""
    h = harness(spark, tmp_path, range_join("full"), schema=PAIRS)
    try:
        assert h.batch([(1, 5), (3, 5)]) == []
        assert answer(h.batch([], [(1, 10), (2, 5)]), *RANGE) == [(1, 1, 5, 10)]
        assert answer(h.batch([], [(1, 9)]), *RANGE) == [(1, 1, 5, 9)]
        assert state_rows(spark, tmp_path) == {"left": [(1, 5), (3, 5)],
                                               "right": [(1, 9), (1, 10), (2, 5)]}  # total 5
        assert answer(h.batch([(1, 7), (1, 30)]), *RANGE) == [(1, 1, 7, 9), (1, 1, 7, 10)]
        assert h.batch([], [(0, 30)]) == []  # the watermark moves to 20 s
        assert answer(h.batch(), *RANGE) == expected((3, None, 5, None), (None, 2, None, 5))
        assert state_rows(spark, tmp_path) == {"left": [(1, 30)], "right": [(0, 30)]}  # total 2
    finally:
        h.stop()


def test_self_full_outer_join(spark, tmp_path):
    """StreamingFullOuterJoinSuite: "self full outer join" (every right row meets its left row,
    so the outer rows are the left outer join's)."""
    h = harness(spark, tmp_path, self_join("full"), schema="_1 long, _2 long")
    try:
        _self_outer_answers(h, spark, tmp_path, [(1, 1, None, None), (3, 3, None, None)])
    finally:
        h.stop()


# --- StreamingLeftSemiJoinSuite ------------------------------------------------------------


def test_windowed_left_semi_join(spark, tmp_path):
    """StreamingLeftSemiJoinSuite: "windowed left semi join" (window equality as a range on the
    windows' ends; a left row that meets a right row on arrival is not buffered, as Spark's)."""
    build = windowed_join("left_semi")
    columns = ("key", "end", "leftValue")
    h = harness(spark, tmp_path, build)
    try:
        assert answer(h.batch(ints(1, 2, 3, 4, 5), ints(3, 4, 5, 6, 7)), *columns) == [
            (3, 10, 6), (4, 10, 8), (5, 10, 10)]
        rows = state_rows(spark, tmp_path)
        assert (len(rows["left"]), len(rows["right"])) == (5, 5)  # total 10
        assert h.batch(ints(21), ints(22)) == []
        assert h.batch() == []
        assert state_rows(spark, tmp_path) == {"left": [(21, 30)], "right": [(22, 30)]}  # total 2
        assert answer(h.batch(ints(22)), *columns) == [(22, 30, 44)]
        assert state_rows(spark, tmp_path) == {"left": [(21, 30)], "right": [(22, 30)]}  # left 22 not buffered
    finally:
        h.stop()
    again = restarted(spark, tmp_path, build, h, schema=INTS)
    try:
        assert again.batch(ints(1)) == []
        assert late(again) == 1
        assert again.batch([], ints(5)) == []
        assert late(again) == 1
    finally:
        again.stop()


def test_left_semi_join_with_watermark_range_condition(spark, tmp_path):
    """StreamingLeftSemiJoinSuite: "left semi join with watermark range condition"."""
    columns = ("leftKey", "leftTime")
    h = harness(spark, tmp_path, range_join("left_semi"), schema=PAIRS)
    try:
        assert h.batch([(1, 5), (3, 5)]) == []
        assert answer(h.batch([], [(1, 10), (2, 5)]), *columns) == [(1, 5)]
        assert h.batch([], [(1, 9)]) == []  # left (1, 5) has been emitted already
        assert answer(h.batch([(1, 7), (1, 30)]), *columns) == [(1, 7)]
        # (1, 7) met a right row on arrival: not buffered (total 6)
        assert state_rows(spark, tmp_path) == {"left": [(1, 5), (1, 30), (3, 5)],
                                               "right": [(1, 9), (1, 10), (2, 5)]}
        assert h.batch([], [(0, 30)]) == []
        assert h.batch() == []  # watermark 20 s: no output
        assert state_rows(spark, tmp_path) == {"left": [(1, 30)], "right": [(0, 30)]}  # total 2
    finally:
        h.stop()


def test_self_left_semi_join(spark, tmp_path):
    """StreamingLeftSemiJoinSuite: "self left semi join".

    The state differs from Spark's: Spark's optimizer infers ``leftId % 2 = 0`` from the right
    side's filter and the key equality and pushes it below the join, so its left side buffers
    only even values (totals 4, 8, 9); batchline's left side buffers every row (7, 13, 15), its
    even ones being Spark's left state. The output is Spark's."""
    h = harness(spark, tmp_path, self_join("left_semi"), schema="_1 long, _2 long")
    columns = ("leftId", "leftTime")
    try:
        assert answer(h.batch(timed(1, 2, 3, 4, 5)), *columns) == [(2, 2), (4, 4)]
        rows = state_rows(spark, tmp_path)
        assert (len(rows["left"]), len(rows["right"])) == (5, 2)  # Spark: (2, 2)
        assert answer(h.batch(timed(6, 7, 8, 9, 10)), *columns) == [(6, 6), (8, 8), (10, 10)]
        assert h.batch() == []  # watermark 5: right 2 and 4 go
        rows = state_rows(spark, tmp_path)
        assert (len(rows["left"]), rows["right"]) == (10, [(6, 6), (8, 8), (10, 10)])  # Spark: (5, 3)
        out = h.batch(timed(11, 12, 13, 14, 15))
        out += h.batch()  # watermark 9: left 1 to 3 go, right 6 and 8
        assert answer(out, *columns) == [(12, 12), (14, 14)]
        rows = state_rows(spark, tmp_path)
        assert [r for r in rows["left"] if r[0] % 2 == 0] == [(t, t) for t in (4, 6, 8, 10, 12, 14)]  # Spark's
        assert (len(rows["left"]), rows["right"]) == (12, [(10, 10), (12, 12), (14, 14)])  # Spark: (6, 3)
    finally:
        h.stop()
