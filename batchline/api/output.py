"""Output operations: each becomes one job of every batch's job set (SPEC C2)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame

from batchline.batch_time import BatchTime
from batchline.scheduler.job import Job

if TYPE_CHECKING:
    from batchline.api.env import PipelineEnv
    from batchline.api.stream import Stream

__all__ = ["OutputOperation"]


@dataclass(frozen=True)
class OutputOperation:
    name: str
    stream: Stream
    fn: Callable[[DataFrame, BatchTime], Any]

    @classmethod
    def register(
        cls, env: PipelineEnv, stream: Stream, fn: Callable[[DataFrame, BatchTime], Any], name: str
    ) -> OutputOperation:
        operation = cls(env.graph.unique_output_name(name), stream, fn)
        env.graph.add_output(operation)
        return operation

    def generate_job(self, batch_time: int) -> Job | None:
        df = self.stream.get_or_compute(batch_time)
        if df is None:
            return None
        fn, stamp = self.fn, BatchTime(batch_time)
        return Job(batch_time, self.name, lambda: fn(df, stamp))
