"""Generates a job set every batch interval and cleans up after each batch (SPEC A1–A3, A5–A7).

Mirrors Spark Streaming's JobGenerator, including its log lines, with time read from an
injected clock so that every path (including the graceful-stop timeout) runs on a manual clock.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from batchline.clock import Clock
from batchline.scheduler.event_loop import EventLoop
from batchline.scheduler.events import ClearCheckpointData, ClearMetadata, DoCheckpoint, GenerateJobs, GeneratorEvent
from batchline.scheduler.job import JobSet
from batchline.scheduler.timer import RecurringTimer

if TYPE_CHECKING:
    from batchline.api.graph import StreamGraph
    from batchline.scheduler.input_info import InputInfoTracker
    from batchline.scheduler.job_scheduler import JobScheduler
    from batchline.scheduler.receiver_tracker import ReceiverTracker

__all__ = ["JobGenerator"]

logger = logging.getLogger(__name__)

STOP_POLL_MS = 100


class JobGenerator:
    def __init__(
        self,
        scheduler: JobScheduler,
        graph: StreamGraph,
        clock: Clock,
        receiver_tracker: ReceiverTracker,
        input_info: InputInfoTracker,
    ) -> None:
        self._scheduler = scheduler
        self._graph = graph
        self._clock = clock
        self._receiver_tracker = receiver_tracker
        self._input_info = input_info
        self.batch_interval_ms = scheduler.settings.batch_interval_ms
        self.timer = RecurringTimer(
            clock, self.batch_interval_ms, self._on_timer, "JobGenerator"
        )
        self._event_loop: EventLoop[GeneratorEvent] = EventLoop(
            "JobGenerator", self._process_event, lambda e: scheduler.report_error("Error in job generator", e)
        )
        self._lock = threading.Lock()
        self._unprocessed: set[int] = set()
        self.last_processed_batch: int | None = None
        self.start_time: int | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._event_loop.start()
        self._start_first_time()

    def _start_first_time(self) -> None:
        start_time = self.timer.get_start_time()
        self._graph.start(start_time - self.batch_interval_ms)
        self.timer.start(start_time)
        self.start_time = start_time
        logger.info("Started JobGenerator at %d ms", start_time)

    def stop(self, process_received_data: bool) -> None:
        if not self._event_loop.is_active:
            return
        if process_received_data:
            logger.info("Stopping JobGenerator gracefully")
            stop_started = self._clock.now_ms()
            timeout_ms = self._scheduler.settings.graceful_stop_timeout_ms

            def timed_out() -> bool:
                return self._clock.now_ms() - stop_started >= timeout_ms

            logger.info("Waiting for all received blocks to be consumed for job generation")
            while not timed_out() and self._receiver_tracker.has_unallocated_blocks():
                self._clock.sleep_ms(STOP_POLL_MS)
            if timed_out():
                logger.warning("Timed out while stopping the job generator (timeout = %d)", timeout_ms)
            logger.info("Waited for all received blocks to be consumed for job generation")

            stop_time = self.timer.stop(interrupt=False)
            self._graph.stop()
            logger.info("Stopped generation timer")
            logger.info("Waiting for jobs to be processed and checkpoints to be written")
            while not timed_out() and not self._all_processed_up_to(stop_time):
                self._clock.sleep_ms(STOP_POLL_MS)
            if not self._all_processed_up_to(stop_time):
                logger.warning(
                    "Timed out while waiting for jobs to be processed (timeout = %d); unprocessed batches: %s",
                    timeout_ms, sorted(self._unprocessed),
                )
            logger.info("Waited for jobs to be processed and checkpoints to be written")
        else:
            logger.info("Stopping JobGenerator immediately")
            self.timer.stop(interrupt=True)
            self._graph.stop()
        self._event_loop.stop()
        logger.info("Stopped JobGenerator")

    def _all_processed_up_to(self, stop_time: int) -> bool:
        with self._lock:
            return not any(t <= stop_time for t in self._unprocessed)

    # ---------------------------------------------------------------- events
    def _on_timer(self, time: int) -> None:
        # Counted as unprocessed from the moment it fires, so a graceful stop waits for it.
        with self._lock:
            self._unprocessed.add(time)
        self._event_loop.post(GenerateJobs(time))

    def _process_event(self, event: GeneratorEvent) -> None:
        match event:
            case GenerateJobs(time):
                self._generate_jobs(time)
            case ClearMetadata(time):
                self._clear_metadata(time)
            case DoCheckpoint(time, clear_later):
                self._do_checkpoint(time, clear_later)
            case ClearCheckpointData(time):
                self._clear_checkpoint_data(time)

    def _generate_jobs(self, time: int) -> None:
        try:
            self._receiver_tracker.allocate_blocks_to_batch(time)
            self._graph.allocate_inputs(time)
            jobs = self._graph.generate_jobs(time)
        except Exception as error:
            self._scheduler.report_error(f"Error generating jobs for time {time}", error)
        else:
            infos = self._input_info.get_info(time)
            self._scheduler.submit_job_set(JobSet(time, jobs, infos, self._clock.now_ms()))
        self._event_loop.post(DoCheckpoint(time, clear_checkpoint_data_later=False))

    def on_batch_completion(self, time: int) -> None:
        self._event_loop.post(ClearMetadata(time))

    def _clear_metadata(self, time: int) -> None:
        self._graph.clear_metadata(time)
        # Checkpointing is off: clean the trackers now rather than after a checkpoint.
        self._clear_trackers_and_mark_processed(time)

    def _do_checkpoint(self, time: int, clear_checkpoint_data_later: bool) -> None:
        """Checkpointing is not configured for this pipeline: there is nothing to write."""

    def _clear_checkpoint_data(self, time: int) -> None:
        self._clear_trackers_and_mark_processed(time)

    def _clear_trackers_and_mark_processed(self, time: int) -> None:
        threshold = time - self._graph.max_input_remember_ms
        self._receiver_tracker.cleanup_old_batches(threshold)
        self._input_info.cleanup(threshold)
        with self._lock:
            self._unprocessed.discard(time)
            if self.last_processed_batch is None or time > self.last_processed_batch:
                self.last_processed_batch = time
