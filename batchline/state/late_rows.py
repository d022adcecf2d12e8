"""The rows a stateful operator dropped as late, as a stream of their own (SPEC D3): each row
as it came in, the operator's name and the watermark it missed. Spark and Bytewax drop late
rows silently; a pipeline here can write them anywhere, exactly once, as any stream.

Which rows are late is decided when the operator's batch runs (its watermark follows the
event time of earlier batches), so the stream's tasks read the batch's watermark from the
parameters the operator published to the batch's jobs, and keep the rows whose event time
(for a window: its end; for a session: the row's own session end) is at or before it: the
rows the operator's tasks dropped, each once per window it missed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from batchline.errors import ConfigurationError
from batchline.state.contract import BATCH_PARAMS_PROPERTY, LATE_AT, batch_params_from_property
from batchline.state.stateful import StatefulNode
from batchline.streams import RuntimeEnv, StreamNode, StreamRuntime

__all__ = ["LateRowsNode", "OPERATOR", "WATERMARK"]

OPERATOR = "operator"
WATERMARK = "watermark"


class LateRowsNode(StreamNode):
    """The late rows of ``operator`` (a stateful node that drops rows behind its watermark)."""

    def __init__(self, operator: StatefulNode, rows: StreamNode) -> None:
        # The operator is a parent too: reading this stream makes it run, and its batch's
        # parameters (the watermark) are published before any output's job.
        super().__init__([rows, operator])
        self.operator = operator

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> StreamRuntime:
        return _LateRowsRuntime(self, env, parents)


class _LateRowsRuntime(StreamRuntime):
    node: LateRowsNode
    _schema: StructType | None = None
    """The stream's columns, the same every batch: worked out (a query analysis) once."""

    def compute(self, batch_time: int) -> DataFrame:
        operator = self.node.operator
        shaped = operator.late_rows(self.parent_frame(batch_time, 0))
        schema = self._schema or self._columns(shaped)
        names = schema.fieldNames()[:-2]
        return shaped.mapInArrow(_late_filter(operator.name, batch_time, names), schema)

    def _columns(self, shaped: DataFrame) -> StructType:
        fields = [f for f in shaped.schema.fields if f.name != LATE_AT]
        clash = [f.name for f in fields if f.name in (OPERATOR, WATERMARK)]
        if clash:
            raise ConfigurationError(
                f"the late rows of operator {self.node.operator.name!r} add the columns {OPERATOR!r} and "
                f"{WATERMARK!r}, but its input has {clash}; rename them before the operator")
        self._schema = StructType([*fields, StructField(OPERATOR, StringType(), False),
                                   StructField(WATERMARK, TimestampType(), False)])
        return self._schema


def _late_filter(operator: str, batch_time: int, names: list[str]) \
        -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """In the tasks: the rows at or before the watermark the operator's tasks used for this
    batch (none when the operator ran nothing in it: then no row came either)."""

    def keep_late(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        watermark: int | None = None
        known = False
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if not known:
                watermark, known = _watermark(operator, batch_time), True
            if watermark is None:
                continue
            late = pc.fill_null(pc.less_equal(batch.column(LATE_AT), pa.scalar(watermark, pa.int64())), False)
            rows = batch.filter(late)
            if rows.num_rows == 0:
                continue
            stamp = pa.scalar(watermark * 1000, pa.timestamp("us", tz="UTC"))
            yield pa.RecordBatch.from_arrays(
                [rows.column(name) for name in names]
                + [pa.repeat(operator, rows.num_rows), pa.repeat(stamp, rows.num_rows)],
                names=[*names, OPERATOR, WATERMARK])

    return keep_late


def _watermark(operator: str, batch_time: int) -> int | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    published = context.getLocalProperty(BATCH_PARAMS_PROPERTY) if context is not None else None
    params = batch_params_from_property(published, operator)  # raises when evaluated outside the batch's jobs
    if params.batch_time != batch_time:
        return None  # the operator ran nothing in this batch (its parameters are an earlier batch's)
    return params.watermark_ms


