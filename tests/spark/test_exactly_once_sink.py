"""``ExactlyOnceSink``, the engine side of the tasks-stage/driver-commits shape: a committed
batch is skipped without computing it, messages reach ``commit`` once in partition order, a
failed task or an empty batch aborts, a failed commit runs the batch again and writes it once."""

import json
import os

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from batchline import BatchContext, BatchTime, ExactlyOnceSink, PendingCommit, RetryPolicy, StreamingContext
from batchline.testing import END, list_stream

ROWS = StructType([StructField("key", StringType(), False), StructField("value", LongType(), True)])


class StagedFiles(ExactlyOnceSink):
    """Tasks stage JSON files; a commit record per batch names them. The driver's copy notes
    every commit and abort (the tasks get copies of their own)."""

    def __init__(self, directory, fail_commits=0):
        self.directory = str(directory)
        self.fail_commits = fail_commits
        self.commits, self.aborts = [], []

    def _record(self, batch_time):
        return os.path.join(self.directory, "commits", f"{int(batch_time)}.json")

    def is_committed(self, batch):
        return os.path.exists(self._record(batch.batch_time))

    def write_partition(self, rows, attempt, partition):
        name = os.path.join(self.directory, "staged", f"{attempt.id}-{partition}.json")
        os.makedirs(os.path.dirname(name), exist_ok=True)
        values = [row for batch in rows for row in batch.to_pylist()]
        with open(name, "w") as out:
            json.dump(values, out)
        return {"partition": partition, "file": name, "rows": len(values)}

    def commit(self, messages, attempt):
        self.commits.append((attempt.batch_time, messages))
        if self.fail_commits:
            self.fail_commits -= 1
            raise OSError("the commit failed")
        os.makedirs(os.path.dirname(self._record(attempt.batch_time)), exist_ok=True)
        with open(self._record(attempt.batch_time), "x") as out:
            json.dump([m["file"] for m in messages], out)

    def abort(self, messages, attempt):
        self.aborts.append((attempt.batch_time, messages))


def committed(directory):
    rows = []
    for name in sorted(os.listdir(os.path.join(directory, "commits"))):
        with open(os.path.join(directory, "commits", name)) as record:
            for file in json.load(record):
                with open(file) as staged:
                    rows += [tuple(row.values()) for row in json.load(staged)]
    return sorted(rows)


def batch(time_ms):
    return BatchContext(BatchTime(time_ms), "out", "p", 1)


def taken(pending):
    assert isinstance(pending, PendingCommit)
    pending.commit()


def test_messages_reach_commit_once_in_partition_order_and_a_committed_batch_is_not_computed(spark, tmp_path):
    sink = StagedFiles(tmp_path)
    df = spark.createDataFrame([("a", 1), ("b", 2), ("c", 3)], ROWS).repartition(6)
    taken(sink.write(df, batch(1000)))
    (time_ms, messages), = sink.commits
    assert time_ms == 1000 and sum(m["rows"] for m in messages) == 3
    partitions = [m["partition"] for m in messages]
    assert partitions == sorted(partitions) and len(partitions) <= 3  # empty partitions send no message
    never = spark.range(0, 1).select(F.raise_error("must not be computed").alias("key"))
    assert sink.write(never, batch(1000)) is None
    assert len(sink.commits) == 1 and sink.newest_commit == 1000
    assert sink.last_commit() == {"batch_time": 1000}
    assert committed(tmp_path) == [("a", 1), ("b", 2), ("c", 3)]


def test_a_failed_task_aborts_the_attempt_and_fails_the_batch(spark, tmp_path):
    sink = StagedFiles(tmp_path)
    bad = spark.range(0, 4).select(F.when(F.col("id") == 3, F.raise_error("boom")).otherwise("k").alias("key"),
                                   F.col("id").alias("value"))
    with pytest.raises(Exception, match="boom"):
        sink.write(bad, batch(1000))
    assert sink.commits == [] and sink.aborts == [(1000, [])]
    assert not sink.is_committed(batch(1000))


