"""Progress records (SPEC I3): one JSON-serializable record per finished batch, in the spirit
of Structured Streaming's ``StreamingQueryProgress`` but for this engine.

Each part of a record is a dataclass of its own. ``BatchProgress.to_json()`` gives plain
JSON types (what the progress file at the checkpoint location, the dashboard and
``batchline status --json`` show); ``BatchProgress.from_json()`` reads it back, ignoring
fields it does not know, so an older reader survives a newer writer.

Every duration is in milliseconds and every time in epoch milliseconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from batchline.batch_time import format_batch_time

__all__ = [
    "BatchDelays",
    "BatchProgress",
    "CheckpointProgress",
    "ExcludedExecutor",
    "InputProgress",
    "JobTiming",
    "PhaseDurations",
    "StateOperatorProgress",
    "CANCELLED",
    "COMPLETED",
    "FAILED",
]

COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
"""Stopped by ``stop()`` before it committed; it runs again at the next start."""


@dataclass(frozen=True)
class BatchDelays:
    """A batch's delays from its time and when its processing started and ended (None while unknown)."""

    batch_time: int
    start_ms: int | None
    end_ms: int | None

    @property
    def scheduling_ms(self) -> int | None:
        """From the batch's time until its first job started."""
        return None if self.start_ms is None else self.start_ms - self.batch_time

    @property
    def processing_ms(self) -> int | None:
        return None if self.start_ms is None or self.end_ms is None else self.end_ms - self.start_ms

    @property
    def total_ms(self) -> int | None:
        return None if self.end_ms is None else self.end_ms - self.batch_time


@dataclass(frozen=True)
class ExcludedExecutor:
    """An executor Spark stopped scheduling tasks on after too many failures (exclude-on-failure)."""

    executor_id: str
    host: str
    since_ms: int
    """When batchline first saw it excluded (the end of that batch), in epoch milliseconds."""


@dataclass(frozen=True)
class StateOperatorProgress:
    """What a stateful operator did in one batch."""

    operator: str
    input_rows: int
    late_rows: int
    keys_called: int
    updated: int
    removed: int
    timed_out: int
    output_rows: int
    state_keys: int
    watermark_ms: int | None
    partitions_kept: int = 0
    """Partitions of a batch re-run after a restart that kept what they had finished."""
    state_bytes: int = 0
    """Estimated bytes of the state in Arrow: each partition's keys times the mean size of
    a row of its latest non-empty delta."""
    delta_bytes: int = 0
    """Bytes of the state delta files the batch wrote."""
    partitions_finished: int = 0
    """State partitions whose input has ended and that hold no timer (SPEC G2)."""
    rerun_note: str | None = None
    """For a batch that a restart ran again: what of its inputs it read again, and why (None
    for a batch that ran in one driver)."""


@dataclass(frozen=True)
class InputProgress:
    """What one input gave one batch."""

    name: str
    records: int
    dead_letters: int = 0
    late_records: int = 0
    """Rows of this input's stream that stateful operators dropped as late (behind the watermark)."""
    input_rate: float = 0.0
    """Records per second of batch interval: how fast the input arrived."""
    processing_rate: float = 0.0
    """Records per second of the batch's processing time (of its last attempt, after a retry):
    how fast the batch worked them off."""
    position: dict[str, Any] = field(default_factory=dict)
    """What the batch took of the input (offsets, entry ids, files), as the input reports it."""
    finished: bool = False
    """The input has ended (a bounded input read to its end) as of this batch: the batch took its last
    records, or came after."""
    lag: int | None = None
    """Records that waited at the source beyond this batch when it was planned (a Kafka consumer's
    lag); None for a source that does not know."""


@dataclass(frozen=True)
class JobTiming:
    """One job of the batch (its last attempt)."""

    name: str
    kind: str
    """A ``JobKind`` value: ``read``, ``state``, ``output`` or ``state_completion`` (a stateful
    operator read by one output only runs its tasks inside that output's job: its ``state``
    job decides and publishes the batch's parameters, its ``state_completion`` job after the
    output takes on what the tasks reported)."""
    started_ms: int
    duration_ms: int


@dataclass(frozen=True)
class CheckpointProgress:
    """A checkpoint written since the previous record (checkpoints are written on a thread of
    their own, after the batch they describe committed; the final checkpoint of a finished
    pipeline comes after its last record, and is in no record)."""

    time: int
    duration_ms: int
    bytes: int


