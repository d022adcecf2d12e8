"""Deterministic synthetic user events at a fixed rate (SPEC B5).

Event ``i`` is a pure function of (seed, i), so any batch can be rebuilt exactly from its
index range; the rows are made by Spark from ``range`` and hash expressions, never on the driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, IntegerType, StringType, StructField, StructType, TimestampType

from batchline.errors import ConfigurationError
from batchline.streams import InputNode, RangeReader, RuntimeEnv, StreamRuntime

__all__ = ["GeneratorSource", "GeneratorReader", "USER_EVENT_SCHEMA"]

USER_EVENT_SCHEMA = StructType(
    [
        StructField("id", IntegerType(), False),
        StructField("data", StringType(), False),
        StructField("is_last", BooleanType(), False),
        StructField("ts", TimestampType(), False),
    ]
)


class GeneratorSource(InputNode):
    """UserEvent rows ``{id, data, is_last, ts}``: ``rate`` events per second of stream time.

    ``max_records_per_batch`` caps a batch (SPEC B4): after down time the backlog is worked
    off over several batches. With ``total`` the input is bounded: it ends after that many events.
    """

    replayable = True

    def __init__(
        self,
        batch_interval_ms: int,
        rate: float,
        users: int = 1000,
        seed: int = 0,
        last_event_probability: float = 0.05,
        partitions: int | None = None,
        name: str = "generator",
        max_records_per_batch: int | None = None,
        total: int | None = None,
    ) -> None:
        if total is not None and total < 0:
            raise ConfigurationError(f"generator total must be >= 0 events; got {total}")
        if rate < 0:
            raise ConfigurationError(f"generator rate must be >= 0 events per second; got {rate}")
        if users <= 0:
            raise ConfigurationError(f"generator users must be positive; got {users}")
        if not 0 <= last_event_probability <= 1:
            raise ConfigurationError(
                f"last_event_probability must be between 0 and 1; got {last_event_probability}"
            )
        super().__init__(name, batch_interval_ms, bounded=total is not None)
        self.total = total
        self.rate = rate
        self.users = users
        self.seed = seed
        self.last_event_probability = last_event_probability
        self.partitions = partitions
        if max_records_per_batch is not None and max_records_per_batch <= 0:
            raise ConfigurationError(f"max_records_per_batch must be positive; got {max_records_per_batch}")
        self.max_records_per_batch = max_records_per_batch

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> GeneratorReader:
        return GeneratorReader(self, env, parents)


class GeneratorReader(RangeReader):
    """The generator's run: the index range of each batch, and the next index to emit."""

    node: GeneratorSource
    position_key = "next_index"

    def _zero_time(self) -> int:
        if self.zero_time is None:
            raise ConfigurationError(f"input {self.name!r} is asked for events before the pipeline started")
        return self.zero_time

    def index_at(self, batch_time: int) -> int:
        """How many events the generator has emitted by ``batch_time``."""
        return int((batch_time - self._zero_time()) * self.node.rate // 1000)

    def allocate(self, batch_time: int) -> None:
        start, end = self.next_index, max(self.next_index, self.index_at(batch_time))
        if self.node.max_records_per_batch is not None:
            end = min(end, start + self.node.max_records_per_batch)
        if self.node.total is not None:
            end = min(end, self.node.total)
        self.restore_allocation(batch_time, {"start": start, "end": end}, advance=True)

    def exhausted(self) -> bool:
        return self.node.total is not None and self.next_index >= self.node.total

    def compute(self, batch_time: int) -> DataFrame:
        return self.events(*self.range_of(batch_time))

    def events(self, start: int, end: int) -> DataFrame:
        """Events ``start`` (inclusive) to ``end`` (exclusive)."""
        node, spark = self.node, self.env.spark
        index = F.col("id")
        user = F.pmod(F.xxhash64(F.lit(node.seed), index), F.lit(node.users)).cast("int")
        last_roll = F.pmod(F.xxhash64(F.lit(node.seed + 1), index), F.lit(1_000_000))
        millis = F.lit(self._zero_time()) + (index * F.lit(1000.0 / node.rate if node.rate else 0)).cast("long")
        frame = spark.range(start, end, numPartitions=node.partitions) if node.partitions else spark.range(start, end)
        return frame.select(
            user.alias("id"),
            F.concat(F.lit("event-"), index.cast("string")).alias("data"),
            (last_roll < F.lit(int(node.last_event_probability * 1_000_000))).alias("is_last"),
            F.timestamp_millis(millis).alias("ts"),
        )
