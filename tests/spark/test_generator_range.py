"""The generator's index range: the rows and partitions of ``spark.range``, with generated
code that stays the same from one batch to the next (so executors do not compile new code
for every batch)."""

import pytest
from pyspark.sql import functions as F

from batchline.sources import generator
from batchline.sources.generator import index_range


def _by_partition(df):
    return sorted(tuple(r) for r in df.select(F.spark_partition_id().alias("p"), "id").collect())


def _code(df) -> str:
    """The generated Java of the frame's stage (without the plan printed above it)."""
    text = df._sc._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "codegen")
    return "\n".join(line for line in text.splitlines() if line.startswith("/* "))


@pytest.mark.parametrize("partitions", [None, 3])
def test_an_index_range_holds_the_rows_of_spark_s_range_in_the_same_partitions(spark, partitions):
    start, end = 1_795_880_000_123, 1_795_880_000_523
    plain = spark.range(start, end, numPartitions=partitions) if partitions else spark.range(start, end)
    built = index_range(spark, start, end, partitions)
    assert built.schema == plain.schema
    assert _by_partition(built) == _by_partition(plain)
    assert index_range(spark, 5, 5, partitions).count() == 0


def test_consecutive_batches_of_one_count_run_the_same_generated_code(spark):
    start = 1_000_000_000_000
    first, second = index_range(spark, start, start + 400, 2), index_range(spark, start + 400, start + 800, 2)
    assert str(start + 400) not in _code(second)  # the start is read, not compiled in
    assert _code(first) == _code(second)
    # A plain range compiles its start into the code: what index_range avoids.
    assert _code(spark.range(start, start + 400, numPartitions=2)) != _code(
        spark.range(start + 400, start + 800, numPartitions=2))


def test_a_range_of_many_indexes_starts_where_it_starts(spark, monkeypatch):
    monkeypatch.setattr(generator, "STABLE_CODE_BELOW", 100)
    built = index_range(spark, 1000, 1100, 2)
    assert _by_partition(built) == _by_partition(spark.range(1000, 1100, numPartitions=2))
    assert "Decimal" not in built._jdf.queryExecution().optimizedPlan().toString()
