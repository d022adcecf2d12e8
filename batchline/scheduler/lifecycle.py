"""The one place a batch's lifecycle is told (SPEC A4, I3).

The generator and the job scheduler say what happens to a batch: generated (with how long
that took), started, each job finished (with its timing), retrying (with why), finished
(committed, or failed for good); the checkpoint writer says when a checkpoint was written.
From these alone come the listeners' ``BatchInfo`` events, each finished batch's
``BatchProgress`` record and the recent records (``StreamingContext.recent_progress``);
metrics, the dashboard and the progress kept at the checkpoint location are listeners of
those records, so they all tell the same story.

Everything here runs on the thread that reports, and only builds small records: delivery
to listeners is asynchronous (``ListenerBus``).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol, TypeVar

from batchline.clock import Clock
from batchline.scheduler.input_info import InputInfoTracker
from batchline.scheduler.job import Job, JobSet
from batchline.scheduler.listener import BatchInfo, ListenerBus, ListenerEvent
from batchline.scheduler.progress import (
    CANCELLED,
    COMPLETED,
    FAILED,
    BatchProgress,
    CheckpointProgress,
    ExcludedExecutor,
    InputProgress,
    JobTiming,
    PhaseDurations,
    StateOperatorProgress,
)

__all__ = ["BatchLifecycle", "PipelineFacts", "DEFAULT_RECENT_PROGRESS"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

DEFAULT_RECENT_PROGRESS = 100


class PipelineFacts(Protocol):
    """What a progress record tells of the pipeline beyond the batch itself."""

    def finished_inputs(self) -> dict[str, int]:
        """The inputs that have ended, with the batch after which each did."""

    def upstream_inputs(self, operator: str) -> tuple[str, ...]:
        """The inputs a stateful operator reads from, by name."""

    def lease(self) -> tuple[str, int] | None:
        """The checkpoint lease's holder and fencing token (None without a checkpoint)."""

    def backlog_after(self, batch_time: int) -> int:
        """Batches due after ``batch_time`` and not yet finished."""


class NoFacts:
    """A pipeline with nothing more to tell (tests of the scheduler alone)."""

    def finished_inputs(self) -> dict[str, int]:
        return {}

    def upstream_inputs(self, operator: str) -> tuple[str, ...]:
        return ()

    def lease(self) -> tuple[str, int] | None:
        return None

    def backlog_after(self, batch_time: int) -> int:
        return 0


