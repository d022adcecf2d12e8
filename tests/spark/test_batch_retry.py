"""A failing batch is retried with exponential backoff on the clock; past the limit the
pipeline stops with the batch uncommitted, and a restart runs it again (SPEC H3).

Everything runs on a manual clock: the tests see each backoff wait the moment the job thread
starts it, check its length, and move the clock by exactly that much.
"""

import logging
import threading

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql.types import LongType, StringType, StructField, StructType

from batchline import BatchFailedError, ConfigurationError, StreamingContext
from batchline.checkpoint.lease import FencedError
from batchline.clock import ManualClock
from batchline.scheduler.retry import RetryPolicy, is_deterministic
from batchline.state import StateFunctionError, read_state
from batchline.testing import BatchRecorder, CollectSink
from tests.helpers import Count, LogWatcher, drive_until_done, running_count

SCHEDULER = "batchline.scheduler.job_scheduler"
BATCH_RUN = "batchline.scheduler.batch_run"
"""Where a batch says it retries, runs again or was cancelled."""
SCHEMA = StructType([StructField("n", LongType(), False)])
KEYED = StructType([StructField("key", StringType()), StructField("value", LongType())])
MINUTE = 60_000
BATCH = 60_000  # the first batch of a one-minute interval started at 10.5 s
BATCH_TEXT = "1970-01-01T00:01:00.000Z (60000 ms)"


class RecordingClock(ManualClock):
    """A manual clock that also records every wait a batch's job thread starts (a backoff)."""

    def __init__(self, start_ms: int) -> None:
        super().__init__(start_ms)
        self.backoffs: list[tuple[int, int]] = []
        self._recorded = threading.Condition()

    def wait_until(self, target_ms, *args, **kwargs):
        if threading.current_thread().name.startswith("batchline-job"):
            with self._recorded:
                self.backoffs.append((self.now_ms(), target_ms))
                self._recorded.notify_all()
        return super().wait_until(target_ms, *args, **kwargs)

    def next_backoff(self, number: int, timeout: float = 60) -> int:
        """The length of backoff ``number`` (1-based), once the job thread waits on it."""
        with self._recorded:
            if not self._recorded.wait_for(lambda: len(self.backoffs) >= number, timeout):
                raise TimeoutError(f"no backoff number {number} within {timeout} s; waits so far: {self.backoffs}")
            start, target = self.backoffs[number - 1]
        return target - start


class RetryRecorder(BatchRecorder):
    def __init__(self) -> None:
        super().__init__()
        self.retrying = []

    def on_batch_retrying(self, info):
        self.retrying.append(info)


class Flaky:
    """An output that fails its first ``failures`` calls, then keeps each batch's rows, once per call."""

    def __init__(self, failures: int, error=ConnectionError("the database did not answer")) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0
        self.delivered: list[tuple[int, list[int]]] = []

    def __call__(self, df, batch_time):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        self.delivered.append((int(batch_time), sorted(row.n for row in df.collect())))


def make_context(spark, retry, start_ms=10_500, **kwargs):
    clock = RecordingClock(start_ms)
    ssc = StreamingContext(spark, "1 minute", clock=clock, retry=retry, **kwargs)
    recorder = RetryRecorder()
    ssc.add_listener(recorder)
    return ssc, clock, recorder


def warnings(logs):
    """The scheduler's WARN lines (not its ERROR ones)."""
    return [r.getMessage() for r in logs.records if r.name in (SCHEDULER, BATCH_RUN) and r.levelno == logging.WARNING]


POLICY = RetryPolicy(max_attempts=4, initial_backoff="1s", multiplier=3, max_backoff="5s")


