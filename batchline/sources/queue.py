"""A stream fed from a queue of DataFrames (PySpark's ``queueStream``), for tests and replays."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from batchline.sources.base import InputStream

if TYPE_CHECKING:
    from batchline.api.env import PipelineEnv

__all__ = ["QueueInputStream"]


class QueueInputStream(InputStream):
    """Each batch takes the next queued DataFrame (or all of them); an empty queue gives an
    empty batch with ``schema``."""

    def __init__(
        self,
        env: PipelineEnv,
        frames: Iterable[DataFrame],
        schema: StructType | None = None,
        one_at_a_time: bool = True,
        name: str = "queue",
    ) -> None:
        super().__init__(env, name)
        self._queue: collections.deque[DataFrame] = collections.deque(frames)
        if schema is None:
            if not self._queue:
                raise ValueError("queue_stream needs a schema when it starts with no DataFrames")
            schema = self._queue[0].schema
        self.schema = schema
        self._one_at_a_time = one_at_a_time
        self._taken: dict[int, list[DataFrame]] = {}
        self._lock = threading.Lock()

    def push(self, df: DataFrame) -> None:
        with self._lock:
            self._queue.append(df)

    def allocate(self, batch_time: int) -> None:
        with self._lock:
            count = 1 if self._one_at_a_time else len(self._queue)
            taken = [self._queue.popleft() for _ in range(min(count, len(self._queue)))]
        self._taken[batch_time] = taken
        self.report(batch_time, None if taken else 0, metadata={"frames": len(taken)})

    def allocation(self, batch_time: int) -> dict[str, int]:
        return {"frames": len(self._taken.get(batch_time, []))}

    def _compute(self, batch_time: int) -> DataFrame:
        frames = self._taken.get(batch_time) or [self.empty_frame(self.schema)]
        result = frames[0]
        for df in frames[1:]:
            result = result.unionByName(df)
        return result

    def forget_before(self, threshold_time: int) -> None:
        for batch_time in [t for t in self._taken if t <= threshold_time]:
            del self._taken[batch_time]
