"""The events of the job generator's loop: Spark Streaming's four (SPEC A2), and the two of
a generation backlog (a restart's missed batches, and a committed batch making room)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "GenerateJobs",
    "RescheduleJobs",
    "MakeRoom",
    "ClearMetadata",
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
class MakeRoom:
    """Batch ``time`` committed, and its checkpoint event went first: it leaves the batches
    in flight, and queued batches are generated while there is room."""

    time: int


@dataclass(frozen=True)
class ClearMetadata:
    time: int


@dataclass(frozen=True)
class DoCheckpoint:
    time: int
    clear_checkpoint_data_later: bool


@dataclass(frozen=True)
class ClearCheckpointData:
    time: int


GeneratorEvent = GenerateJobs | RescheduleJobs | MakeRoom | ClearMetadata | DoCheckpoint | ClearCheckpointData
