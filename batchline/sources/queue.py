"""A stream fed from a queue of DataFrames (PySpark's ``queueStream``), for tests and replays."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Sequence

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from batchline.errors import ConfigurationError
from batchline.streams import InputNode, InputRuntime, RuntimeEnv, StreamRuntime

__all__ = ["QueueSource"]


class QueueSource(InputNode):
    """Each batch takes the next queued DataFrame (or all of them); an empty queue gives an
    empty batch with ``schema``. The queue is the user's channel into the pipeline: ``push``
    adds to it before or while the pipeline runs."""

    def __init__(
        self,
        batch_interval_ms: int,
        frames: Iterable[DataFrame],
        schema: StructType | None = None,
        one_at_a_time: bool = True,
        name: str = "queue",
    ) -> None:
        super().__init__(name, batch_interval_ms)
        self._queue: collections.deque[DataFrame] = collections.deque(frames)
        if schema is None:
            if not self._queue:
                raise ConfigurationError("queue_stream needs a schema when it starts with no DataFrames; pass schema=")
            schema = self._queue[0].schema
        self.schema = schema
        self.one_at_a_time = one_at_a_time
        self._lock = threading.Lock()

    def push(self, df: DataFrame) -> None:
        with self._lock:
            self._queue.append(df)

    def take(self) -> list[DataFrame]:
        """The next DataFrame, or every queued one."""
        with self._lock:
            count = 1 if self.one_at_a_time else len(self._queue)
            return [self._queue.popleft() for _ in range(min(count, len(self._queue)))]

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> QueueReader:
        return QueueReader(self, env, parents)


class QueueReader(InputRuntime):
    node: QueueSource

    def __init__(self, node: QueueSource, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> None:
        super().__init__(node, env, parents)
        self._taken: dict[int, list[DataFrame]] = {}

    def allocate(self, batch_time: int) -> None:
        taken = self.node.take()
        self._taken[batch_time] = taken
        self.report(batch_time, None if taken else 0, metadata={"frames": len(taken)})

    def allocation(self, batch_time: int) -> dict[str, int]:
        return {"frames": len(self._taken.get(batch_time, []))}

    def compute(self, batch_time: int) -> DataFrame:
        frames = self._taken.get(batch_time) or [self.env.empty_frame(self.node.schema)]
        result = frames[0]
        for df in frames[1:]:
            result = result.unionByName(df)
        return result

    def forget_before(self, threshold_time: int) -> None:
        for batch_time in [t for t in self._taken if t <= threshold_time]:
            del self._taken[batch_time]
