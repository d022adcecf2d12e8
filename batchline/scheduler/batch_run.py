"""One batch from its timer tick to its commit: ``BatchRun`` (SPEC A4, A7, H3).

A batch's life, in the order of its methods:

1. ``generate`` (on the generator's loop, when the batch is due): the batch takes its input
   (received blocks, then ``BatchPipeline.jobs_for``, which logs it) and builds its jobs. The
   run is GENERATED; the job scheduler queues it behind the batch before it (``queue``).
2. ``run`` (on a job thread, once a slot is free): RUNNING. Its jobs run one after another
   (``_run_jobs``); each may leave a ``PendingCommit``. When one fails, the jobs run again
   after a backoff on the clock, as the retry policy allows (``_after_failure``).
3. WAITING_TO_COMMIT: until the batch before has stopped running (``_wait_for_turn``); with
   overlapping commits the slot goes to the next batch's jobs meanwhile. When the batch before
   ran its jobs again after this batch's ran (a failed commit), this batch runs its own again:
   outputs see batches in order.
4. COMMITTING: the commits its jobs left (``_commit_pending``), then the batch's commit
   (``_commit``): the pipeline counts, verifies, writes the commit marker and moves every
   node on (``recovery.batch_commit``), and the generator cleans up and checkpoints.
5. COMMITTED; or FAILED for good; or CANCELLED, by a stop or because the batch before it
   failed. What each stateful operator did in the batch is taken from it before its commit
   (or as it fails), and each end is told to the lifecycle, which builds the batch's progress
   record from the run's ``JobSet``.

The job scheduler keeps what is about many batches: the slots, the threads, cancelling and
shutting down (``Scheduling``).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from batchline.batch_time import format_batch_time
from batchline.clock import Clock
from batchline.errors import BatchFailedError, ContextStateError, carried_error_in, short_cause
from batchline.scheduler.input_info import InputInfoTracker
from batchline.scheduler.job import BatchState, FailedIn, Job, JobSet, PendingCommit
from batchline.scheduler.lifecycle import BatchLifecycle
from batchline.scheduler.progress import StateOperatorProgress
from batchline.scheduler.retry import RetryPolicy

__all__ = ["BatchRun", "RunState", "BatchPipeline", "Scheduling"]

logger = logging.getLogger(__name__)


class RunState(enum.Enum):
    GENERATED = "generated"
    RUNNING = "running"
    WAITING_TO_COMMIT = "waiting for its turn to commit"
    COMMITTING = "committing"
    COMMITTED = "committed"
    FAILED = "failed"
    CANCELLED = "cancelled"


FRESH_LEASE_CHECK_MS = 1_000
"""How long before its commit marker a batch's lease check, made beside its jobs' commits, may be."""

_ENDS = frozenset({RunState.COMMITTED, RunState.FAILED, RunState.CANCELLED})

_ALLOWED: dict[RunState, frozenset[RunState]] = {
    RunState.GENERATED: frozenset({RunState.RUNNING, RunState.FAILED, RunState.CANCELLED}),
    # Running again is a retry after a failed job.
    RunState.RUNNING: frozenset({RunState.RUNNING, RunState.WAITING_TO_COMMIT, RunState.FAILED,
                                 RunState.CANCELLED}),
    # Back to running: the batch before ran its jobs again after this batch's ran.
    RunState.WAITING_TO_COMMIT: frozenset({RunState.RUNNING, RunState.COMMITTING, RunState.FAILED,
                                           RunState.CANCELLED}),
    # Back to running: a commit the jobs left failed, and the retry policy runs the batch again.
    RunState.COMMITTING: frozenset({RunState.RUNNING, RunState.COMMITTED, RunState.FAILED, RunState.CANCELLED}),
    RunState.COMMITTED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.CANCELLED: frozenset(),
}


class BatchPipeline(Protocol):
    """What a batch asks of the pipeline (``recovery.BatchCommit``)."""

    def jobs_for(self, batch_time: int) -> list[Job]:
        """Take the batch's input (logged before anything runs) and build its jobs."""

    def check_commit(self, batch_time: int) -> None:
        """What the batch's commit marker needs that no commit of its jobs changes (that this
        driver still holds the checkpoint lease); raises as ``commit`` would. Called beside
        those commits: on an object store it is a round trip that need not follow theirs."""

    def commit(self, batch_time: int, lease_checked: bool = False) -> None:
        """Every job of the batch succeeded: make the batch durable (count, verify, commit marker,
        move every node on). ``lease_checked``: ``check_commit`` passed after the batch's jobs."""

    def operator_progress(self, batch_time: int) -> dict[str, StateOperatorProgress]:
        """What each stateful operator did in the batch (so far), by name."""


