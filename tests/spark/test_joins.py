"""Stream-stream joins end to end on a manual clock: the basics (Spark's own cases are ported in
test_spark_join_port.py)."""

import pytest
from pyspark.sql import functions as F

from batchline.testing import BatchHarness


def test_inner_on_key(spark, tmp_path):
    def build(a, b):
        left = a.select(F.col("value").alias("key"), (F.col("value") * 2).alias("leftValue"))
        right = b.select(F.col("value").alias("key"), (F.col("value") * 3).alias("rightValue"))
        return left.join(right, "key")
    h = BatchHarness(spark, build, ["value long", "value long"], checkpoint=str(tmp_path / "c")).start()
    try:
        assert h.batch([(1,)]) == []
        assert h.batch([], [(1,), (10,)]) == [{"key": 1, "leftValue": 2, "rightValue": 3}]
        assert h.batch([(10,)]) == [{"key": 10, "leftValue": 20, "rightValue": 30}]
        assert h.batch([], [(1,)]) == [{"key": 1, "leftValue": 2, "rightValue": 3}]
    finally:
        h.stop()


def test_left_outer_within(spark, tmp_path):
    def build(a, b):
        left = a.select(F.col("k").alias("key"), F.timestamp_seconds("t").alias("lt"), F.col("v").alias("lv")) \
            .with_watermark("lt", "10 seconds")
        right = b.select(F.col("k").alias("key"), F.timestamp_seconds("t").alias("rt"), F.col("v").alias("rv")) \
            .with_watermark("rt", "10 seconds")
        return left.join(right, "key", how="left", within=("lt", "rt", "-5 seconds", "5 seconds"))
    h = BatchHarness(spark, build, ["k long, t long, v long", "k long, t long, v long"],
                     checkpoint=str(tmp_path / "c")).start()
    try:
        out = h.batch([(1, 10, 100), (2, 20, 200)], [(1, 12, 1000)])
        assert [(r["key"], r["lv"], r["rv"]) for r in out] == [(1, 100, 1000)]
        out = h.batch([(8, 60, 8)], [(9, 60, 9)])   # watermark to 50 next batch
        assert out == []
        out = h.batch()
        assert sorted((r["key"], r["lv"], r["rv"]) for r in out) == [(2, 200, None)], out
    finally:
        h.stop()


def timed(stream, time, delay="10 seconds"):
    """Rows ``(k, t, v)`` keyed ``key`` with event time ``t`` seconds in column ``time``."""
    return (stream.select(F.col("k").alias("key"), F.timestamp_seconds("t").alias(time), F.col("v").alias(time + "_v"))
            .with_watermark(time, delay))


def held(spark, checkpoint):
    """How many rows of each side the join's state holds (``read_state``)."""
    from batchline.state import read_state

    rows = read_state(spark, checkpoint, "join").collect()
    return sum(len(r["left"]) for r in rows), sum(len(r["right"]) for r in rows)


def test_state_holds_only_rows_that_can_still_match(spark, tmp_path):
    """After the watermark passes, each side's state holds only the rows that a row still to
    come could meet: left rows whose time plus the upper bound lies after the watermark, right
    rows whose time minus the lower bound does. Read back with ``read_state``."""
    checkpoint = str(tmp_path / "c")

    def build(a, b):
        return timed(a, "lt").join(timed(b, "rt"), "key", within=("lt", "rt", "-5 seconds", "20 seconds"))

    h = BatchHarness(spark, build, ["k long, t long, v long"] * 2, checkpoint=checkpoint).start()
    try:
        h.batch([(k, k, k) for k in range(0, 100, 2)], [(k, k + 1, k) for k in range(1, 100, 2)])
        assert held(spark, checkpoint) == (50, 50)
        # Newest event time 100 s on both sides: the watermark becomes 90 s.
        assert h.batch([(1000, 100, 0)], [(1001, 100, 0)]) == []
        h.batch()
        left, right = held(spark, checkpoint)
        # Left rows go once t + 20 s + 1 ms <= 90 s, right rows once t + 5 s + 1 ms <= 90 s (lower is -5 s).
        assert left == len([k for k in range(0, 100, 2) if k > 69]) + 1
        assert right == len([k for k in range(1, 100, 2) if k + 1 > 84]) + 1
        assert h.info().state_operators["join"].state_keys == left + right
    finally:
        h.stop()


