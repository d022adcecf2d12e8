"""The events of the job generator's loop: the timer's tick, a restart's batches, the
checkpoint as of a generated batch, a batch committed (from the batch's thread) and a
checkpoint written (from the writer's thread). A committed batch is cleared, checkpointed and
makes room in one event, so its checkpoint step leaves the loop only for the writer."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "GenerateJobs",
    "RescheduleJobs",
    "BatchCommitted",
    "DoCheckpoint",
    "ClearCheckpointData",
    "GeneratorEvent",
]


@dataclass(frozen=True)
class GenerateJobs:
    """The timer fired ``time``: generate its batch, or queue it behind earlier ones."""

    time: int


@dataclass(frozen=True)
class RescheduleJobs:
    """A restart's batches (pending, then missed while down), oldest first, due at once."""

    times: tuple[int, ...]


@dataclass(frozen=True)
class BatchCommitted:
    """Batch ``time`` committed: clear what it needed, checkpoint, and let it leave the
    batches in flight, so queued batches are generated while there is room."""

    time: int


@dataclass(frozen=True)
class DoCheckpoint:
    """Checkpoint as of generated batch ``time`` (behind the generation of batches already due)."""

    time: int


@dataclass(frozen=True)
class ClearCheckpointData:
    """The checkpoint as of batch ``time`` is written: what only older checkpoints needed goes."""

    time: int


GeneratorEvent = GenerateJobs | RescheduleJobs | DoCheckpoint | BatchCommitted | ClearCheckpointData
