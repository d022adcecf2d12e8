"""A DataFrame (or a table) as a bounded input (SPEC G1, F4).

A DataFrame need not give the same rows twice (a query over tables that change, a plan with
random parts), yet a restart must give each batch exactly the rows it had. So at the
pipeline's first start Spark tasks write the DataFrame's rows once, as Parquet files under
``<checkpoint>/inputs/<name>/<attempt>/``, and a manifest naming each file and its row
count is created last: until it exists, a restart writes them anew (in a new attempt
folder). Batches are ranges of those files, at most ``max_records_per_batch`` rows each
(the rows are spread over files of about that size), read back by Spark tasks through
fsspec, so it works the same on a local disk and on an object store.
"""

from __future__ import annotations

import io
import logging
import math
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import TaskContext
from pyspark.sql import DataFrame

from batchline.checkpoint.storage import CheckpointStorage, seal
from batchline.errors import ConfigurationError
from batchline.streams import InputNode, RangeReader, RuntimeEnv, StreamRuntime

__all__ = ["DataFrameSource", "DataFrameReader", "INPUTS_DIR"]

logger = logging.getLogger(__name__)

INPUTS_DIR = "inputs"


class DataFrameSource(InputNode):
    """The rows of ``df``, in batches of at most ``max_records_per_batch`` rows, then the end."""

    replayable = True

    def __init__(self, batch_interval_ms: int, df: DataFrame, name: str,
                 max_records_per_batch: int | None = None) -> None:
        if max_records_per_batch is not None and max_records_per_batch <= 0:
            raise ConfigurationError(f"max_records_per_batch must be positive; got {max_records_per_batch}")
        super().__init__(name, batch_interval_ms, bounded=True)
        self.df = df
        self.max_records_per_batch = max_records_per_batch

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> DataFrameReader:
        return DataFrameReader(self, env, parents)


class DataFrameReader(RangeReader):
    """Batches as index ranges over the files the DataFrame was written to."""

    node: DataFrameSource

    def __init__(self, node: DataFrameSource, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> None:
        super().__init__(node, env, parents)
        if env.checkpoint is None:
            raise ConfigurationError(
                f"input {node.name!r} reads a DataFrame, which it keeps as files at the checkpoint location so "
                "that a restart gives each batch the same rows; create the StreamingContext with checkpoint=<path "
                "or URL>"
            )
        self._storage: CheckpointStorage = env.checkpoint.storage
        self._folder = f"{INPUTS_DIR}/{node.name.replace('/', '_')}"
        self._manifest = f"{self._folder}/manifest.json"
        self._written: list[dict[str, Any]] | None = None

    @property
    def _files(self) -> list[dict[str, Any]]:
        """The files and their row counts; read from the manifest (a restart replays logged
        batches before ``open``), empty until the rows are written."""
        if self._written is None and self._storage.exists(self._manifest):
            self._written = list(self._storage.read_sealed(self._manifest)["files"])
        return self._written or []

    def open(self) -> None:
        if self._files:
            return
        self._written = self._write_rows()
        self._storage.write_new(self._manifest, seal({"files": self._written}))
        logger.info("Input %s keeps its DataFrame's %d rows as %d files under %s", self.name,
                    sum(f["rows"] for f in self._files), len(self._files), self._storage.full_url(self._folder))

    def _write_rows(self) -> list[dict[str, Any]]:
        df, limit = self.node.df, self.node.max_records_per_batch
        if limit is not None:
            df = df.repartition(max(1, math.ceil(df.count() / limit)))
        storage, folder = self._storage, f"{self._folder}/{uuid.uuid4().hex[:12]}"

        def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            context = TaskContext.get()
            assert context is not None
            table = pa.Table.from_batches(list(batches))
            if table.num_rows:
                name = f"{folder}/part-{context.partitionId():05d}.parquet"
                buffer = io.BytesIO()
                pq.write_table(table, buffer)
                storage.replace(name, buffer.getvalue())
                yield pa.RecordBatch.from_pydict({"file": [name], "rows": [table.num_rows]})

        written = df.mapInArrow(write, "file string, rows long").collect()
        return [{"file": row.file, "rows": row.rows} for row in sorted(written, key=lambda r: r.file)]

    def allocate(self, batch_time: int) -> None:
        start = end = self.next_index
        rows, limit = 0, self.node.max_records_per_batch
        while end < len(self._files) and (end == start or limit is None or rows + self._files[end]["rows"] <= limit):
            rows += self._files[end]["rows"]
            end += 1
        self.restore_allocation(batch_time, {"start": start, "end": end}, advance=True)

    def exhausted(self) -> bool:
        return self.next_index >= len(self._files)

    def report_range(self, batch_time: int, start: int, end: int) -> None:
        self.report(batch_time, sum(f["rows"] for f in self._files[start:end]), metadata={"start": start, "end": end})

    def compute(self, batch_time: int) -> DataFrame:
        start, end = self.range_of(batch_time)
        schema = self.node.df.schema
        if start == end:
            return self.env.empty_frame(schema)
        storage, names = self._storage, [f["file"] for f in self._files[start:end]]

        def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    yield from pq.read_table(pa.BufferReader(storage.read(names[index]))).to_batches()

        return self.env.spark.range(0, len(names), 1, len(names)).mapInArrow(read, schema)
