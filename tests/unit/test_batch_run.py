"""One batch's life as its BatchRun lives it, on a manual clock and without Spark: the states
it goes through, the transitions it refuses, its pending commits, and a batch behind one that
failed for good."""

import concurrent.futures
import itertools
import threading

import pytest

from batchline.clock import ManualClock
from batchline.errors import ContextStateError
from batchline.scheduler.batch_run import FRESH_LEASE_CHECK_MS, BatchRun, RunState
from batchline.scheduler.input_info import InputInfoTracker
from batchline.scheduler.job import BatchState, Job, JobKind, JobSet, PendingCommit
from batchline.scheduler.lifecycle import BatchLifecycle
from batchline.scheduler.listener import ListenerBus
from batchline.scheduler.progress import StateOperatorProgress
from batchline.scheduler.retry import RetryPolicy


class Scheduling:
    """The scheduler's side, one slot, no Spark."""

    def __init__(self) -> None:
        self.clock = ManualClock(10_000)
        self.lifecycle = BatchLifecycle(ListenerBus(), self.clock, InputInfoTracker(), 1000)
        self.retry = RetryPolicy.never()
        self.overlap_commits = False
        self.cancelling = False
        self.stop_waiting = threading.Event()
        self.errors: list[BaseException] = []
        self._slots = threading.Semaphore(1)
        self._runs = itertools.count(1)

    def take_slot(self) -> None:
        assert self._slots.acquire(timeout=5)

    def give_back_slot(self) -> None:
        self._slots.release()

    def next_job_run(self) -> int:
        return next(self._runs)

    def enter_job_group(self, batch_time: int) -> None:
        pass

    def report_error(self, message: str, error: BaseException) -> None:
        self.errors.append(error)

    def beside(self, work):
        done = concurrent.futures.Future()
        done.set_result(work())
        return done


class Pipeline:
    """Records the state each batch is in when the pipeline commits it."""

    def __init__(self) -> None:
        self.runs: dict[int, BatchRun] = {}
        self.committed: list[tuple[int, RunState]] = []
        self.checked: list[int] = []
        self.operators: dict[int, StateOperatorProgress] = {}
        """What an operator did, by batch; it lets go of it once the batch commits."""

    def jobs_for(self, batch_time: int) -> list[Job]:
        return []

    def check_commit(self, batch_time: int) -> None:
        self.checked.append(batch_time)

    def commit(self, batch_time: int, lease_checked: bool = False) -> None:
        assert lease_checked and self.checked[-1] == batch_time, "committed without the lease checked beside"
        self.committed.append((batch_time, self.runs[batch_time].state))
        self.operators.pop(batch_time, None)

    def operator_progress(self, batch_time: int) -> dict[str, StateOperatorProgress]:
        done = self.operators.get(batch_time)
        return {done.operator: done} if done is not None else {}


class Staged(PendingCommit):
    def __init__(self, log: list[str], name: str, fails: bool = False) -> None:
        self.log, self.name, self.fails = log, name, fails

    def commit(self) -> None:
        self.log.append(f"commit {self.name}")
        if self.fails:
            raise OSError("the store is gone")

    def abandon(self) -> None:
        self.log.append(f"abandon {self.name}")


def batch(pipeline: Pipeline, time: int, *jobs: Job, cleaned: list[int] | None = None) -> BatchRun:
    run = BatchRun(JobSet(time, list(jobs), {}, submission_time=time), pipeline,
                   cleaned.append if cleaned is not None else None)
    pipeline.runs[time] = run
    return run


def test_a_batch_runs_waits_commits_and_is_cleaned_up_after_in_that_order():
    scheduling, pipeline, log, cleaned = Scheduling(), Pipeline(), [], []
    seen: list[RunState] = []

    def output():
        seen.append(run.state)
        return Staged(log, "out")

    run = batch(pipeline, 11_000, Job(11_000, "out", output, JobKind.OUTPUT), cleaned=cleaned)
    assert run.state is RunState.GENERATED
    run.queue(None, scheduling.lifecycle)
    run.run(scheduling)
    assert seen == [RunState.RUNNING]
    assert pipeline.committed == [(11_000, RunState.COMMITTING)] and log == ["commit out"]
    assert cleaned == [11_000]
    assert (run.state, run.job_set.state, run.attempts) == (RunState.COMMITTED, BatchState.COMPLETED, 1)
    assert run.ended(0) and scheduling.errors == []
    assert [p.status for p in scheduling.lifecycle.recent_progress] == ["completed"]


def test_a_failed_commit_left_by_a_job_abandons_the_rest_and_fails_the_batch():
    scheduling, pipeline, log = Scheduling(), Pipeline(), []
    run = batch(pipeline, 11_000, Job(11_000, "a", lambda: Staged(log, "a", fails=True), JobKind.OUTPUT),
                Job(11_000, "b", lambda: Staged(log, "b"), JobKind.OUTPUT))
    run.queue(None, scheduling.lifecycle)
    run.run(scheduling)
    assert log == ["commit a", "abandon b"]
    assert run.state is RunState.FAILED and run.job_set.state is BatchState.FAILED
    assert pipeline.committed == []
    (error,) = scheduling.errors
    assert "failed in output 'a'" in str(error) and "the store is gone" in str(error)


