"""Writing an operator's state offline (SPEC D8): fix, migrate, bootstrap, seed; a restarted
pipeline resumes from what was written. Real Spark, pipelines driven batch by batch."""

import datetime as dt
import time

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from batchline import ConfigurationError
from batchline.checkpoint.events import JobEventStore, PartitionFinished
from batchline.checkpoint.lease import CheckpointLockedError
from batchline.checkpoint.storage import CheckpointStorage
from batchline.state import (
    GroupStateTimeout,
    StateSchemaError,
    WriteStateResult,
    read_state,
    state_versions,
    write_state,
)
from batchline.state.schema import RowSchema
from batchline.state.store import DELTA, OUTPUT, FileHeader, FileStateStore, entries_table
from batchline.testing import BatchHarness
from tests.helpers import Count, running_count

SCHEMA = StructType([StructField("key", StringType()), StructField("value", LongType()),
                     StructField("ts", TimestampType())])
STATE = "key string, count long, total long"


def at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


class Pipeline(BatchHarness):
    """A queue of DataFrames in, ``running_count`` as operator "op", its output per batch."""

    def __init__(self, spark, checkpoint, start_ms=100_000, **kwargs):
        def build(stream):
            return stream.group_by_key("key").flat_map_groups_with_state(
                running_count, state_schema=Count, output_schema="key string, count long",
                timeout=GroupStateTimeout.NO_TIMEOUT, name="op", **kwargs)

        super().__init__(spark, build, SCHEMA, checkpoint=str(checkpoint), start_ms=start_ms)

    def batch(self, rows=()):
        return super().batch([(k, v, at(self.batch_time / 1000)) for k, v in rows])


def restarted(spark, checkpoint, last_batch):
    """The pipeline started again on ``checkpoint`` half an interval after ``last_batch``."""
    q = Pipeline(spark, checkpoint, start_ms=last_batch + 500).start()
    q.batch_time = last_batch
    return q


