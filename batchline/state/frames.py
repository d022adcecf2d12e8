"""State as DataFrames: write a DataFrame into an operator's state files (initial state,
rescale, SPEC D6/D8) and read any retained version back (SPEC D7).

Both run as Spark jobs with one task per state partition, so state of any size moves
between executors and the checkpoint location without passing through the driver.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from batchline.errors import ConfigurationError, DuplicateStateKeyError
from batchline.state.execution import load_partition
from batchline.state.schema import RowSchema, as_python
from batchline.state.store import SNAPSHOT, FileHeader, StateMetadata, StateStore, entries_table

__all__ = ["write_state_frame", "read_state_frame", "TIMEOUT_COLUMN"]

logger = logging.getLogger(__name__)

TIMEOUT_COLUMN = "timeout_timestamp_ms"
"""The key's timeout deadline (epoch ms) in state read as a DataFrame; null without one."""


def _partition_id() -> int:
    context = TaskContext.get()
    if context is None:
        raise ConfigurationError("state is written and read as DataFrames inside Spark tasks; call this from "
                                 "a Spark job, or use the StateStore directly")
    return context.partitionId()


def write_state_frame(df: DataFrame, store: StateStore, metadata: StateMetadata, state: RowSchema, version: int,
                      initial: bool) -> int:
    """Write ``df`` (key columns, state fields, optionally ``timeout_timestamp_ms``) as the
    snapshot at ``version`` of every partition of ``metadata``'s generation; returns the key count.
    With ``initial`` the state function is called for each key in the first batch."""
    keys = metadata.key_schema.fieldNames()
    with_timeout = TIMEOUT_COLUMN in df.columns
    columns = [*keys, *state.names, *([TIMEOUT_COLUMN] if with_timeout else [])]
    single_key = len(keys) == 1
    n_keys, n_state = len(keys), len(state.names)
    key_schema, generation = metadata.key_schema, metadata.generation

    def task(batches: Any) -> Any:
        partition = _partition_id()
        entries: dict[Any, tuple[tuple[Any, ...], int | None]] = {}
        for batch in batches:
            cols = [as_python(c) for c in batch.columns]
            key_values = cols[0] if single_key else list(zip(*cols[:n_keys], strict=True))
            values = list(zip(*cols[n_keys:n_keys + n_state], strict=True))
            timeouts = cols[-1] if with_timeout else [None] * len(key_values)
            for key, value, timeout in zip(key_values, values, timeouts, strict=True):
                if key in entries:
                    raise DuplicateStateKeyError(repr(key))
                entries[key] = (value, timeout)
        rows = ((k, v, t) for k, (v, t) in entries.items())
        store.write_version(generation, FileHeader(version, partition, SNAPSHOT, initial=initial),
                            entries_table(key_schema, state, rows, single_key))
        yield pa.RecordBatch.from_pydict({"partition": [partition], "keys": [len(entries)]})

    written = (df.select(*columns).repartition(metadata.num_partitions, *keys)
               .mapInArrow(task, "partition long, keys long").collect())
    if len(written) != metadata.num_partitions:
        raise ConfigurationError(
            f"wrote {len(written)} of {metadata.num_partitions} state partitions; adaptive execution must not "
            "coalesce the state shuffle"
        )
    return sum(row.keys for row in written)


def state_frame_schema(metadata: StateMetadata, state: RowSchema) -> StructType:
    return StructType([*metadata.key_schema.fields, *state.struct.fields,
                       StructField(TIMEOUT_COLUMN, LongType(), True)])


def read_state_frame(spark: SparkSession, store: StateStore, metadata: StateMetadata, state: RowSchema,
                     version: int) -> DataFrame:
    """Every key of the operator at ``version``: key columns, state fields, timeout."""
    schema = state_frame_schema(metadata, state)
    arrow_schema = RowSchema.of(schema).arrow
    single_key = len(metadata.key_schema.fields) == 1
    generation = metadata.generation

    def task(batches: Any) -> Any:
        for batch in batches:
            for partition in batch.column(0).to_pylist():
                # The newest version at or below: a partition that sat batches out wrote none for them.
                data = load_partition(store, state, single_key, generation, partition, None, below=version + 1)
                # Keys with state; a timeout kept without state (after remove()) is no state to read.
                held = [(k, v, t) for k, (v, t) in data.entries.items() if v is not None]
                keys = [k for k, _, _ in held]
                key_columns = [keys] if single_key else [list(c) for c in zip(*keys, strict=True)]
                if not keys:
                    key_columns = [[] for _ in metadata.key_schema.fields]
                values = [v for _, v, _ in held]
                state_columns = ([list(c) for c in zip(*values, strict=True)] if values
                                 else [[] for _ in state.names])
                timeouts = [t for _, _, t in held]
                arrays = [pa.array(col, type=field.type)
                          for col, field in zip([*key_columns, *state_columns, timeouts], arrow_schema, strict=True)]
                yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)

    n = metadata.num_partitions
    return spark.range(0, n, 1, n).mapInArrow(task, schema)
