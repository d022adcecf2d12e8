"""Each batch reads its input once (issue 17): no job of the file source's own, its lines
counted by the job that consumes them, exactly once, with two outputs, under a Spark task
retry and under batchline's batch retry; the JSON fast path gives the same rows and reasons."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from batchline import BatchFailedError, StreamingContext
from batchline.clock import ManualClock
from batchline.scheduler.listener import BatchInfo, StreamingListener
from batchline.scheduler.retry import RetryPolicy
from batchline.sources import parsing
from batchline.state import GroupStateTimeout, read_state
from batchline.testing import BatchRecorder, CollectSink
from tests.helpers import DRIVERS, ROOT, Count, poll_until, running_count

SCHEMA = StructType([StructField("key", StringType(), False), StructField("value", IntegerType(), True)])
START, INTERVAL = 100_000, 1000
GOOD, BAD = 40, 3


def write_batch_file(directory: Path, index: int) -> None:
    """``GOOD`` good lines over 5 keys and ``BAD`` bad ones (malformed, wrong type, no key)."""
    lines = [json.dumps({"key": f"k{i % 5}", "value": index * 100 + i}) for i in range(GOOD)]
    lines += ["not json", json.dumps({"key": "k1", "value": "seven"}), json.dumps({"value": 3})]
    (directory / f"batch-{index:03d}.json").write_text("\n".join(lines) + "\n")


class AdvanceOnRetry(StreamingListener):
    """Moves the manual clock past a retry's backoff, which waits on it."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def on_batch_retrying(self, info: BatchInfo) -> None:
        self.clock.advance(100)


def run_batches(spark, tmp_path, n, build, **context):
    """``n`` batches of one file each on a manual clock; the recorder and the context."""
    incoming = tmp_path / "in"
    incoming.mkdir()
    for i in range(n):
        write_batch_file(incoming, i)
    clock = ManualClock(START)
    ssc = StreamingContext(spark, INTERVAL / 1000, clock=clock, checkpoint=str(tmp_path / "checkpoint"), **context)
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    ssc.add_listener(AdvanceOnRetry(clock))
    stream = ssc.file_stream(str(incoming), "json", SCHEMA, settle=0, max_files_per_batch=1)
    build(stream)
    ssc.start()
    try:
        for i in range(n):
            clock.advance(INTERVAL)
            info = recorder.wait_for_batch(START + (i + 1) * INTERVAL, 120)
            assert info.failure is None, info.failure
    finally:
        ssc.stop()
    return recorder, ssc


def test_a_stateful_batch_runs_no_job_of_the_source_and_counts_what_its_jobs_read(spark, tmp_path):
    out = tmp_path / "out"

    def build(stream):
        stream.group_by_key("key").flat_map_groups_with_state(
            running_count, state_schema=Count, output_schema="key string, count long", name="counts",
            num_partitions=2, timeout=GroupStateTimeout.NO_TIMEOUT).write_files(str(out), "parquet", name="out")
        stream.dead_letters.write_files(str(tmp_path / "dead"), "json", name="dead")

    recorder, ssc = run_batches(spark, tmp_path, 3, build)
    tracker = spark.sparkContext.statusTracker()
    prefix = ssc.job_group_prefix
    for info in recorder.completed:
        if not info.num_records:
            continue
        jobs = tracker.getJobIdsForGroup(f"{prefix}-{info.batch_time}")
        # One job per output, the state operator's work inside its only output's job; none
        # reads the files just to count.
        assert len(jobs) == 2, (info.batch_time, sorted(jobs))
        assert (info.num_records, info.dead_letters) == (GOOD, BAD)
        written = pq.read_table(out / f"batch_time={info.batch_time}").num_rows
        dead = sum(1 for part in (tmp_path / "dead" / f"batch_time={info.batch_time}").glob("part-*")
                   for _ in part.read_text().splitlines())
        assert (written, dead) == (5, BAD)  # one row per key called


