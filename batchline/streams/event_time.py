"""Event time as tasks measure it: the newest of a column of timestamps (or epoch ms), and,
for an operator downstream of a union of streams with their own ``with_watermark``, each
one's newest as its rows pass it (``measure_newest``)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

__all__ = ["NewestParam", "epoch_ms", "measure_newest"]


def epoch_ms(column: Any) -> Any:
    """Timestamps as epoch ms; an integer column already holds them."""
    if pa.types.is_integer(column.type):
        return column
    return pc.divide(pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64()), 1000)


class NewestParam(AccumulatorParam):  # type: ignore[type-arg]
    """The newest of what tasks add (None: nothing yet). A task run twice adds the same rows
    again, which changes no maximum: any attempt's value is exact."""

    def zero(self, value: int | None) -> int | None:
        return None

    def addInPlace(self, a: int | None, b: int | None) -> int | None:  # noqa: N802 - Spark's name
        if a is None:
            return b
        return a if b is None else max(a, b)


def measure_newest(df: DataFrame, column: str, newest: Accumulator[int | None]) -> DataFrame:
    """``df`` unchanged, the newest event time in ``column`` of the rows that pass added to
    ``newest`` by the tasks that read them. A filter that keeps every row, so that only the
    column goes to Python and Spark may still prune and push down around it; nondeterministic,
    so that no filter downstream is moved under it (and rows go unmeasured)."""

    def keep_all(times: pa.Array) -> pa.Array:
        found = pc.max(epoch_ms(times)).as_py()
        if found is not None:
            newest.add(found)
        return pa.repeat(True, len(times))

    passing = F.arrow_udf(keep_all, BooleanType()).asNondeterministic()  # type: ignore[call-overload]
    return df.filter(passing(F.col(column)))
