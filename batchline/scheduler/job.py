"""A batch's jobs (one per output operation) and its lifecycle."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from batchline.errors import ContextStateError
from batchline.scheduler.input_info import StreamInputInfo

__all__ = ["Job", "JobSet", "BatchState"]


@dataclass(frozen=True)
class Job:
    batch_time: int
    name: str
    run: Callable[[], None]


class BatchState(enum.Enum):
    GENERATED = "generated"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


_ALLOWED = {
    BatchState.GENERATED: {BatchState.RUNNING, BatchState.FAILED},
    BatchState.RUNNING: {BatchState.COMPLETED, BatchState.FAILED},
    BatchState.COMPLETED: set(),
    BatchState.FAILED: set(),
}


@dataclass
class JobSet:
    time: int
    jobs: list[Job]
    input_infos: dict[int, StreamInputInfo]
    submission_time: int
    state: BatchState = BatchState.GENERATED
    processing_start_time: int | None = None
    processing_end_time: int | None = None
    failure: str | None = None

    def move_to(self, state: BatchState) -> None:
        if state not in _ALLOWED[self.state]:
            raise ContextStateError(f"batch {self.time} cannot go from {self.state.value} to {state.value}")
        self.state = state
