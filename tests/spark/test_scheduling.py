"""Scheduling on a manual clock with real Spark jobs: alignment, event order, stops, errors."""

import logging
import threading
import time

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from batchline import (
    BatchFailedError,
    ConfigurationError,
    ContextState,
    ContextStateError,
    NoOutputOperationError,
    Receiver,
    StreamingContext,
)
from batchline.clock import ManualClock
from batchline.scheduler.retry import RetryPolicy
from batchline.testing import BatchRecorder, CollectSink
from tests.helpers import LogWatcher, drive_until_done, poll_until

SCHEMA = StructType([StructField("n", LongType(), False)])
GENERATOR = "batchline.scheduler.job_generator"


def frames(spark, *batches):
    return [spark.createDataFrame([(n,) for n in batch], SCHEMA) for batch in batches]


def make_context(spark, start_ms=10_500, **kwargs):
    clock = ManualClock(start_ms)
    ssc = StreamingContext(spark, "1s", clock=clock, **kwargs)
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    return ssc, clock, recorder


def test_batches_align_to_the_interval_and_events_come_in_order(spark):
    ssc, clock, recorder = make_context(spark)
    queue = ssc.queue_stream(frames(spark, [1, 2], [3]), schema=SCHEMA)
    sink = CollectSink()
    queue.foreach_batch(sink)
    with LogWatcher() as logs:
        ssc.start()
        try:
            assert ssc.job_generator.start_time == 11_000  # next multiple of 1 s after 10.5 s
            assert ssc.pipeline.zero_time == 10_000  # one interval earlier
            clock.advance(500)
            recorder.wait_for_batch(11_000)
            clock.advance(1000)
            recorder.wait_for_batch(12_000)
            clock.advance(1000)
            recorder.wait_for_batch(13_000)
        finally:
            ssc.stop()
    assert recorder.events == [
        (kind, t) for t in (11_000, 12_000, 13_000) for kind in ("submitted", "started", "completed")
    ]
    # 13 000 held no row: it committed without calling the output (SPEC E6).
    assert sink.batches == {11_000: [{"n": 1}, {"n": 2}], 12_000: [{"n": 3}]}
    first = recorder.completed[0]
    assert (first.scheduling_delay_ms, first.processing_delay_ms, first.total_delay_ms) == (0, 0, 0)
    assert "Started JobGenerator at 11000 ms" in logs.messages(GENERATOR, level=logging.DEBUG)
    assert "Started timer for JobGenerator at time 11000" in logs.messages(level=logging.DEBUG)


def test_listener_delays_follow_the_clock(spark):
    ssc, clock, recorder = make_context(spark)
    queue = ssc.queue_stream(frames(spark, [1]), schema=SCHEMA)
    release = threading.Event()

    def slow_output(df, batch_time):
        df.count()
        release.wait(30)

    queue.foreach_batch(slow_output)
    ssc.start()
    try:
        clock.advance(500)
        recorder.wait_for_event("started", 11_000)
        clock.advance(300)  # the batch has been processing for 300 ms of clock time
        release.set()
        info = recorder.wait_for_batch(11_000)
    finally:
        ssc.stop()
    assert info.scheduling_delay_ms == 0
    assert info.processing_delay_ms == 300
    assert info.total_delay_ms == 300
    assert info.num_records is not None


def test_graceful_stop_finishes_every_generated_batch_and_logs_the_seed_lines(spark):
    ssc, clock, recorder = make_context(spark)
    queue = ssc.queue_stream(frames(spark, [1], [2], [3]), schema=SCHEMA)
    sink = CollectSink()
    queue.foreach_batch(sink)
    with LogWatcher() as logs:
        ssc.start()
        clock.advance(500)
        recorder.wait_for_batch(11_000)
        stopper = threading.Thread(target=ssc.stop, kwargs={"graceful": True})
        stopper.start()
        drive_until_done(clock, stopper)
    # The timer fired the time it was waiting for, and that batch ran before stop returned.
    assert sorted(sink.batches) == [11_000, 12_000]
    assert ssc.job_generator.last_processed_batch == 12_000
    assert ssc.state is ContextState.STOPPED
    assert logs.messages(GENERATOR, level=logging.DEBUG) == [
        "Started JobGenerator at 11000 ms",
        "Stopping JobGenerator gracefully",
        "Waiting for all received blocks to be consumed for job generation",
        "Waited for all received blocks to be consumed for job generation",
        "Stopped generation timer",
        "Waiting for jobs to be processed and checkpoints to be written",
        "Waited for jobs to be processed and checkpoints to be written",
        "Stopped JobGenerator",
    ]
    assert ssc.await_termination(0) is True


def test_immediate_stop_cancels_the_running_spark_job(spark):
    ssc, clock, recorder = make_context(spark)
    queue = ssc.queue_stream(frames(spark, [1]), schema=SCHEMA)
    # max, not sum: a sum of the upper half's ids overflows within milliseconds and ends the job
    queue.foreach_batch(lambda df, t: df.sparkSession.range(10**13).agg(F.max("id")).collect())
    with LogWatcher() as logs:
        ssc.start()
        clock.advance(500)
        recorder.wait_for_event("started", 11_000)
        tracker = spark.sparkContext.statusTracker()
        # waiting for Spark itself to submit the job
        assert poll_until(tracker.getActiveJobsIds, 30, 0.05), "the long Spark job never started"
        began = time.monotonic()
        ssc.stop(graceful=False)
        took = time.monotonic() - began
    assert took < 15, f"immediate stop took {took:.1f} s"
    assert "Stopping JobGenerator immediately" in logs.messages(GENERATOR, level=logging.DEBUG)
    assert "Cancelling Spark jobs of batch 11000" in logs.messages()
    assert ssc.await_termination(0) is True  # a cancelled batch is not a pipeline error
    assert poll_until(lambda: not tracker.getActiveJobsIds(), 15, 0.05), tracker.getActiveJobsIds()


