"""A graceful stop that times out while a batch still runs: the batch is cancelled before the
lease is given up, named in the log, left uncommitted, and run by the next start."""

import logging
import threading
import time

import pytest

from batchline import BatchFailedError, StreamingContext
from batchline.checkpoint.lease import LEASE_FILE, LeaseRecord
from batchline.checkpoint.storage import unseal
from batchline.clock import SystemClock
from batchline.scheduler.batch_run import BatchRun
from batchline.scheduler.input_info import InputInfoTracker
from batchline.scheduler.job import Job, JobKind, JobSet
from batchline.scheduler.job_scheduler import JobScheduler, SchedulerSettings
from batchline.scheduler.lifecycle import BatchLifecycle
from batchline.scheduler.listener import ListenerBus, StreamingListener
from batchline.scheduler.retry import RetryPolicy
from batchline.testing import BatchRecorder
from tests.helpers import LogWatcher, poll_until


class _NothingToCommit:
    """A pipeline whose batches have nothing to commit: the scheduler alone is under test."""

    def jobs_for(self, batch_time: int) -> list[Job]:
        return []

    def check_commit(self, batch_time: int) -> None:
        pass

    def commit(self, batch_time: int, lease_checked: bool = False) -> None:
        pass

    def operator_progress(self, batch_time: int) -> dict:
        return {}


def _run(job_set: JobSet) -> BatchRun:
    return BatchRun(job_set, _NothingToCommit())


def test_a_timed_out_graceful_stop_cancels_the_running_batch_before_releasing_the_lease(spark, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    seen: list[int] = []

    def slow(df, batch_time):
        seen.append(int(batch_time))
        df.rdd.map(lambda row: time.sleep(20)).count()  # a Spark job the stop must cancel

    ssc = StreamingContext(spark, "200ms", checkpoint=checkpoint, graceful_stop_timeout="500ms",
                           retry=RetryPolicy.never())
    ssc.generator_stream(10, partitions=1, name="events").foreach_batch(slow, name="slow")
    with LogWatcher() as log:
        ssc.start()
        assert poll_until(lambda: seen, 60, 0.05), "no batch started"
        began = time.monotonic()
        ssc.stop(graceful=True)
        took = time.monotonic() - began
    stuck = seen[0]
    errors = [r.getMessage() for r in log.records if r.levelno >= logging.ERROR]
    assert errors == [], errors  # no FencedError about this driver's own released lease
    assert any("graceful stop timed out with" in m and "cancelling them" in m for m in log.messages())
    assert took < 15  # cancelled, not waited out
    assert not ssc.checkpoint_manager.events.is_completed(stuck)

    again = StreamingContext(spark, "200ms", checkpoint=checkpoint)
    recorder = BatchRecorder()
    again.add_listener(recorder)
    again.generator_stream(10, partitions=1, name="events").foreach_batch(lambda df, t: df.count(), name="slow")
    again.start()
    try:
        info = recorder.wait_for_batch(stuck, 60)
        assert info.failure is None
    finally:
        again.stop()


class _SlowToTell(BatchLifecycle):
    """Tells of a finished batch slowly, as an event store on S3 does: the batch has committed
    while its thread still runs."""

    def __init__(self, committed: threading.Event) -> None:
        super().__init__(ListenerBus(), SystemClock(), InputInfoTracker(), 200)
        self._committed = committed

    def finished(self, job_set: JobSet, attempts: int, commit_ms: int = 0, cancelled: bool = False) -> None:
        self._committed.set()
        time.sleep(0.5)
        super().finished(job_set, attempts, commit_ms, cancelled)


def test_a_committed_batch_still_telling_its_listeners_is_not_named_unfinished(spark):
    committed = threading.Event()
    lifecycle = _SlowToTell(committed)
    scheduler = JobScheduler(SchedulerSettings(200, 1, 5000, "batchline-test-slow-tell"), spark, SystemClock(),
                             lifecycle, on_error=lambda error: None)
    scheduler.submit(_run(JobSet(1000, [], {}, submission_time=0)))
    assert committed.wait(30)
    # The generator saw the batch committed, so a graceful stop asks which batches are left.
    assert scheduler.shutdown(graceful=True) == []
    assert [p.batch_time for p in lifecycle.recent_progress] == [1000]  # told before the stop returned


def test_a_batch_after_one_that_failed_for_good_runs_none_of_its_jobs(spark):
    # Commits overlap (a stateless pipeline): a batch whose jobs failed for good gives up its
    # slot, and the next batch, waiting for it, takes it. That batch must learn of the failure
    # first: an output that ran would see rows the restart reads again.
    lifecycle = BatchLifecycle(ListenerBus(), SystemClock(), InputInfoTracker(), 200)
    scheduler = JobScheduler(
        SchedulerSettings(200, 1, 5000, "batchline-test-failed-turn", overlap_commits=True), spark, SystemClock(),
        lifecycle, on_error=lambda error: None)
    first_started, let_first_fail = threading.Event(), threading.Event()
    ran: list[int] = []

    def failing() -> None:
        first_started.set()
        assert let_first_fail.wait(30)
        raise ValueError("a bad row")

    def output() -> None:
        ran.append(2000)

    scheduler.submit(_run(JobSet(1000, [Job(1000, "out", failing, JobKind.OUTPUT)], {}, submission_time=0)))
    assert first_started.wait(30)
    scheduler.submit(_run(JobSet(2000, [Job(2000, "out", output, JobKind.OUTPUT)], {}, submission_time=0)))
    let_first_fail.set()  # the second batch already waits for the slot
    assert scheduler.wait_for_running_jobs(30)
    scheduler.shutdown(graceful=True)
    assert ran == []
    assert [(p.batch_time, p.status) for p in lifecycle.recent_progress] == [(1000, "failed"), (2000, "cancelled")]


def test_a_stop_after_a_failed_batch_returns_once_the_stop_the_failure_began_has_ended(spark, tmp_path):
    # A failed batch stops the pipeline on a thread of its own, and a short await_termination
    # raises the error as soon as it is known. The user's stop then must not return while that
    # stop still writes to the checkpoint location (here held up by a listener it waits for).
    checkpoint = tmp_path / "checkpoint"
    told_failed, let_go = threading.Event(), threading.Event()

    class SlowToHearOfTheFailure(StreamingListener):
        def on_progress(self, progress) -> None:
            if progress.status == "failed":
                told_failed.set()
                let_go.wait(30)

    def failing(df, batch_time):
        raise ValueError("a bad row")

    ssc = StreamingContext(spark, "200ms", checkpoint=str(checkpoint), retry=RetryPolicy.never())
    ssc.add_listener(SlowToHearOfTheFailure())
    ssc.generator_stream(10, partitions=1, name="events").foreach_batch(failing, name="failing")
    ssc.start()
    assert told_failed.wait(60)
    with pytest.raises(BatchFailedError, match="a bad row"):
        for _ in range(3000):  # the error is known a moment after the listener hears of the batch
            ssc.await_termination(0.02)
    stopping = threading.Thread(target=ssc.stop)
    stopping.start()
    stopping.join(1.0)
    assert stopping.is_alive(), "stop() returned while the stop under way was still running"
    let_go.set()
    stopping.join(30)
    assert not stopping.is_alive()
    lease = LeaseRecord.from_json(unseal((checkpoint / LEASE_FILE).read_bytes(), LEASE_FILE))
    assert lease.released  # before stop() returned
