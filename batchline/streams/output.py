"""Output operations: each becomes one job of every batch's job set (SPEC C2)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame

from batchline.batch_time import BatchTime
from batchline.scheduler.job import Job
from batchline.streams.base import StreamNode, StreamRuntime

__all__ = ["OutputOperation"]


@dataclass(frozen=True)
class OutputOperation:
    """``fn(df, batch_time)`` for every batch of ``node``, under a name unique in the pipeline."""

    name: str
    node: StreamNode
    fn: Callable[[DataFrame, BatchTime], Any]

    sink: Any = None
    """The object behind ``fn`` when it keeps commits of its own (``last_commit()``), for the
    final checkpoint (SPEC G3)."""
    reads_all_rows: bool = True
    """Whether ``fn`` reads every row of its DataFrame (a write does; ``console``'s ``show``
    does not). An input's counts come from the first job that reads all of its rows."""

    def job(self, runtime: StreamRuntime, batch_time: int) -> Job | None:
        """The batch's job; none once the stream has finished (SPEC G1: finished streams run
        no work). Whether it has is checked again when the job runs: an operator learns that
        it drained only when the batch before has run."""
        if runtime.finished_before(batch_time):
            return None
        df = runtime.get_or_compute(batch_time)
        if df is None:
            return None
        fn, stamp = self.fn, BatchTime(batch_time)

        def run() -> None:
            if not runtime.finished_before(batch_time):
                fn(df, stamp)

        return Job(batch_time, self.name, run)
