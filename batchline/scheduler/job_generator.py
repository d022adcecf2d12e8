"""Generates a job set every batch interval and cleans up after each batch (SPEC A1–A3, A5–A8).

Mirrors Spark Streaming's JobGenerator, including its log lines, with time read from an
injected clock so that every path (graceful-stop timeout, restart after down time) runs on
a manual clock. What a batch is (its inputs, its log entry, its jobs, its checkpoint) is the
``Batches`` given to it; with checkpointing, checkpoints are written on the checkpoint
interval by a writer thread of their own.

Unlike Spark Streaming, at most ``max_batches_ahead`` batches are generated and not yet
committed at a time. After down time a restart has every missed batch due at once; each
generation takes the batch's input and logs it, so generating them all first would keep the
first committed batch's checkpoint waiting behind all of them. The due batches wait instead,
in time order, and each commit lets the next one be generated, after that batch's checkpoint.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from batchline.checkpoint.manager import CheckpointManager
from batchline.checkpoint.model import Checkpoint
from batchline.clock import Clock
from batchline.scheduler.batch_run import BatchPipeline, BatchRun
from batchline.scheduler.event_loop import EventLoop
from batchline.scheduler.events import (
    BatchCommitted,
    ClearCheckpointData,
    DoCheckpoint,
    GenerateJobs,
    GeneratorEvent,
    RescheduleJobs,
)
from batchline.scheduler.input_info import InputInfoTracker
from batchline.scheduler.receiver_tracker import ReceiverTracker
from batchline.scheduler.timer import RecurringTimer

__all__ = ["JobGenerator", "Batches", "GeneratorSettings", "default_max_batches_ahead"]

logger = logging.getLogger(__name__)

STOP_POLL_MS = 100


class Batches(BatchPipeline, Protocol):
    """What the generator asks of the pipeline, batch by batch (and each batch of it, as a
    ``BatchPipeline``)."""

    @property
    def max_input_remember_ms(self) -> int:
        """How far back inputs keep what they allocated (windows reach back that far)."""

    def start_fresh(self, zero_time: int) -> None:
        """Start the pipeline at ``zero_time`` with nothing to recover."""

    def restart(self, checkpoint: Checkpoint, restart_time: int) -> list[int]:
        """Resume from ``checkpoint``; returns the batch times to run before ``restart_time``."""

    def clear_metadata(self, batch_time: int) -> None:
        """Forget what no later batch needs."""

    def checkpoint(self, batch_time: int, pending: tuple[int, ...]) -> Checkpoint:
        """The pipeline's progress as of ``batch_time``, for the checkpoint writer."""


@dataclass(frozen=True)
class GeneratorSettings:
    batch_interval_ms: int
    graceful_stop_timeout_ms: int
    max_batches_ahead: int | None
    """How many batches may be generated and not yet committed at once; None: no limit, every
    due batch is generated at once, as in Spark Streaming. After down time that holds the first
    committed batch's checkpoint back until every missed batch is generated (issue 12)."""


def default_max_batches_ahead(concurrent_jobs: int) -> int:
    """One more than the job scheduler runs at once: when a batch commits, the next one is
    already generated and starts while the room it made is filled."""
    return max(2, concurrent_jobs + 1)


@dataclass
class _Backlog:
    """Due batches waiting for earlier ones to commit, since ``since_ms``."""

    since_ms: int
    generated: int = 0
    reported: bool = False


