"""A batch's jobs (one per output operation), what they leave to commit, and what listeners are
told of the batch (``JobSet``, with its ``BatchState`` and the trace its progress record is built from)."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from batchline.errors import ContextStateError
from batchline.scheduler.input_info import StreamInputInfo
from batchline.scheduler.progress import JobTiming, StateOperatorProgress

__all__ = ["Job", "JobKind", "JobSet", "BatchState", "BatchTrace", "FailedIn", "PendingCommit"]


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


class PendingCommit(ABC):
    """What a job leaves to do on the driver once all of its batch's jobs succeeded: a sink
    commits what its tasks staged (``Sink.write`` returns one). The engine calls exactly one
    of ``commit`` and ``abandon``, on the thread that ran the job."""

    @abstractmethod
    def commit(self) -> None:
        """Make the batch's writes visible, idempotently per batch time: a batch that runs
        again (a later commit of the same batch failed) commits again. Raise to fail the batch;
        it then runs again from its jobs, as the retry policy allows."""

    def abandon(self) -> None:  # noqa: B027 (optional hook)
        """This attempt of the batch will not commit (another of its jobs or commits failed,
        or the pipeline stops): let go of what was staged. Errors are logged, not raised."""


@dataclass(frozen=True)
class Job:
    batch_time: int
    name: str
    """The input's, operator's or output's name."""
    run: Callable[[], PendingCommit | None]
    """Runs the job's Spark work; an output's may leave its commit to run after the batch's jobs."""
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
class BatchTrace:
    """What is known of a batch while it runs, for its progress record."""

    jobs: list[JobTiming] = field(default_factory=list)
    """The jobs of the attempt that counts (the last one), as they finished."""
    errors: list[str] = field(default_factory=list)
    """Why each earlier attempt failed."""


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
    trace: BatchTrace = field(default_factory=BatchTrace)
    state_operators: dict[str, StateOperatorProgress] = field(default_factory=dict)
    """What each stateful operator did in the batch, by name: taken from them as the batch ends."""

    def move_to(self, state: BatchState) -> None:
        if state not in _ALLOWED[self.state]:
            raise ContextStateError(f"batch {self.time} cannot go from {self.state.value} to {state.value}")
        self.state = state
