"""Stream-stream joins end to end on a manual clock: the basics (Spark's own cases are ported in
test_spark_join_port.py)."""

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