def after_wall_clock(version):
    """A manual clock's start on the batch grid, after a wall-clock state version."""
    return (version // 1000 + 1) * 1000


def state_of(spark, checkpoint, operator="op"):
    return sorted(tuple(r) for r in read_state(spark, str(checkpoint), operator).collect())


def run_two_batches(spark, checkpoint):
    p = Pipeline(spark, checkpoint, num_partitions=2).start()
    try:
        p.batch([("a", 1), ("b", 2), ("c", 3)])
        p.batch([("a", 1)])
    finally:
        p.stop()
    return p.batch_time


def test_round_trip_fixes_the_state_and_a_restart_resumes_from_it(spark, tmp_path):
    location = str(tmp_path)
    last = run_two_batches(spark, tmp_path)
    assert state_of(spark, tmp_path) == [("a", 2, 2, None), ("b", 1, 2, None), ("c", 1, 3, None)]

    # Fix: a's count becomes 10, c goes.
    fixed = (read_state(spark, location, "op").filter(F.col("key") != "c")
             .withColumn("count", F.when(F.col("key") == "a", F.lit(10)).otherwise(F.col("count")).cast("long")))
    result = write_state(spark, location, "op", fixed)

    assert result == WriteStateResult("op", last + 1, 2, 2, False)  # just above the last committed batch
    assert state_of(spark, tmp_path) == [("a", 10, 2, None), ("b", 1, 2, None)]
    assert state_versions(location, "op") == [last + 1]
    assert fixed.count() == 2  # the DataFrame it came from can still be evaluated

    q = restarted(spark, tmp_path, last)
    try:
        assert q.batch([("a", 1), ("c", 1)]) == [{"key": "a", "count": 11}, {"key": "c", "count": 1}]
        assert q.batch([("b", 1)]) == [{"key": "b", "count": 2}]
    finally:
        q.stop()
    assert state_of(spark, tmp_path) == [("a", 11, 3, None), ("b", 2, 3, None), ("c", 1, 1, None)]


def test_bootstrapping_a_new_location_then_a_pipeline_starts_from_it(spark, tmp_path):
    initial = spark.createDataFrame([("a", 5, 50), ("b", 1, 1)], STATE)
    with pytest.raises(ConfigurationError, match="needs key_columns and state_schema"):
        write_state(spark, str(tmp_path), "op", initial)
    with pytest.raises(ConfigurationError, match="needs state_schema"):
        write_state(spark, str(tmp_path), "op", initial, key_columns=["key"])

    result = write_state(spark, str(tmp_path), "op", initial, key_columns=["key"], state_schema=Count,
                         num_partitions=3)

    assert (result.created, result.keys, result.num_partitions) == (True, 2, 3)
    assert abs(result.version - time.time() * 1000) < 60_000  # nothing ran there: the wall clock
    assert state_versions(str(tmp_path), "op") == [result.version]
    p = Pipeline(spark, tmp_path, start_ms=after_wall_clock(result.version)).start()
    try:
        assert p.batch([("a", 1), ("z", 1)]) == [{"key": "a", "count": 6}, {"key": "z", "count": 1}]
        assert p.batch([("b", 1)]) == [{"key": "b", "count": 2}]  # not called for b in the first batch
    finally:
        p.stop()


def test_seeding_a_location_from_another_pipelines_final_state(spark, tmp_path):
    source, seeded = tmp_path / "bounded", tmp_path / "streaming"
    last = run_two_batches(spark, source)

    result = write_state(spark, str(seeded), "op", read_state(spark, str(source), "op"), key_columns=["key"],
                         state_schema=Count)
    assert (result.created, result.keys) == (True, 3)
    assert state_of(spark, seeded) == state_of(spark, source)
    p = Pipeline(spark, seeded, start_ms=after_wall_clock(result.version)).start()
    try:
        assert p.batch([("a", 1), ("c", 1)]) == [{"key": "a", "count": 3}, {"key": "c", "count": 2}]
    finally:
        p.stop()

    # A new operator at a location where a pipeline ran: just above its last committed batch,
    # so that its restart (not only a fresh start) reads it.
    extra = write_state(spark, str(source), "op2", spark.createDataFrame([("x", 1, 1)], STATE),
                        key_columns=["key"], state_schema=Count)
    assert (extra.version, extra.created) == (last + 1, True)


def test_columns_that_do_not_fit_are_refused_naming_them_and_nothing_is_written(spark, tmp_path):
    location = str(tmp_path)
    write_state(spark, location, "op", spark.createDataFrame([("a", 1, 2)], STATE), key_columns=["key"],
                state_schema=Count, num_partitions=2)
    versions, before = state_versions(location, "op"), state_of(spark, tmp_path)
    good = read_state(spark, location, "op")

    cases = [
        (good.drop("total"), r"state field 'total' \(bigint\) is missing"),
        (good.withColumn("extra", F.lit(1)), r"column 'extra' is neither a key column \['key'\]"),
        (good.withColumn("count", F.col("count").cast("int")), r"state field 'count' is int .* but bigint"),
        (good.withColumn("key", F.lit(7)), r"key column 'key' is int in the DataFrame but string"),
        (good.withColumn("timeout_timestamp_ms", F.lit("soon")), r"'timeout_timestamp_ms' is string"),
    ]
    for df, message in cases:
        with pytest.raises(StateSchemaError, match=message):
            write_state(spark, location, "op", df)
    with pytest.raises(ConfigurationError, match=r"has key 'a' more than once.*dropDuplicates\(\['key'\]\)"):
        write_state(spark, location, "op", good.union(good))
    with pytest.raises(ConfigurationError, match=r"keyed by \['key'\], not \['id'\]"):
        write_state(spark, location, "op", good, key_columns=["id"])

    assert state_versions(location, "op") == versions
    assert state_of(spark, tmp_path) == before
    assert sorted(CheckpointStorage(location).list_names("state/op")) == ["_metadata.json", "g0"]

    # A migration: a field changes type, which schema evolution cannot read; rewriting it can.
    migrated = good.withColumn("total", F.col("total").cast("double"))
    write_state(spark, location, "op", migrated, state_schema="count long, total double")
    assert state_of(spark, tmp_path) == [("a", 1, 2.0, None)]
    assert FileStateStore.open(location, "op").read_metadata().state_schema.simpleString() == \
        "struct<count:bigint,total:double>"


def test_refused_while_a_driver_holds_the_location(spark, tmp_path):
    # On a manual clock ahead of the wall clock, so that the driver's lease is not expired for write_state.
    p = Pipeline(spark, tmp_path, start_ms=after_wall_clock(int(time.time() * 1000) + 3_600_000)).start()
    try:
        with pytest.raises(CheckpointLockedError, match="write_state works on a stopped pipeline: stop that driver"):
            write_state(spark, str(tmp_path), "op", spark.createDataFrame([("a", 1, 2)], STATE),
                        key_columns=["key"], state_schema=Count)
    finally:
        p.stop()
    assert CheckpointStorage(str(tmp_path)).list_names("state") == []


def crash_after_partitions_finished(spark, tmp_path):
    """A pipeline's last batch, then a crash in the next after both partitions finished:
    logged (with no input to replay), each partition's delta, output and finish record
    written, no commit marker. Returns (last committed, crashed batch, generation)."""
    location = str(tmp_path)
    p = Pipeline(spark, tmp_path, num_partitions=2).start()
    try:
        p.batch([("a", 1), ("b", 1)])
    finally:
        p.stop()
    last = p.batch_time
    crashed = last + 1000
    files = FileStateStore.open(location, "op")
    metadata = files.read_metadata()
    events = JobEventStore(CheckpointStorage(location))
    events.batch_started(crashed, {}, None)
    for partition in range(2):
        files.write_version(metadata.generation, FileHeader(crashed, partition, DELTA),
                            entries_table(metadata.key_schema, RowSchema.of(Count), iter([]), True))
        files.write_version(metadata.generation, FileHeader(crashed, partition, OUTPUT),
                            pa.table({"key": ["stale"], "count": pa.array([99], pa.int64())}))
        events.partition_finished(crashed, PartitionFinished("op", partition, metadata.generation, crashed, 1,
                                                               {"partitions": 1 << partition, "output_rows": 1}))
    return last, crashed, metadata.generation


def test_a_batch_logged_but_not_committed_reruns_whole_on_the_written_state(spark, tmp_path):
    location = str(tmp_path)
    last, crashed, generation = crash_after_partitions_finished(spark, tmp_path)
    events = JobEventStore(CheckpointStorage(location))
    fixed = read_state(spark, location, "op").withColumn("count", F.lit(7).cast("long"))
    result = write_state(spark, location, "op", fixed)

    assert result.version == last + 1  # below the batch that re-runs
    assert all(events.finished(crashed, "op", generation, partition) is None for partition in range(2))
    q = restarted(spark, tmp_path, crashed)  # the restart re-runs the crashed batch first
    try:
        q.recorder.wait_for_batch(crashed, 120)
        assert q.sink.batches.get(crashed, []) == []  # re-ran on the written state, not kept from before
        assert q.batch([("a", 1)]) == [{"key": "a", "count": 8}]
    finally:
        q.stop()
