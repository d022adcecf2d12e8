"""A stream fed from a queue of DataFrames (PySpark's ``queueStream``), for tests and replays."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from batchline.errors import ConfigurationError, SourceError
from batchline.sources.source import BatchTimes, Position, Source, SourceBatch, SourceRun, Split
from batchline.state.schema import as_struct

__all__ = ["QueueSource"]

logger = logging.getLogger(__name__)


class QueueSource(Source):
    """Each batch takes the next queued DataFrame (or all of them); an empty queue gives an
    empty batch with ``schema``. The queue is the user's channel into the pipeline: ``push``
    adds to it before or while the pipeline runs.

    The DataFrames live in the driver's memory only: a batch logged before a restart cannot
    have them again (``can_replay`` is False, and the batch re-runs without them), and their
    rows are not counted (it would run the user's plans once more). Its position counts the
    DataFrames taken in this run (``{"taken": n}``); the checkpoint keeps nothing of it.
    """

    counted = False

    def __init__(self, frames: Iterable[DataFrame], schema: StructType | str | type | None = None,
                 one_at_a_time: bool = True) -> None:
        self._queue: collections.deque[DataFrame] = collections.deque(frames)
        if schema is None:
            if not self._queue:
                raise ConfigurationError("queue_stream needs a schema when it starts with no DataFrames; pass schema=")
            schema = self._queue[0].schema
        self.row_schema = as_struct(schema, "the schema of queue_stream")
        self.one_at_a_time = one_at_a_time
        self._lock = threading.Lock()
        self._taken: dict[int, DataFrame] = {}
        """The DataFrames batches took, by their number in this run, until the engine forgets
        the batch (a window may read it after it committed)."""
        self.name = "queue"

    def schema(self) -> StructType:
        return self.row_schema

    def attach(self, run: SourceRun) -> None:
        self.name = run.name

    def push(self, df: DataFrame) -> None:
        with self._lock:
            self._queue.append(df)

    def take(self) -> list[DataFrame]:
        """The next DataFrame, or every queued one."""
        with self._lock:
            count = 1 if self.one_at_a_time else len(self._queue)
            return [self._queue.popleft() for _ in range(min(count, len(self._queue)))]

    def initial_position(self) -> Position:
        return {"taken": 0}

    def plan(self, start: Position, end_of_input: Position | None) -> SourceBatch:
        first = int(start["taken"])
        frames = self.take()
        for number, df in enumerate(frames, first):
            self._taken[number] = df
        end = first + len(frames)
        return SourceBatch(start, {"taken": end}, tuple({"frame": n} for n in range(first, end)),
                           info={"frames": len(frames)})

    def can_replay(self, batch: SourceBatch) -> bool:
        return False

    def forget(self, batch: SourceBatch) -> None:
        for split in batch.splits:
            self._taken.pop(int(split.get("frame", -1)), None)

    def checkpoint_position(self, position: Position | None, end_of_input: Position | None) -> dict[str, Any]:
        return {}

    def restore_position(self, record: Mapping[str, Any]) -> tuple[Position | None, Position | None]:
        return None, None

    def log_batch(self, batch: SourceBatch) -> dict[str, Any]:
        return {"frames": len(batch.splits)}

    def logged_batch(self, record: Mapping[str, Any], position: Position | None, at: BatchTimes) -> SourceBatch:
        frames = int(record.get("frames", 0))
        logger.warning("Input %s cannot replay batch %d: it re-runs without this input's data", self.name,
                       at.batch_time_ms)
        start = dict(position) if position is not None else {"taken": 0}
        # The DataFrames are gone with the driver that took them: none of their rows comes back.
        return SourceBatch(start, start, tuple({"lost": n} for n in range(frames)), info={"frames": frames},
                           records=0)

    def frame(self, spark: SparkSession, batch: SourceBatch) -> DataFrame:
        frames = [self._taken[int(split["frame"])] for split in batch.splits if int(split.get("frame", -1)) in
                  self._taken]
        if not frames:
            return spark.createDataFrame(spark.sparkContext.emptyRDD(), self.row_schema)
        result = frames[0]
        for df in frames[1:]:
            result = result.unionByName(df)
        return result

    def read(self, split: Split) -> Iterable[Any]:
        raise SourceError(f"the DataFrames of {self.name} are handed to Spark as they are (frame()), never read "
                          "split by split; this is a bug in batchline")
