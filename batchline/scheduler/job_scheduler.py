"""Runs each batch's job set on Spark and reports its lifecycle to listeners (SPEC A4, A7)."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import SparkSession

from batchline.batch_time import format_batch_time
from batchline.clock import Clock
from batchline.errors import BatchFailedError
from batchline.scheduler.input_info import InputInfoTracker
from batchline.scheduler.job import BatchState, JobSet
from batchline.scheduler.listener import BatchInfo, ListenerBus

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


class JobScheduler:
    """Runs job sets, at most ``concurrent_jobs`` batches at a time, in submission order.

    The jobs of one batch run one after another on the same thread, inside a Spark job group
    named after the batch, so an immediate stop can cancel exactly the running batches. Once
    they all succeeded, ``commit(batch_time)`` commits the batch on that same thread.
    """

    def __init__(
        self,
        settings: SchedulerSettings,
        spark: SparkSession,
        clock: Clock,
        input_info: InputInfoTracker,
        listener_bus: ListenerBus,
        on_error: Callable[[BaseException], None],
        commit: Callable[[int], None],
    ) -> None:
        self.settings = settings
        self._spark = spark
        self._clock = clock
        self._input_info = input_info
        self._listener_bus = listener_bus
        self._on_error = on_error
        self._commit = commit
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.concurrent_jobs, thread_name_prefix="batchline-job"
        )
        self._lock = threading.Lock()
        self._futures: dict[int, concurrent.futures.Future[None]] = {}
        self._cancelling = False

    # ---------------------------------------------------------------- submission
    def submit_job_set(self, job_set: JobSet) -> None:
        if not job_set.jobs:
            # Still reported: the batch took its input, and listeners see every batch time.
            logger.info("No jobs added for time %d ms", job_set.time)
        self._listener_bus.post("on_batch_submitted", self._info(job_set))
        future = self._executor.submit(self._run_job_set, job_set)
        with self._lock:
            self._futures[job_set.time] = future
        future.add_done_callback(functools.partial(self._forget_future, job_set.time))
        if job_set.jobs:
            logger.info("Added jobs for time %d ms", job_set.time)

    def report_error(self, message: str, error: BaseException) -> None:
        logger.error("%s: %s", message, error)
        self._listener_bus.post("on_error", error)
        self._on_error(error)

    def _group_id(self, batch_time: int) -> str:
        return f"{self.settings.job_group_prefix}-{batch_time}"

    # ---------------------------------------------------------------- execution
    def _run_job_set(self, job_set: JobSet) -> None:
        if self._cancelling:
            return
        spark_context = self._spark.sparkContext
        spark_context.setJobGroup(
            self._group_id(job_set.time), f"batchline batch {format_batch_time(job_set.time)}", True
        )
        job_set.processing_start_time = self._clock.now_ms()
        job_set.move_to(BatchState.RUNNING)
        self._listener_bus.post("on_batch_started", self._info(job_set))
        try:
            for job in job_set.jobs:
                logger.debug("Starting job %s of batch %d", job.name, job.batch_time)
                try:
                    job.run()
                except BaseException as cause:
                    raise BatchFailedError(job_set.time, job.name, cause) from cause
            job_set.processing_end_time = self._clock.now_ms()
            try:
                self._commit(job_set.time)
            except BaseException as cause:
                raise BatchFailedError(job_set.time, "commit", cause) from cause
        except BatchFailedError as error:
            job_set.processing_end_time = self._clock.now_ms()
            job_set.failure = str(error)
            job_set.move_to(BatchState.FAILED)
            self._finish(job_set)
            if self._cancelling:
                logger.info("Batch %d was cancelled by an immediate stop", job_set.time)
            else:
                self.report_error(f"Error running job of batch {job_set.time}", error)
            return
        job_set.move_to(BatchState.COMPLETED)
        self._finish(job_set)
        logger.info(
            "Finished jobs of time %d ms (total delay %d ms, processing %d ms)",
            job_set.time, job_set.processing_end_time - job_set.time,
            job_set.processing_end_time - job_set.processing_start_time,
        )

    def _forget_future(self, batch_time: int, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._futures.pop(batch_time, None)

    def _finish(self, job_set: JobSet) -> None:
        self._listener_bus.post("on_batch_completed", self._info(job_set))

    def _info(self, job_set: JobSet) -> BatchInfo:
        # Sources that count while the batch runs (files) replace their statistics then.
        return BatchInfo(
            batch_time=job_set.time,
            submission_time=job_set.submission_time,
            processing_start_time=job_set.processing_start_time,
            processing_end_time=job_set.processing_end_time,
            input_infos=self._input_info.get_info(job_set.time) or job_set.input_infos,
            failure=job_set.failure,
            state_operators=self._input_info.get_operators(job_set.time),
        )

    # ---------------------------------------------------------------- stopping
    def wait_for_running_jobs(self, timeout_s: float) -> bool:
        with self._lock:
            pending = list(self._futures.values())
        done, not_done = concurrent.futures.wait(pending, timeout=timeout_s)
        return not not_done

    def cancel_all(self) -> None:
        """Cancel queued batches and the Spark jobs of running ones."""
        self._cancelling = True
        with self._lock:
            futures = dict(self._futures)
        for batch_time, future in futures.items():
            if not future.cancel():
                logger.info("Cancelling Spark jobs of batch %d", batch_time)
                self._spark.sparkContext.cancelJobGroup(self._group_id(batch_time))

    def shutdown(self, graceful: bool) -> None:
        if not graceful:
            self.cancel_all()
            if not self.wait_for_running_jobs(_CANCEL_GRACE_S):
                logger.warning("Some batch jobs did not return %.0f s after being cancelled", _CANCEL_GRACE_S)
        self._executor.shutdown(wait=False, cancel_futures=True)
