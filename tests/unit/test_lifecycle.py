"""The one place a batch's lifecycle is told (issue 18): the progress record built from the
generator's and the scheduler's events, on a manual clock, field by field."""

from __future__ import annotations

from batchline.clock import ManualClock
from batchline.scheduler.input_info import InputInfoTracker, StreamInputInfo
from batchline.scheduler.job import Job, JobKind, JobSet
from batchline.scheduler.lifecycle import BatchLifecycle
from batchline.scheduler.listener import ListenerBus, StreamingListener
from batchline.scheduler.progress import ExcludedExecutor, StateOperatorProgress

BATCH, INTERVAL = 10_000, 1000


class Facts:
    def __init__(self, backlog: int) -> None:
        self.backlog = backlog

    def finished_inputs(self) -> dict[str, int]:
        return {"files": BATCH}

    def upstream_inputs(self, operator: str) -> tuple[str, ...]:
        return ("files",) if operator == "sessions" else ("files", "socket")

    def lease(self) -> tuple[str, int] | None:
        return ("driver-1", 7)

    def backlog_after(self, batch_time: int) -> int:
        return self.backlog


class Progress(StreamingListener):
    def __init__(self) -> None:
        self.records = []

    def on_progress(self, progress) -> None:
        self.records.append(progress)


def operator(name: str, late: int, watermark: int) -> StateOperatorProgress:
    return StateOperatorProgress(name, input_rows=100, late_rows=late, keys_called=10, updated=8, removed=1,
                                 timed_out=2, output_rows=3, state_keys=50, watermark_ms=watermark,
                                 state_bytes=5000, delta_bytes=700)


def run_batch(lifecycle, clock, tracker, *, fail_first: bool = False, cancel: bool = False):
    """Generation takes 30 ms; the batch starts 50 ms after its time; the state job takes 200
    ms, the output 120 ms; the commit 10 ms. ``fail_first``: the output fails once after 400
    ms, then the batch runs again after a 1 s backoff."""
    clock.set_time(BATCH + 20)
    state, output = Job(BATCH, "sessions", lambda: None, JobKind.STATE), Job(BATCH, "out", lambda: None,
                                                                                JobKind.OUTPUT)
    job_set = JobSet(BATCH, [state, output], {}, clock.now_ms() + 30, generation_ms=30)
    clock.advance(30)
    lifecycle.generated(job_set)
    clock.set_time(BATCH + 50)
    job_set.processing_start_time = clock.now_ms()
    lifecycle.started(job_set, 1)
    attempts = 1
    if fail_first:
        started = clock.now_ms()
        clock.advance(400)
        lifecycle.job_finished(job_set, output, started, clock.now_ms())
        lifecycle.retrying(job_set, 1, "output 'out': IOError: disk full")
        clock.advance(1000)
        attempts = 2
    for job, took in ((state, 200), (output, 120)):
        started = clock.now_ms()
        clock.advance(took)
        lifecycle.job_finished(job_set, job, started, clock.now_ms())
    tracker.report(BATCH, StreamInputInfo(0, "files", 500, dead_letters=4, metadata={"files": ["a.json"]}))
    job_set.state_operators = {"sessions": operator("sessions", 6, 8_000), "joined": operator("joined", 9, 7_000)}
    job_set.processing_end_time = clock.now_ms()
    clock.advance(10)
    if cancel:
        job_set.failure = "cancelled by the stop"
    lifecycle.finished(job_set, attempts, commit_ms=10, cancelled=cancel)
    return job_set


def lifecycle_of(backlog: int = 0):
    clock, tracker, bus = ManualClock(0), InputInfoTracker(), ListenerBus()
    progress = Progress()
    bus.add(progress)
    lifecycle = BatchLifecycle(bus, clock, tracker, INTERVAL, Facts(backlog),
                               lambda: [ExcludedExecutor("3", "host-b", 9_000)])
    return lifecycle, clock, tracker, bus, progress


def test_a_record_tells_the_batch_exactly():
    lifecycle, clock, tracker, bus, progress = lifecycle_of(backlog=2)
    lifecycle.checkpoint_written(9_000, 45, 2048)
    lifecycle.checkpoint_written(9_500, 55, 4096)
    run_batch(lifecycle, clock, tracker)
    assert bus.flush(5)
    (record,) = progress.records
    assert record == lifecycle.last_progress
    assert record.status == "completed" and record.attempts == 1 and record.errors == ()
    assert (record.scheduling_delay_ms, record.processing_ms, record.total_delay_ms) == (50, 320, 370)
    assert record.durations.generation_ms == 30 and record.durations.commit_ms == 10
    assert [(j.name, j.kind, j.started_ms, j.duration_ms) for j in record.durations.jobs] == [
        ("sessions", "state", BATCH + 50, 200), ("out", "output", BATCH + 250, 120)]
    (files,) = record.inputs
    assert (files.records, files.dead_letters, files.finished, files.position) == (500, 4, True, {"files": ["a.json"]})
    assert files.input_rate == 500.0 and files.processing_rate == round(500 / 0.32, 3)
    assert files.late_records == 6  # "sessions" reads only files; "joined" reads two inputs: not attributed
    assert record.late_records == 15
    assert record.watermark_ms == 7_000  # the lowest operator's, as Spark's global watermark
    assert [c.time for c in record.checkpoints] == [9_000, 9_500] and record.durations.checkpoint_ms == 55
    assert (record.lease_holder, record.lease_token, record.backlog) == ("driver-1", 7, 2)
    assert record.excluded_executors == (ExcludedExecutor("3", "host-b", 9_000),)


def test_a_retried_batch_times_its_last_attempt_and_keeps_each_cause():
    lifecycle, clock, tracker, bus, progress = lifecycle_of()
    run_batch(lifecycle, clock, tracker, fail_first=True)
    assert bus.flush(5)
    (record,) = progress.records
    assert record.attempts == 2 and record.errors == ("attempt 1: output 'out': IOError: disk full",)
    assert [j.duration_ms for j in record.durations.jobs] == [200, 120]  # not the failed attempt's 400 ms
    assert record.processing_ms == 400 + 1000 + 320
    assert record.inputs[0].processing_rate == round(500 / 0.32, 3)  # over the attempt that counted


def test_a_cancelled_batch_is_recorded_as_cancelled_and_records_are_kept_bounded():
    lifecycle, clock, tracker, bus, progress = lifecycle_of()
    run_batch(lifecycle, clock, tracker, cancel=True)
    assert lifecycle.last_progress.status == "cancelled"
    earlier = list(lifecycle.recent_progress)
    small = BatchLifecycle(ListenerBus(), clock, tracker, INTERVAL, keep_recent=2)
    small.seed(earlier * 3)
    assert len(small.recent_progress) == 2
