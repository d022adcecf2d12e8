"""Runs each batch's job set on Spark and reports its lifecycle to listeners (SPEC A4, A7)."""

from __future__ import annotations

import concurrent.futures
import enum
import functools
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from batchline.batch_time import format_batch_time
from batchline.clock import Clock
from batchline.errors import BatchFailedError, short_cause
from batchline.scheduler.job import BatchState, FailedIn, Job, JobSet, PendingCommit
from batchline.scheduler.lifecycle import BatchLifecycle
from batchline.scheduler.retry import RetryPolicy

__all__ = ["JobScheduler", "SchedulerSettings"]

logger = logging.getLogger(__name__)

# How long an immediate stop waits for cancelled jobs to return before leaving them behind.
_CANCEL_GRACE_S = 5.0


@dataclass(frozen=True)
class SchedulerSettings:
    batch_interval_ms: int
    concurrent_jobs: int
    graceful_stop_timeout_ms: int
    job_group_prefix: str
    retry: RetryPolicy = field(default_factory=RetryPolicy.never)
    """How a batch whose job failed runs again (SPEC H3)."""
    overlap_commits: bool = False
    """Whether a batch may commit while the next batch's jobs run. True when no stateful
    operator builds a batch on the one before; batches still commit in order."""


class _Verdict(enum.Enum):
    """What follows a failed run of a batch."""

    RETRY = "retry"
    GIVE_UP = "give up"
    STOPPED = "stopped"


def _batch(batch_time: int) -> str:
    return f"{format_batch_time(batch_time)} ({batch_time} ms)"


@dataclass
class _Turn:
    """A batch's place in the commit order: set done when the batch stops running (committed
    or not); the next batch commits only after it, and only if it committed."""

    done: threading.Event = field(default_factory=threading.Event)
    committed: bool = False
    failed: bool = False
    """Set before the batch gives up its slot when its jobs failed for good: the next batch,
    which takes that slot, then runs none of its own (its outputs must not see it)."""
    jobs_run: int = 0
    """When the jobs of the run that committed finished (the scheduler's count of job runs). A
    batch whose own jobs finished before that runs them again: its predecessor ran again after
    it (a failed commit), and outputs see batches in order."""


_Failure = tuple[Job, BaseException]


