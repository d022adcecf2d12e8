"""A stateful operator read by one output only runs inside that output's Spark job (issue 17):
one job per batch; and whatever the output does with its DataFrame (reads every row, some
rows, none, on another thread), every partition's function runs once per batch."""

import dataclasses
import os
import threading

import pyarrow as pa
import pytest
from pyspark import InheritableThread

from batchline import ExactlyOnceSink, StreamingContext
from batchline.clock import ManualClock
from batchline.scheduler.listener import BatchInfo, StreamingListener
from batchline.scheduler.retry import RetryPolicy
from batchline.sinks.files import FileSink
from batchline.state import read_state
from batchline.testing import BatchRecorder, CollectSink, list_stream

START, INTERVAL, PARTITIONS = 100_000, 1000, 3
BATCHES = [[(f"k{i % 7}", 1) for i in range(30)], [(f"k{i % 5}", 1) for i in range(10)]]
EXPECTED = {f"k{i}": (30 // 7 + (i < 30 % 7)) + (2 if i < 5 else 0) for i in range(7)}


def count_rows(key, rows, state):
    count = (state.get()[0] if state.exists else 0) + sum(1 for _ in rows)
    state.update((count,))
    yield (key, count)


class _AdvanceOnRetry(StreamingListener):
    """Moves the manual clock past a retry's backoff, which waits on it."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def on_batch_retrying(self, info: BatchInfo) -> None:
        self.clock.advance(10_000)


def run(spark, tmp_path, build_outputs, batches=BATCHES, fn=count_rows, **context):
    """``len(batches)`` batches of the running count, outputs built by ``build_outputs(stream)``;
    returns the recorder, the context and the checkpoint."""
    checkpoint = str(tmp_path / "checkpoint")
    clock = ManualClock(START)
    ssc = StreamingContext(spark, INTERVAL / 1000, clock=clock, checkpoint=checkpoint, **context)
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    ssc.add_listener(_AdvanceOnRetry(clock))
    counts = list_stream(ssc, batches, "key string, n long").group_by_key("key").flat_map_groups_with_state(
        fn, state_schema="count long", output_schema="key string, count long", name="counts",
        num_partitions=PARTITIONS)
    build_outputs(counts)
    ssc.start()
    try:
        for i in range(len(batches)):
            clock.advance(INTERVAL)
            recorder.wait_for_batch(START + (i + 1) * INTERVAL, 120)
    finally:
        ssc.stop()
    return recorder, ssc, checkpoint


def jobs_of(spark, ssc, batch_time: int) -> list[int]:
    prefix = ssc.job_group_prefix
    return spark.sparkContext.statusTracker().getJobIdsForGroup(f"{prefix}-{batch_time}")


def state_of(spark, checkpoint: str) -> dict[str, int]:
    return {r["key"]: r["count"] for r in read_state(spark, checkpoint, "counts").collect()}


def test_one_output_one_job_two_outputs_a_job_of_the_operator_s_own(spark, tmp_path):
    one = CollectSink()
    recorder, ssc, checkpoint = run(spark, tmp_path, lambda counts: counts.foreach_batch(one, name="one"))
    for info in recorder.completed:
        assert info.failure is None, info.failure
        assert len(jobs_of(spark, ssc, info.batch_time)) == 1  # read, shuffle, state and output in one job
        assert info.state_operators["counts"].keys_called == len({k for k, _ in BATCHES[info.batch_time // INTERVAL
                                                                                       - START // INTERVAL - 1]})
    assert sorted((r["key"], r["count"]) for r in one.batches[START + 2 * INTERVAL]) == [
        (f"k{i}", EXPECTED[f"k{i}"]) for i in range(5)]
    assert state_of(spark, checkpoint) == EXPECTED

    first, second = CollectSink(), CollectSink()

    def two(counts):
        counts.foreach_batch(first, name="first")
        counts.foreach_batch(second, name="second")

    recorder, ssc, checkpoint = run(spark, tmp_path / "two", two)
    for info in recorder.completed:
        assert len(jobs_of(spark, ssc, info.batch_time)) == 3  # the operator's job, then one per output
    assert first.batches == second.batches
    assert state_of(spark, checkpoint) == EXPECTED


@pytest.mark.parametrize("reads", ["nothing", "one row"])
def test_an_output_that_reads_few_rows_or_none_still_runs_every_partition_once(spark, tmp_path, reads):
    def output(df, batch_time):
        if reads == "one row":
            df.limit(1).collect()

    recorder, _, checkpoint = run(spark, tmp_path, lambda counts: counts.foreach_batch(output, name="out"))
    for info, batch in zip(recorder.completed, BATCHES, strict=True):
        assert info.failure is None, info.failure
        progress = info.state_operators["counts"]
        assert (progress.input_rows, progress.keys_called) == (len(batch), len({k for k, _ in batch}))
    assert state_of(spark, checkpoint) == EXPECTED


def test_a_thread_of_the_output_s_own_must_carry_the_batch_s_parameters(spark, tmp_path):
    seen: list[int] = []

    def inheritable(df, batch_time):
        worker = InheritableThread(target=lambda: seen.append(df.count()))
        worker.start()
        worker.join()

    recorder, _, checkpoint = run(spark, tmp_path, lambda counts: counts.foreach_batch(inheritable, name="out"))
    assert seen == [7, 5]
    assert state_of(spark, checkpoint) == EXPECTED

    errors: list[BaseException] = []

    def plain(df, batch_time):
        def count() -> None:
            try:
                df.count()
            except BaseException as error:  # noqa: BLE001 - handed to the output's thread
                errors.append(error)

        worker = threading.Thread(target=count)
        worker.start()
        worker.join()
        raise errors[0]

    # Not retried: the same code fails the same way.
    recorder, _, _ = run(spark, tmp_path / "plain", lambda counts: counts.foreach_batch(plain, name="out"),
                         batches=BATCHES[:1])
    (failed,) = recorder.completed
    assert failed.attempts == 1
    assert failed.failure is not None and "pyspark.InheritableThread" in failed.failure, failed.failure


def test_a_write_that_fails_after_the_operator_s_part_is_retried_and_the_partition_kept(spark, tmp_path):
    """The output's own task code fails once in one partition, after that partition's state
    function ran inside the same task (its rows cached, its finish recorded): the retry reads
    the cached rows without running the function again, and the batch commits exactly."""
    marker = str(tmp_path / "failed-once")
    written: dict[int, list[tuple[str, int]]] = {}

    def writer(batches):
        from pyspark import TaskContext

        rows = [row for batch in batches for row in zip(*[c.to_pylist() for c in batch.columns], strict=True)]
        if TaskContext.get().partitionId() == 0 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("injected: the write fails after the partition's state function ran")
        yield pa.RecordBatch.from_pylist([{"key": k, "count": c} for k, c in rows],
                                         schema=pa.schema([("key", pa.string()), ("count", pa.int64())]))

    def output(df, batch_time):
        written[batch_time] = [(r["key"], r["count"]) for r in df.mapInArrow(writer, "key string, count long")
                               .collect()]

    recorder, _, checkpoint = run(spark, tmp_path, lambda counts: counts.foreach_batch(output, name="out"),
                                  retry=RetryPolicy(max_attempts=3, initial_backoff="10ms"))
    assert os.path.exists(marker)
    first, second = (recorder.wait_for_batch(START + i * INTERVAL) for i in (1, 2))
    assert (first.failure, first.attempts, second.failure, second.attempts) == (None, 2, None, 1)
    progress = first.state_operators["counts"]
    assert (progress.input_rows, progress.keys_called) == (30, 7)
    assert sorted(written[first.batch_time]) == sorted((f"k{i}", 30 // 7 + (i < 30 % 7)) for i in range(7))
    assert state_of(spark, checkpoint) == EXPECTED


def _coalesced(df, batch_time):
    return df.coalesce(1).collect()


def _coalesced_to_two(df, batch_time):
    return df.coalesce(2).collect()


def _after_another_frame(df, batch_time):
    other = df.sparkSession.range(0, 4, 1, 2).selectExpr("concat('other', id) AS key", "-1L AS count")
    return [row for row in other.unionByName(df).collect() if row["count"] >= 0]


@pytest.mark.parametrize("combine", [_coalesced, _coalesced_to_two, _after_another_frame],
                         ids=["coalesce(1)", "coalesce(2)", "union after another frame"])
def test_an_output_that_coalesces_or_unions_the_frame_runs_each_partition_as_itself(spark, tmp_path, combine):
    """The output's job runs the operator's partitions under other task numbers: several in one
    task (coalesce), or numbered after another frame's (union). Each partition still runs as
    itself, once: every key's count is exact, and each key is in one state partition."""
    seen: dict[int, list[tuple[str, int]]] = {}
    calls = tmp_path / "calls"
    calls.mkdir()

    def output(df, batch_time):
        seen[batch_time] = sorted((r["key"], r["count"]) for r in combine(df, batch_time))

    def counting_where_it_runs(key, rows, state):
        from pyspark import TaskContext

        with open(calls / f"{os.getpid()}-{threading.get_ident()}", "a") as log:
            log.write(f"{key} {TaskContext.get().partitionId()}\n")
        yield from count_rows(key, rows, state)

    recorder, _, checkpoint = run(spark, tmp_path, lambda counts: counts.foreach_batch(output, name="out"),
                                  fn=counting_where_it_runs)
    for info, batch in zip(recorder.completed, BATCHES, strict=True):
        assert info.failure is None, info.failure
        progress = info.state_operators["counts"]
        assert (progress.input_rows, progress.keys_called) == (len(batch), len({k for k, _ in batch}))
    assert seen[START + 2 * INTERVAL] == [(f"k{i}", EXPECTED[f"k{i}"]) for i in range(5)]
    rows = read_state(spark, checkpoint, "counts").collect()
    assert sorted((r["key"], r["count"]) for r in rows) == sorted(EXPECTED.items())  # each key once
    # The case under test happened: some key's function ran in a task numbered other than its partition.
    values = ", ".join(f"('{k}')" for k in EXPECTED)
    placed = {r["key"]: r["p"] for r in spark.sql(
        f"SELECT key, pmod(hash(key), {PARTITIONS}) AS p FROM VALUES {values} AS t(key)").collect()}
    ran_in = [line.split() for f in calls.iterdir() for line in f.read_text().splitlines()]
    assert any(int(task) != placed[key] for key, task in ran_in), ran_in


class _PlanRecordingFileSink(FileSink):
    """A file sink that keeps the logical plan of each batch's write."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.plans: list[str] = []

    def write(self, df, batch):
        mapper = batch.arrow_mapper

        def recorded(frame, fn, schema):
            written = mapper(frame, fn, schema)
            self.plans.append(written._jdf.queryExecution().analyzed().toString())
            return written

        return super().write(df, dataclasses.replace(batch, arrow_mapper=recorded))


def test_a_sink_that_reads_once_gets_the_rows_in_the_state_tasks_without_a_cache(spark, tmp_path):
    files = _PlanRecordingFileSink(str(tmp_path / "out"))
    recorder, _, checkpoint = run(spark, tmp_path, lambda counts: counts.write(files, name="files"))
    assert all(info.failure is None for info in recorder.completed)
    assert len(files.plans) == len(BATCHES)
    for plan in files.plans:
        # The state task and the write in one Python function over the shuffled rows.
        assert plan.count("MapInArrow") == 1, plan
        assert "InMemoryRelation" not in plan, plan
    written = spark.read.parquet(str(tmp_path / "out")).collect()
    assert max(r["count"] for r in written if r["key"] == "k0") == EXPECTED["k0"]
    assert state_of(spark, checkpoint) == EXPECTED


def test_a_function_that_may_read_twice_gets_the_cached_rows(spark, tmp_path):
    cached = []

    def twice(df, batch_time):
        cached.append(df.is_cached)
        df.count()
        df.collect()

    recorder, _, checkpoint = run(spark, tmp_path, lambda counts: counts.foreach_batch(twice, name="twice"))
    assert all(info.failure is None for info in recorder.completed)
    assert cached == [True] * len(BATCHES)
    assert state_of(spark, checkpoint) == EXPECTED


class _FailsOnceAfterTheState(ExactlyOnceSink):
    """A sink that evaluates once, whose partition 0 write of the first batch fails once,
    after the state function ran in its task."""

    def __init__(self, directory) -> None:
        self.directory = str(directory)

    def is_committed(self, batch):
        return os.path.exists(os.path.join(self.directory, f"committed-{batch.batch_time}"))

    def write_partition(self, rows, attempt, partition):
        values = [row for batch in rows for row in batch.to_pylist()]
        marker = os.path.join(self.directory, "failed-once")
        if partition == 0 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("injected: the write fails after the partition's state function ran")
        return {"rows": values}

    def commit(self, messages, attempt):
        with open(os.path.join(self.directory, f"committed-{attempt.batch_time}"), "w") as out:
            out.write(repr(sorted((r["key"], r["count"]) for m in messages for r in m["rows"])))


def test_a_retried_write_of_a_sink_that_evaluates_once_keeps_what_the_failed_attempt_finished(spark, tmp_path):
    """The operator runs inside the write's tasks (its rows are not cached). The write fails
    in one partition after every partition's function ran: the retry's tasks find what the
    failed attempt's partitions finished and keep it, so each key's function runs once a batch."""
    (tmp_path / "sink").mkdir()
    calls = tmp_path / "calls"
    calls.mkdir()

    def counted(key, rows, state):
        with open(calls / f"{os.getpid()}-{threading.get_ident()}", "a") as log:
            log.write(f"{key}\n")
        yield from count_rows(key, rows, state)

    recorder, _, checkpoint = run(spark, tmp_path, lambda counts: counts.write(_FailsOnceAfterTheState(
        tmp_path / "sink"), name="out"), fn=counted, retry=RetryPolicy(max_attempts=3, initial_backoff="10ms"))
    first, second = (recorder.wait_for_batch(START + i * INTERVAL) for i in (1, 2))
    assert (first.failure, first.attempts, second.failure, second.attempts) == (None, 2, None, 1)
    called = [line for f in calls.iterdir() for line in f.read_text().split()]
    assert len(called) == len(EXPECTED) + 5  # the first batch's 7 keys and the second's 5, each once
    assert (tmp_path / "sink" / f"committed-{first.batch_time}").read_text() == repr(
        sorted((f"k{i}", 30 // 7 + (i < 30 % 7)) for i in range(7)))
    assert state_of(spark, checkpoint) == EXPECTED
