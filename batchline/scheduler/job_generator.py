"""Generates a job set every batch interval and cleans up after each batch (SPEC A1–A3, A5–A8).

Mirrors Spark Streaming's JobGenerator, including its log lines, with time read from an
injected clock so that every path (graceful-stop timeout, restart after down time) runs on
a manual clock. With checkpointing, each batch's input allocation is written to the batch
log before its jobs run and a commit marker after they succeed; checkpoints are written on
the checkpoint interval by a writer thread of their own.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from batchline.checkpoint.model import Checkpoint
from batchline.clock import Clock
from batchline.errors import ConfigurationError
from batchline.scheduler.event_loop import EventLoop
from batchline.scheduler.events import ClearCheckpointData, ClearMetadata, DoCheckpoint, GenerateJobs, GeneratorEvent
from batchline.scheduler.job import JobSet
from batchline.scheduler.timer import RecurringTimer

if TYPE_CHECKING:
    from batchline.api.graph import StreamGraph
    from batchline.checkpoint.manager import CheckpointManager
    from batchline.scheduler.input_info import InputInfoTracker
    from batchline.scheduler.job_scheduler import JobScheduler
    from batchline.scheduler.receiver_tracker import ReceiverTracker

__all__ = ["JobGenerator"]

logger = logging.getLogger(__name__)

STOP_POLL_MS = 100


def _times(times: list[int], shown: int = 20) -> str:
    """The seed's list of batch times, shortened in the middle when it is long."""
    if len(times) <= shown:
        return ", ".join(f"{t} ms" for t in times)
    head, tail = times[: shown // 2], times[-(shown // 2):]
    return (", ".join(f"{t} ms" for t in head) + f", ... ({len(times) - shown} more), "
            + ", ".join(f"{t} ms" for t in tail))


class JobGenerator:
    def __init__(
        self,
        scheduler: JobScheduler,
        graph: StreamGraph,
        clock: Clock,
        receiver_tracker: ReceiverTracker,
        input_info: InputInfoTracker,
        checkpoints: CheckpointManager | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._graph = graph
        self._clock = clock
        self._receiver_tracker = receiver_tracker
        self._input_info = input_info
        self._checkpoints = checkpoints
        self.batch_interval_ms = scheduler.settings.batch_interval_ms
        self.timer = RecurringTimer(clock, self.batch_interval_ms, self._on_timer, "JobGenerator")
        self._event_loop: EventLoop[GeneratorEvent] = EventLoop(
            "JobGenerator", self._process_event, lambda e: scheduler.report_error("Error in job generator", e)
        )
        self._lock = threading.Lock()
        self._unprocessed: set[int] = set()
        self._logged: set[int] = set()
        """Batches a restart re-runs; their logged inputs were restored when it began."""
        self._purged_before: int | None = None
        self.last_processed_batch: int | None = None
        self.start_time: int | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self, checkpoint: Checkpoint | None = None) -> None:
        self._event_loop.start()
        if checkpoint is not None:
            self._restart(checkpoint)
        else:
            self._start_first_time()

    def _start_first_time(self) -> None:
        start_time = self.timer.get_start_time()
        zero_time = start_time - self.batch_interval_ms
        self._graph.start(zero_time)
        self._graph.open_state(self._checkpoints, zero_time)
        if self._checkpoints is not None:
            # The first checkpoint, at zero time, is written before any batch: a crash at
            # any later moment restarts from a checkpoint, never from nothing.
            assert self._checkpoints.writer is not None
            self._checkpoints.writer.write_now(self._make_checkpoint(zero_time))
        self.timer.start(start_time)
        self.start_time = start_time
        logger.info("Started JobGenerator at %d ms", start_time)

    def _restart(self, checkpoint: Checkpoint) -> None:
        """Resume from a checkpoint: re-run logged but uncommitted batches with their logged
        inputs, generate the batches missed during down time, then go on with the timer."""
        assert self._checkpoints is not None
        if checkpoint.batch_interval_ms != self.batch_interval_ms:
            raise ConfigurationError(
                f"the checkpoint at {self._checkpoints.storage.url} was written with a batch interval of "
                f"{checkpoint.batch_interval_ms} ms, but this pipeline uses {self.batch_interval_ms} ms; "
                "keep the interval, or start from a new checkpoint location"
            )
        batch_log = self._checkpoints.batch_log
        self._graph.start(checkpoint.zero_time)
        self._graph.restore(checkpoint.inputs)
        interval = self.batch_interval_ms
        # The checkpoint's pending batches and the batches a window may still need get
        # their logged allocations back, without advancing the sources: the checkpointed
        # position already includes them.
        window_start = max(checkpoint.zero_time + interval,
                           checkpoint.time - self._graph.max_input_remember_ms + interval)
        for past in sorted(set(checkpoint.pending_times) | set(range(window_start, checkpoint.time + 1, interval))):
            allocations = batch_log.read_batch(past)
            if allocations is not None:
                self._graph.restore_allocations(past, allocations, advance=False)
                self._logged.add(past)
        # Batches logged after the checkpoint: advance the sources past them.
        last_logged = checkpoint.time
        while (allocations := batch_log.read_batch(last_logged + interval)) is not None:
            last_logged += interval
            self._graph.restore_allocations(last_logged, allocations, advance=True)
            self._logged.add(last_logged)
        for stream in self._graph.inputs:
            stream.recover_after_restart()
        self._graph.open_state(self._checkpoints, checkpoint.zero_time,
                               self._last_committed_progress(last_logged, checkpoint))

        restart_time = self.timer.get_restart_time(checkpoint.zero_time)
        down_times = list(range(last_logged + interval, restart_time, interval))
        logger.info("Batches during down time (%d batches): %s", len(down_times), _times(down_times))
        candidates = sorted(set(checkpoint.pending_times) | {t for t in self._logged if t > checkpoint.time})
        pending = [t for t in candidates if t < restart_time and not batch_log.is_committed(t)]
        logger.info("Batches pending processing (%d batches): %s", len(pending), _times(pending))
        self._logged &= set(pending)
        to_reschedule = sorted(set(pending) | set(down_times))
        logger.info("Batches to reschedule (%d batches): %s", len(to_reschedule), _times(to_reschedule))
        for batch_time in to_reschedule:
            self._on_timer(batch_time)
        self.timer.start(restart_time)
        self.start_time = restart_time
        logger.info("Restarted JobGenerator at %d ms", restart_time)

    def _last_committed_progress(self, last_logged: int, checkpoint: Checkpoint) -> dict[str, dict[str, object]]:
        """Stateful operators' progress as of the newest committed batch (its commit marker)."""
        assert self._checkpoints is not None
        batch_log = self._checkpoints.batch_log
        oldest = max(checkpoint.zero_time, checkpoint.time - self._graph.max_input_remember_ms)
        for time in range(last_logged, oldest, -self.batch_interval_ms):
            commit = batch_log.read_commit(time)
            if commit is not None:
                return commit.get("operators", {})
        return checkpoint.extra.get("operators", {})

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
            if time in self._logged:
                self._logged.discard(time)  # its logged inputs were restored by the restart
            else:
                self._receiver_tracker.allocate_blocks_to_batch(time)
                self._graph.allocate_inputs(time)
                if self._checkpoints is not None:
                    self._checkpoints.log_batch(time, self._graph.allocations(time))
            jobs = self._graph.generate_jobs(time)
        except Exception as error:
            self._scheduler.report_error(f"Error generating jobs for time {time}", error)
        else:
            infos = self._input_info.get_info(time)
            self._scheduler.submit_job_set(JobSet(time, jobs, infos, self._clock.now_ms()))
        self._event_loop.post(DoCheckpoint(time, clear_checkpoint_data_later=False))

    def on_batch_completion(self, time: int) -> None:
        """Called on the job thread once every job of the batch succeeded."""
        if self._checkpoints is not None:
            self._checkpoints.commit_batch(time, self._graph.state_progress())
        self._graph.on_batch_committed(time)
        self._event_loop.post(ClearMetadata(time))

    def _clear_metadata(self, time: int) -> None:
        self._graph.clear_metadata(time)
        if self._checkpoints is not None:
            self._event_loop.post(DoCheckpoint(time, clear_checkpoint_data_later=True))
        else:
            self._clear_trackers_and_mark_processed(time)

    def _do_checkpoint(self, time: int, clear_checkpoint_data_later: bool) -> None:
        manager = self._checkpoints
        zero_time = self._graph.zero_time
        assert zero_time is not None
        if manager is not None and (time - zero_time) % manager.interval_ms == 0:
            logger.info("Checkpointing graph for time %d ms", time)
            assert manager.writer is not None
            on_written = self._post_clear_checkpoint_data if clear_checkpoint_data_later else None
            manager.writer.write(self._make_checkpoint(time), on_written)
        elif clear_checkpoint_data_later:
            self._clear_trackers_and_mark_processed(time)

    def _post_clear_checkpoint_data(self, checkpoint: Checkpoint) -> None:
        self._event_loop.post(ClearCheckpointData(checkpoint.time))

    def _make_checkpoint(self, time: int) -> Checkpoint:
        assert self._checkpoints is not None and self._graph.zero_time is not None
        with self._lock:
            pending = tuple(sorted(t for t in self._unprocessed if t <= time))
        return Checkpoint(
            time=time,
            zero_time=self._graph.zero_time,
            batch_interval_ms=self.batch_interval_ms,
            checkpoint_interval_ms=self._checkpoints.interval_ms,
            pending_times=pending,
            inputs=self._graph.snapshot(),
            outputs=tuple(op.name for op in self._graph.outputs),
            written_at_ms=self._clock.now_ms(),
            extra={"operators": self._graph.state_progress()} if self._graph.stateful else {},
        )

    def _clear_checkpoint_data(self, time: int) -> None:
        self._clear_trackers_and_mark_processed(time)
        manager = self._checkpoints
        oldest = manager.writer.oldest_needed_time() if manager is not None and manager.writer else None
        if manager is not None and oldest is not None:
            # Any retained checkpoint may be the one a restart falls back to: keep the batch
            # log back to its oldest pending batch, and as far back as windows reach. Several
            # coalesced checkpoints report back at once; list the log only when the bound moved.
            threshold = oldest - self._graph.max_input_remember_ms
            if threshold != self._purged_before:
                manager.batch_log.purge_before(threshold)
                self._purged_before = threshold

    def _clear_trackers_and_mark_processed(self, time: int) -> None:
        threshold = time - self._graph.max_input_remember_ms
        self._receiver_tracker.cleanup_old_batches(threshold)
        self._input_info.cleanup(threshold)
        with self._lock:
            self._unprocessed.discard(time)
            if self.last_processed_batch is None or time > self.last_processed_batch:
                self.last_processed_batch = time