def test_the_batch_behind_one_that_failed_for_good_runs_nothing_and_is_cancelled():
    scheduling, pipeline, ran = Scheduling(), Pipeline(), []

    def failing():
        raise ValueError("a bad row")

    first = batch(pipeline, 11_000, Job(11_000, "out", failing, JobKind.OUTPUT))
    second = batch(pipeline, 12_000, Job(12_000, "out", lambda: ran.append(12_000), JobKind.OUTPUT))
    first.queue(None, scheduling.lifecycle)
    second.queue(first, scheduling.lifecycle)
    first.run(scheduling)
    second.run(scheduling)
    assert (first.state, first.failed_holding_slot) == (RunState.FAILED, True)
    assert (second.state, second.attempts, ran) == (RunState.CANCELLED, 0, [])
    assert second.job_set.state is BatchState.FAILED  # what listeners are told, as before
    assert [(p.batch_time, p.status) for p in scheduling.lifecycle.recent_progress] == [
        (11_000, "failed"), (12_000, "cancelled")]


def test_a_stop_before_the_batch_starts_cancels_it_without_a_word():
    scheduling, pipeline = Scheduling(), Pipeline()
    run = batch(pipeline, 11_000, Job(11_000, "out", lambda: None, JobKind.OUTPUT))
    run.queue(None, scheduling.lifecycle)
    scheduling.cancelling = True
    run.run(scheduling)
    assert run.state is RunState.CANCELLED and run.job_set.state is BatchState.GENERATED
    assert scheduling.lifecycle.recent_progress == [] and scheduling.errors == []


@pytest.mark.parametrize(("start", "to"), [
    (RunState.GENERATED, RunState.COMMITTED),
    (RunState.GENERATED, RunState.WAITING_TO_COMMIT),
    (RunState.RUNNING, RunState.COMMITTING),
    (RunState.COMMITTED, RunState.RUNNING),
    (RunState.CANCELLED, RunState.RUNNING),
    (RunState.FAILED, RunState.COMMITTED),
])
def test_a_transition_a_batch_cannot_make_is_refused(start, to):
    run = batch(Pipeline(), 11_000)
    run.state = start
    with pytest.raises(ContextStateError, match=f"cannot go from {start.value} to {to.value}"):
        run._move(to)
    assert run.state is start


@pytest.mark.parametrize("fails", [False, True])
def test_what_the_operators_did_goes_into_the_batchs_record_before_they_let_go_of_it(fails):
    scheduling, pipeline = Scheduling(), Pipeline()

    def sessions():
        pipeline.operators[11_000] = StateOperatorProgress(
            "sessions", input_rows=5, late_rows=0, keys_called=2, updated=2, removed=0, timed_out=0, output_rows=1,
            state_keys=2, watermark_ms=None)
        if fails:
            raise ValueError("a bad row")

    run = batch(pipeline, 11_000, Job(11_000, "sessions", sessions, JobKind.STATE))
    run.queue(None, scheduling.lifecycle)
    run.run(scheduling)
    (record,) = scheduling.lifecycle.recent_progress
    assert record.status == ("failed" if fails else "completed")
    assert [(op.operator, op.input_rows, op.updated) for op in record.state_operators] == [("sessions", 5, 2)]


class _Threaded(Scheduling):
    """The scheduler's side with a real thread beside the batch's, as ``JobScheduler`` has."""

    def __init__(self) -> None:
        super().__init__()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    def beside(self, work):
        return self._pool.submit(work)


class _Fenced(Exception):
    pass


def test_the_lease_is_checked_beside_the_commits_the_jobs_left_and_before_the_batch_s_commit():
    scheduling, log = _Threaded(), []
    checking = threading.Event()

    class Pipeline_(Pipeline):
        def check_commit(self, batch_time):
            checking.set()
            super().check_commit(batch_time)

    class WaitsForTheCheck(Staged):
        def commit(self):
            assert checking.wait(5), "the lease was checked only after the output's commit"
            super().commit()

    pipeline = Pipeline_()
    run = batch(pipeline, 11_000, Job(11_000, "out", lambda: WaitsForTheCheck(log, "out"), JobKind.OUTPUT))
    run.queue(None, scheduling.lifecycle)
    run.run(scheduling)
    assert log == ["commit out"] and pipeline.committed == [(11_000, RunState.COMMITTING)]
    assert run.state is RunState.COMMITTED and scheduling.errors == []


def test_a_lease_lost_while_the_outputs_committed_fails_the_batch_s_commit():
    scheduling, log = _Threaded(), []

    class Pipeline_(Pipeline):
        def check_commit(self, batch_time):
            raise _Fenced("this driver lost its lease")

    pipeline = Pipeline_()
    run = batch(pipeline, 11_000, Job(11_000, "out", lambda: Staged(log, "out"), JobKind.OUTPUT))
    run.queue(None, scheduling.lifecycle)
    run.run(scheduling)
    assert pipeline.committed == [] and run.state is RunState.FAILED
    (error,) = scheduling.errors
    assert "lost its lease" in str(error)


def test_commits_that_took_long_leave_the_lease_to_be_checked_again_right_before_the_marker():
    scheduling, log, asked = _Threaded(), [], []

    class Pipeline_(Pipeline):
        def commit(self, batch_time, lease_checked=False):
            asked.append(lease_checked)

    class Slow(Staged):
        def commit(self):
            scheduling.clock.advance(FRESH_LEASE_CHECK_MS + 1)
            super().commit()

    run = batch(Pipeline_(), 11_000, Job(11_000, "out", lambda: Slow(log, "out"), JobKind.OUTPUT))
    run.queue(None, scheduling.lifecycle)
    run.run(scheduling)
    assert asked == [False], "a lease check older than the commits was trusted for the marker"
