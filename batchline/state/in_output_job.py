"""A stateful operator read by one output only, directly, runs inside that output's job.

Such an operator runs no Spark job of its own. Its job (``StatefulRuntime.prepare_job``)
decides what the batch runs and publishes the batch's parameters on the batch's thread
(``InOutputJob.started``); the output's job then evaluates the operator's DataFrame, and so
runs the state function in its tasks: one Spark job fewer, and no pass over the persisted
output. The completion job after the output's (``finish_job``) takes on what the tasks
reported, running any partition the output's job did not evaluate. A failure of the output's
job is the operator's when the operator's own part of it failed (``explain_failure``).
"""

from __future__ import annotations

from typing import Protocol

from pyspark.sql import DataFrame

from batchline.errors import MissingBatchParamsError, error_chain
from batchline.scheduler.job import FailedIn, Job, JobKind
from batchline.state.contract import BatchParams, StateFunctionError, Stats
from batchline.state.operator_batch import OperatorBatch, Started
from batchline.state.store import DamagedStateFileError, KeptOutputLostError

__all__ = ["InOutputJob", "FusedOperator"]


class FusedOperator(Protocol):
    """What the fused path asks of its stateful operator (``StatefulRuntime``)."""

    name: str

    def batch(self, batch_time: int) -> OperatorBatch | None:
        """The operator's part of the batch, if the batch concerns it."""

    def get_or_compute(self, batch_time: int) -> DataFrame | None: ...

    def complete(self, batch_time: int, df: DataFrame, started: Started) -> None:
        """Run what no job ran yet of the batch, then take on what its tasks reported."""

    def reported(self, batch_time: int, params: BatchParams) -> Stats:
        """What the batch's tasks reported so far, completed from the partitions' finish records."""

    def all_reported(self, stats: Stats) -> bool: ...


class InOutputJob:
    """The fused path of one operator: its batches run inside its only output's job."""

    def __init__(self, operator: FusedOperator) -> None:
        self._operator = operator

    def started(self, batch: OperatorBatch, started: Started) -> None:
        """The batch's parameters are published to the thread that runs the output's job next."""
        batch.started = started

    def finish_job(self, batch_time: int) -> Job | None:
        """The completion job, after the output's job."""
        operator = self._operator
        batch = operator.batch(batch_time)
        if batch is None or not batch.awaiting_commit:
            return None
        df = operator.get_or_compute(batch_time)
        return None if df is None else Job(batch_time, operator.name, lambda: self._finish(batch_time, df),
                                             JobKind.STATE_COMPLETION)

    def _finish(self, batch_time: int, df: DataFrame) -> None:
        batch = self._operator.batch(batch_time)
        started = batch.started if batch is not None else None
        if batch is not None and started is not None:
            batch.started = None
            self._operator.complete(batch_time, df, started)

    def explain_failure(self, batch_time: int, error: BaseException) -> BaseException | None:
        """A failure of the operator's own part of its output's job is the operator's, as if
        its own job had failed: a state function's error (raised as ``StateFunctionError``), or
        a task that did not finish its partition (a Python worker that died). An output that
        evaluated the DataFrame on a thread without the batch's parameters made a mistake no
        retry mends: that is raised as a ``ConfigurationError``."""
        operator = self._operator
        for cause in error_chain(error):
            found = StateFunctionError.carried_in(cause)
            if found is not None:
                return FailedIn(self._naming_job(batch_time), found)
            missing = MissingBatchParamsError.carried_in(cause)
            if missing is not None and missing.operator == operator.name:
                return missing
            damaged = DamagedStateFileError.carried_in(cause) or KeptOutputLostError.carried_in(cause)
            if damaged is not None:
                return FailedIn(self._naming_job(batch_time), damaged)
        batch = operator.batch(batch_time)
        started = batch.started if batch is not None else None
        if started is not None and not operator.all_reported(operator.reported(batch_time, started.params)):
            root = error
            while root.__cause__ is not None:  # the Spark job's error under the sink's
                root = root.__cause__
            return FailedIn(self._naming_job(batch_time), root)
        return None

    def _naming_job(self, batch_time: int) -> Job:
        """The operator's job of the batch, as a failure inside its output's job names it."""
        return Job(batch_time, self._operator.name, lambda: None, JobKind.STATE)