def test_pairs_across_batches_and_restart_once_each(spark, tmp_path):
    """A pair is emitted in the batch where its second row arrives, whichever side that is,
    also after a restart from the checkpoint; never again."""
    checkpoint = str(tmp_path / "c")

    def build(a, b):
        return timed(a, "lt").join(timed(b, "rt"), "key", within=("lt", "rt", "0 seconds", "30 seconds"))

    def pairs(rows):
        return sorted((r["key"], r["lt_v"], r["rt_v"]) for r in rows)

    schemas = ["k long, t long, v long"] * 2
    h = BatchHarness(spark, build, schemas, checkpoint=checkpoint).start()
    try:
        assert pairs(h.batch([(1, 10, 1)], [(2, 12, 20)])) == []
        assert pairs(h.batch([(2, 11, 2)], [(1, 15, 10), (1, 50, 11)])) == [(1, 1, 10), (2, 2, 20)]
    finally:
        h.stop()
    h = BatchHarness(spark, build, schemas, checkpoint=checkpoint, start_ms=h.batch_time).start()
    try:
        assert pairs(h.batch([(1, 20, 3)], [(1, 25, 12)])) == [(1, 1, 12), (1, 3, 11), (1, 3, 12)]
        assert pairs(h.batch()) == []
    finally:
        h.stop()


def test_full_and_semi_joins_and_the_late_stream(spark, tmp_path):
    """A full outer join emits each row that never met one, once, when the watermark passes
    it; a left semi join each left row with a match, once; rows behind the watermark are late,
    counted and on ``late_rows``."""
    def build(a, b):
        joined = timed(a, "lt").join(timed(b, "rt"), "key", how="full", within=("lt", "rt", "0 seconds", "5 seconds"))
        joined.late_rows.foreach_batch(lambda df, _: late.extend(df.collect()), name="late")
        return joined

    late = []
    h = BatchHarness(spark, build, ["k long, t long, v long"] * 2, checkpoint=str(tmp_path / "c")).start()
    try:
        out = h.batch([(1, 10, 1), (2, 10, 2)], [(1, 12, 10), (3, 11, 30)])
        assert sorted((r["key"], r["lt_v"], r["rt_v"]) for r in out) == [(1, 1, 10)]
        out = h.batch([(9, 100, 9)], [(9, 100, 90), (4, 5, 40)])  # watermark 90 s next
        assert sorted((r["key"], r["lt_v"], r["rt_v"]) for r in out) == [(9, 9, 90)]
        out = h.batch([(5, 20, 5)], [])  # late: 20 s <= 90 s
        assert sorted((r["key"], r["lt_v"], r["rt_v"]) for r in out) == [(2, 2, None), (3, None, 30), (4, None, 40)]
        assert h.info().state_operators["join"].late_rows == 1
    finally:
        h.stop()
    assert [(r["side"], r["key"], r["left"]["lt_v"], r["right"]) for r in late] == [("left", 5, 5, None)]

    def semi(a, b):
        return timed(a, "lt").join(timed(b, "rt"), "key", how="left_semi",
                                   within=("lt", "rt", "0 seconds", "5 seconds"))

    h = BatchHarness(spark, semi, ["k long, t long, v long"] * 2, checkpoint=str(tmp_path / "s")).start()
    try:
        out = h.batch([(1, 10, 1), (2, 10, 2)], [(1, 12, 10)])
        assert [(r["key"], r["lt_v"]) for r in out] == [(1, 1)] and "rt_v" not in out[0]
        assert h.batch([], [(1, 13, 11), (2, 11, 20)]) == [{"key": 2, "lt": out[0]["lt"], "lt_v": 2}]
    finally:
        h.stop()


def test_definitions_refused_with_what_to_add(spark, tmp_path):
    from batchline import StreamingContext
    from batchline.errors import ConfigurationError

    ssc = StreamingContext(spark, 1, checkpoint=str(tmp_path / "c"))
    a = ssc.queue_stream([], schema="k long, t timestamp")
    b = ssc.queue_stream([], schema="k long, t2 timestamp")
    with pytest.raises(ConfigurationError, match="needs within="):
        a.join(b, "k", how="left")
    with pytest.raises(ConfigurationError, match="watermark on the right stream"):
        a.with_watermark("t", "1 minute").join(b, "k", how="left", within=("t", "t2", 0, 60))
    with pytest.raises(ConfigurationError, match="compares the left stream's 'x'"):
        a.with_watermark("t", "1 minute").join(b, "k", within=("x", "t2", 0, 60))
    with pytest.raises(ConfigurationError, match="how must be one of"):
        a.join(b, "k", how="outer")
    with pytest.raises(ConfigurationError, match="lower bound"):
        a.join(b, "k", within=("t", "t2", "1 minute", "-1 minute"))


