"""Output operations: each becomes one job of every batch's job set (SPEC C2)."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

from batchline.batch_time import BatchTime
from batchline.scheduler.job import Job, JobKind, PendingCommit
from batchline.sinks.sink import NO_FENCING_TOKEN, BatchContext, Sink, SinkContext
from batchline.streams.base import StreamNode, StreamRuntime

__all__ = ["OutputOperation", "pipeline_identity"]

logger = logging.getLogger(__name__)


def pipeline_identity(runtime: StreamRuntime) -> str:
    """What sinks key their commits by: the checkpoint location, or "batchline" without one."""
    checkpoint = runtime.env.checkpoint
    return checkpoint.storage.url if checkpoint is not None else "batchline"


@dataclass(frozen=True)
class OutputOperation:
    """``sink.write(df, batch)`` for every batch of ``node`` that may hold rows, under a name
    unique in the pipeline."""

    name: str
    node: StreamNode
    sink: Sink
    _warned: set[str] = field(default_factory=set, init=False, repr=False, compare=False)
    """What was logged once: a sink's return value that is not a ``PendingCommit``."""

    @property
    def reads_all_rows(self) -> bool:
        """Whether the sink reads every row (a write does; ``console``'s ``show`` does not).
        An input's counts come from the first job that reads all of its rows."""
        return self.sink.reads_all_rows

    @property
    def evaluates_once(self) -> bool:
        """Whether the sink reads the batch's DataFrame in one pass (``Sink.evaluates_once``)."""
        return self.sink.evaluates_once

    def open(self, runtime: StreamRuntime) -> None:
        self.sink.open(SinkContext(pipeline_identity(runtime), self.name))

    def job(self, runtime: StreamRuntime, batch_time: int, logged_here: bool = False) -> Job | None:
        """The batch's job; none once the stream has finished (SPEC G1: finished streams run
        no work). Whether it has is checked again when the job runs: an operator learns that
        it drained only when the batch before has run. ``logged_here``: this driver logged the
        batch, exclusively, so no driver wrote it before the job's first run
        (``BatchContext.first_attempt``)."""
        if runtime.finished_before(batch_time) or not runtime.has_rows(batch_time):
            return None  # known idle when generated: no DataFrame is even built (SPEC E6)
        df = runtime.get_or_compute(batch_time)
        if df is None:
            return None
        sink, pipeline, stamp = self.sink, pipeline_identity(runtime), BatchTime(batch_time)
        checkpoint = runtime.env.checkpoint
        runs = 0

        def run() -> PendingCommit | None:
            nonlocal runs
            # Asked as the job runs, after the batch's stateful operators: a batch known to hold
            # no rows (no input, no timer due) costs no Spark job and no call of the sink.
            if runtime.finished_before(batch_time) or not runtime.has_rows(batch_time):
                return None
            # The token as the job runs: the one this driver's commit marker will carry.
            token = checkpoint.lease.token if checkpoint is not None else None
            runs += 1
            try:
                left = sink.write(df, BatchContext(stamp, self.name, pipeline,
                                                   NO_FENCING_TOKEN if token is None else token,
                                                   functools.partial(runtime.map_in_arrow, batch_time),
                                                   first_attempt=logged_here and runs == 1))
            except Exception as error:
                explained = runtime.explain_failure(batch_time, error)  # e.g. a state function that raised
                if explained is None:
                    raise
                raise explained from None
            if left is None or isinstance(left, PendingCommit):
                return left
            if "returned" not in self._warned:
                self._warned.add("returned")
                logger.warning("Output %s: %r.write returned %r, which is not a PendingCommit; the engine ignores it "
                               "(return None when the batch is written by the time write returns)", self.name, sink,
                               left)
            return None

        return Job(batch_time, self.name, run, JobKind.OUTPUT)
