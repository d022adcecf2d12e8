"""Runs batches on Spark, at most ``concurrent_jobs`` at a time, and stops them (SPEC A4, A7).

What happens to one batch is ``BatchRun``'s (``batchline.scheduler.batch_run``); the scheduler
keeps what is about many: the slots, the threads, the commit order's tail, cancelling and
shutting down.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from batchline.batch_time import format_batch_time
from batchline.clock import Clock
from batchline.errors import error_text
from batchline.scheduler.batch_run import BatchRun, RunState
from batchline.scheduler.lifecycle import BatchLifecycle
from batchline.scheduler.retry import RetryPolicy
from batchline.spark import spark_gone

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


class JobScheduler:
    """Runs batches, at most ``concurrent_jobs`` batches' jobs at a time, in submission order.

    Each batch runs on a thread of its own (``BatchRun.run``), its jobs inside a Spark job group
    named after the batch, so an immediate stop can cancel exactly the running batches. Batches
    commit in order, and not after a batch before them failed. With ``overlap_commits`` a batch
    gives its slot to the next batch's jobs while it waits for its turn and commits; when a
    failed commit makes it run its jobs again, the batches after it run theirs again too, so
    every output sees the batches in order. (A sink that commits inside ``write`` may then have
    written the next batch before this one fails for good; the next start runs both again, in
    order.) What happens to each batch is told to ``lifecycle``.
    """

    def __init__(
        self,
        settings: SchedulerSettings,
        spark: SparkSession,
        clock: Clock,
        lifecycle: BatchLifecycle,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.settings = settings
        self._spark = spark
        self._clock = clock
        self._lifecycle = lifecycle
        self._on_error = on_error
        # One more thread when commits overlap: a batch committing while the next runs its jobs.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.concurrent_jobs + (1 if settings.overlap_commits else 0),
            thread_name_prefix="batchline-job",
        )
        self._beside = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="batchline-commit-check")
        """What a committing batch does beside its commits (``beside``); batches commit one at a time."""
        self._slots = threading.Semaphore(settings.concurrent_jobs)
        """Held while a batch runs its jobs: at most ``concurrent_jobs`` batches do at once."""
        self._lock = threading.Lock()
        self._runs: dict[int, tuple[BatchRun, concurrent.futures.Future[None]]] = {}
        """Batches submitted whose thread has not returned yet; one committed may still be
        telling the listeners, and a stop does not count it as unfinished."""
        self._last_run: BatchRun | None = None
        """The newest batch submitted: the next one commits after it."""
        self._job_runs = itertools.count(1)
        self._cancelling = False
        self._stop_waiting = threading.Event()

    # ---------------------------------------------------------------- what a batch asks (Scheduling)
    def beside(self, work: Callable[[], None]) -> concurrent.futures.Future[None]:
        try:
            return self._beside.submit(work)
        except RuntimeError:  # shut down meanwhile: done here, as before there was a thread for it
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            try:
                work()
                done.set_result(None)
            except BaseException as error:  # noqa: BLE001 (handed to the batch, which fails its commit with it)
                done.set_exception(error)
            return done

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def lifecycle(self) -> BatchLifecycle:
        return self._lifecycle

    @property
    def retry(self) -> RetryPolicy:
        # Asked after a batch failed: when Spark went away, no run of it can succeed, and the
        # pipeline stops for that; a retry would only announce a wait that the stop cuts short.
        return RetryPolicy.never() if spark_gone(self._spark) is not None else self.settings.retry

    @property
    def overlap_commits(self) -> bool:
        return self.settings.overlap_commits

    @property
    def cancelling(self) -> bool:
        return self._cancelling

    @property
    def stop_waiting(self) -> threading.Event:
        return self._stop_waiting

    def take_slot(self) -> None:
        self._slots.acquire()

    def give_back_slot(self) -> None:
        self._slots.release()

    def next_job_run(self) -> int:
        return next(self._job_runs)

    def enter_job_group(self, batch_time: int) -> None:
        self._spark.sparkContext.setJobGroup(
            self._group_id(batch_time), f"batchline batch {format_batch_time(batch_time)}", True
        )

    def report_error(self, message: str, error: BaseException) -> None:
        # When Spark went away, every batch and generation fails the same way after it: the
        # pipeline says that once, as the reason it stops (``on_error`` hears of it).
        gone = spark_gone(self._spark) is not None
        logger.log(logging.DEBUG if gone else logging.ERROR, "%s: %s", message, error_text(error))
        self._lifecycle.error(error)
        self._on_error(error)

    # ---------------------------------------------------------------- submission
    def submit(self, run: BatchRun) -> None:
        """Queue the batch behind the one submitted before it; it runs once a slot is free."""
        if not run.job_set.jobs:
            # Still reported: the batch took its input, and listeners see every batch time.
            logger.debug("No jobs added for time %d ms", run.time)
        with self._lock:
            run.queue(self._last_run, self._lifecycle)
            self._last_run = run
            future = self._executor.submit(run.run, self)
            self._runs[run.time] = (run, future)
        future.add_done_callback(functools.partial(self._forget_run, run.time))
        if run.job_set.jobs:
            logger.debug("Added jobs for time %d ms", run.time)

    def _group_id(self, batch_time: int) -> str:
        return f"{self.settings.job_group_prefix}-{batch_time}"

    def _forget_run(self, batch_time: int, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._runs.pop(batch_time, None)

    # ---------------------------------------------------------------- stopping
    def wait_for_running_jobs(self, timeout_s: float) -> bool:
        with self._lock:
            pending = [future for _, future in self._runs.values()]
        done, not_done = concurrent.futures.wait(pending, timeout=timeout_s)
        return not not_done

    def cancel_all(self) -> None:
        """Cancel queued batches, the Spark jobs of running ones, and waits before a retry."""
        self._cancelling = True
        self._stop_waiting.set()
        with self._lock:
            futures = {t: future for t, (_, future) in self._runs.items()}
        for batch_time, future in futures.items():
            if not future.cancel():
                logger.info("Cancelling Spark jobs of batch %d", batch_time)
                try:
                    self._spark.sparkContext.cancelJobGroup(self._group_id(batch_time))
                except Exception as error:  # noqa: BLE001 (Spark gone: its jobs went with it; the stop goes on)
                    level = logging.DEBUG if spark_gone(self._spark) is not None else logging.WARNING
                    logger.log(level, "Could not cancel the Spark jobs of batch %d (%s); the batch was not committed, "
                                   "so the next start runs it", batch_time, error_text(error))

    def shutdown(self, graceful: bool) -> list[int]:
        """Stop running batches, so that none runs on once the checkpoint lease is given up.

        A graceful stop has already waited for them (up to its timeout); the batches still
        queued or running then (a backlog, or batches slower than the interval) are cancelled
        and named: they were not committed, and the next start runs them. A batch waiting to
        retry gives up the same way. Returns the batches that were not finished."""
        self._stop_waiting.set()
        with self._lock:
            running = [future for _, future in self._runs.values() if not future.done()]
            unfinished = sorted(t for t, (run, future) in self._runs.items()
                                if not future.done() and run.state is not RunState.COMMITTED)
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
        self._beside.shutdown(wait=False, cancel_futures=True)
        return unfinished
