"""One state partition of an operator, run batch by batch over a ``MemoryStateStore`` without
Spark: what the bulk-call tests run a built-in state function and its per-key twin through."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from batchline.state.contract import BatchParams, OperatorSpec, Stats
from batchline.state.execution import PartitionCache, load_partition, run_partition
from batchline.state.group_state import GroupStateTimeout
from batchline.state.schema import RowSchema
from batchline.state.store import DELTA, MemoryStateStore


def per_key(fn: Any) -> Any:
    """The same function without its bulk hooks: called per key, as any state function."""
    return lambda key, rows, state: fn(key, rows, state)


@dataclasses.dataclass
class PartitionRun:
    """Partition 0 of an operator of ``fn``, keyed by ``key_names`` (columns of ``input``)."""

    fn: Any
    state: StructType
    output: StructType
    input: StructType
    key_names: tuple[str, ...]
    timeout: GroupStateTimeout = GroupStateTimeout.EVENT_TIME
    event_time: str | None = None
    late: str | None = None
    input_column: str | None = None
    rows_column: str | None = None

    def __post_init__(self) -> None:
        self.spec = OperatorSpec(
            store=MemoryStateStore("op"), generation=0, key_names=self.key_names,
            key_schema=StructType([self.input[name] for name in self.key_names]), state=RowSchema.of(self.state),
            output=RowSchema.of(self.output), fn=self.fn, flat=True, timeout=self.timeout,
            event_time_column=self.event_time, late_column=self.late, input_column=self.input_column,
            rows_column=self.rows_column)
        self.cache = PartitionCache()
        self.version: int | None = None

    def batch(self, batch_time: int, rows: list[tuple[Any, ...]] | list[dict[str, Any]], watermark: int | None,
              end: bool = False) -> tuple[list[dict[str, Any]], Stats, list[dict[str, Any]]]:
        """The batch's output rows, its stats and its delta's rows."""
        arrow = to_arrow_schema(self.input, timezone="UTC")
        records = [row if isinstance(row, dict) else dict(zip(arrow.names, row, strict=True)) for row in rows]
        batches = [pa.RecordBatch.from_pylist(records, schema=arrow)] if rows else []
        stats: list[Stats] = []
        params = BatchParams(batch_time=batch_time, prev_version=self.version, token=0, watermark_ms=watermark,
                             end_of_input=end)
        out = [row for b in run_partition(self.spec, params, batches, 0, stats.append, cache=self.cache,
                                          background_snapshots=False) for row in b.to_pylist()]
        self.version = batch_time
        delta = self.spec.store.read_version(0, 0, batch_time, DELTA).table.to_pylist()
        return out, stats[0], delta

    def stored(self) -> dict[Any, Any]:
        """Every key's entry as a restart reads it from the files."""
        assert self.version is not None
        data = load_partition(self.spec.store, self.spec.state, self.spec.single_key, 0, 0, self.version)
        return dict(data.entries.items())
