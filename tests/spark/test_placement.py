"""A stateful operator's shuffle with marker rows puts every row exactly where Spark's
``repartition(n, keys)`` puts it (state partitions keep their identity across releases), and
gives every partition one marker row naming it."""

import pytest
from pyspark.sql import functions as F

from batchline.state.contract import MARKER_COLUMN
from batchline.state.placement import StateShuffle, route_values, spark_hash_int


def test_hash_of_an_int_is_spark_s(spark):
    values = [0, 1, -1, 7, 42, 2**31 - 1, -(2**31), 123_456_789, -987_654]
    frame = spark.createDataFrame([(v,) for v in values], "v int").select("v", F.hash("v").alias("h"))
    assert {r["v"]: r["h"] for r in frame.collect()} == {v: spark_hash_int(v) for v in values}


@pytest.mark.parametrize("n", [1, 2, 3, 8, 200])
def test_each_route_value_lands_in_its_partition(n):
    routes = route_values(n)
    assert [spark_hash_int(v) % n for v in routes] == list(range(n))


KEYS = {
    "one string key": ("key string, value long", ["key"],
                       [(f"user-{i}" if i % 17 else None, i) for i in range(400)]),
    "one long key": ("key long, value long", ["key"], [(i * 7919 - 50_000, i) for i in range(400)]),
    "two keys": ("a string, b int, value long", ["a", "b"], [(f"a{i % 13}", i % 11, i) for i in range(400)]),
}


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("case", sorted(KEYS))
def test_rows_go_where_repartition_by_keys_sends_them_and_each_partition_gets_its_marker(spark, case, n):
    schema, keys, rows = KEYS[case]
    df = spark.createDataFrame(rows, schema)
    expected = {tuple(r[:-1]): r[-1] for r in
                df.repartition(n, *keys).select("value", *keys, F.spark_partition_id()).collect()}
    shuffled = StateShuffle(spark, keys, n)(df).select(
        "value", *keys, MARKER_COLUMN, F.spark_partition_id().alias("pid")).collect()
    data = [r for r in shuffled if r[MARKER_COLUMN] is None]
    assert {(r["value"], *(r[k] for k in keys)): r["pid"] for r in data} == expected
    assert len(data) == len(rows)
    assert sorted((r[MARKER_COLUMN], r["pid"]) for r in shuffled if r[MARKER_COLUMN] is not None) == [
        (p, p) for p in range(n)]


def test_a_frame_with_two_columns_of_one_name_is_shuffled_and_the_marker_s_name_is_refused(spark):
    from batchline.errors import ConfigurationError

    df = spark.createDataFrame([("a", 1, 2), ("b", 3, 4)], "key string, v long, w long").toDF("key", "v", "v")
    shuffle = StateShuffle(spark, ["key"], 2)
    shuffled = shuffle(df).collect()
    assert sorted(tuple(r) for r in shuffled if r[MARKER_COLUMN] is None) == [("a", 1, 2, None), ("b", 3, 4, None)]
    with pytest.raises(ConfigurationError, match="rename that column"):
        shuffle(df.withColumn(MARKER_COLUMN, F.lit(1)))


def test_one_shuffle_serves_batch_after_batch_and_follows_a_change_of_columns(spark):
    """Built once per operator: its marker rows follow the input's columns when they change."""
    shuffle = StateShuffle(spark, ["key"], 3)
    for schema, rows in [("key string, v long", [("a", 1), ("b", 2)]), ("key string, v long", [("c", 3)]),
                         ("key string, v string, w double", [("d", "x", 1.5)])]:
        shuffled = shuffle(spark.createDataFrame(rows, schema)).collect()
        assert sorted(tuple(r) for r in shuffled if r[MARKER_COLUMN] is None) == sorted((*r, None) for r in rows)
        assert sorted(r[MARKER_COLUMN] for r in shuffled if r[MARKER_COLUMN] is not None) == [0, 1, 2]