def test_a_batch_without_rows_aborts_and_commits_nothing(spark, tmp_path):
    sink = StagedFiles(tmp_path)
    assert sink.write(spark.createDataFrame([], ROWS), batch(1000)) is None
    assert sink.commits == [] and sink.aborts == [(1000, [])]


def test_an_abandoned_commit_aborts_with_the_tasks_messages(spark, tmp_path):
    sink = StagedFiles(tmp_path)
    pending = sink.write(spark.createDataFrame([("a", 1)], ROWS), batch(1000))
    pending.abandon()
    assert sink.commits == [] and [m["rows"] for m in sink.aborts[0][1]] == [1]
    assert sink.newest_commit is None


def test_a_sink_that_commits_in_write_returns_no_pending_commit(spark, tmp_path):
    class InWrite(StagedFiles):
        commit_after_jobs = False

    sink = InWrite(tmp_path)
    assert sink.write(spark.createDataFrame([("a", 1)], ROWS), batch(1000)) is None
    assert sink.is_committed(batch(1000)) and sink.newest_commit == 1000


def test_a_commit_that_fails_once_runs_the_batch_again_and_writes_it_once(spark, tmp_path):
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "checkpoint"),
                           retry=RetryPolicy(max_attempts=3, initial_backoff="100ms"))
    sink = StagedFiles(tmp_path / "out", fail_commits=1)
    list_stream(ssc, [[("a", 1), ("b", 2)], [("c", 3)], END], ROWS, bounded=True).write(sink, name="out")
    assert ssc.run_until_finished(120)
    assert committed(tmp_path / "out") == [("a", 1), ("b", 2), ("c", 3)]
    failed, retried = sink.commits[0], sink.commits[1]
    assert failed[0] == retried[0], "the failed batch's commit is taken again, after its tasks ran again"
    assert failed[1] != retried[1], "the retry staged anew"
    assert len(sink.commits) == 3


class NotingAttempts(StagedFiles):
    """Notes, for every call of ``write``, the batch and whether it was its first attempt."""

    def __init__(self, directory, fail_commits=0):
        super().__init__(directory, fail_commits)
        self.calls = []

    def write(self, df, batch):
        self.calls.append((int(batch.batch_time), batch.first_attempt))
        return super().write(df, batch)


def test_only_a_batch_this_driver_logged_is_a_first_attempt_and_only_at_its_first_write(spark, tmp_path):
    """A batch's first write is its first attempt; its retry is not, nor a restart's re-run of
    a batch an earlier driver logged. Batches the restarted driver logs itself are again."""
    checkpoint = tmp_path / "checkpoint"
    ssc = StreamingContext(spark, "200ms", checkpoint=str(checkpoint),
                           retry=RetryPolicy(max_attempts=2, initial_backoff="10ms"))
    failing = NotingAttempts(tmp_path / "out", fail_commits=1_000)
    list_stream(ssc, [[("a", 1)], [("b", 2)], END], ROWS, bounded=True).write(failing, name="out")
    with pytest.raises(Exception, match="the commit failed"):
        ssc.run_until_finished(120)
    ssc.stop()
    for batch_time in {t for t, _ in failing.calls}:
        assert [first for t, first in failing.calls if t == batch_time] in ([True], [True, False])
    assert (failing.calls[0][0], False) in failing.calls  # the first batch was retried
    logged = {int(name) for name in os.listdir(checkpoint / "events") if name.isdigit()}

    ssc = StreamingContext(spark, "200ms", checkpoint=str(checkpoint))
    sink = NotingAttempts(tmp_path / "out")
    list_stream(ssc, [[("a", 1)], [("b", 2)], [("c", 3)], END], ROWS, bounded=True).write(sink, name="out")
    assert ssc.run_until_finished(120)
    assert committed(tmp_path / "out") == [("a", 1), ("b", 2), ("c", 3)]
    rerun = [first for t, first in sink.calls if t in logged]
    fresh = [first for t, first in sink.calls if t not in logged]
    assert rerun and not any(rerun)  # re-runs of what the first driver logged
    assert fresh and all(fresh)  # logged by this driver, each written once
