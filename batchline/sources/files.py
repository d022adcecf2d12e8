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
from typing import Any

import fsspec
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from batchline.batch_time import format_batch_time
from batchline.checkpoint.storage import RawJson
from batchline.errors import ConfigurationError, SourceError
from batchline.scheduler.job import Job, JobKind
from batchline.sources import parsing
from batchline.sources.dead_letters import CountedBatch, DeadLetterNode, DeadLetterReader
from batchline.streams import InputNode, InputRuntime, Readers, RuntimeEnv, StreamRuntime

__all__ = ["FileSource", "FileReader", "FORMATS"]

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


class FileReader(InputRuntime, DeadLetterReader):
    """A file source's run: the names it has taken, each batch's files, their parsed rows."""

    node: FileSource

    def __init__(self, node: FileSource, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> None:
        super().__init__(node, env, parents)
        self._fs, self._root = fsspec.core.url_to_fs(node.path, **node.storage_options)
        self._protocol = node.path.split("://", 1)[0] if "://" in node.path else "file"
        self._seen: set[str] = set()
        self._seen_json = bytearray()  # the seen names, JSON-encoded as they arrive
        self._batch_files: dict[int, list[str]] = {}
        self._parsed: dict[int, CountedBatch] = {}
        self._parser: parsing.LineParser | None = None
        self._counting: tuple[Column, list[Column], list[Column]] | None = None
        """The ok flag, the counting metrics and the schema's columns, built once."""
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
        if self.node.format == "parquet":
            return reader.schema(self.node.schema).parquet(*urls).select(*self._line_parser().columns)
        return self._line_parser().parse(reader.text(urls))

    def _line_parser(self) -> parsing.LineParser:
        """The source's parsing expressions, built on first use and reused by every batch."""
        if self._parser is None:
            node = self.node
            if node.format == "parquet":
                self._parser = parsing.parquet_parser(node.schema)
            elif node.format == "json":
                self._parser = parsing.json_parser(node.schema)
            elif node.format == "csv":
                self._parser = parsing.csv_parser(node.schema, node.sep, node.header)
            else:
                self._parser = parsing.text_parser()
        return self._parser

    def parsed(self, batch_time: int) -> DataFrame | None:
        """Every parsed line of the batch with its ok flag (None for a batch with no files)."""
        self.get_or_compute(batch_time)
        batch = self._parsed.get(batch_time)
        return None if batch is None else batch.frame

    def compute(self, batch_time: int) -> DataFrame:
        """The batch's good rows. Its lines are counted, good and bad, by the first job that
        reads them all (``observe``), so no job of its own reads the files just to count."""
        files = self._batch_files.get(batch_time, [])
        if not files:
            return self.env.empty_frame(self.node.schema)
        if self._counting is None:
            ok = F.col(parsing.OK)
            metrics = [F.count(F.when(ok, 1)).alias("records"), F.count(F.when(~ok, 1)).alias("dead_letters")]
            self._counting = (ok, metrics, [F.col(name) for name in self.node.schema.fieldNames()])
        ok, metrics, fields = self._counting
        counts = Observation()
        parsed = self._read(files).observe(counts, *metrics)
        if self._cache_lines:
            parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
        self._parsed[batch_time] = CountedBatch(parsed, counts)
        return parsed.where(ok).select(*fields)

    @property
    def _readers(self) -> Readers:
        return self.env.readers.get(self.node.node_id, Readers(0, False))

    @property
    def _cache_lines(self) -> bool:
        # Read once: cached only when several jobs read the lines, or later batches do (windows).
        return self._readers.jobs > 1 or self.remember_ms > self.node.slide_ms

    def release(self, batch_time: int, df: DataFrame) -> None:
        parsed = self._parsed.pop(batch_time, None)
        if parsed is not None and self._cache_lines:
            parsed.frame.unpersist()

    def prepare_job(self, batch_time: int) -> Job | None:
        """A job that reads and counts the batch's lines only when the first job that reads
        them would not read them all (a ``console`` output)."""
        files = self._batch_files.get(batch_time)
        if not files or self._readers.first_reads_all:
            return None
        batch = self._parsed_batch(batch_time)

        def read_and_count() -> None:
            batch.frame.count()  # the observation counts; after_jobs reports

        return Job(batch_time, self.name, read_and_count, JobKind.READ)

    def after_jobs(self, batch_time: int) -> None:
        """Report the batch's good and bad lines as the job that read them counted them (once,
        however many jobs read them, and whichever attempt of a task or of the batch did), and
        say where the bad ones went."""
        files = self._batch_files.get(batch_time)
        if not files:
            return
        batch = self._parsed_batch(batch_time)
        if not batch.counted():
            batch.frame.count()  # no job read them all (every reader had finished): count now
        counts = batch.counts.get
        good, bad = int(counts["records"]), int(counts["dead_letters"])
        self.report(batch_time, good, dead_letters=bad, metadata={"files": files})
        if bad and self.node.dead_letters.node_id not in self.env.consumed:
            self._log_dead_letters(batch_time, bad)

    def _parsed_batch(self, batch_time: int) -> CountedBatch:
        self.get_or_compute(batch_time)
        return self._parsed[batch_time]

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