@dataclass(frozen=True)
class PhaseDurations:
    """Where the batch's time went, phase by phase."""

    generation_ms: int = 0
    """Taking the input and building the batch's jobs (on the generator's thread)."""
    jobs: tuple[JobTiming, ...] = ()
    """Each output's and each stateful operator's job, in the order they ran."""
    commit_ms: int = 0
    """Counting, verifying and writing the commit marker."""
    checkpoint_ms: int | None = None
    """How long the newest checkpoint written since the previous record took, if any."""


@dataclass(frozen=True)
class BatchProgress:
    """Everything about one finished batch (completed, or failed for good)."""

    batch_time: int
    status: str
    """``completed``; ``failed`` (the pipeline stops; the batch runs again at the next start); or
    ``cancelled`` by a stop before it committed (it runs again at the next start)."""
    submission_time_ms: int
    processing_start_ms: int | None
    processing_end_ms: int | None
    batch_interval_ms: int
    attempts: int
    inputs: tuple[InputProgress, ...] = ()
    state_operators: tuple[StateOperatorProgress, ...] = ()
    durations: PhaseDurations = field(default_factory=PhaseDurations)
    checkpoints: tuple[CheckpointProgress, ...] = ()
    """Checkpoints written since the previous record, oldest first."""
    watermark_ms: int | None = None
    """The pipeline's event-time watermark as the batch ran: the lowest of its stateful
    operators' (as Spark's global watermark), None without one."""
    lease_holder: str | None = None
    lease_token: int | None = None
    excluded_executors: tuple[ExcludedExecutor, ...] = ()
    backlog: int = 0
    """Batches due and not yet finished when this one finished (0 when keeping up)."""
    errors: tuple[str, ...] = ()
    """Why the batch failed, and why earlier attempts failed (each retry)."""

    # ---------------------------------------------------------------- derived
    @property
    def checkpoint(self) -> CheckpointProgress | None:
        """The newest checkpoint written since the previous record."""
        return self.checkpoints[-1] if self.checkpoints else None

    @property
    def batch_time_iso(self) -> str:
        return format_batch_time(self.batch_time)

    @property
    def scheduling_delay_ms(self) -> int | None:
        """From the batch's time until its first job started."""
        return BatchDelays(self.batch_time, self.processing_start_ms, self.processing_end_ms).scheduling_ms

    @property
    def processing_ms(self) -> int | None:
        return BatchDelays(self.batch_time, self.processing_start_ms, self.processing_end_ms).processing_ms

    @property
    def total_delay_ms(self) -> int | None:
        return BatchDelays(self.batch_time, self.processing_start_ms, self.processing_end_ms).total_ms

    @property
    def records(self) -> int:
        return sum(i.records for i in self.inputs)

    @property
    def dead_letters(self) -> int:
        return sum(i.dead_letters for i in self.inputs)

    @property
    def late_records(self) -> int:
        return sum(op.late_rows for op in self.state_operators)

    # ---------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        payload = dataclasses.asdict(self)
        payload["batch_time_iso"] = self.batch_time_iso
        payload["checkpoint"] = dataclasses.asdict(self.checkpoint) if self.checkpoint else None
        payload["scheduling_delay_ms"] = self.scheduling_delay_ms
        payload["processing_ms"] = self.processing_ms
        payload["total_delay_ms"] = self.total_delay_ms
        payload["records"] = self.records
        payload["dead_letters"] = self.dead_letters
        payload["late_records"] = self.late_records
        return payload

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> BatchProgress:
        durations = payload.get("durations") or {}
        return cls(**{
            **_known(cls, payload),
            "inputs": tuple(InputProgress(**_known(InputProgress, i)) for i in payload.get("inputs", ())),
            "state_operators": tuple(StateOperatorProgress(**_known(StateOperatorProgress, o))
                                     for o in payload.get("state_operators", ())),
            "durations": PhaseDurations(**{
                **_known(PhaseDurations, durations),
                "jobs": tuple(JobTiming(**_known(JobTiming, j)) for j in durations.get("jobs", ())),
            }),
            "checkpoints": tuple(CheckpointProgress(**_known(CheckpointProgress, c))
                                 for c in payload.get("checkpoints", ())),
            "excluded_executors": tuple(ExcludedExecutor(**_known(ExcludedExecutor, e))
                                        for e in payload.get("excluded_executors", ())),
            "errors": tuple(payload.get("errors", ())),
        })


def _known(cls: type, payload: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in payload.items() if k in names}
