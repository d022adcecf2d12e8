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

    def job(self, runtime: StreamRuntime, batch_time: int) -> Job | None:
        df = runtime.get_or_compute(batch_time)
        if df is None:
            return None
        fn, stamp = self.fn, BatchTime(batch_time)
        return Job(batch_time, self.name, lambda: fn(df, stamp))