class JobScheduler:
    """Runs job sets, at most ``concurrent_jobs`` batches' jobs at a time, in submission order.

    The jobs of one batch run one after another on the same thread, inside a Spark job group
    named after the batch, so an immediate stop can cancel exactly the running batches. When
    one fails, the batch's jobs run again after a backoff on the clock, as ``settings.retry``
    allows; a stop cuts the wait short. Once they all succeeded and the batch before has
    committed, the commits they left (``PendingCommit``, a sink's move of staged rows) run,
    then ``commit(batch_time)`` commits the batch, on that same thread: batches commit in
    order, and not after a batch before them failed. With ``overlap_commits`` the batch gives
    its slot to the next batch's jobs for that commit step; when a failed commit makes it run
    its jobs again, the batches after it run theirs again too, so every output sees the
    batches in order. (A sink that commits inside ``write`` may then have written the next
    batch before this one fails for good; the next start runs both again, in order.) What
    happens to each batch is told to ``lifecycle``.
    """

    def __init__(
        self,
        settings: SchedulerSettings,
        spark: SparkSession,
        clock: Clock,
        lifecycle: BatchLifecycle,
        on_error: Callable[[BaseException], None],
        commit: Callable[[int], None],
    ) -> None:
        self.settings = settings
        self._spark = spark
        self._clock = clock
        self._lifecycle = lifecycle
        self._on_error = on_error
        self._commit = commit
        # One more thread when commits overlap: a batch committing while the next runs its jobs.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.concurrent_jobs + (1 if settings.overlap_commits else 0),
            thread_name_prefix="batchline-job",
        )
        self._slots = threading.Semaphore(settings.concurrent_jobs)
        """Held while a batch runs its jobs: at most ``concurrent_jobs`` batches do at once."""
        self._lock = threading.Lock()
        self._futures: dict[int, concurrent.futures.Future[None]] = {}
        self._committed: set[int] = set()
        """Batches committed whose thread has not returned yet (it still tells the listeners): a
        stop does not count them as unfinished."""
        self._last_turn: _Turn | None = None
        self._job_runs = itertools.count(1)
        self._cancelling = False
        self._stop_waiting = threading.Event()
        """Set on stop: a batch waiting to retry gives up at once."""

    # ---------------------------------------------------------------- submission
    def submit_job_set(self, job_set: JobSet) -> None:
        if not job_set.jobs:
            # Still reported: the batch took its input, and listeners see every batch time.
            logger.info("No jobs added for time %d ms", job_set.time)
        self._lifecycle.generated(job_set)
        with self._lock:
            previous, turn = self._last_turn, _Turn()
            self._last_turn = turn
            future = self._executor.submit(self._run_job_set, job_set, previous, turn)
            self._futures[job_set.time] = future
        future.add_done_callback(functools.partial(self._forget_future, job_set.time))
        if job_set.jobs:
            logger.info("Added jobs for time %d ms", job_set.time)

    def report_error(self, message: str, error: BaseException) -> None:
        logger.error("%s: %s", message, error)
        self._lifecycle.error(error)
        self._on_error(error)

    def _group_id(self, batch_time: int) -> str:
        return f"{self.settings.job_group_prefix}-{batch_time}"

    # ---------------------------------------------------------------- execution
    def _run_job_set(self, job_set: JobSet, previous: _Turn | None, turn: _Turn) -> None:
        try:
            self._run_and_commit(job_set, previous, turn)
        except BaseException as error:  # a bug: report it, or the batches after this one would wait on it silently
            self.report_error(f"Error running batch {job_set.time}", error)
        finally:
            turn.done.set()

    def _run_and_commit(self, job_set: JobSet, previous: _Turn | None, turn: _Turn) -> None:
        """Run the batch's jobs, again after a backoff while the retry policy allows (SPEC H3),
        then (its turn come) the commits they left and the batch's commit. A batch that fails
        for good is reported, uncommitted."""
        if self._cancelling:
            return
        self._slots.acquire()
        holding = True
        try:
            if self._cancelling:  # stopped while it waited for a slot
                return
            if previous is not None and previous.failed:
                turn.failed = True
                self._fail(job_set, BatchFailedError(
                    job_set.time, "commit", RuntimeError("the batch before it failed"), 0,
                    "the batch's jobs"), 0, stopped=True)
                return
            self._spark.sparkContext.setJobGroup(
                self._group_id(job_set.time), f"batchline batch {format_batch_time(job_set.time)}", True
            )
            job_set.processing_start_time = self._clock.now_ms()
            job_set.move_to(BatchState.RUNNING)
            attempts = 1
            self._lifecycle.started(job_set, attempts)
            while True:
                if not holding:  # after a failed commit, the jobs run again in a slot
                    self._slots.acquire()
                    holding = True
                failure, pending = self._run_jobs(job_set)
                if failure is None:
                    jobs_run = next(self._job_runs)
                    if self.settings.overlap_commits:
                        self._slots.release()
                        holding = False
                    if not self._wait_for_turn(previous):
                        _abandon(pending)
                        self._fail(job_set, BatchFailedError(
                            job_set.time, "commit", RuntimeError("the batch before it did not commit"), attempts,
                            "the batch's commit"), attempts, stopped=True)
                        return
                    if previous is not None and previous.jobs_run > jobs_run:
                        if job_set.jobs:
                            logger.info("Batch %s runs its jobs again, after the batch before it ran its own again",
                                        _batch(job_set.time))
                        _abandon(pending)
                        continue
                    commit_started = self._clock.now_ms()
                    failure = _commit_all(pending)
                    if failure is None:
                        turn.jobs_run = jobs_run
                        break
                job, cause = failure
                verdict = self._after_failure(job_set, job, cause, attempts)  # a failed job keeps its slot
                if verdict is not _Verdict.RETRY:
                    turn.failed = holding
                    self._fail(job_set, BatchFailedError(job_set.time, job.name, cause, attempts, job.describe()),
                               attempts, stopped=verdict is _Verdict.STOPPED)
                    return
                attempts += 1
        finally:
            if holding:
                self._slots.release()
        job_set.processing_end_time = self._clock.now_ms()
        try:
            # Not retried: the commit marker may already be written, and a fenced driver must stop.
            self._commit(job_set.time)
        except BaseException as cause:
            self._fail(job_set, BatchFailedError(job_set.time, "commit", cause, attempts, "the batch's commit"),
                       attempts, stopped=self._cancelling)
            return
        with self._lock:
            self._committed.add(job_set.time)
        turn.committed = True
        job_set.move_to(BatchState.COMPLETED)
        self._lifecycle.finished(job_set, attempts, self._clock.now_ms() - commit_started)
        logger.info(
            "Finished jobs of time %d ms (total delay %d ms, processing %d ms%s)",
            job_set.time, job_set.processing_end_time - job_set.time,
            job_set.processing_end_time - job_set.processing_start_time,
            f", {attempts} attempts" if attempts > 1 else "",
        )

    def _wait_for_turn(self, previous: _Turn | None) -> bool:
        """Wait until the batch before has stopped running; whether it committed (a stop ends
        the wait with False)."""
        if previous is None:
            return True
        while not previous.done.wait(0.05):
            if self._cancelling:
                return False
        return previous.committed and not self._cancelling

    def _run_jobs(self, job_set: JobSet) -> tuple[_Failure | None, list[tuple[Job, PendingCommit]]]:
        """Run every job of the batch in order: the first one that fails and why (or None), and
        the commits the jobs left (none after a failure: they are abandoned)."""
        pending: list[tuple[Job, PendingCommit]] = []
        for job in job_set.jobs:
            logger.debug("Starting job %s of batch %d", job.describe(), job.batch_time)
            started = self._clock.now_ms()
            try:
                left = job.run()
            except FailedIn as failure:
                _abandon(pending)
                return (failure.job, failure.cause), []
            except BaseException as cause:
                _abandon(pending)
                return (job, cause), []
            finally:
                self._lifecycle.job_finished(job_set, job, started, self._clock.now_ms())
            if left is not None:
                pending.append((job, left))
        return None, pending

    def _after_failure(self, job_set: JobSet, job: Job, cause: BaseException, attempt: int) -> _Verdict:
        """Decide whether run ``attempt`` of the batch is followed by another; wait the backoff if so."""
        if self._cancelling or self._stop_waiting.is_set():
            return _Verdict.STOPPED
        policy = self.settings.retry
        if not policy.should_retry(cause, attempt):
            if attempt < policy.max_attempts:
                logger.warning("Batch %s failed in %s with an error that the same input raises the same way "
                               "every time; not retrying: %s", _batch(job_set.time), job.describe(),
                               short_cause(cause))
            return _Verdict.GIVE_UP
        delay_ms = policy.backoff_ms(attempt)
        resume_at = self._clock.now_ms() + delay_ms  # fixed before anyone hears of the wait
        logger.warning("Batch %s failed in %s (attempt %d of %d): %s; retrying in %d ms",
                       _batch(job_set.time), job.describe(), attempt, policy.max_attempts,
                       short_cause(cause), delay_ms)
        self._lifecycle.retrying(job_set, attempt, f"{job.describe()}: {short_cause(cause)}")
        if not self._clock.wait_until(resume_at, self._stop_waiting):
            return _Verdict.STOPPED
        logger.info("Running batch %s again (attempt %d of %d)", _batch(job_set.time), attempt + 1,
                    policy.max_attempts)
        return _Verdict.RETRY

    def _fail(self, job_set: JobSet, error: BatchFailedError, attempts: int, stopped: bool) -> None:
        job_set.processing_end_time = self._clock.now_ms()
        job_set.failure = str(error)
        job_set.move_to(BatchState.FAILED)
        self._lifecycle.finished(job_set, attempts, cancelled=stopped)
        if stopped:
            logger.info("Batch %d was cancelled by the stop; it was not committed, so the next start runs it",
                        job_set.time)
        else:
            self.report_error(f"Error running job of batch {job_set.time}", error)

    def _forget_future(self, batch_time: int, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._futures.pop(batch_time, None)
            self._committed.discard(batch_time)

    # ---------------------------------------------------------------- stopping
    def wait_for_running_jobs(self, timeout_s: float) -> bool:
        with self._lock:
            pending = list(self._futures.values())
        done, not_done = concurrent.futures.wait(pending, timeout=timeout_s)
        return not not_done

    def cancel_all(self) -> None:
        """Cancel queued batches, the Spark jobs of running ones, and waits before a retry."""
        self._cancelling = True
        self._stop_waiting.set()
        with self._lock:
            futures = dict(self._futures)
        for batch_time, future in futures.items():
            if not future.cancel():
                logger.info("Cancelling Spark jobs of batch %d", batch_time)
                self._spark.sparkContext.cancelJobGroup(self._group_id(batch_time))

    def shutdown(self, graceful: bool) -> list[int]:
        """Stop running batches, so that none runs on once the checkpoint lease is given up.

        A graceful stop has already waited for them (up to its timeout); the batches still
        queued or running then (a backlog, or batches slower than the interval) are cancelled
        and named: they were not committed, and the next start runs them. A batch waiting to
        retry gives up the same way. Returns the batches that were not finished."""
        self._stop_waiting.set()
        with self._lock:
            running = [future for future in self._futures.values() if not future.done()]
            unfinished = sorted(t for t, future in self._futures.items()
                                if not future.done() and t not in self._committed)
        if graceful and unfinished:
            logger.warning("The graceful stop timed out with %d batches not finished (%s); cancelling them. They "
                           "were not committed, so the next start runs them", len(unfinished),
                           ", ".join(format_batch_time(t) for t in unfinished))
        if unfinished or not graceful:
            self.cancel_all()
            if not self.wait_for_running_jobs(_CANCEL_GRACE_S):
                logger.warning("Some batch jobs did not return %.0f s after being cancelled", _CANCEL_GRACE_S)
        else:  # committed, still telling the listeners: let them finish before the lease is given up
            concurrent.futures.wait(running, timeout=_CANCEL_GRACE_S)
        self._executor.shutdown(wait=False, cancel_futures=True)
        return unfinished


def _commit_all(pending: list[tuple[Job, PendingCommit]]) -> _Failure | None:
    """The jobs' commits in job order; the first that fails (the rest are abandoned) or None."""
    for index, (job, left) in enumerate(pending):
        try:
            left.commit()
        except BaseException as cause:
            _abandon(pending[index + 1:])
            return job, cause
    return None


def _abandon(pending: list[tuple[Job, PendingCommit]]) -> None:
    for job, left in pending:
        try:
            left.abandon()
        except Exception as error:  # noqa: BLE001 (what was staged is cleaned up by the next start)
            logger.warning("Letting go of what %s staged for batch %d failed: %s", job.describe(), job.batch_time,
                           short_cause(error))