class BatchLifecycle:
    def __init__(self, bus: ListenerBus, clock: Clock, input_info: InputInfoTracker, batch_interval_ms: int,
                 facts: PipelineFacts | None = None,
                 excluded_executors: Callable[[], list[ExcludedExecutor]] | None = None,
                 keep_recent: int = DEFAULT_RECENT_PROGRESS) -> None:
        self._bus = bus
        self._clock = clock
        self._input_info = input_info
        self._batch_interval_ms = batch_interval_ms
        self.facts: PipelineFacts = facts or NoFacts()
        """Set once the pipeline runs."""
        self.excluded_executors: Callable[[], list[ExcludedExecutor]] = excluded_executors or list
        """Which executors Spark excluded (SPEC H2); set once the pipeline runs."""
        self._lock = threading.Lock()
        self._recent: deque[BatchProgress] = deque(maxlen=max(1, keep_recent))
        self._checkpoints: list[CheckpointProgress] = []
        """Checkpoints written since the last record, for the next record."""

    # ---------------------------------------------------------------- what the records say
    @property
    def recent_progress(self) -> list[BatchProgress]:
        with self._lock:
            return list(self._recent)

    @property
    def last_progress(self) -> BatchProgress | None:
        with self._lock:
            return self._recent[-1] if self._recent else None

    def seed(self, earlier: list[BatchProgress]) -> None:
        """Records an earlier run of the pipeline left at its checkpoint location, oldest first."""
        with self._lock:
            fresh = list(self._recent)
            self._recent.clear()
            self._recent.extend([*earlier, *fresh])

    # ---------------------------------------------------------------- events
    def generated(self, job_set: JobSet) -> None:
        self._bus.post(ListenerEvent.BATCH_SUBMITTED, self._info(job_set, 0))

    def started(self, job_set: JobSet, attempts: int) -> None:
        self._bus.post(ListenerEvent.BATCH_STARTED, self._info(job_set, attempts))

    def job_finished(self, job_set: JobSet, job: Job, started_ms: int, ended_ms: int) -> None:
        with self._lock:
            job_set.trace.jobs.append(JobTiming(job.name, job.kind.value, started_ms, max(0, ended_ms - started_ms)))

    def retrying(self, job_set: JobSet, attempt: int, failure: str) -> None:
        """Run ``attempt`` failed with ``failure``; the batch runs again after a backoff."""
        with self._lock:
            trace = job_set.trace
            trace.errors.append(f"attempt {attempt}: {failure}")
            trace.jobs.clear()  # the record times the attempt that counts, the last one
        self._bus.post(ListenerEvent.BATCH_RETRYING, self._info(job_set, attempt, failure))

    def finished(self, job_set: JobSet, attempts: int, commit_ms: int = 0, cancelled: bool = False) -> None:
        """The batch committed, failed for good (``job_set.failure``), or was cancelled by a stop."""
        info = self._info(job_set, attempts)
        progress = self._progress(job_set, info, commit_ms, cancelled)
        with self._lock:
            self._recent.append(progress)
        self._bus.post(ListenerEvent.BATCH_COMPLETED, info)
        self._bus.post(ListenerEvent.PROGRESS, progress)

    def checkpoint_written(self, time: int, duration_ms: int, size: int) -> None:
        with self._lock:
            self._checkpoints.append(CheckpointProgress(time, duration_ms, size))

    def error(self, error: BaseException) -> None:
        self._bus.post(ListenerEvent.ERROR, error)

    # ---------------------------------------------------------------- building
    def _info(self, job_set: JobSet, attempts: int, failure: str | None = None) -> BatchInfo:
        # Sources that count while the batch runs (files) replace their statistics then.
        return BatchInfo(
            batch_time=job_set.time,
            submission_time=job_set.submission_time,
            processing_start_time=job_set.processing_start_time,
            processing_end_time=job_set.processing_end_time,
            input_infos=self._input_info.get_info(job_set.time) or job_set.input_infos,
            failure=failure or job_set.failure,
            state_operators=job_set.state_operators,
            attempts=attempts,
            excluded_executors=self._excluded() if attempts else [],
        )

    def _progress(self, job_set: JobSet, info: BatchInfo, commit_ms: int, cancelled: bool) -> BatchProgress:
        with self._lock:
            trace = job_set.trace
            checkpoints, self._checkpoints = tuple(self._checkpoints), []
        # Over the attempt that counted: a retried batch's backoff is not time spent processing.
        start = trace.jobs[0].started_ms if trace.jobs and trace.errors else job_set.processing_start_time
        end = job_set.processing_end_time
        processing_s = (end - start) / 1000 if start is not None and end is not None else 0.0
        interval_s = self._batch_interval_ms / 1000
        nothing: dict[str, int] = {}
        finished = self._safely(self.facts.finished_inputs, nothing)
        operators = tuple(info.state_operators[name] for name in sorted(info.state_operators))
        late_by_input = self._late_rows_by_input(operators)
        inputs = tuple(
            InputProgress(
                name=i.input_name,
                records=i.num_records or 0,
                dead_letters=i.dead_letters,
                late_records=i.late_records + late_by_input.get(i.input_name, 0),
                input_rate=round((i.num_records or 0) / interval_s, 3),
                processing_rate=round((i.num_records or 0) / processing_s, 3) if processing_s > 0 else 0.0,
                position=dict(i.metadata),
                lag=i.lag,
                # As of this batch: batches generated before the one that took the last records were not.
                finished=i.input_name in finished and job_set.time >= finished[i.input_name],
            )
            for i in sorted(info.input_infos.values(), key=lambda i: i.input_id)
        )
        watermarks = [op.watermark_ms for op in operators if op.watermark_ms is not None]
        lease = self._safely(self.facts.lease, None)
        errors = [*trace.errors, *([job_set.failure] if job_set.failure else [])]
        return BatchProgress(
            batch_time=job_set.time,
            status=CANCELLED if cancelled else FAILED if job_set.failure else COMPLETED,
            submission_time_ms=job_set.submission_time,
            processing_start_ms=job_set.processing_start_time,
            processing_end_ms=job_set.processing_end_time,
            batch_interval_ms=self._batch_interval_ms,
            attempts=info.attempts,
            inputs=inputs,
            state_operators=operators,
            durations=PhaseDurations(job_set.generation_ms, tuple(trace.jobs), commit_ms,
                                     checkpoints[-1].duration_ms if checkpoints else None),
            checkpoints=checkpoints,
            watermark_ms=min(watermarks) if watermarks else None,
            lease_holder=lease[0] if lease else None,
            lease_token=lease[1] if lease else None,
            excluded_executors=tuple(info.excluded_executors),
            backlog=self._safely(lambda: self.facts.backlog_after(job_set.time), 0),
            errors=tuple(errors),
        )

    def _late_rows_by_input(self, operators: tuple[StateOperatorProgress, ...]) -> dict[str, int]:
        """An operator's late rows, counted against the input it reads (an operator over several
        inputs cannot tell whose rows they were: its own count is the only one)."""
        late: dict[str, int] = {}
        for op in operators:
            none: tuple[str, ...] = ()
            upstream = self._safely(functools.partial(self.facts.upstream_inputs, op.operator), none)
            if op.late_rows and len(upstream) == 1:
                late[upstream[0]] = late.get(upstream[0], 0) + op.late_rows
        return late

    def _excluded(self) -> list[ExcludedExecutor]:
        none: list[ExcludedExecutor] = []
        return list(self._safely(self.excluded_executors, none))

    @staticmethod
    def _safely(read: Callable[[], _T], default: _T) -> _T:
        try:
            return read()
        except Exception:
            logger.exception("Could not read %s for the batch's record; leaving it out",
                             getattr(read, "__name__", read))
            return default