def test_rescaled_state_still_meets_the_rows_to_come(spark, tmp_path):
    """A join's state moved to more partitions (``rescale_state``) keeps every buffered row
    of both sides: rows that come after the restart meet them."""
    from batchline.state import rescale_state

    checkpoint = str(tmp_path / "c")

    def build(partitions):
        def join(a, b):
            return timed(a, "lt").join(timed(b, "rt"), "key", within=("lt", "rt", "-30 seconds", "30 seconds"),
                                       num_partitions=partitions)
        return join

    schemas = ["k long, t long, v long"] * 2
    h = BatchHarness(spark, build(2), schemas, checkpoint=checkpoint).start()
    try:
        assert h.batch([(k, 10, k) for k in range(20)], [(k, 10, -k) for k in range(20, 40)]) == []
    finally:
        h.stop()
    before = held(spark, checkpoint)
    assert rescale_state(spark, checkpoint, "join", 3).keys == 40
    assert held(spark, checkpoint) == before == (20, 20)
    h = BatchHarness(spark, build(3), schemas, checkpoint=checkpoint, start_ms=h.batch_time).start()
    try:
        out = h.batch([(k, 12, k) for k in range(20, 40)], [(k, 12, -k) for k in range(20)])
        assert sorted((r["key"], r["lt_v"], r["rt_v"]) for r in out) == [(k, k, -k) for k in range(40)]
    finally:
        h.stop()


def test_a_joined_stream_feeds_a_window(spark, tmp_path):
    """The joined stream is a stream like any other: here counted per 10 s window of the left
    time, emitted once the watermark passes the window."""
    from batchline import aggregates as agg
    from batchline import window

    def build(a, b):
        joined = timed(a, "lt").join(timed(b, "rt"), "key", within=("lt", "rt", "0 seconds", "5 seconds"))
        return joined.group_by_key(window("lt", "10 seconds")).aggregate(agg.count(), output_mode="append",
                                                                         name="per_window")

    h = BatchHarness(spark, build, ["k long, t long, v long"] * 2, checkpoint=str(tmp_path / "c")).start()
    try:
        assert h.batch([(1, 1, 0), (2, 3, 0), (3, 12, 0)], [(1, 2, 0), (2, 4, 0), (3, 13, 0)]) == []
        h.batch([(9, 60, 0)], [(9, 60, 0)])
        out = h.batch()
        assert sorted((r["window_start"].second, r["count"]) for r in out) == [(0, 2), (10, 1)]
    finally:
        h.stop()


def test_state_written_with_the_keys_in_each_row_restarts_in_its_own_layout(spark, tmp_path, monkeypatch):
    """A checkpoint whose buffered rows repeat the key columns (as joins wrote them before the
    rows left them out) restarts: its rows still meet and go out unmatched, and its state keeps
    that layout (read back with ``read_state``)."""
    from batchline.state import read_state
    from batchline.state.join import JoinNode

    checkpoint = str(tmp_path / "c")
    derive = JoinNode.derive

    def build(a, b):
        return timed(a, "lt").join(timed(b, "rt"), "key", how="left", within=("lt", "rt", "0 seconds", "30 seconds"))

    def pairs(rows):
        return sorted((r["key"], r["lt_v"], r["rt_v"]) for r in rows)

    schemas = ["k long, t long, v long"] * 2
    monkeypatch.setattr(JoinNode, "derive", lambda self, schema, keys_in_rows=False: derive(self, schema, True))
    h = BatchHarness(spark, build, schemas, checkpoint=checkpoint).start()
    try:
        assert pairs(h.batch([(1, 10, 1), (2, 11, 2)], [(2, 12, 20)])) == [(2, 2, 20)]
    finally:
        h.stop()
    monkeypatch.undo()
    h = BatchHarness(spark, build, schemas, checkpoint=checkpoint, start_ms=h.batch_time).start()
    try:
        assert pairs(h.batch([(3, 20, 3)], [(1, 25, 10)])) == [(1, 1, 10)]
        state = read_state(spark, checkpoint, "join").collect()
        held = [side for row in state for side in (*row["left"], *row["right"])]
        assert held and all("key" in side.asDict() for side in held)
        assert pairs(h.batch([(9, 100, 9)], [(9, 100, 90)])) == [(9, 9, 90)]
        # The watermark (90 s) passes the rows of keys 1, 2 and 3: they time out, and 3's
        # left row goes out unmatched.
        assert pairs(h.batch()) == [(3, 3, None)]
    finally:
        h.stop()