def test_two_outputs_on_one_stream_count_each_line_once(spark, tmp_path):
    first, second = CollectSink(), CollectSink()

    def build(stream):
        stream.foreach_batch(first, name="first")
        stream.where("value % 2 = 0").foreach_batch(second, name="second")

    recorder, _ = run_batches(spark, tmp_path, 2, build)
    with_data = [info for info in recorder.completed if info.num_records]
    assert [(i.num_records, i.dead_letters) for i in with_data] == [(GOOD, BAD)] * 2
    assert [len(first.batches[i.batch_time]) for i in with_data] == [GOOD] * 2
    assert [len(second.batches[i.batch_time]) for i in with_data] == [GOOD // 2] * 2


def test_a_batch_retried_by_batchline_counts_its_lines_once(spark, tmp_path):
    failed = []

    def flaky(df, batch_time):
        df.count()
        if not failed:
            failed.append(batch_time)
            raise RuntimeError("injected: the output fails once after reading every row")

    recorder, _ = run_batches(spark, tmp_path, 2, lambda stream: stream.foreach_batch(flaky, name="flaky"),
                              retry=RetryPolicy(max_attempts=3, initial_backoff="10ms"))
    with_data = [info for info in recorder.completed if info.num_records]
    assert [(i.num_records, i.dead_letters, i.attempts) for i in with_data] == [(GOOD, BAD, 2), (GOOD, BAD, 1)]


def test_a_console_output_alone_still_counts_every_line(spark, tmp_path, capsys):
    recorder, _ = run_batches(spark, tmp_path, 1, lambda stream: stream.console(num_rows=2))
    (info,) = [info for info in recorder.completed if info.num_records]
    assert (info.num_records, info.dead_letters) == (GOOD, BAD)
    assert "only showing top 2 rows" in capsys.readouterr().out


@pytest.mark.spark
def test_a_spark_task_retry_counts_its_lines_once(tmp_path):
    """On ``local[2,2]`` Spark retries a failed task itself: the first attempt of a task that
    reads the file fails after reading, and the counts stay exact."""
    incoming = tmp_path / "in"
    incoming.mkdir()
    for i in range(2):
        write_batch_file(incoming, i)
    driver = DRIVERS / "task_retry_driver.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(driver), str(incoming), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["failed_attempts"] == 1, result
    assert result["counts"] == [[GOOD, BAD]] * 2, result
    assert result["rows"] == [GOOD] * 2, result


# -------------------------------------------------------------------- the JSON fast path
ZOO = [
    '{"key": "a", "value": 1}', '{"key": "a", "value": "1"}', '{"key": "a", "value": 1.5}', '{"value": 1}',
    '{"key": null}', '42', '[1,2]', '"text"', 'null', '{"key": "a",', 'garbage', '{}', '{"KEY": "a"}',
    '{"key": "a", "value": 99999999999}', '{"key": "a", "extra": [1]}', '{"key": {"nested": 1}}',
    '  {"key": "b"}  ', '{"key": "a", "key": "b"}', '{"key": "a"} trailing',
]


def slow_path_reason(line):
    """The reasons the slow path alone names, the way the dead letters named them before."""
    try:
        value = json.loads(line)
    except ValueError:
        return "malformed JSON: not one JSON object per line"
    if not isinstance(value, dict):
        return "malformed JSON: not one JSON object per line"
    return None


def test_the_json_fast_path_flags_exactly_the_lines_the_reasons_name(spark):
    lines = spark.createDataFrame([(line,) for line in ZOO], "value string")
    parsed = parsing.json_parser(SCHEMA).parse(lines.selectExpr("value", "named_struct('file_path', 'f') AS _metadata"))
    rows = {r[parsing.RAW]: r for r in parsed.collect()}
    assert set(rows) == set(ZOO)
    for line, row in rows.items():
        assert row[parsing.OK] == (row[parsing.REASON] is None), line
        if slow_path_reason(line) is not None and line != '{"key": "a"} trailing':
            assert row[parsing.REASON] == slow_path_reason(line), line
    good = sorted(line for line, row in rows.items() if row[parsing.OK])
    assert good == sorted(['{"key": "a", "value": 1}', '{"key": "a", "extra": [1]}', '{"key": {"nested": 1}}',
                           '  {"key": "b"}  ', '{"key": "a", "key": "b"}', '{"key": "a"} trailing'])
    assert rows['{"key": "a", "value": "1"}'][parsing.REASON] == "field 'value': expected int, got 1"
    assert rows['{"value": 1}'][parsing.REASON] == "field 'key' is required but missing or null"
    assert rows['{"key": "a", "value": 1}']["value"] == 1


# -------------------------------------------------------------------- a re-run shuffles only what it re-runs
RERUN_PARTITIONS, USERS = 8, 64


def test_the_filter_places_keys_as_spark_s_hash_partitioning_does(spark):
    from pyspark.sql import functions as F

    df = spark.range(0, 5000).selectExpr("id AS user", "cast(id AS string) AS name")
    placed = df.repartition(RERUN_PARTITIONS, "user", "name").select(
        "user", F.spark_partition_id().alias("spark"),
        F.pmod(F.hash("user", "name"), F.lit(RERUN_PARTITIONS)).alias("ours"))
    assert placed.where("spark != ours").count() == 0
    assert placed.select("spark").distinct().count() == RERUN_PARTITIONS


def shuffle_writes(spark, group: str) -> list[int]:
    """Rows each stage of a job group's jobs wrote to a shuffle, for the stages that wrote any."""
    store = spark.sparkContext._jsc.sc().statusStore()
    tracker = spark.sparkContext.statusTracker()
    stages = {stage for job in tracker.getJobIdsForGroup(group) for stage in tracker.getJobInfo(job).stageIds}
    return sorted(n for n in (store.lastStageAttempt(stage).shuffleWriteRecords() for stage in stages) if n)


def failing_once(checkpoint: str, marker: str, bad_user: int):
    """A running count; in the second batch the call for ``bad_user`` waits until the other
    partitions recorded their finish, then raises (once)."""

    def fn(user, rows, state):
        count = (state.get()[0] if state.exists else 0) + sum(1 for _ in rows)
        if user == bad_user and state.exists and not os.path.exists(marker):
            batch_dir = os.path.join(checkpoint, "events", f"{state.current_processing_time_ms():015d}")
            poll_until(lambda: os.path.isdir(batch_dir) and sum(
                n.startswith("finished-counts-") for n in os.listdir(batch_dir)) >= RERUN_PARTITIONS - 1, 60, 0.05)
            open(marker, "w").close()
            raise RuntimeError("injected failure after the other partitions finished")
        state.update((count,))
        yield (user, count)

    return fn


def test_a_rerun_batch_shuffles_only_the_rows_of_the_partitions_it_reruns(spark, tmp_path):
    from batchline.testing import END, list_stream

    checkpoint, marker = str(tmp_path / "checkpoint"), str(tmp_path / "failed")
    batches = [[(u, 1) for u in range(USERS)], [(u, 2) for u in range(USERS) for _ in range(3)], END]

    def start(fn, start_ms):
        clock = ManualClock(start_ms)
        ssc = StreamingContext(spark, INTERVAL / 1000, clock=clock, checkpoint=checkpoint)
        recorder, sink = BatchRecorder(), CollectSink()
        ssc.add_listener(recorder)
        list_stream(ssc, batches, "user long, n long", bounded=True).group_by_key("user").flat_map_groups_with_state(
            fn, state_schema="count long", output_schema="user long, count long", name="counts",
            num_partitions=RERUN_PARTITIONS).foreach_batch(sink)
        ssc.start()
        return ssc, clock, recorder, sink

    ssc, clock, recorder, _ = start(failing_once(checkpoint, marker, bad_user=13), START)
    try:
        clock.advance(INTERVAL)
        recorder.wait_for_batch(START + INTERVAL, 120)
        clock.advance(INTERVAL)
        with pytest.raises(BatchFailedError, match="injected failure"):
            ssc.await_termination(120)
    finally:
        ssc.stop()
    failed = START + 2 * INTERVAL

    def fixed(user, rows, state):
        count = (state.get()[0] if state.exists else 0) + sum(1 for _ in rows)
        state.update((count,))
        yield (user, count)

    ssc, clock, recorder, sink = start(fixed, failed)
    try:
        info = recorder.wait_for_batch(failed, 120)
        shuffled = shuffle_writes(spark, f"{ssc.job_group_prefix}-{failed}")
    finally:
        ssc.stop()
    assert info.failure is None, info.failure
    progress = info.state_operators["counts"]
    assert progress.partitions_kept == RERUN_PARTITIONS - 1
    assert progress.rerun_note is not None and "left out of the state shuffle" in progress.rerun_note
    # Into the state shuffle: the three rows of each user in user 13's partition, no others, and
    # one marker row per state partition (the operator runs inside its only output's job: there
    # is no count of its own).
    from pyspark.sql import functions as F
    users = spark.range(USERS).withColumnRenamed("id", "user")
    placed = users.select("user", F.pmod(F.hash("user"), F.lit(RERUN_PARTITIONS)).alias("p"))
    rerun = placed.where(f"p = {placed.where('user = 13').first()['p']}").count()
    assert shuffled == [3 * rerun + RERUN_PARTITIONS], (shuffled, rerun)
    assert progress.input_rows == 3 * USERS  # the kept partitions' rows come from their finish records
    assert sorted((r["user"], r["count"]) for r in sink.batches[failed]) == [(u, 4) for u in range(USERS)]
    state = {r["user"]: r["count"] for r in read_state(spark, checkpoint, "counts").collect()}
    assert state == {u: 4 for u in range(USERS)}