class Scheduling(Protocol):
    """What a batch asks of the job scheduler, which keeps what is about many batches."""

    @property
    def clock(self) -> Clock: ...

    @property
    def lifecycle(self) -> BatchLifecycle: ...

    @property
    def retry(self) -> RetryPolicy: ...

    @property
    def overlap_commits(self) -> bool:
        """Whether a batch gives up its slot while it waits for its turn to commit."""

    @property
    def cancelling(self) -> bool:
        """A stop cancels every batch: none starts, waits or commits any more."""

    @property
    def stop_waiting(self) -> threading.Event:
        """Set on stop: a batch waiting to retry gives up at once."""

    def take_slot(self) -> None: ...

    def give_back_slot(self) -> None: ...

    def next_job_run(self) -> int:
        """A number that grows with every run of a batch's jobs that succeeded, across batches."""

    def enter_job_group(self, batch_time: int) -> None:
        """Run this thread's Spark jobs in the batch's job group, which a stop cancels."""

    def report_error(self, message: str, error: BaseException) -> None: ...

    def beside(self, work: Callable[[], None]) -> Future[None]:
        """``work`` on a thread of the scheduler's own, beside the batch's."""


class _Verdict(enum.Enum):
    """What follows a failed run of a batch."""

    RETRY = "retry"
    GIVE_UP = "give up"
    STOPPED = "stopped"


_Failure = tuple[Job, BaseException]


def _batch(batch_time: int) -> str:
    return f"{format_batch_time(batch_time)} ({batch_time} ms)"