# ------------------------------------------------------------------ the policy
def test_backoff_grows_by_the_multiplier_up_to_the_cap():
    assert POLICY.backoffs_ms() == [1000, 3000, 5000]
    assert RetryPolicy().backoffs_ms() == [5000, 10_000, 20_000]  # the default: 4 runs within about a minute
    assert RetryPolicy.never().backoffs_ms() == []
    assert RetryPolicy(max_attempts=3, initial_backoff="2s", multiplier=1).backoffs_ms() == [2000, 2000]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_attempts": 0}, "max_attempts counts every run .* at least 1 .*; got 0"),
    ({"max_attempts": True}, "got True"),
    ({"multiplier": 0.5}, "multiplier must be a number of at least 1"),
    ({"initial_backoff": "10s", "max_backoff": "5s"}, r"max_backoff \('5s'\) is shorter than initial_backoff"),
    ({"initial_backoff": "soon"}, "initial backoff 'soon' is not a duration"),
    ({"no_retry_on": ValueError}, "no_retry_on is a tuple of exception classes"),
])
def test_a_malformed_policy_is_refused(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        RetryPolicy(**kwargs)


def _state_function_error():
    return StateFunctionError("raised", "sessions", "'u1'", BATCH, "the function raised", carry=False)


def test_errors_that_a_retry_would_repeat_are_not_retried():
    policy = RetryPolicy(no_retry_on=(KeyError,))
    assert policy.should_retry(ConnectionError("database down"), 1)
    assert policy.should_retry(RuntimeError("Job aborted due to stage failure: ExecutorLostFailure"), 3)
    assert not policy.should_retry(RuntimeError("still down"), 4)  # the fourth run was the last
    for error in (ConfigurationError("bad setting"), _state_function_error(), AnalysisException("cannot resolve x"),
                  FencedError("lost its lease"), KeyError("yours"), KeyboardInterrupt()):
        assert not policy.should_retry(error, 1), error
    try:
        try:
            raise ConfigurationError("bad schema")
        except ConfigurationError as inner:
            raise RuntimeError("the job failed") from inner
    except RuntimeError as wrapped:
        assert is_deterministic(wrapped)  # what it was raised from decides
    assert not is_deterministic(RuntimeError("Python worker exited unexpectedly (crashed)"))


# ------------------------------------------------------------------ retried batches
def test_a_failing_output_is_retried_with_backoff_then_delivers_once(spark):
    ssc, clock, recorder = make_context(spark, POLICY)
    queue = ssc.queue_stream([spark.createDataFrame([(1,), (2,), (3,)], SCHEMA)], schema=SCHEMA)
    output = Flaky(failures=2)
    queue.foreach_batch(output, name="flaky")
    with LogWatcher() as logs:
        ssc.start()
        try:
            clock.advance(BATCH - 10_500)
            assert clock.next_backoff(1) == 1000
            clock.advance(1000)
            assert clock.next_backoff(2) == 3000
            clock.advance(3000)
            info = recorder.wait_for_batch(BATCH)
        finally:
            ssc.stop()
    assert warnings(logs) == [
        f"Batch {BATCH_TEXT} failed in output 'flaky' (attempt 1 of 4): ConnectionError: the database did not answer; "
        "retrying in 1000 ms",
        f"Batch {BATCH_TEXT} failed in output 'flaky' (attempt 2 of 4): ConnectionError: the database did not answer; "
        "retrying in 3000 ms",
    ]
    assert f"Running batch {BATCH_TEXT} again (attempt 3 of 4)" in logs.messages(BATCH_RUN)
    assert output.calls == 3 and output.delivered == [(BATCH, [1, 2, 3])]
    assert info.failure is None and info.attempts == 3
    assert (info.processing_start_time, info.processing_end_time) == (BATCH, BATCH + 4000)  # the waits count
    assert info.excluded_executors == []
    assert [(r.attempts, r.failure) for r in recorder.retrying] == [
        (n, "output 'flaky': ConnectionError: the database did not answer") for n in (1, 2)]
    assert recorder.events[:3] == [("submitted", BATCH), ("started", BATCH), ("completed", BATCH)]
    assert recorder.errors == []


def test_past_the_limit_the_pipeline_stops_and_a_restart_with_fixed_code_reruns_the_batch(spark, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    rows = spark.createDataFrame([(1,), (2,), (3,)], SCHEMA)
    ssc, clock, recorder = make_context(spark, POLICY, checkpoint=checkpoint)
    broken = Flaky(failures=10**6, error=RuntimeError("the output's table is locked"))
    ssc.dataframe_stream(rows).foreach_batch(broken, name="out")
    with LogWatcher() as logs:
        ssc.start()
        try:
            clock.advance(BATCH - 10_500)
            for number, expected in enumerate([1000, 3000, 5000], start=1):
                assert clock.next_backoff(number) == expected
                clock.advance(expected)
            with pytest.raises(BatchFailedError) as raised:
                ssc.await_termination(60)
            events = ssc.checkpoint_manager.events
            assert not events.is_completed(BATCH)  # not marked processed: the next start runs it
        finally:
            ssc.stop()
    error = raised.value
    assert (error.batch_time, error.job_name, error.attempts) == (BATCH, "out", 4)
    assert str(error).startswith(f"batch {BATCH_TEXT} failed in output 'out' after 4 attempts: "
                                 "RuntimeError: the output's table is locked. Fix the cause and start the pipeline "
                                 "again")
    assert isinstance(error.cause, RuntimeError) and broken.calls == 4 and broken.delivered == []
    assert [m.rsplit("; ", 1)[1] for m in warnings(logs)] == [
        "retrying in 1000 ms", "retrying in 3000 ms", "retrying in 5000 ms"]
    assert "(attempt 3 of 4): RuntimeError: the output's table is locked" in warnings(logs)[2]
    failed = recorder.wait_for_batch(BATCH)
    assert failed.attempts == 4 and "after 4 attempts" in failed.failure
    assert [type(e) for e in recorder.errors] == [BatchFailedError]

    fixed, clock, recorder = make_context(spark, POLICY, start_ms=BATCH + 5 * 1000, checkpoint=checkpoint)
    sink = CollectSink()
    fixed.dataframe_stream(rows).foreach_batch(sink, name="out")
    fixed.start()
    try:
        info = recorder.wait_for_batch(BATCH)  # re-run at the restart, with the same rows
        # Its only input ended, so the pipeline finishes: a graceful stop that polls on the clock.
        finisher = threading.Thread(target=fixed.await_termination, args=(120,))
        finisher.start()
        drive_until_done(clock, finisher)
        assert fixed.await_termination(0)
        assert fixed.checkpoint_manager.events.is_completed(BATCH)
    finally:
        fixed.stop()
    assert info.failure is None and info.attempts == 1
    assert sink.batches == {BATCH: [{"n": 1}, {"n": 2}, {"n": 3}]}
    assert clock.backoffs == []


def test_an_error_that_would_repeat_stops_at_once(spark):
    ssc, clock, recorder = make_context(spark, POLICY)
    queue = ssc.queue_stream([spark.createDataFrame([(1,)], SCHEMA)], schema=SCHEMA)
    output = Flaky(failures=1, error=ConfigurationError("column 'm' is not in the output's table"))
    queue.foreach_batch(output, name="typed")
    with LogWatcher() as logs:
        ssc.start()
        try:
            clock.advance(BATCH - 10_500)
            with pytest.raises(BatchFailedError, match="failed in output 'typed': ConfigurationError"):
                ssc.await_termination(60)
        finally:
            ssc.stop()
    assert output.calls == 1 and clock.backoffs == []
    assert warnings(logs) == [
        f"Batch {BATCH_TEXT} failed in output 'typed' with an error that the same input raises the same way every "
        "time; not retrying: ConfigurationError: column 'm' is not in the output's table"]


def test_an_immediate_stop_cuts_a_backoff_wait_short(spark):
    ssc, clock, recorder = make_context(spark, RetryPolicy(initial_backoff="1h", max_backoff="1h"))
    queue = ssc.queue_stream([spark.createDataFrame([(1,)], SCHEMA)], schema=SCHEMA)
    output = Flaky(failures=10)
    queue.foreach_batch(output, name="flaky")
    with LogWatcher() as logs:
        ssc.start()
        clock.advance(BATCH - 10_500)
        assert clock.next_backoff(1) == 3_600_000
        stopper = threading.Thread(target=ssc.stop)
        stopper.start()
        stopper.join(30)  # far shorter than the hour of clock time it would otherwise wait
        assert not stopper.is_alive()
        assert ssc.await_termination(1)  # a stop is not an error
    info = recorder.wait_for_batch(BATCH)
    assert info.attempts == 1 and info.failure is not None and output.calls == 1
    assert any(m.startswith(f"Batch {BATCH} was cancelled by the stop") for m in logs.messages(BATCH_RUN))
    assert not any("did not return" in m for m in warnings(logs))
    assert recorder.errors == []


def test_a_graceful_stop_that_times_out_gives_up_the_wait_and_leaves_the_batch_for_the_next_start(spark):
    ssc, clock, recorder = make_context(spark, RetryPolicy(initial_backoff="1h", max_backoff="1h"),
                                        graceful_stop_timeout="3s")
    queue = ssc.queue_stream([spark.createDataFrame([(1,)], SCHEMA)], schema=SCHEMA)
    queue.foreach_batch(Flaky(failures=10), name="flaky")
    with LogWatcher() as logs:
        ssc.start()
        clock.advance(BATCH - 10_500)
        clock.next_backoff(1)
        stopper = threading.Thread(target=ssc.stop, kwargs={"graceful": True})
        stopper.start()
        drive_until_done(clock, stopper)
        assert ssc.await_termination(1)
        logs.wait_for(f"Batch {BATCH} was cancelled by the stop; it was not committed, so the next start runs it")
    timed_out = warnings(logs)[-1]  # the batch, and the next one if the driven clock generated it meanwhile
    assert timed_out.startswith("The graceful stop timed out with ") and f"({BATCH_TEXT[:24]}" in timed_out
    assert recorder.wait_for_batch(BATCH).failure is not None and recorder.errors == []


def test_a_retried_stateful_batch_leaves_exact_state_and_output(spark, tmp_path):
    clock = RecordingClock(100_000)
    ssc = StreamingContext(spark, "1s", clock=clock, checkpoint=str(tmp_path),
                           retry=RetryPolicy(max_attempts=3, initial_backoff="500ms", max_backoff="500ms"))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    queue = ssc.queue_stream([], schema=KEYED)
    counts = queue.group_by_key("key").flat_map_groups_with_state(
        running_count, state_schema=Count, output_schema="key string, count long", name="op", num_partitions=3)
    sink = CollectSink()
    counts.foreach_batch(sink, name="collect")
    failed_once: set[int] = set()

    def fails_once_in_the_second_batch(df, batch_time):
        if batch_time == 102_000 and batch_time not in failed_once:
            failed_once.add(batch_time)
            raise ConnectionError("the mirror did not answer")

    counts.foreach_batch(fails_once_in_the_second_batch, name="mirror")
    ssc.start()
    try:
        queue.push(spark.createDataFrame([("a", 1), ("b", 2), ("a", 3)], KEYED))
        clock.advance(1000)
        recorder.wait_for_batch(101_000)
        queue.push(spark.createDataFrame([("a", 5), ("c", 1)], KEYED))
        clock.advance(1000)
        assert clock.next_backoff(1) == 500
        clock.advance(500)
        retried = recorder.wait_for_batch(102_000)
        queue.push(spark.createDataFrame([("a", 1)], KEYED))
        clock.advance(500)
        recorder.wait_for_batch(103_000)
    finally:
        ssc.stop()
    assert retried.attempts == 2 and retried.failure is None
    assert retried.state_operators["op"].input_rows == 2
    assert sink.batches == {101_000: [{"key": "a", "count": 2}, {"key": "b", "count": 1}],
                            102_000: [{"key": "a", "count": 3}, {"key": "c", "count": 1}],
                            103_000: [{"key": "a", "count": 4}]}
    state = {r["key"]: (r["count"], r["total"]) for r in read_state(spark, str(tmp_path), "op").collect()}
    assert state == {"a": (4, 10), "b": (1, 2), "c": (1, 1)}
