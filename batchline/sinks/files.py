"""Batches as files that a plain directory reader can trust (SPEC C2).

Spark's own file writer leaves ``_SUCCESS`` markers, ``.crc`` files and zero-byte part
files, and its part files appear one by one. Readers such as pyarrow, pandas and DuckDB
ignore names starting with ``_`` or ``.``, so each batch is written under a hidden staging
directory and then moved into place whole.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import fsspec
from pyspark.sql import DataFrame

from batchline.batch_time import BatchTime
from batchline.errors import ConfigurationError, SinkError

__all__ = ["FileSink", "FILE_SINK_FORMATS"]

logger = logging.getLogger(__name__)

FILE_SINK_FORMATS = ("parquet", "json")
STAGING_DIR = "_staging"


class FileSink:
    """Writes batch ``t`` to ``<path>/batch_time=<t>/`` (a Hive-style partition readers understand)."""

    def __init__(self, path: str, format: str = "parquet", options: dict[str, Any] | None = None) -> None:
        if format not in FILE_SINK_FORMATS:
            raise ConfigurationError(
                f"file output format {format!r} is not supported; use one of {', '.join(FILE_SINK_FORMATS)}"
            )
        self.format = format
        self.options = dict(options or {})
        if "://" not in path:
            path = os.path.abspath(path)
        self.path = path.rstrip("/")
        self._fs, self._root = fsspec.core.url_to_fs(self.path)

    def write(self, df: DataFrame, batch_time: BatchTime) -> None:
        """Commit one batch.

        Step 1: a batch already in place was committed before; leave it.
        Step 2: write the batch with Spark into a fresh staging directory.
        Step 3: drop Spark's markers, checksums and files that hold no rows.
        Step 4: move the staging directory into place in one rename (nothing left: nothing to move).
        """
        target = f"{self._root}/batch_time={int(batch_time)}"
        # Step 1
        if self._fs.exists(target):
            logger.info("Batch %s is already in %s; not writing it again", batch_time, target)
            return
        # Step 2
        staging_name = f"{STAGING_DIR}/{int(batch_time)}-{uuid.uuid4().hex}"
        staging = f"{self._root}/{staging_name}"
        try:
            df.write.format(self.format).options(**self.options).mode("errorifexists").save(
                f"{self.path}/{staging_name}"
            )
        except Exception as error:
            self._remove(staging)
            raise SinkError(f"writing batch {batch_time} to {self.path} failed: {error}") from error
        # Step 3
        kept = self._keep_only_rows(staging)
        # Step 4
        if kept:
            self._fs.mv(staging, target, recursive=True)
            logger.debug("Committed batch %s to %s (%d files)", batch_time, target, kept)
        self._remove(staging)

    def _keep_only_rows(self, staging: str) -> int:
        kept = 0
        for name, info in self._fs.find(staging, detail=True).items():
            base = name.rsplit("/", 1)[-1]
            if base.startswith(("_", ".")) or not self._has_rows(name, info):
                self._fs.rm(name)
            else:
                kept += 1
        return kept

    def _has_rows(self, name: str, info: dict[str, Any]) -> bool:
        if not info.get("size"):
            return False
        if self.format == "parquet":
            import pyarrow.parquet as pq

            with self._fs.open(name, "rb") as handle:
                return pq.ParquetFile(handle).metadata.num_rows > 0
        return True

    def _remove(self, path: str) -> None:
        if self._fs.exists(path):
            self._fs.rm(path, recursive=True)
