"""What a checkpoint holds: JSON only, never pickled user code (SPEC E4)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Checkpoint", "FORMAT_VERSION"]

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    """The pipeline's progress at ``time``: everything a restarted driver needs to go on.

    Inputs and outputs are named by their stable names, so a restarted pipeline may run
    changed code and still find its offsets.
    """

    time: int
    zero_time: int
    batch_interval_ms: int
    checkpoint_interval_ms: int
    pending_times: tuple[int, ...]
    inputs: dict[str, dict[str, Any]]
    outputs: tuple[str, ...]
    written_at_ms: int
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Checkpoint:
        payload = dict(payload)
        payload["pending_times"] = tuple(payload["pending_times"])
        payload["outputs"] = tuple(payload["outputs"])
        return cls(**payload)
