"""The four events of the job generator's loop (SPEC A2)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GenerateJobs", "ClearMetadata", "DoCheckpoint", "ClearCheckpointData", "GeneratorEvent"]


@dataclass(frozen=True)
class GenerateJobs:
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


GeneratorEvent = GenerateJobs | ClearMetadata | DoCheckpoint | ClearCheckpointData
