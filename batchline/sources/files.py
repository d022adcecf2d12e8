"""New files in a directory or object-store prefix, read once each (SPEC B1, B6).

A file is taken once it is complete: not hidden (``.``/``_``), not a temporary name, and
last modified at least ``settle_s`` ago (a writer that pauses longer than that should write
under a hidden or temporary name and rename when done). Each batch's rows are parsed in Spark; bad lines become dead
letters with their reason and raw text.

What a running source remembers stays bounded however long it runs (SPEC E6): as Structured
Streaming's file source, it remembers the files it read by a watermark on their modification
time (the newest read) and the names of those modified within ``max_file_age`` of it
(``seen_files.SeenFiles``). Files are taken oldest first, so the watermark follows the
backlog. A file that turns up last modified before ``watermark - max_file_age`` (copied with
its old time kept, or held back longer than that) is **not read**: it is logged at WARN with
its name and the setting to change (raise ``max_file_age``, or ``touch`` the file to give it
a new time). A bounded source reads every file present at its first start, whatever its age.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import fsspec
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from batchline.batch_time import format_batch_time
from batchline.checkpoint.storage import RawJson
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError, SourceError
from batchline.scheduler.job import Job, JobKind
from batchline.sources import parsing
from batchline.sources.dead_letters import CountedBatch, DeadLetterNode, DeadLetterReader
from batchline.sources.seen_files import DEFAULT_MAX_FILE_AGE, SeenFiles, mtime_ms
from batchline.streams import InputNode, InputRuntime, Readers, RuntimeEnv, StreamRuntime

__all__ = ["FileSource", "FileReader", "FORMATS"]

logger = logging.getLogger(__name__)

FORMATS = ("json", "csv", "parquet", "text")
_TEMPORARY_SUFFIXES = (".tmp", ".temp", "._copying_", ".crc", ".part", ".inprogress", ".swp", ".partial")
_DEAD_LETTERS_LOGGED_PER_BATCH = 20


def _is_visible(name: str) -> bool:
    base = name.rstrip("/").rsplit("/", 1)[-1]
    return not base.startswith((".", "_")) and not base.lower().endswith(_TEMPORARY_SUFFIXES)


class FileSource(InputNode):
    """New files under ``path``, read once each; ``dead_letters`` is the stream of bad lines.

    ``bounded``: only the files present when the pipeline first starts (settled or not; the
    list is kept in the checkpoint, so a restart reads the same set), then the input ends.

    ``max_file_age`` (default 7 days, as Structured Streaming's ``maxFileAge``): files last
    modified more than that before the newest file read are ignored, and their names
    forgotten, so the checkpoint holds the names of about that much input, not of every file
    ever read. A file that appears with a modification time older than that is not read and
    is named in a WARN line; raise ``max_file_age`` (it widens what is remembered from then
    on; files already forgotten stay forgotten, so none is read twice) or ``touch`` the file.
    Not used by a bounded source, which reads every file present at its start.
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
        max_file_age: object = DEFAULT_MAX_FILE_AGE,
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
        self.max_file_age_ms = parse_duration_ms(max_file_age, "max_file_age", allow_zero=True)
        self.dead_letters = DeadLetterNode(self)

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> FileReader:
        return FileReader(self, env, parents)


class FileReader(InputRuntime, DeadLetterReader):
    """A file source's run: the files it has taken, each batch's files, their parsed rows."""

    node: FileSource

    def __init__(self, node: FileSource, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> None:
        super().__init__(node, env, parents)
        self._fs, self._root = fsspec.core.url_to_fs(node.path, **node.storage_options)
        self._protocol = node.path.split("://", 1)[0] if "://" in node.path else "file"
        self._prefix = self._root.rstrip("/") + "/"
        self._seen = SeenFiles(node.max_file_age_ms)
        """The files read (unbounded): a watermark and the names near it, by base name."""
        self._known_old: set[str] | None = None
        """Names last listed as modified before the horizon (None before this run's first
        listing): one that is not among them turned up late, and is named in a WARN line."""
        self._batch_files: dict[int, list[str]] = {}
        self._batch_mtimes: dict[int, list[int]] = {}
        self._parsed: dict[int, CountedBatch] = {}
        self._parser: parsing.LineParser | None = None
        self._counting: tuple[Column, list[Column], list[Column]] | None = None
        """The ok flag, the counting metrics and the schema's columns, built once."""
        self._listing: list[str] | None = None
        """A bounded source's files: those present at its first start, in name order."""
        self._listing_json = b"[]"
        self._listing_index: dict[str, int] = {}
        self._taken = 0
        """How many of the listing's files batches have taken: always its first ones."""

    def open(self) -> None:
        if self.node.bounded and self._listing is None:
            self._set_listing([name for name, _ in self._list(settled_before=None)])
            logger.info("Bounded input %s reads the %d files present at start under %s", self.name,
                        len(self._listing or ()), self.node.path)

    def _set_listing(self, names: list[str]) -> None:
        self._listing = sorted(names)
        self._listing_json = json.dumps(self._listing).encode()
        self._listing_index = {name: index for index, name in enumerate(self._listing)}

    def _key(self, name: str) -> str:
        """How a file is remembered: its base name when it lies directly under the path (as
        every listed file does), which keeps the checkpoint small; else its whole name."""
        base = name[len(self._prefix):] if name.startswith(self._prefix) else ""
        return base if base and "/" not in base else name

    # ---------------------------------------------------------------- allocation
    def list_new_files(self) -> list[str]:
        """Complete files not taken yet, oldest first (a bounded source's in name order, from its listing)."""
        return [name for name, _ in self._new_files()]

    def _new_files(self) -> list[tuple[str, int]]:
        """(name, modification time in ms) of the files the next batch may take, in the order it takes them."""
        if self._listing is not None:
            return [(name, 0) for name in self._listing[self._taken:]]
        new: list[tuple[int, str]] = []
        old: set[str] = set()
        for name, modified in self._list(settled_before=time.time() - self.node.settle_s):  # wall-clock file times
            key = self._key(name)
            if key in self._seen:
                continue
            if self._seen.too_old(modified):
                old.add(key)
            else:
                new.append((modified, name))
        self._note_too_old(old)
        return [(name, modified) for modified, name in sorted(new)]

    def _note_too_old(self, old: set[str]) -> None:
        """Name the files that turned up already older than the horizon: they are not read."""
        if self._known_old is None:
            if old:
                # Mostly files read long ago and forgotten; a restart cannot tell a late one among them.
                logger.info("Input %s: %d files under %s were last modified before %s (max_file_age=%s before the "
                            "newest file read) and are not read", self.name, len(old), self.node.path,
                            _when(self._seen.horizon_ms), _age(self.node.max_file_age_ms))
        else:
            for key in sorted(old - self._known_old):
                logger.warning(
                    "Input %s ignores file %s: it appeared last modified before %s, which is more than max_file_age="
                    "%s before the newest file read, so it may have been read and forgotten. To read such files, "
                    "raise max_file_age on file_stream(...), or touch the file to give it a new modification time",
                    self.name, self._prefix + key if "/" not in key else key, _when(self._seen.horizon_ms),
                    _age(self.node.max_file_age_ms))
        self._known_old = old

    def exhausted(self) -> bool:
        return self._listing is not None and self._taken >= len(self._listing)

    def _list(self, settled_before: float | None) -> list[tuple[str, int]]:
        """Visible files under the path, with their modification times (ms); with ``settled_before``
        only those last modified at or before then (epoch seconds)."""
        try:
            entries = self._fs.ls(self._root, detail=True)
        except FileNotFoundError:
            entries = []
        except OSError as error:
            raise SourceError(f"cannot list {self.node.path}: {error}; check the path and its permissions") from error
        settled_ms = None if settled_before is None else settled_before * 1000
        listed = []
        for entry in entries:
            if entry.get("type") != "file" or not _is_visible(entry["name"]):
                continue
            modified = mtime_ms(entry)
            if settled_ms is None or modified <= settled_ms:
                listed.append((str(entry["name"]), modified))
        return sorted(listed)

    def allocate(self, batch_time: int) -> None:
        taken = self._new_files()[: self.node.max_files_per_batch]
        if taken:
            logger.info("Batch %s takes %d new files from %s", format_batch_time(batch_time), len(taken),
                        self.node.path)
        taken.sort()  # read in name order
        allocation: dict[str, Any] = {"files": [name for name, _ in taken]}
        if self._listing is None:
            allocation["mtimes"] = [modified for _, modified in taken]
        self.restore_allocation(batch_time, allocation, advance=True)

    def allocation(self, batch_time: int) -> dict[str, Any]:
        allocation: dict[str, Any] = {"files": self._batch_files[batch_time]}
        if batch_time in self._batch_mtimes:
            allocation["mtimes"] = self._batch_mtimes[batch_time]
        return allocation

    def restore_allocation(self, batch_time: int, allocation: dict[str, Any], advance: bool) -> None:
        files = list(allocation["files"])
        self._batch_files[batch_time] = files
        mtimes = allocation.get("mtimes")
        if mtimes is not None:
            self._batch_mtimes[batch_time] = [int(m) for m in mtimes]
        if advance:
            self._advance(files, self._batch_mtimes.get(batch_time))
        self.report(batch_time, None if files else 0, metadata={"files": files})

    def _advance(self, files: list[str], mtimes: list[int] | None) -> None:
        """Move the position past a batch's files."""
        if self._listing is not None:
            taken = [self._listing_index[name] for name in files if name in self._listing_index]
            self._taken = max([self._taken, *(index + 1 for index in taken)])
            return
        if mtimes is None:  # logged by a release before max_file_age: look the times up
            mtimes = self._times_now(files)
        for name, modified in zip(files, mtimes, strict=True):
            self._seen.add(self._key(name), modified)
        forgotten = self._seen.purge()
        if forgotten and self._known_old is not None:
            self._known_old.update(forgotten)  # read, then forgotten: not a late file

    def _times_now(self, files: list[str]) -> list[int]:
        """The files' modification times as listed now; a file gone from the path gets the
        newest time read so far (it cannot be listed, so it is never read again anyway)."""
        listed = dict(self._list(settled_before=None))
        fallback = self._seen.watermark_ms or 0
        return [listed.get(name, fallback) for name in files]

    def snapshot(self) -> dict[str, Any]:
        if self._listing is not None:
            # Kept encoded: a checkpoint costs a copy of the listing, not an encoding.
            return {"listing": RawJson(self._listing_json), "taken": self._taken}
        return {"seen_files": self._seen.to_json()}

    def restore(self, snapshot: dict[str, Any]) -> None:
        if self.node.bounded and "listing" in snapshot:
            self._set_listing(list(snapshot["listing"]))
            self._taken = int(snapshot["taken"]) if "taken" in snapshot else self._legacy_taken(snapshot)
        elif "seen_files" in snapshot:
            self._seen = SeenFiles.from_json(snapshot["seen_files"], self.node.max_file_age_ms)
        else:
            self._restore_legacy(list(snapshot.get("seen", ())))
        self._known_old = None

    def _legacy_taken(self, snapshot: dict[str, Any]) -> int:
        """A bounded source's position in a checkpoint of a release before max_file_age: the
        names it had read, always the first ones of its listing."""
        seen = set(snapshot.get("seen", ()))
        listing = self._listing or []
        return next((index for index, name in enumerate(listing) if name not in seen), len(listing))

    def _restore_legacy(self, seen: list[str]) -> None:
        """Convert a checkpoint of a release before max_file_age, which names every file ever
        read, without reading any file twice or skipping one that release would have read: the
        watermark is the newest time among the named files still present, and the horizon is
        ``watermark - max_file_age``, or earlier when an unread file is older than that."""
        listed = self._list(settled_before=None)
        read = {self._key(name) for name in seen}
        restored = SeenFiles(self.node.max_file_age_ms)
        unread_times = []
        for name, modified in listed:
            if self._key(name) in read:
                restored.add(self._key(name), modified)
            else:
                unread_times.append(modified)
        if restored.watermark_ms is not None:
            restored.start_at(min([restored.watermark_ms - self.node.max_file_age_ms, *unread_times]))
        self._seen = restored
        logger.info("Input %s: converted the checkpoint's %d names of files read to a watermark at %s with the %d "
                    "files modified within max_file_age=%s of it (names no longer under %s are dropped: they "
                    "cannot be listed, so they are not read again)", self.name, len(seen),
                    _when(restored.watermark_ms), len(restored), _age(self.node.max_file_age_ms), self.node.path)

    def forget_before(self, threshold_time: int) -> None:
        for batch_time in [t for t in self._batch_files if t <= threshold_time]:
            del self._batch_files[batch_time]
            self._batch_mtimes.pop(batch_time, None)

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


def _when(ms: int | None) -> str:
    return "(none yet)" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _age(ms: int) -> str:
    for unit, size in (("days", 86_400_000), ("hours", 3_600_000), ("minutes", 60_000)):
        if ms and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms / 1000:g} s"