class BatchRun:
    """One batch, from generation to commit; its steps are its methods, in the order above."""

    def __init__(self, job_set: JobSet, pipeline: BatchPipeline,
                 on_committed: Callable[[int], None] | None = None) -> None:
        self.job_set = job_set
        """The batch's jobs and what the listeners are told of it (its ``BatchState``, its trace)."""
        self._pipeline = pipeline
        self._on_committed = on_committed
        """The generator's clean-up and checkpoint after the commit."""
        self.state = RunState.GENERATED
        self.attempts = 0
        """Runs of the batch's jobs so far (0 until it starts)."""
        self._pending: list[tuple[Job, PendingCommit]] = []
        """The commits the current run's jobs left, in job order."""
        self._previous: BatchRun | None = None
        """The batch before, in the commit order, while this one runs."""
        self._ended = threading.Event()
        self.failed_holding_slot = False
        """Set before the batch gives up its slot when its jobs failed for good: the next batch,
        which takes that slot, then runs none of its own (its outputs must not see it)."""
        self.jobs_run = 0
        """When the jobs of the run that committed finished (``Scheduling.next_job_run``). A
        batch whose own jobs finished before that runs them again: its predecessor ran again
        after it (a failed commit), and outputs see batches in order."""

    @property
    def time(self) -> int:
        return self.job_set.time

    # ---------------------------------------------------------------- 1. generated
    @classmethod
    def generate(cls, time: int, pipeline: BatchPipeline, input_info: InputInfoTracker, clock: Clock,
                 on_committed: Callable[[int], None] | None = None) -> BatchRun:
        """Take the batch's input and build its jobs (raises when either fails)."""
        began = clock.now_ms()
        jobs = pipeline.jobs_for(time)
        infos = input_info.get_info(time)
        now = clock.now_ms()
        return cls(JobSet(time, jobs, infos, now, generation_ms=now - began), pipeline, on_committed)

    def queue(self, previous: BatchRun | None, lifecycle: BatchLifecycle) -> None:
        """Take a place in the commit order, behind ``previous`` (None: the first batch)."""
        self._previous = previous
        lifecycle.generated(self.job_set)

    # ---------------------------------------------------------------- 2.-5. run, wait, commit
    def run(self, scheduling: Scheduling) -> None:
        """Run the batch's jobs, then (its turn come) the commits they left and the batch's
        commit, on this thread. A batch that fails for good is reported, uncommitted."""
        try:
            self._run(scheduling)
        except BaseException as error:  # a bug: report it, or the batches after this one would wait on it silently
            if self.state not in _ENDS:
                self.state = RunState.FAILED
            scheduling.report_error(f"Error running batch {self.time}", error)
        finally:
            self._previous = None  # the commit order needs only the batches still running
            self._ended.set()

    def ended(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until the batch has stopped running (committed or not)."""
        return self._ended.wait(timeout_s)

    def _run(self, scheduling: Scheduling) -> None:
        if scheduling.cancelling:  # queued when the stop came: it never started
            self._move(RunState.CANCELLED)
            return
        scheduling.take_slot()
        holding = True
        try:
            if scheduling.cancelling:  # stopped while it waited for a slot
                self._move(RunState.CANCELLED)
                return
            previous = self._previous
            if previous is not None and previous.failed_holding_slot:
                self.failed_holding_slot = True
                self._fail(scheduling, BatchFailedError(
                    self.time, "commit", RuntimeError("the batch before it failed"), 0, "the batch's jobs"),
                    stopped=True)
                return
            # Step 2
            self._start(scheduling)
            while True:
                if not holding:  # after a failed commit, the jobs run again in a slot
                    scheduling.take_slot()
                    holding = True
                failure = self._run_jobs(scheduling)
                if failure is None:
                    jobs_run = scheduling.next_job_run()
                    if scheduling.overlap_commits:
                        scheduling.give_back_slot()
                        holding = False
                    # Step 3
                    self._move(RunState.WAITING_TO_COMMIT)
                    if not self._wait_for_turn(scheduling):
                        self._abandon_pending()
                        self._fail(scheduling, BatchFailedError(
                            self.time, "commit", RuntimeError("the batch before it did not commit"), self.attempts,
                            "the batch's commit"), stopped=True)
                        return
                    if previous is not None and previous.jobs_run > jobs_run:
                        if self.job_set.jobs:
                            logger.info("Batch %s runs its jobs again, after the batch before it ran its own again",
                                        _batch(self.time))
                        self._abandon_pending()
                        self._move(RunState.RUNNING)
                        continue
                    # Step 4
                    self._move(RunState.COMMITTING)
                    commit_started = scheduling.clock.now_ms()
                    lease_check = scheduling.beside(lambda: self._pipeline.check_commit(self.time))
                    failure = self._commit_pending()
                    if failure is None:
                        self.jobs_run = jobs_run
                        break
                job, cause = failure
                verdict = self._after_failure(scheduling, job, cause)  # a failed job keeps its slot
                if verdict is not _Verdict.RETRY:
                    self.failed_holding_slot = holding
                    self._fail(scheduling, BatchFailedError(self.time, job.name, cause, self.attempts,
                                                            job.describe()), stopped=verdict is _Verdict.STOPPED)
                    return
                self.attempts += 1
                self._move(RunState.RUNNING)
        finally:
            if holding:
                scheduling.give_back_slot()
        self._commit(scheduling, commit_started, lease_check)  # Steps 4 and 5

    def _start(self, scheduling: Scheduling) -> None:
        scheduling.enter_job_group(self.time)
        self.job_set.processing_start_time = scheduling.clock.now_ms()
        self.job_set.move_to(BatchState.RUNNING)
        self._move(RunState.RUNNING)
        self.attempts = 1
        scheduling.lifecycle.started(self.job_set, self.attempts)

    def _run_jobs(self, scheduling: Scheduling) -> _Failure | None:
        """Run every job of the batch in order, keeping the commits they leave: the first one
        that fails and why (its commits are then abandoned), or None."""
        clock, lifecycle = scheduling.clock, scheduling.lifecycle
        for job in self.job_set.jobs:
            logger.debug("Starting job %s of batch %d", job.describe(), job.batch_time)
            started = clock.now_ms()
            try:
                left = job.run()
            except BaseException as raised:
                self._abandon_pending()
                failed, cause = (raised.job, raised.cause) if isinstance(raised, FailedIn) else (job, raised)
                # A batchline error raised in a task (a damaged file it read, a full store) arrives
                # as text in Spark's error: the batch fails with it, retried or not as it says.
                return failed, carried_error_in(cause) or cause
            finally:
                lifecycle.job_finished(self.job_set, job, started, clock.now_ms())
            if left is not None:
                self._pending.append((job, left))
        return None

    def _after_failure(self, scheduling: Scheduling, job: Job, cause: BaseException) -> _Verdict:
        """Decide whether this run of the batch is followed by another; wait the backoff if so."""
        if scheduling.cancelling or scheduling.stop_waiting.is_set():
            return _Verdict.STOPPED
        policy, attempt = scheduling.retry, self.attempts
        if not policy.should_retry(cause, attempt):
            if attempt < policy.max_attempts:
                logger.warning("Batch %s failed in %s with an error that the same input raises the same way "
                               "every time; not retrying: %s", _batch(self.time), job.describe(),
                               short_cause(cause))
            return _Verdict.GIVE_UP
        delay_ms = policy.backoff_ms(attempt)
        resume_at = scheduling.clock.now_ms() + delay_ms  # fixed before anyone hears of the wait
        logger.warning("Batch %s failed in %s (attempt %d of %d): %s; retrying in %d ms",
                       _batch(self.time), job.describe(), attempt, policy.max_attempts,
                       short_cause(cause), delay_ms)
        scheduling.lifecycle.retrying(self.job_set, attempt, f"{job.describe()}: {short_cause(cause)}")
        if not scheduling.clock.wait_until(resume_at, scheduling.stop_waiting):
            return _Verdict.STOPPED
        logger.info("Running batch %s again (attempt %d of %d)", _batch(self.time), attempt + 1,
                    policy.max_attempts)
        return _Verdict.RETRY

    def _wait_for_turn(self, scheduling: Scheduling) -> bool:
        """Wait until the batch before has stopped running; whether it committed (a stop ends
        the wait with False)."""
        previous = self._previous
        if previous is None:
            return True
        while not previous.ended(0.05):
            if scheduling.cancelling:
                return False
        return previous.state is RunState.COMMITTED and not scheduling.cancelling

    def _commit_pending(self) -> _Failure | None:
        """The jobs' commits in job order; the first that fails (the rest are abandoned) or None."""
        pending, self._pending = self._pending, []
        for index, (job, left) in enumerate(pending):
            try:
                left.commit()
            except BaseException as cause:
                self._pending = pending[index + 1:]
                self._abandon_pending()
                return job, cause
        return None

    def _abandon_pending(self) -> None:
        pending, self._pending = self._pending, []
        for job, left in pending:
            try:
                left.abandon()
            except Exception as error:  # noqa: BLE001 (what was staged is cleaned up by the next start)
                logger.warning("Letting go of what %s staged for batch %d failed: %s", job.describe(),
                               job.batch_time, short_cause(error))

    def _commit(self, scheduling: Scheduling, commit_started: int, lease_check: Future[None]) -> None:
        job_set, clock = self.job_set, scheduling.clock
        job_set.processing_end_time = clock.now_ms()
        try:
            # Taken before the commit: once committed, an operator may let go of its part of the batch.
            job_set.state_operators = self._pipeline.operator_progress(self.time)
            lease_check.result()
            # A check older than that (commits that took long) is made again, right before the marker.
            fresh = clock.now_ms() - commit_started <= FRESH_LEASE_CHECK_MS
            # Not retried: the commit marker may already be written, and a fenced driver must stop.
            self._pipeline.commit(self.time, lease_checked=fresh)
            if self._on_committed is not None:
                self._on_committed(self.time)
        except BaseException as cause:
            self._fail(scheduling, BatchFailedError(self.time, "commit", cause, self.attempts, "the batch's commit"),
                       stopped=scheduling.cancelling)
            return
        self._move(RunState.COMMITTED)
        job_set.move_to(BatchState.COMPLETED)
        scheduling.lifecycle.finished(job_set, self.attempts, clock.now_ms() - commit_started)
        logger.debug(
            "Finished jobs of time %d ms (total delay %d ms, processing %d ms%s)",
            self.time, job_set.processing_end_time - self.time,
            job_set.processing_end_time - (job_set.processing_start_time or 0),
            f", {self.attempts} attempts" if self.attempts > 1 else "",
        )

    def _fail(self, scheduling: Scheduling, error: BatchFailedError, stopped: bool) -> None:
        job_set = self.job_set
        job_set.processing_end_time = scheduling.clock.now_ms()
        job_set.failure = str(error)
        try:
            job_set.state_operators = self._pipeline.operator_progress(self.time)
        except Exception:
            logger.exception("Could not read the operators' progress of failed batch %d for its record", self.time)
        job_set.move_to(BatchState.FAILED)
        self._move(RunState.CANCELLED if stopped else RunState.FAILED)
        scheduling.lifecycle.finished(job_set, self.attempts, cancelled=stopped)
        if stopped:
            logger.info("Batch %d was cancelled by the stop; it was not committed, so the next start runs it",
                        self.time)
        else:
            scheduling.report_error(f"Error running job of batch {self.time}", error)

    def _move(self, state: RunState) -> None:
        if state not in _ALLOWED[self.state]:
            raise ContextStateError(f"batch {self.time} cannot go from {self.state.value} to {state.value}; "
                                    "this is a bug in batchline's scheduler, please report it")
        self.state = state
