"""An output's Arrow function run in the tasks that make a stream's rows, with the rows as
Spark's ``mapInArrow`` would hand them to it.

``df.mapInArrow(fn)`` over rows that a Python task made (a source's read, a stateful
operator's task) sends them to the JVM and back to a second Python worker. When the output is
the rows' only reader and reads them in one pass, the engine runs ``fn`` in the task that makes
them instead (``StreamRuntime.map_in_arrow``); ``ArrowHandover`` keeps what ``fn`` sees the
same: the session's time zone and string types, at most ``maxRecordsPerBatch`` rows a batch,
no empty batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

__all__ = ["ArrowHandover"]


@dataclass(frozen=True)
class ArrowHandover:
    """How Spark would hand a ``mapInArrow`` function rows of one schema."""

    schema: pa.Schema
    max_rows: int

    @classmethod
    def of(cls, spark: SparkSession, schema: StructType) -> ArrowHandover:
        conf = spark.conf
        arrow = to_arrow_schema(schema, timezone=conf.get("spark.sql.session.timeZone", "UTC"),
                                prefers_large_types=conf.get("spark.sql.execution.arrow.useLargeVarTypes",
                                                             "false") == "true")
        max_rows = int(conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000") or 10000)
        return cls(arrow, max_rows if max_rows > 0 else 2**31)

    def batches(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches`` in this schema (their columns in its order and types), cut to at most
        ``max_rows`` rows, empty ones left out."""
        for batch in batches:
            if not batch.schema.equals(self.schema):
                batch = batch.cast(self.schema)
            for offset in range(0, batch.num_rows, self.max_rows):
                yield batch.slice(offset, self.max_rows)
