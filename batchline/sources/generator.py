"""Deterministic synthetic user events at a fixed rate (SPEC B5).

Event ``i`` is a pure function of (seed, i), so any batch can be rebuilt exactly from its
index range; the rows are made by Spark from ``range`` and hash expressions, never on the driver.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, IntegerType, StringType, StructField, StructType, TimestampType

from batchline.errors import ConfigurationError, SourceError
from batchline.sources.index_range import IndexRangeSource
from batchline.sources.source import BatchTimes, Position, SourceBatch, Split

__all__ = ["GeneratorSource", "USER_EVENT_SCHEMA", "index_range"]

USER_EVENT_SCHEMA = StructType(
    [
        StructField("id", IntegerType(), False),
        StructField("data", StringType(), False),
        StructField("is_last", BooleanType(), False),
        StructField("ts", TimestampType(), False),
    ]
)


STABLE_CODE_BELOW = 1_000_000
"""From this many indexes on, ``index_range`` is a plain range from ``start``."""


def index_range(spark: SparkSession, start: int, end: int, partitions: int | None = None) -> DataFrame:
    """``spark.range(start, end)`` (column ``id``), split into ``partitions`` the same way, built
    so that consecutive batches run the same generated code. Spark compiles a range's bounds
    into the code of its stage, so each new range compiled new code on every executor (25-60 ms
    of CPU a batch, and a place in Spark's cache of compiled code). A range from 0 has the same
    code for the same count; ``start`` is added as a decimal literal, which the code reads by
    reference. From ``STABLE_CODE_BELOW`` indexes, adding in decimals (about 20 ns an index)
    costs more than the compile, and the range starts at ``start`` itself."""
    count = end - start
    plain = count >= STABLE_CODE_BELOW
    first = start if plain else 0
    frame = spark.range(first, first + count, numPartitions=partitions or None)
    if plain:
        return frame
    # coalesce: the sum's cast could be null to Spark (overflow), and the range's id is not.
    return frame.select(F.coalesce((F.col("id") + F.lit(Decimal(start))).cast("long"), F.lit(0)).alias("id"))


class GeneratorSource(IndexRangeSource):
    """UserEvent rows ``{id, data, is_last, ts}``: ``rate`` events per second of stream time.

    ``max_records_per_batch`` caps a batch (SPEC B4): after down time the backlog is worked
    off over several batches. With ``total`` the input is bounded: it ends after that many events.

    Its position is the next event's index (``{"next_index": n}``); a batch is the index range
    due by its time, built by Spark (``frame``), so its count is known as it is planned.
    """

    position_key = "next_index"

    def __init__(
        self,
        rate: float,
        users: int = 1000,
        seed: int = 0,
        last_event_probability: float = 0.05,
        partitions: int | None = None,
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
        if max_records_per_batch is not None and max_records_per_batch <= 0:
            raise ConfigurationError(f"max_records_per_batch must be positive; got {max_records_per_batch}")
        self.bounded = total is not None
        self.total = total
        self.rate = rate
        self.users = users
        self.seed = seed
        self.last_event_probability = last_event_probability
        self.partitions = partitions
        self.max_records_per_batch = max_records_per_batch

    def schema(self) -> StructType:
        return USER_EVENT_SCHEMA

    def initial_position(self) -> Position:
        return {"next_index": 0}

    def end_of_input(self) -> Position:
        return {"next_index": self.total}

    def exhausted(self, position: Position, end_of_input: Position) -> bool:
        return self.total is not None and int(position["next_index"]) >= self.total

    def index_at(self, at: BatchTimes) -> int:
        """How many events the generator has emitted by the batch's time."""
        if at.zero_time_ms is None:
            raise ConfigurationError("a generator is asked for events before the pipeline started; start the "
                                     "StreamingContext first")
        return int((at.batch_time_ms - at.zero_time_ms) * self.rate // 1000)

    def plan_at(self, start: Position, end_of_input: Position | None, at: BatchTimes) -> SourceBatch:
        first = int(start["next_index"])
        end = max(first, self.index_at(at))
        if self.max_records_per_batch is not None:
            end = min(end, first + self.max_records_per_batch)
        if self.total is not None:
            end = min(end, self.total)
        return self._range(first, end, at)

    def _range(self, start: int, end: int, at: BatchTimes | None = None) -> SourceBatch:
        assert at is not None, "the generator's batches depend on the batch time"
        splits = ({"start": start, "end": end, "zero_time": at.zero_time_ms},) if end > start else ()
        return SourceBatch({"next_index": start}, {"next_index": end}, splits, info={"start": start, "end": end},
                           records=end - start)

    def frame(self, spark: SparkSession, batch: SourceBatch) -> DataFrame:
        [split] = batch.splits
        return self.events(spark, int(split["start"]), int(split["end"]), int(split["zero_time"]))

    def read(self, split: Split) -> Iterable[Any]:
        raise SourceError("generated events are made by Spark (frame()), never split by split; this is a bug in "
                          "batchline")

    def events(self, spark: SparkSession, start: int, end: int, zero_time_ms: int) -> DataFrame:
        """Events ``start`` (inclusive) to ``end`` (exclusive) of a pipeline started at ``zero_time_ms``."""
        index = F.col("id")
        user = F.pmod(F.xxhash64(F.lit(self.seed), index), F.lit(self.users)).cast("int")
        last_roll = F.pmod(F.xxhash64(F.lit(self.seed + 1), index), F.lit(1_000_000))
        millis = F.lit(zero_time_ms) + (index * F.lit(1000.0 / self.rate if self.rate else 0)).cast("long")
        return index_range(spark, start, end, self.partitions).select(
            user.alias("id"),
            F.concat(F.lit("event-"), index.cast("string")).alias("data"),
            (last_roll < F.lit(int(self.last_event_probability * 1_000_000))).alias("is_last"),
            F.timestamp_millis(millis).alias("ts"),
        )
