"""Where a stateful operator's rows go, and how each task learns which state partition it runs.

A state partition keeps its identity across batches: a key's rows go where Spark's
``repartition(n, keys)`` sends them, ``pmod(hash(keys), n)`` (Murmur3, seed 42). A task
cannot take its partition from ``TaskContext.partitionId()``: an output that reads the
operator's DataFrame through ``coalesce`` runs several state partitions in one task, and a
``union`` after another frame numbers them after that frame's. So the shuffle carries one
marker row per partition, whose ``MARKER_COLUMN`` holds the partition's number; data rows
hold null there. Every partition, even one without data, gets its marker, and its task
runs as the partition the marker names (``batchline.state.execution``).

Spark's hash partitioning hashes whatever expressions it is given, so a row cannot be sent to
a partition by number directly. It is sent by a stand-in: for each partition ``p`` the
smallest integer whose own hash lands in ``p`` (``route_values``). Data rows are routed by
the stand-in of ``pmod(hash(keys), n)``, which puts them exactly where ``repartition(n,
keys)`` would: checkpoints written before markers existed keep their partitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from batchline.errors import ConfigurationError
from batchline.state.contract import MARKER_COLUMN

__all__ = ["StateShuffle", "marker_frame", "placement", "route_values", "spark_hash_int"]

_SEED = 42  # Spark's hash() and HashPartitioning


def placement(key_names: Sequence[str], num_partitions: int) -> Column:
    """The state partition of a row, as Spark's ``repartition(num_partitions, *keys)`` computes it."""
    return F.pmod(F.hash(*key_names), F.lit(num_partitions))


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & 0xFFFFFFFF


def spark_hash_int(value: int, seed: int = _SEED) -> int:
    """Spark's ``hash()`` of one 32-bit integer: ``Murmur3_x86_32.hashInt``."""
    k1 = _rotl((value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = _rotl((seed & 0xFFFFFFFF) ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & 0xFFFFFFFF
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return _int32(h1)


@lru_cache(maxsize=64)
def route_values(num_partitions: int) -> tuple[int, ...]:
    """For each partition ``p``, the smallest integer ``v >= 0`` with ``pmod(hash(v), n) == p``."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < num_partitions:
        found.setdefault(spark_hash_int(value) % num_partitions, value)
        value += 1
    return tuple(found[p] for p in range(num_partitions))


def marker_frame(spark: SparkSession, num_partitions: int) -> DataFrame:
    """One marker row per state partition, built in the JVM (a local list would start Python tasks)."""
    return spark.range(0, num_partitions, 1, 1).select(F.col("id").cast("int").alias(MARKER_COLUMN))


class StateShuffle:
    """A stateful operator's rows shuffled into its state partitions as
    ``repartition(num_partitions, *keys)`` does, with each partition's marker row added
    (``marker_frame``), batch after batch. The routing expression and the typed marker rows are
    built once (for as long as the input's columns stay the same), not every batch: each costs
    round trips to the JVM and a query analysis. Marker rows join data rows by position, not
    by name, so a frame with two columns of one name goes through as before."""

    def __init__(self, spark: SparkSession, key_names: Sequence[str], num_partitions: int) -> None:
        self.num_partitions = num_partitions
        self._markers = marker_frame(spark, num_partitions)
        self._no_marker = F.lit(None).cast("int").alias(MARKER_COLUMN)
        target = F.coalesce(F.col(MARKER_COLUMN), placement(key_names, num_partitions))
        stand_ins = F.array(*[F.lit(v) for v in route_values(num_partitions)])
        self._route = F.element_at(stand_ins, target + 1)
        self._typed: tuple[StructType, DataFrame] | None = None
        """The marker rows with a null in each of the input's columns, and those columns."""

    def __call__(self, df: DataFrame, schema: StructType | None = None) -> DataFrame:
        """``df`` (whose columns are ``schema``, when known) shuffled into the partitions."""
        schema = df.schema if schema is None else schema
        if MARKER_COLUMN in schema.fieldNames():
            raise ConfigurationError(f"the input of a stateful operator has a column named {MARKER_COLUMN!r}, the "
                                     "name batchline marks state partitions with; rename that column before grouping")
        if self._typed is None or self._typed[0] != schema:
            self._typed = schema, self._markers.select(
                *[F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields], MARKER_COLUMN)
        data = df.select("*", self._no_marker)
        return data.union(self._typed[1]).repartition(self.num_partitions, self._route)
