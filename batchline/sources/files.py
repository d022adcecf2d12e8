"""New files in a directory or object-store prefix, read once each (SPEC B1, B6).

A file is taken once it is complete: not hidden (``.``/``_``), not a temporary name, and
last modified at least ``settle_s`` ago (a writer that pauses longer than that should write
under a hidden or temporary name and rename when done). Each batch's rows are parsed in Spark; bad lines become dead
letters with their reason and raw text.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any, cast

import fsspec
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from batchline.batch_time import format_batch_time
from batchline.checkpoint.storage import RawJson
from batchline.errors import ConfigurationError, SourceError
from batchline.scheduler.job import Job
from batchline.sources import parsing
from batchline.streams import InputNode, InputRuntime, RuntimeEnv, StreamNode, StreamRuntime

__all__ = ["FileSource", "FileReader", "DeadLetterNode", "FORMATS"]

logger = logging.getLogger(__name__)

FORMATS = ("json", "csv", "parquet", "text")
_TEMPORARY_SUFFIXES = (".tmp", ".temp", "._copying_", ".crc", ".part", ".inprogress", ".swp", ".partial")
_DEAD_LETTERS_LOGGED_PER_BATCH = 20


def _mtime(info: dict[str, Any]) -> float:
    for key in ("mtime", "LastModified", "last_modified", "modified", "created"):
        value = info.get(key)
        if value is not None:
            return value.timestamp() if hasattr(value, "timestamp") else float(value)
    return 0.0


def _is_visible(name: str) -> bool:
    base = name.rstrip("/").rsplit("/", 1)[-1]
    return not base.startswith((".", "_")) and not base.lower().endswith(_TEMPORARY_SUFFIXES)


class FileSource(InputNode):
    """New files under ``path``, read once each; ``dead_letters`` is the stream of bad lines.

    ``bounded``: only the files present when the pipeline first starts (settled or not; the
    list is kept in the checkpoint, so a restart reads the same set), then the input ends.
    """

    replayable = True

    def __init__(
        self,
        batch_interval_ms: int,
        path: str,
        format: str,
        schema: StructType | None = None,
        header: bool = False,
        sep: str = ",",
        settle_s: float = 1.0,
        name: str | None = None,
        storage_options: dict[str, Any] | None = None,
        max_files_per_batch: int | None = None,
        bounded: bool = False,
    ) -> None:
        if max_files_per_batch is not None and max_files_per_batch <= 0:
            raise ConfigurationError(f"max_files_per_batch must be positive; got {max_files_per_batch}")
        if format not in FORMATS:
            raise ConfigurationError(f"file format {format!r} is not supported; use one of {', '.join(FORMATS)}")
        if format == "text":
            schema = StructType([StructField("value", StringType(), True)])
        elif schema is None:
            raise ConfigurationError(
                f"a {format} file stream needs a schema (a StructType): batches must not change "
                "shape with the files that happen to arrive"
            )
        super().__init__(name or f"files:{path}", batch_interval_ms, bounded)
        self.path = path
        self.format = format
        self.schema: StructType = schema
        self.header = header
        self.sep = sep
        self.settle_s = settle_s
        self.storage_options = dict(storage_options or {})
        self.max_files_per_batch = max_files_per_batch
        self.dead_letters = DeadLetterNode(self)

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> FileReader:
        return FileReader(self, env, parents)


class FileReader(InputRuntime):
    """A file source's run: the names it has taken, each batch's files, their parsed rows."""

    node: FileSource

    def __init__(self, node: FileSource, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> None:
        super().__init__(node, env, parents)
        self._fs, self._root = fsspec.core.url_to_fs(node.path, **node.storage_options)
        self._protocol = node.path.split("://", 1)[0] if "://" in node.path else "file"
        self._seen: set[str] = set()
        self._seen_json = bytearray()  # the seen names, JSON-encoded as they arrive
        self._batch_files: dict[int, list[str]] = {}
        self._parsed: dict[int, DataFrame] = {}
        self._listing: list[str] | None = None
        """A bounded source's files: those present at its first start, in name order."""
        self._listing_json = b"[]"

    def open(self) -> None:
        if self.node.bounded and self._listing is None:
            self._set_listing(self._list(settled_before=None))
            logger.info("Bounded input %s reads the %d files present at start under %s", self.name,
                        len(self._listing or ()), self.node.path)

    def _set_listing(self, names: list[str]) -> None:
        self._listing = sorted(names)
        self._listing_json = json.dumps(self._listing).encode()

    # ---------------------------------------------------------------- allocation
    def list_new_files(self) -> list[str]:
        """Complete files not taken yet, in name order (a bounded source's from its listing)."""
        if self._listing is not None:
            return [name for name in self._listing if name not in self._seen]
        return self._list(settled_before=time.time() - self.node.settle_s)  # file times are wall-clock times

    def exhausted(self) -> bool:
        return self._listing is not None and not self.list_new_files()

    def _list(self, settled_before: float | None) -> list[str]:
        try:
            entries = self._fs.ls(self._root, detail=True)
        except FileNotFoundError:
            entries = []
        except OSError as error:
            raise SourceError(f"cannot list {self.node.path}: {error}; check the path and its permissions") from error
        return sorted(
            e["name"]
            for e in entries
            if e.get("type") == "file"
            and _is_visible(e["name"])
            and e["name"] not in self._seen
            and (settled_before is None or _mtime(e) <= settled_before)
        )

    def allocate(self, batch_time: int) -> None:
        files = self.list_new_files()[: self.node.max_files_per_batch]
        if files:
            logger.info("Batch %s takes %d new files from %s", format_batch_time(batch_time), len(files),
                        self.node.path)
        self.restore_allocation(batch_time, {"files": files}, advance=True)

    def allocation(self, batch_time: int) -> dict[str, Any]:
        return {"files": self._batch_files[batch_time]}

    def restore_allocation(self, batch_time: int, allocation: dict[str, Any], advance: bool) -> None:
        files = list(allocation["files"])
        self._batch_files[batch_time] = files
        if advance:
            self._remember_seen(files)
        self.report(batch_time, None if files else 0, metadata={"files": files})

    def _remember_seen(self, files: list[str]) -> None:
        for name in files:
            if name not in self._seen:
                self._seen.add(name)
                self._seen_json += (b"," if self._seen_json else b"") + json.dumps(name).encode()

    def snapshot(self) -> dict[str, Any]:
        # Kept encoded as it grows: a checkpoint costs a copy of it, not an encoding.
        snapshot: dict[str, Any] = {"seen": RawJson(b"[" + bytes(self._seen_json) + b"]")}
        if self._listing is not None:
            snapshot["listing"] = RawJson(self._listing_json)
        return snapshot

    def restore(self, snapshot: dict[str, Any]) -> None:
        self._seen, self._seen_json = set(), bytearray()
        self._remember_seen(list(snapshot["seen"]))
        if self.node.bounded and "listing" in snapshot:
            self._set_listing(list(snapshot["listing"]))

    def forget_before(self, threshold_time: int) -> None:
        for batch_time in [t for t in self._batch_files if t <= threshold_time]:
            del self._batch_files[batch_time]

    # ---------------------------------------------------------------- reading
    def _url(self, name: str) -> str:
        return name if self._protocol == "file" else f"{self._protocol}://{name}"

    def _read(self, files: list[str]) -> DataFrame:
        reader = self.env.spark.read
        urls = [self._url(f) for f in files]
        node = self.node
        if node.format == "parquet":
            frame = reader.schema(node.schema).parquet(*urls)
            return frame.select(
                *node.schema.fieldNames(),
                F.lit(True).alias(parsing.OK),
                F.lit(None).cast("string").alias(parsing.RAW),
                F.lit(None).cast("string").alias(parsing.REASON),
                F.col("_metadata.file_path").alias(parsing.SOURCE_FILE),
            )
        lines = reader.text(urls).select("value", F.col("_metadata.file_path").alias(parsing.SOURCE_FILE))
        if node.format == "json":
            return parsing.parse_json_lines(lines, node.schema)
        if node.format == "csv":
            return parsing.parse_csv_lines(lines, node.schema, node.sep, node.header)
        return lines.select(
            "value",
            F.lit(True).alias(parsing.OK),
            F.col("value").alias(parsing.RAW),
            F.lit(None).cast("string").alias(parsing.REASON),
            F.col(parsing.SOURCE_FILE),
        )

    def parsed(self, batch_time: int) -> DataFrame | None:
        """Every parsed line of the batch with its ok flag (None for a batch with no files)."""
        self.get_or_compute(batch_time)
        return self._parsed.get(batch_time)

    def compute(self, batch_time: int) -> DataFrame:
        files = self._batch_files.get(batch_time, [])
        if not files:
            return self.env.empty_frame(self.node.schema)
        parsed = self._read(files).persist(StorageLevel.MEMORY_AND_DISK)
        self._parsed[batch_time] = parsed
        return parsed.where(F.col(parsing.OK)).select(*self.node.schema.fieldNames())

    def release(self, batch_time: int, df: DataFrame) -> None:
        parsed = self._parsed.pop(batch_time, None)
        if parsed is not None:
            parsed.unpersist()

    def prepare_job(self, batch_time: int) -> Job | None:
        """Read the batch's files once into the cache, count good and bad lines, and say
        where the bad ones went."""
        files = self._batch_files.get(batch_time)
        if not files:
            return None
        parsed = self.parsed(batch_time)
        assert parsed is not None

        def read_and_count() -> None:
            counts = {row[0]: row[1] for row in parsed.groupBy(parsing.OK).count().collect()}
            good, bad = counts.get(True, 0), counts.get(False, 0)
            self.report(batch_time, good, dead_letters=bad, metadata={"files": files})
            if bad and self.node.dead_letters.node_id not in self.env.consumed:
                self._log_dead_letters(batch_time, bad)

        return Job(batch_time, f"read:{self.name}", read_and_count)

    def dead_letter_frame(self, batch_time: int) -> DataFrame:
        """The batch's bad records: ``raw_record``, ``reason``, ``source``, ``batch_time``."""
        parsed = self.parsed(batch_time)
        if parsed is None:
            return self.env.empty_frame(parsing.DEAD_LETTER_SCHEMA)
        return parsed.where(~F.col(parsing.OK)).select(
            F.col(parsing.RAW).alias("raw_record"),
            F.col(parsing.REASON).alias("reason"),
            F.col(parsing.SOURCE_FILE).alias("source"),
            F.lit(format_batch_time(batch_time)).alias("batch_time"),
        )

    def _log_dead_letters(self, batch_time: int, bad: int) -> None:
        rows = self.dead_letter_frame(batch_time).limit(_DEAD_LETTERS_LOGGED_PER_BATCH).collect()
        logger.warning(
            "Batch %s: %d bad records in %s went to the dead letters; attach an output to "
            "stream.dead_letters to keep them (first %d follow)",
            format_batch_time(batch_time), bad, self.node.path, len(rows),
        )
        for row in rows:
            logger.warning("Dead letter from %s: %s | raw: %s", row.source, row.reason, row.raw_record)


class DeadLetterNode(StreamNode):
    """The bad records of a file source: ``raw_record``, ``reason``, ``source``, ``batch_time``."""

    def __init__(self, source: FileSource) -> None:
        super().__init__([source])

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> StreamRuntime:
        return _DeadLetters(self, env, parents)


class _DeadLetters(StreamRuntime):
    def compute(self, batch_time: int) -> DataFrame:
        return cast(FileReader, self.parents[0]).dead_letter_frame(batch_time)
