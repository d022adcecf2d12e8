"""A batch's jobs (one per output operation) and its lifecycle."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from batchline.errors import ContextStateError
from batchline.scheduler.input_info import StreamInputInfo

__all__ = ["Job", "JobKind", "JobSet", "BatchState", "FailedIn"]


class JobKind(enum.Enum):
    """What a batch's job does: progress records time jobs by kind, and errors name the part of
    the pipeline that failed by it."""

    READ = "read"
    """An input reads and counts its batch before any output runs."""
    STATE = "state"
    """A stateful operator runs its function over the batch and writes its state."""
    OUTPUT = "output"
    """An output operation writes the batch."""
    STATE_COMPLETION = "state_completion"
    """A stateful operator whose tasks ran inside its only output's job takes on what they
    reported (and runs the partitions that job did not evaluate)."""


@dataclass(frozen=True)
class Job:
    batch_time: int
    name: str
    """The input's, operator's or output's name."""
    run: Callable[[], None]
    kind: JobKind

    def describe(self) -> str:
        """What the job is, for people: "operator 'sessions'", "input 'files'", "output 'out'"."""
        what = {JobKind.READ: "input", JobKind.STATE: "operator", JobKind.OUTPUT: "output",
                JobKind.STATE_COMPLETION: "completion of operator"}[self.kind]
        return f"{what} '{self.name}'"


class FailedIn(Exception):  # noqa: N818 - read as "failed in <job>"
    """Raised by a job whose Spark job also ran another part of the batch's work (a stateful
    operator read by one output only runs inside that output's job) when that part failed: the
    batch's failure names ``job``, and ``cause`` is what that part raised."""

    def __init__(self, job: Job, cause: BaseException) -> None:
        super().__init__(f"{job.describe()}: {cause}")
        self.job = job
        self.cause = cause


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
    generation_ms: int = 0
    """How long taking the batch's input and building its jobs took."""

    def move_to(self, state: BatchState) -> None:
        if state not in _ALLOWED[self.state]:
            raise ContextStateError(f"batch {self.time} cannot go from {self.state.value} to {state.value}")
        self.state = state
