"""A DataFrame (or a table) as a bounded input (SPEC G1, F4).

A DataFrame need not give the same rows twice (a query over tables that change, a plan with
random parts), yet a restart must give each batch exactly the rows it had. So at the
pipeline's first start Spark tasks write the DataFrame's rows once, as Parquet files under
``<checkpoint>/inputs/<name>/<attempt>/``, and a manifest naming each file and its row
count is created last: until it exists, a restart writes them anew (in a new attempt
folder). Batches are ranges of those files, at most ``max_records_per_batch`` rows each
(the rows are spread over files of about that size), read back by Spark tasks through
fsspec, so it works the same on a local disk and on an object store. The manifest keeps each
file's SHA-256, checked whenever a task reads the file back: a damaged file fails the batch,
naming it, instead of giving it other rows (manifests written before kept no digests; their
files are read as they are).
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from batchline.checkpoint.storage import CheckpointStorage, seal
from batchline.errors import ConfigurationError, DamagedFileError, SourceError
from batchline.sources.index_range import IndexRangeSource
from batchline.sources.source import BatchTimes, Position, SourceBatch, SourceRun, Split

__all__ = ["DamagedInputFileError", "DataFrameSource", "INPUTS_DIR", "verified_rows"]

logger = logging.getLogger(__name__)

INPUTS_DIR = "inputs"


class DamagedInputFileError(DamagedFileError):
    """A kept input file that does not verify: the batch would read other rows."""

    kind = "input file"
    consequence = "batchline stops rather than give a batch other rows than it had"
    remedy = "start from a new checkpoint location (the input is read from its beginning)"


def verified_rows(data: bytes, sha256: str | None, where: str) -> pa.Table:
    """A kept input file's rows, once its bytes match the digest the manifest kept (None: a
    manifest written before digests were kept, read as it is)."""
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        problem = ("it is empty (0 bytes)" if not data
                   else f"its checksum does not match its content ({len(data)} bytes)")
        raise DamagedInputFileError(where, problem, carry=TaskContext.get() is not None)
    try:
        return pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as error:
        raise DamagedInputFileError(where, f"it is unreadable ({error})", carry=TaskContext.get() is not None) \
            from None


class DataFrameSource(IndexRangeSource):
    """The rows of ``df``, in batches of at most ``max_records_per_batch`` rows, then the end.

    Its position is the index of the next file to read (``{"next": n}``), its end the number
    of files; a batch is a range of files, so its count is known as it is planned.
    """

    bounded = True

    def __init__(self, df: DataFrame, max_records_per_batch: int | None = None) -> None:
        if max_records_per_batch is not None and max_records_per_batch <= 0:
            raise ConfigurationError(f"max_records_per_batch must be positive; got {max_records_per_batch}")
        self.df = df
        self.max_records_per_batch = max_records_per_batch
        self.name = "dataframe"
        self._storage: CheckpointStorage | None = None
        self._folder = ""
        self._manifest = ""
        self._written: list[dict[str, Any]] | None = None

    def schema(self) -> StructType:
        return self.df.schema

    def attach(self, run: SourceRun) -> None:
        if run.storage is None:
            raise ConfigurationError(
                f"input {run.name!r} reads a DataFrame, which it keeps as files at the checkpoint location so "
                "that a restart gives each batch the same rows; create the StreamingContext with checkpoint=<path "
                "or URL>"
            )
        self.name = run.name
        self._storage = run.storage
        self._folder = f"{INPUTS_DIR}/{run.name.replace('/', '_')}"
        self._manifest = f"{self._folder}/manifest.json"
        self._written = None

    @property
    def _kept(self) -> CheckpointStorage:
        if self._storage is None:
            raise ConfigurationError(f"input {self.name!r} is not part of a running pipeline; start the "
                                     "StreamingContext that reads it")
        return self._storage

    @property
    def _files(self) -> list[dict[str, Any]]:
        """The files and their row counts; read from the manifest (a restart replays logged
        batches before ``open``), empty until the rows are written."""
        if self._written is None:
            manifest = self._kept.read_sealed_if_present(self._manifest)
            if manifest is not None:
                self._written = list(manifest["files"])
        return self._written or []

    def open(self) -> None:
        if self._files:
            return
        self._written = self._write_rows()
        self._kept.write_new(self._manifest, seal({"files": self._written}))
        logger.info("Input %s keeps its DataFrame's %d rows as %d files under %s", self.name,
                    sum(f["rows"] for f in self._files), len(self._files), self._kept.full_url(self._folder))

    def _write_rows(self) -> list[dict[str, Any]]:
        df, limit = self.df, self.max_records_per_batch
        if limit is not None:
            df = df.repartition(max(1, math.ceil(df.count() / limit)))
        storage, folder = self._kept, f"{self._folder}/{uuid.uuid4().hex[:12]}"

        def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            context = TaskContext.get()
            assert context is not None
            table = pa.Table.from_batches(list(batches))
            if table.num_rows:
                name = f"{folder}/part-{context.partitionId():05d}.parquet"
                buffer = io.BytesIO()
                pq.write_table(table, buffer)
                data = buffer.getvalue()
                storage.replace(name, data)
                yield pa.RecordBatch.from_pydict({"file": [name], "rows": [table.num_rows],
                                                  "sha256": [hashlib.sha256(data).hexdigest()]})

        written = df.mapInArrow(write, "file string, rows long, sha256 string").collect()
        return [{"file": row.file, "rows": row.rows, "sha256": row.sha256}
                for row in sorted(written, key=lambda r: r.file)]

    # ---------------------------------------------------------------- positions
    def initial_position(self) -> Position:
        return {"next": 0}

    def end_of_input(self) -> Position:
        return {"next": len(self._files)}

    def exhausted(self, position: Position, end_of_input: Position) -> bool:
        return int(position["next"]) >= len(self._files)

    def plan(self, start: Position, end_of_input: Position | None) -> SourceBatch:
        first = end = int(start["next"])
        rows, limit, files = 0, self.max_records_per_batch, self._files
        while end < len(files) and (end == first or limit is None or rows + files[end]["rows"] <= limit):
            rows += files[end]["rows"]
            end += 1
        return self._range(first, end)

    def _range(self, start: int, end: int, at: BatchTimes | None = None) -> SourceBatch:
        return SourceBatch({"next": start}, {"next": end}, ({"start": start, "end": end},) if end > start else (),
                           info={"start": start, "end": end},
                           records=sum(f["rows"] for f in self._files[start:end]))

    def _end_after_restart(self) -> Position | None:
        # The end is the manifest's length; before the rows are written, open() asks for it again.
        return self.end_of_input() if self._files else None

    # ---------------------------------------------------------------- reading
    def frame(self, spark: SparkSession, batch: SourceBatch) -> DataFrame:
        """The batch's files, read back by Spark tasks through the checkpoint's storage."""
        [split] = batch.splits
        storage, files = self._kept, self._files[int(split["start"]):int(split["end"])]

        def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    name = files[index]["file"]
                    where = storage.full_url(name)
                    try:
                        data = storage.read(name, large=True)
                    except FileNotFoundError:
                        raise DamagedInputFileError(where, "it is missing", carry=TaskContext.get() is not None) \
                            from None
                    yield from verified_rows(data, files[index].get("sha256"), where).to_batches()

        return spark.range(0, len(files), 1, len(files)).mapInArrow(read, self.df.schema)

    def read(self, split: Split) -> Iterable[Any]:
        raise SourceError(f"the rows of {self.name} are read back by Spark (frame()), never split by split; this "
                          "is a bug in batchline")
