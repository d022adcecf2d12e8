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
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import fsspec
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from batchline.batch_time import format_batch_time
from batchline.checkpoint import migrations
from batchline.checkpoint.storage import RawJson
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError, SourceError
from batchline.sources import parsing
from batchline.sources.seen_files import DEFAULT_MAX_FILE_AGE, SeenFiles, mtime_ms
from batchline.sources.source import BatchTimes, Position, Source, SourceBatch, SourceRun, Split
from batchline.state.schema import SCHEMA_FORMS, as_struct

__all__ = ["FileSource", "FORMATS"]

logger = logging.getLogger(__name__)

FORMATS = ("json", "csv", "parquet", "text")
_TEMPORARY_SUFFIXES = (".tmp", ".temp", "._copying_", ".crc", ".part", ".inprogress", ".swp", ".partial")


def _is_visible(name: str) -> bool:
    base = name.rstrip("/").rsplit("/", 1)[-1]
    return not base.startswith((".", "_")) and not base.lower().endswith(_TEMPORARY_SUFFIXES)


class FileSource(Source):
    """New files under ``path``, read once each; bad lines go to the input's ``dead_letters``.

    ``bounded``: only the files present when the pipeline first starts (settled or not; the
    list is kept in the checkpoint, so a restart reads the same set), then the input ends.

    ``max_file_age`` (default 7 days, as Structured Streaming's ``maxFileAge``): files last
    modified more than that before the newest file read are ignored, and their names
    forgotten, so the checkpoint holds the names of about that much input, not of every file
    ever read. A file that appears with a modification time older than that is not read and
    is named in a WARN line; raise ``max_file_age`` (it widens what is remembered from then
    on; files already forgotten stay forgotten, so none is read twice) or ``touch`` the file.
    Not used by a bounded source, which reads every file present at its start.

    Its position is what it has read: the files remembered by their watermark
    (``{"seen_files": ...}``), or for a bounded source how many files of its listing batches
    took (``{"taken": n}``, the listing being its end of input). A batch's splits are its
    files, which Spark reads and parses natively (``frame``).
    """

    def __init__(
        self,
        path: str,
        format: str,
        schema: StructType | str | type | None = None,
        header: bool = False,
        sep: str = ",",
        settle_s: float = 1.0,
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
            struct = StructType([StructField("value", StringType(), True)])
        elif schema is None:
            raise ConfigurationError(
                f"a {format} file stream needs a schema ({SCHEMA_FORMS}): batches must not change "
                "shape with the files that happen to arrive"
            )
        else:
            struct = as_struct(schema, f"the schema of file_stream({path!r})")
        self.path = path
        self.format = format
        self.row_schema: StructType = struct
        self.header = header
        self.sep = sep
        self.settle_s = settle_s
        self.storage_options = dict(storage_options or {})
        self.max_files_per_batch = max_files_per_batch
        self.bounded = bounded
        self.max_file_age_ms = parse_duration_ms(max_file_age, "max_file_age", allow_zero=True)
        self.name = f"files:{path}"
        """The input's name, for log lines (the pipeline's, once attached)."""
        self._fs, self._root = fsspec.core.url_to_fs(path, **self.storage_options)
        self._protocol = path.split("://", 1)[0] if "://" in path else "file"
        self._prefix = self._root.rstrip("/") + "/"
        self._known_old: set[str] | None = None
        """Names last listed as modified before the horizon (None before this run's first
        listing): one that is not among them turned up late, and is named in a WARN line."""
        self._seen: tuple[object, SeenFiles] | None = None
        """The files remembered at the position last planned, decoded: the position's
        ``seen_files`` object and its ``SeenFiles`` (the next plan starts there)."""
        self._listing: tuple[object, dict[str, int], bytes] | None = None
        """A bounded source's listing, indexed and encoded once: the list, each name's index,
        its JSON (a checkpoint costs a copy of the listing, not an encoding)."""
        self._parser: parsing.LineParser | None = None

    def schema(self) -> StructType:
        return self.row_schema

    @property
    def reads_fields_by_name(self) -> bool:  # type: ignore[override]
        """JSON lines name their fields, and a CSV file with a header; a CSV file without one
        gives its columns by position, parquet's columns are applied to its own, and text has one."""
        return self.format == "json" or (self.format == "csv" and self.header)

    def record_fields(self, batch: SourceBatch) -> list[str] | None:
        """The keys of the first line of the batch's first file (a CSV file's header); one short
        read on the driver, only when a column was null in every row."""
        if not batch.splits or (self.format == "csv" and not self.header):
            return None
        with self._fs.open(batch.splits[0]["file"], "rb") as handle:
            first = handle.readline(_FIRST_LINE_LIMIT).decode("utf-8", errors="replace").strip()
        if self.format == "csv":
            return [name.strip().strip('"') for name in first.split(self.sep)] or None
        record = json.loads(first)
        return [str(key) for key in record] if isinstance(record, dict) else None

    def attach(self, run: SourceRun) -> None:
        self.name = run.name

    def _key(self, name: str) -> str:
        """How a file is remembered: its base name when it lies directly under the path (as
        every listed file does), which keeps the checkpoint small; else its whole name."""
        base = name[len(self._prefix):] if name.startswith(self._prefix) else ""
        return base if base and "/" not in base else name

    # ---------------------------------------------------------------- positions
    def initial_position(self) -> Position:
        return {"taken": 0} if self.bounded else {"seen_files": SeenFiles(self.max_file_age_ms).to_json()}

    def end_of_input(self) -> Position:
        listing = sorted(name for name, _ in self._list(settled_before=None))
        logger.info("Bounded input %s reads the %d files present at start under %s", self.name, len(listing),
                    self.path)
        self._index(listing)
        return {"listing": listing}

    def exhausted(self, position: Position, end_of_input: Position) -> bool:
        return int(position["taken"]) >= len(end_of_input["listing"])

    def _seen_at(self, position: Position) -> SeenFiles:
        """The files remembered at ``position``: decoded once, then carried from plan to plan."""
        payload = position["seen_files"]
        cached, self._seen = self._seen, None  # taken: the caller moves it on
        if cached is not None and cached[0] is payload:
            return cached[1]
        return SeenFiles.from_json(payload, self.max_file_age_ms)

    def _remembered(self, seen: SeenFiles) -> Position:
        payload = seen.to_json()
        self._seen = (payload, seen)
        return {"seen_files": payload}

    def _index(self, listing: list[str]) -> tuple[dict[str, int], bytes]:
        if self._listing is None or self._listing[0] is not listing:
            self._listing = (listing, {name: index for index, name in enumerate(listing)},
                             json.dumps(listing).encode())
        return self._listing[1], self._listing[2]

    # ---------------------------------------------------------------- planning
    def plan_at(self, start: Position, end_of_input: Position | None, at: BatchTimes) -> SourceBatch:
        if end_of_input is not None:
            taken = int(start["taken"])
            files = list(end_of_input["listing"][taken:])[: self.max_files_per_batch]
            if files:
                logger.debug("Batch %s takes %d new files from %s", format_batch_time(at.batch_time_ms), len(files),
                            self.path)
            return self._batch(start, {"taken": taken + len(files)}, files, None)
        seen = self._seen_at(start)
        new = self._new_files(seen)[: self.max_files_per_batch]
        if new:
            logger.debug("Batch %s takes %d new files from %s", format_batch_time(at.batch_time_ms), len(new),
                        self.path)
        new.sort()  # read in name order
        files, mtimes = [name for name, _ in new], [modified for _, modified in new]
        return self._batch(start, self._after(seen, files, mtimes), files, mtimes)

    def _batch(self, start: Position, end: Position, files: list[str], mtimes: list[int] | None) -> SourceBatch:
        splits: tuple[dict[str, Any], ...]
        if mtimes is None:
            splits = tuple({"file": name} for name in files)
        else:
            splits = tuple({"file": name, "mtime": modified} for name, modified in zip(files, mtimes, strict=True))
        return SourceBatch(start, end, splits, info={"files": files})

    def _new_files(self, seen: SeenFiles) -> list[tuple[str, int]]:
        """(name, modification time in ms) of the files the next batch may take, oldest first."""
        new: list[tuple[int, str]] = []
        old: set[str] = set()
        for name, modified in self._list(settled_before=time.time() - self.settle_s):  # wall-clock file times
            key = self._key(name)
            if key in seen:
                continue
            if seen.too_old(modified):
                old.add(key)
            else:
                new.append((modified, name))
        self._note_too_old(old, seen)
        return [(name, modified) for modified, name in sorted(new)]

    def _note_too_old(self, old: set[str], seen: SeenFiles) -> None:
        """Name the files that turned up already older than the horizon: they are not read."""
        if self._known_old is None:
            if old:
                # Mostly files read long ago and forgotten; a restart cannot tell a late one among them.
                logger.info("Input %s: %d files under %s were last modified before %s (max_file_age=%s before the "
                            "newest file read) and are not read", self.name, len(old), self.path,
                            _when(seen.horizon_ms), _age(self.max_file_age_ms))
        else:
            for key in sorted(old - self._known_old):
                logger.warning(
                    "Input %s ignores file %s: it appeared last modified before %s, which is more than max_file_age="
                    "%s before the newest file read, so it may have been read and forgotten. To read such files, "
                    "raise max_file_age on file_stream(...), or touch the file to give it a new modification time",
                    self.name, self._prefix + key if "/" not in key else key, _when(seen.horizon_ms),
                    _age(self.max_file_age_ms))
        self._known_old = old

    def _after(self, seen: SeenFiles, files: list[str], mtimes: list[int]) -> Position:
        """The position past a batch's files (``seen`` moved on)."""
        for name, modified in zip(files, mtimes, strict=True):
            seen.add(self._key(name), modified)
        forgotten = seen.purge()
        if forgotten and self._known_old is not None:
            self._known_old.update(forgotten)  # read, then forgotten: not a late file
        return self._remembered(seen)

    def _list(self, settled_before: float | None) -> list[tuple[str, int]]:
        """Visible files under the path, with their modification times (ms); with ``settled_before``
        only those last modified at or before then (epoch seconds)."""
        try:
            entries = self._fs.ls(self._root, detail=True)
        except FileNotFoundError:
            entries = []
        except OSError as error:
            raise SourceError(f"cannot list {self.path}: {error}; check the path and its permissions") from error
        settled_ms = None if settled_before is None else settled_before * 1000
        listed = []
        for entry in entries:
            if entry.get("type") != "file" or not _is_visible(entry["name"]):
                continue
            modified = mtime_ms(entry)
            if settled_ms is None or modified <= settled_ms:
                listed.append((str(entry["name"]), modified))
        return sorted(listed)

    # ---------------------------------------------------------------- the checkpoint and the batch log
    def checkpoint_position(self, position: Position | None, end_of_input: Position | None) -> dict[str, Any]:
        # "v" tells this layout from the one before max_file_age (see checkpoint.migrations).
        version = migrations.FILE_SOURCE_POSITION_VERSION
        if self.bounded and end_of_input is not None:
            _, encoded = self._index(end_of_input["listing"])
            return {"v": version, "listing": RawJson(encoded), "taken": int(position["taken"]) if position else 0}
        if position is None or "seen_files" not in position:
            return {"v": version, "seen_files": SeenFiles(self.max_file_age_ms).to_json()}
        return {"v": version, "seen_files": position["seen_files"]}

    def restore_position(self, record: Mapping[str, Any]) -> tuple[Position | None, Position | None]:
        self._known_old = None
        older = migrations.file_source_position_version(record, self.name) < migrations.FILE_SOURCE_POSITION_VERSION
        record = migrations.upgrade_file_source_position(
            record, bounded=self.bounded, max_file_age_ms=self.max_file_age_ms,
            listed=lambda: self._list(settled_before=None), key=self._key, what=self.name)
        if self.bounded and "listing" in record:
            listing = sorted(record["listing"])
            self._index(listing)
            return {"taken": int(record["taken"])}, {"listing": listing}
        if self.bounded:  # written before its listing was made: the listing is made at open
            return {"taken": 0}, None
        if "seen_files" in record:
            # A converted record's horizon may lie below watermark - max_file_age on purpose (an
            # unread file older than that is still to be read): kept until the first batch.
            return self._remembered(SeenFiles.from_json(record["seen_files"], self.max_file_age_ms,
                                                        purge=not older)), None
        # A bounded source's position, read by this unbounded one: nothing remembered.
        return self._remembered(SeenFiles(self.max_file_age_ms)), None

    def log_batch(self, batch: SourceBatch) -> dict[str, Any]:
        record: dict[str, Any] = {"files": [split["file"] for split in batch.splits]}
        if not self.bounded and all("mtime" in split for split in batch.splits):
            record["mtimes"] = [split["mtime"] for split in batch.splits]
        return record

    def logged_batch(self, record: Mapping[str, Any], position: Position | None, at: BatchTimes) -> SourceBatch:
        files = list(record["files"])
        mtimes = record.get("mtimes")
        times = None if mtimes is None else [int(m) for m in mtimes]
        if position is None:
            return self._batch({}, {}, files, times)
        if "taken" in position:
            index = self._listing[1] if self._listing is not None else {}
            taken = max([int(position["taken"]), *(index[name] + 1 for name in files if name in index)])
            return self._batch(position, {"taken": taken}, files, times)
        seen = self._seen_at(position)
        # Times looked up now for a batch logged without them (see checkpoint.migrations); its
        # files stay as logged, so the allocation reads back as it was.
        mtimes = migrations.file_source_batch_mtimes(record, listed=lambda: self._list(settled_before=None),
                                                     fallback_ms=seen.watermark_ms)
        return self._batch(position, self._after(seen, files, mtimes), files, times)

    # ---------------------------------------------------------------- reading
    def frame(self, spark: SparkSession, batch: SourceBatch) -> DataFrame:
        """The batch's files read and parsed by Spark: the schema's columns, then the
        dead-letter columns (raw line, reason, file)."""
        urls = [self._url(split["file"]) for split in batch.splits]
        if self.format == "parquet":
            return spark.read.schema(self.row_schema).parquet(*urls).select(*self._line_parser().columns)
        return self._line_parser().parse(spark.read.text(urls))

    def read(self, split: Split) -> Iterable[Any]:
        raise SourceError(f"the files of {self.name} are read by Spark (frame()), never split by split; this is a "
                          "bug in batchline")

    def _url(self, name: str) -> str:
        return name if self._protocol == "file" else f"{self._protocol}://{name}"

    def _line_parser(self) -> parsing.LineParser:
        """The source's parsing expressions, built on first use and reused by every batch."""
        if self._parser is None:
            if self.format == "parquet":
                self._parser = parsing.parquet_parser(self.row_schema)
            elif self.format == "json":
                self._parser = parsing.json_parser(self.row_schema)
            elif self.format == "csv":
                self._parser = parsing.csv_parser(self.row_schema, self.sep, self.header)
            else:
                self._parser = parsing.text_parser()
        return self._parser


_FIRST_LINE_LIMIT = 64 * 1024
"""How much of a file's first line names its fields for a warning: a long line is cut (and then
not parsed); enough for any record whose keys are worth listing."""


def _when(ms: int | None) -> str:
    return "(none yet)" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _age(ms: int) -> str:
    for unit, size in (("days", 86_400_000), ("hours", 3_600_000), ("minutes", 60_000)):
        if ms and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms / 1000:g} s"