class JobGenerator:
    def __init__(
        self,
        settings: GeneratorSettings,
        batches: Batches,
        clock: Clock,
        receiver_tracker: ReceiverTracker,
        input_info: InputInfoTracker,
        submit: Callable[[BatchRun], None],
        report_error: Callable[[str, BaseException], None],
        checkpoints: CheckpointManager | None = None,
    ) -> None:
        self.settings = settings
        self._batches = batches
        self._clock = clock
        self._receiver_tracker = receiver_tracker
        self._input_info = input_info
        self._submit = submit
        self._report_error = report_error
        self._checkpoints = checkpoints
        self.batch_interval_ms = settings.batch_interval_ms
        self.timer = RecurringTimer(clock, self.batch_interval_ms, self._on_timer, "JobGenerator")
        self._event_loop: EventLoop[GeneratorEvent] = EventLoop(
            "JobGenerator", self._process_event, lambda e: report_error("Error in job generator", e)
        )
        self._lock = threading.Lock()
        self._cut_short = threading.Event()
        """Ends a graceful stop's waits at once (a second Ctrl-C)."""
        self._unprocessed: set[int] = set()
        # The event loop's own: due batch times not generated yet (oldest first), and the
        # batches generated and not yet committed.
        self._queued: deque[int] = deque()
        self._in_flight: set[int] = set()
        self._backlog: _Backlog | None = None
        self._purged_before: int | None = None
        self._generation_failed = False
        """A batch's generation failed: the inputs' positions may include an allocation no batch
        log holds (the log's write failed), and a checkpoint of them would make a restart skip
        that data; none is written after it (the pipeline stops on that failure)."""
        self.zero_time: int | None = None
        self.last_processed_batch: int | None = None
        self.start_time: int | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self, checkpoint: Checkpoint | None = None) -> None:
        self._event_loop.start()
        if checkpoint is None:
            start_time = self.timer.get_start_time()
            self.zero_time = start_time - self.batch_interval_ms
            self._batches.start_fresh(self.zero_time)
            self.timer.start(start_time)
            self.start_time = start_time
            logger.debug("Started JobGenerator at %d ms", start_time)
            return
        restart_time = self.timer.get_restart_time(checkpoint.zero_time)
        self.zero_time = checkpoint.zero_time
        times = tuple(self._batches.restart(checkpoint, restart_time))
        if times:
            # Due now, so unprocessed now (as the timer's times): a graceful stop waits for them.
            with self._lock:
                self._unprocessed.update(times)
            self._event_loop.post(RescheduleJobs(times))
        self.timer.start(restart_time)
        self.start_time = restart_time
        logger.debug("Restarted JobGenerator at %d ms", restart_time)

    def stop(self, process_received_data: bool) -> bool:
        """Stop generating; gracefully, first let every received block into a batch and wait for
        the generated batches. False when a graceful stop's timeout cut that short."""
        if not self._event_loop.is_active:
            return True
        drained = True
        if process_received_data:
            logger.debug("Stopping JobGenerator gracefully")
            stop_started = self._clock.now_ms()
            timeout_ms = self.settings.graceful_stop_timeout_ms

            def timed_out() -> bool:
                return self._cut_short.is_set() or self._clock.now_ms() - stop_started >= timeout_ms

            logger.debug("Waiting for all received blocks to be consumed for job generation")
            while not timed_out() and self._receiver_tracker.has_unallocated_blocks():
                self._clock.sleep_ms(STOP_POLL_MS)
            if timed_out():
                drained = False
                logger.warning("Timed out while stopping the job generator (timeout = %d)", timeout_ms)
            logger.debug("Waited for all received blocks to be consumed for job generation")

            stop_time = self.timer.stop(interrupt=False)
            logger.debug("Stopped generation timer")
            logger.debug("Waiting for jobs to be processed and checkpoints to be written")
            while not timed_out() and not self._all_processed_up_to(stop_time):
                self._clock.sleep_ms(STOP_POLL_MS)
            if not self._all_processed_up_to(stop_time):
                drained = False
                logger.warning(
                    "Timed out while waiting for jobs to be processed (timeout = %d); unprocessed batches: %s",
                    timeout_ms, sorted(self._unprocessed),
                )
            logger.debug("Waited for jobs to be processed and checkpoints to be written")
        else:
            logger.debug("Stopping JobGenerator immediately")
            self.timer.stop(interrupt=True)
        self._event_loop.stop()
        if self._queued:  # the loop has ended, so its queue holds still
            logger.info("%d due batches were not generated (%s to %s ms); nothing of them was logged, so the next "
                        "start runs them as missed batches", len(self._queued), self._queued[0], self._queued[-1])
        logger.debug("Stopped JobGenerator")
        return drained

    def cut_short(self) -> None:
        """End a graceful stop's waits now: what is not processed yet is cancelled by the stop
        and runs again at the next start."""
        self._cut_short.set()

    def due_after(self, time: int) -> int:
        """Batches due (their timer fired) after batch ``time`` and not yet processed: the backlog
        behind it."""
        with self._lock:
            return sum(1 for t in self._unprocessed if t > time)

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
                self._on_due((time,))
            case RescheduleJobs(times):
                self._on_due(times)
            case BatchCommitted(time):
                self._batch_committed(time)
            case DoCheckpoint(time):
                self._do_checkpoint(time, clear_checkpoint_data_later=False)
            case ClearCheckpointData(time):
                self._clear_checkpoint_data(time)

    # ---------------------------------------------------------------- the backlog
    def _on_due(self, times: tuple[int, ...]) -> None:
        # Behind any batch already waiting, so batches are generated in time order.
        self._queued.extend(times)
        self._note_backlog()
        self._generate_queued()

    def _generate_queued(self) -> None:
        """Generate due batches, oldest first, while there is room."""
        while self._queued and self._has_room() and not self._generation_failed:
            self._generate_jobs(self._queued.popleft())
            if self._backlog is not None:
                self._backlog.generated += 1
        if not self._queued:
            self._end_backlog()

    def _has_room(self) -> bool:
        limit = self.settings.max_batches_ahead
        return limit is None or len(self._in_flight) < limit

    def _note_backlog(self) -> None:
        limit = self.settings.max_batches_ahead
        if limit is None:
            return
        waiting = len(self._queued) - max(0, limit - len(self._in_flight))
        if waiting <= 0:
            return
        if self._backlog is None:
            self._backlog = _Backlog(self._clock.now_ms())
        # Said once, when as many wait as may be ahead: a batch or two waiting behind a slow
        # one is no news, and would be said again and again.
        if not self._backlog.reported and waiting >= max(2, limit):
            self._backlog.reported = True
            logger.info("%d batches are due; generating them as earlier ones commit, at most %d ahead",
                        len(self._queued) + len(self._in_flight), limit)

    def _end_backlog(self) -> None:
        backlog, self._backlog = self._backlog, None
        if backlog is not None and backlog.reported:
            logger.info("Worked off the backlog: %d batches generated in %d ms; batches are generated when due again",
                        backlog.generated, self._clock.now_ms() - backlog.since_ms)

    # ---------------------------------------------------------------- one batch
    def _generate_jobs(self, time: int) -> None:
        try:
            run = BatchRun.generate(time, self._batches, self._input_info, self._clock,
                                    self.on_batch_committed)
        except Exception as error:
            self._generation_failed = True
            self._report_error(f"Error generating jobs for time {time}", error)
            return
        self._in_flight.add(time)
        self._submit(run)
        # Queued, not taken here: generating a backlog of due batches goes first.
        self._event_loop.post(DoCheckpoint(time))

    def on_batch_committed(self, time: int) -> None:
        """Called by the batch, on its thread, once it is committed; the rest happens on the loop."""
        self._event_loop.post(BatchCommitted(time))

    def _batch_committed(self, time: int) -> None:
        """Clean up, checkpoint (the writer writes it on its own thread), and only then let the
        committed batch's room generate the next one, so a generation never holds back the
        checkpoint of the commit that allowed it."""
        self._batches.clear_metadata(time)
        if self._checkpoints is not None:
            self._do_checkpoint(time, clear_checkpoint_data_later=True)
        else:
            self._clear_trackers_and_mark_processed(time)
        self._in_flight.discard(time)
        self._generate_queued()

    def _do_checkpoint(self, time: int, clear_checkpoint_data_later: bool) -> None:
        manager = self._checkpoints
        if self._generation_failed:
            logger.debug("Not checkpointing for time %d ms: a batch's generation failed", time)
            if clear_checkpoint_data_later:
                self._clear_trackers_and_mark_processed(time)
        elif manager is not None and self.zero_time is not None and (time - self.zero_time) % manager.interval_ms == 0:
            logger.debug("Checkpointing graph for time %d ms", time)
            on_written = self._post_clear_checkpoint_data if clear_checkpoint_data_later else None
            manager.checkpoint_writer().write(self._batches.checkpoint(time, self.pending_up_to(time)), on_written)
        elif clear_checkpoint_data_later:
            self._clear_trackers_and_mark_processed(time)

    def _post_clear_checkpoint_data(self, checkpoint: Checkpoint) -> None:
        self._event_loop.post(ClearCheckpointData(checkpoint.time))

    def pending_up_to(self, time: int) -> tuple[int, ...]:
        """Batches due at or before ``time`` and not yet processed. A checkpoint asks as of a
        generated batch, and batches are generated in time order: a batch due and still queued
        is later than ``time``, so it is never pending in a checkpoint; a restart finds it
        unlogged and runs it as a missed batch."""
        with self._lock:
            return tuple(sorted(t for t in self._unprocessed if t <= time))

    def _clear_checkpoint_data(self, time: int) -> None:
        self._clear_trackers_and_mark_processed(time)
        manager = self._checkpoints
        oldest = manager.checkpoint_writer().oldest_needed_time() if manager is not None else None
        if manager is not None and oldest is not None:
            # Any retained checkpoint may be the one a restart falls back to: keep the batch
            # log back to its oldest pending batch, and as far back as windows reach. Several
            # coalesced checkpoints report back at once; purge (off this loop) only when the bound moved.
            threshold = oldest - self._batches.max_input_remember_ms
            if threshold != self._purged_before:
                manager.purge_events_before(threshold)
                self._purged_before = threshold

    def _clear_trackers_and_mark_processed(self, time: int) -> None:
        threshold = time - self._batches.max_input_remember_ms
        self._input_info.cleanup(threshold)
        with self._lock:
            self._unprocessed.discard(time)
            if self.last_processed_batch is None or time > self.last_processed_batch:
                self.last_processed_batch = time
