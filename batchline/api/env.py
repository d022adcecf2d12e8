"""What every stream of one pipeline shares: Spark, the clock, the interval and the trackers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession

from batchline.clock import Clock
from batchline.scheduler.input_info import InputInfoTracker, StreamInputInfo
from batchline.scheduler.receiver_tracker import ReceiverTracker

if TYPE_CHECKING:
    from batchline.api.graph import StreamGraph

__all__ = ["PipelineEnv"]


@dataclass
class PipelineEnv:
    spark: SparkSession
    clock: Clock
    batch_interval_ms: int
    graph: StreamGraph
    input_info: InputInfoTracker = field(default_factory=InputInfoTracker)
    receiver_tracker: ReceiverTracker | None = None
    """Created when the context starts, once every receiver stream is known."""

    def report_input(self, batch_time: int, info: StreamInputInfo) -> None:
        self.input_info.report(batch_time, info)