class ManualReceiver(Receiver):
    """A receiver the test feeds directly through store()."""

    def on_start(self):
        pass

    def on_stop(self):
        self.store("stored while stopping")


def test_graceful_stop_gives_up_after_its_timeout(spark):
    ssc, clock, recorder = make_context(spark, graceful_stop_timeout="3s")
    receiver = ManualReceiver()
    generation_may_go_on = threading.Event()
    generation_held = threading.Event()

    def block_generation_after_first_batch(df, batch_time):
        if batch_time > 11_000:
            generation_held.set()
            generation_may_go_on.wait(60)  # holds the event loop inside batch generation
        return df

    lines = ssc.receiver_stream(receiver).transform(block_generation_after_first_batch)
    lines.foreach_batch(CollectSink())
    with LogWatcher() as logs:
        ssc.start()
        receiver.store("a")
        clock.advance(500)
        recorder.wait_for_batch(11_000)
        receiver.store("b")  # a row for 12 000, whose DataFrame (and transform) is built at generation
        clock.advance(1000)  # 12 000: generation blocks; the block stored on stop stays unallocated
        assert generation_held.wait(30)
        stopper = threading.Thread(target=ssc.stop, kwargs={"graceful": True})
        stopper.start()
        logs.wait_for("Waiting for all received blocks")
        for _ in range(40):  # 4 s of clock time > the 3 s timeout
            clock.advance(100)
            if "Timed out while waiting for jobs" in " ".join(logs.messages()):
                break
            stopper.join(0.02)
        logs.wait_for("Timed out while waiting for jobs to be processed")
        generation_may_go_on.set()
        drive_until_done(clock, stopper)
    warnings = [m for m in logs.messages(GENERATOR, level=30)]
    assert warnings[0] == "Timed out while stopping the job generator (timeout = 3000)"
    assert warnings[1].startswith("Timed out while waiting for jobs to be processed (timeout = 3000)")
    assert logs.messages(GENERATOR, level=logging.DEBUG)[-1] == "Stopped JobGenerator"


def test_a_failed_batch_stops_the_pipeline_and_is_raised(spark):
    ssc, clock, recorder = make_context(spark, retry=RetryPolicy.never())
    queue = ssc.queue_stream(frames(spark, [1]), schema=SCHEMA)

    def broken(df, batch_time):
        raise ValueError("the output could not take this batch")

    queue.foreach_batch(broken, name="broken-output")
    ssc.start()
    clock.advance(500)
    with pytest.raises(BatchFailedError) as raised:
        ssc.await_termination(60)
    error = raised.value
    assert error.batch_time == 11_000 and error.job_name == "broken-output"
    assert "ValueError: the output could not take this batch" in str(error)
    assert "start the pipeline again" in str(error)
    info = recorder.wait_for_batch(11_000)
    assert info.failure and "broken-output" in info.failure
    assert [type(e) for e in recorder.errors] == [BatchFailedError]
    assert ssc.job_generator.last_processed_batch is None  # a failed batch is never marked processed
    assert ssc.state is ContextState.STOPPED  # await_termination raises once the stop is done


def test_a_failing_transformation_is_reported_too(spark):
    ssc, clock, recorder = make_context(spark)
    queue = ssc.queue_stream(frames(spark, [1]), schema=SCHEMA)
    queue.select("no_such_column").foreach_batch(lambda df, t: df.count())
    ssc.start()
    clock.advance(500)
    with pytest.raises(Exception, match="no_such_column"):
        ssc.await_termination(60)


def test_a_pipeline_with_no_output_is_refused(spark):
    ssc, _, _ = make_context(spark)
    ssc.queue_stream(frames(spark, [1]), schema=SCHEMA).select("n")
    with pytest.raises(NoOutputOperationError, match="add one, e.g. stream.foreach_batch"):
        ssc.start()


@pytest.mark.parametrize("interval", ["0s", "-2s", "fast", 0])
def test_bad_batch_intervals_are_refused(spark, interval):
    with pytest.raises(ConfigurationError, match="batch interval"):
        StreamingContext(spark, interval)


def test_lifecycle_misuse_is_refused(spark):
    ssc, clock, _ = make_context(spark)
    queue = ssc.queue_stream(frames(spark, [1]), schema=SCHEMA)
    queue.foreach_batch(lambda df, t: None)
    with pytest.raises(ContextStateError, match="call start"):
        ssc.await_termination(0)
    ssc.start()
    try:
        with pytest.raises(ContextStateError, match="create a new one"):
            ssc.start()
        with pytest.raises(ContextStateError, match="build the whole pipeline"):
            ssc.queue_stream(frames(spark, [1]), schema=SCHEMA)
    finally:
        ssc.stop()
    ssc.stop()  # stopping twice is harmless
