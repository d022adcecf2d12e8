"""Batches as files that a plain directory reader can trust, on local disks and object stores (SPEC C2).

Spark's own file writer cannot reach ``s3://`` without Hadoop's S3 connector (pip's PySpark
has none), leaves ``_SUCCESS`` markers, ``.crc`` files and zero-byte part files, and its part
files appear one by one. So the sink writes the files itself, in three stages (on
``ExactlyOnceSink``: the tasks stage, the driver commits):

- Spark tasks write their partition's rows with pyarrow through fsspec to
  ``<own>/staging/<batch_time>/<attempt>/part-<partition>.<ext>`` (an empty partition
  writes nothing) and hand the driver each file's name and row count. ``<own>`` is the sink's
  own directory, a hidden sibling of the output: ``<parent>/.<name>.batchline`` for output
  ``<parent>/<name>`` (``own_location``).
- The driver writes a commit record, ``<own>/commits/<batch_time>.json``, naming the files.
  It is created exclusively (:meth:`CheckpointStorage.write_new`): from then on the batch is
  committed, and only this record's files are ever published for it.
- The files are published to ``<path>/batch_time=<batch_time>/``: on a local disk by one
  rename of the whole directory (a sibling is on the same file system), so readers see the
  batch whole; on an object store by a server-side copy per file, each of which appears
  whole. Then the staging is deleted. On an object store, what an earlier attempt of the batch
  may have left (its batch folder, staged files) is looked for while the tasks run, so that
  the commit waits for no listing: it deletes the staging by name, in one request.

Nothing of the sink's own is under the output, so no reader meets a staged file, not even
one that globs ``out/**/*.parquet`` (DuckDB) and does not skip ``_`` or ``.`` names; every
visible file is complete and committed. Records and staging that releases before 0.2 kept
under the output (``_batchline/commits``, ``_staging``) are still honoured, never written:
that layout is known to ``checkpoint.migrations`` only.

Writing a batch again (the engine re-runs a batch with the same data after a crash) looks
for the record first: with a record, what is missing is published from the staging and
nothing is computed or written anew; without one, nothing of the batch was published yet,
so it is written from scratch and leftovers of the crashed attempt are discarded. Each
batch ends up complete, exactly once.

Commit records stay bounded (SPEC E6): at a run's first commit and every ``COMPACT_EVERY``
commits after it, a thread of the sink's own folds all but the newest ``keep_commits``
records into ``<own>/commits/_compacted.json`` (``through_ms``: every batch up to then that
this output committed is committed and fully published) and deletes them. The engine re-runs
only batches without a commit marker, and never more at once than the batches in flight
(``concurrent_jobs`` plus ``max_batches_ahead``), so a batch older than the ``keep_commits``
newest commits is never re-run unfinished: a re-run of one (a restart from an older
checkpoint) is recognised as committed through the snapshot and writes nothing. Nothing a
write or a restart reads grows with the number of commits: records are found by name, the
snapshot is one small file. Records under the output written by releases before 0.2 are left
as they are.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from itertools import chain
from typing import Any

import fsspec
import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem
from pyspark.sql import DataFrame

from batchline.batch_time import BatchTime
from batchline.checkpoint import migrations
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, fsync_path, seal
from batchline.errors import ConfigurationError, SinkError
from batchline.sinks.exactly_once import ExactlyOnceSink, WriteAttempt
from batchline.sinks.sink import NO_FENCING_TOKEN, BatchContext

__all__ = ["FileSink", "FILE_SINK_FORMATS"]

logger = logging.getLogger(__name__)

FILE_SINK_FORMATS = ("parquet", "json")
STAGING_DIR = "staging"
COMMITS_DIR = "commits"
"""Both in the sink's own directory beside the output (``own_location``), never under it."""
COMPACTED_RECORD = f"{COMMITS_DIR}/_compacted.json"
"""The snapshot of the records compacted away (not a record: those are named by digits only)."""
DEFAULT_KEEP_COMMITS = 1000
COMPACT_EVERY = 100
"""Commits of a run between two compactions: a compaction lists the commit records once."""
PARQUET_COMPRESSIONS = ("snappy", "gzip", "zstd", "brotli", "lz4", "none")
# Test hook for the crash tests (one variable, read in _test_kill_point only): the commit
# SIGKILLs its own process at the named point, "before-record" or "after-record:<files published>".
TEST_KILL_VARIABLE = "BATCHLINE_TEST_KILL_AT"


class FileSink(ExactlyOnceSink[dict[str, Any]]):
    """Writes batch ``t`` to ``<path>/batch_time=<t>/`` (a Hive-style partition readers understand),
    on a local path or any fsspec URL (``storage_options`` for its file system)."""

    commit_after_jobs = False
    """A batch is committed and published by the time ``write`` returns (a ``foreach_batch``
    function that calls ``write`` relies on it)."""

    def __init__(self, path: str, format: str = "parquet", options: dict[str, Any] | None = None,
                 storage_options: dict[str, Any] | None = None, keep_commits: int = DEFAULT_KEEP_COMMITS) -> None:
        """``keep_commits``: how many of the newest commit records stay files of their own; the
        older ones are compacted. It must exceed the batches that can be in flight at once
        (``concurrent_jobs`` plus ``max_batches_ahead``), which is far below the default."""
        if keep_commits < 1:
            raise ConfigurationError(f"keep_commits must be at least 1; got {keep_commits}. Keep the default "
                                     f"({DEFAULT_KEEP_COMMITS}) unless more batches than that run at once")
        if format not in FILE_SINK_FORMATS:
            raise ConfigurationError(
                f"file output format {format!r} is not supported; use one of {', '.join(FILE_SINK_FORMATS)}"
            )
        self.format = format
        self.options = _checked_options(format, dict(options or {}))
        if "://" not in path:
            path = os.path.abspath(path)
        self.path = path.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self._storage = CheckpointStorage(self.path, self.storage_options)
        self._own = CheckpointStorage(own_location(self.path), self.storage_options)
        self.keep_commits = keep_commits
        self._compacted_through: int | None = None
        """Every batch up to this time that was committed is compacted (None: not read yet, or none)."""
        self._compacted_read = False
        self._commits_since_compaction = COMPACT_EVERY - 1
        """The first commit of a run compacts what earlier runs left; then every COMPACT_EVERY commits."""
        self._compaction: threading.Thread | None = None
        self.compaction_error: BaseException | None = None
        self._layout_1_records: bool | None = None
        """Whether the output holds records of layout 1 (None: not looked yet). Only releases
        before 0.2 wrote them, and none of them runs beside this one on the same output, so a
        run that finds none at its first look never needs to look for one again."""
        self._looks: dict[str, Future[_Left]] = {}
        """Per write attempt on an object store: what earlier attempts left, looked for while
        its tasks run (``prepare``); taken by its ``commit`` or ``abort``."""
        self._looking: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Threads do not pickle; a copy of the sink (a task's) never compacts nor looks ahead.
        state = dict(self.__dict__)
        state.update(_compaction=None, _looks={}, _looking=None)
        return state

    def last_commit(self) -> dict[str, Any]:
        """The newest batch committed to this output, for a finished pipeline's final
        checkpoint (SPEC G3); found among the commit records when this run committed none."""
        last = self.newest_commit
        if last is None:
            # Bounded: compaction leaves about keep_commits records.
            names = self._own.list_names(COMMITS_DIR) + self._storage.list_names(migrations.FILE_SINK_COMMITS_V1)
            last = max((int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit()), default=None)
        record = None
        if last is not None:
            under_output = (not self._own.has_file(_record_name(last))
                            and self._storage.has_file(migrations.file_sink_record_name_v1(last)))
            record = self._record_url(last, under_output)
        return {"path": self.path, "batch_time": last, "record": record}

    def write(self, df: DataFrame, batch: BatchContext | int) -> None:
        """Commit one batch (a ``BatchContext``, or its time in ms), exactly once across crashes
        and restarts, in the steps of ``ExactlyOnceSink.write``:

        Step 1: its commit record exists: publish what is missing (Steps 5, 6), compute nothing.
        Step 2: the tasks write their partitions' rows to a fresh staging directory.
        Step 3: no rows: nothing to commit; a batch directory without a record (written by an
                earlier release of this sink) is left as it is.
        Step 4: write the commit record naming the staged files, exclusively: the batch is committed.
        Step 5: publish the files to batch_time=<t>/: one rename on a local disk, else a copy per
                file that is not in place yet.
        Step 6: delete the batch's staging (with any leftovers of crashed attempts).
        """
        if not isinstance(batch, BatchContext):
            batch = BatchContext(BatchTime(int(batch)), f"files:{self.path}", "batchline", NO_FENCING_TOKEN)
        super().write(df, batch)

    # ---------------------------------------------------------------- the steps
    def is_committed(self, batch: BatchContext) -> bool:
        """Step 1. A batch's first attempt reads no record (``_first_attempt``): the only one
        there could be is one compacted away, of a batch time this output held before the
        pipeline's checkpoint knew it (a checkpoint restored from a backup), which the
        snapshot read once per run tells."""
        time_ms = int(batch.batch_time)
        if self._first_attempt(batch):
            through = self._read_compacted_through()
            if through is None or time_ms > through:
                return False
        record = self._read_record(time_ms)
        if record is None:
            return False
        if record.get("compacted"):
            logger.info("Batch %s was committed to %s before and its record compacted (%s): it is complete; "
                        "nothing is written again", batch.batch_time, self.path, self._own.full_url(COMPACTED_RECORD))
            self._drop_staging(time_ms)
            return True
        logger.info("Batch %s was committed to %s before; completing it without writing it again",
                    batch.batch_time, self.path)
        try:
            self._publish(time_ms, record, fresh=False)
            self._drop_staging(time_ms, under_output=bool(record.get("under_output")))
            self.note_committed(time_ms)
        except OSError as error:
            raise SinkError(
                f"completing batch {batch.batch_time} in {self.path} failed: {error}. Start the pipeline again to "
                "complete it; the batch is committed and is not written twice") from error
        return True

    def prepare(self, df: DataFrame, attempt: WriteAttempt) -> None:
        """Step 2, on an object store: look for what earlier attempts of the batch left while the
        tasks stage, in a thread (its answer does not change meanwhile: one driver writes an
        output). Without it the commit would look after them, one request after another."""
        if self._storage.is_local or self._first_attempt(attempt.batch):
            return  # a look costs no round trip there; a first attempt has nothing to look for
        if self._looking is None:
            self._looking = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batchline-file-sink-look")
        self._looks[attempt.id] = self._looking.submit(self._look_left, attempt.batch_time)

    def _first_attempt(self, batch: BatchContext) -> bool:
        """Whether the batch is one no writer tried before (``BatchContext.first_attempt``), on
        a store whose commit record is created exclusively: a batch another writer committed
        anyway is then found at the commit, and completed instead of written twice."""
        return batch.first_attempt and self._own.exclusive_creates

    def _look_left(self, time_ms: int) -> _Left:
        return _Left(self._storage.has_folder(_target(time_ms)), self._own.find_files(f"{STAGING_DIR}/{time_ms}"))

    def _left(self, attempt: WriteAttempt) -> _Left | None:
        """What ``prepare``'s look found, or None (a local output, or the look failed: the
        commit then looks itself). A first attempt finds nothing left."""
        if self._first_attempt(attempt.batch) and not self._storage.is_local:
            return _Left(batch_folder=False, staged=[])
        look = self._looks.pop(attempt.id, None)
        if look is None:
            return None
        try:
            return look.result()
        except Exception as error:  # noqa: BLE001 (only a head start)
            logger.debug("Looking ahead for what earlier attempts of batch %d left failed (%s); looking again",
                         attempt.batch_time, error)
            return None

    def write_partition(self, rows: Iterator[pa.RecordBatch], attempt: WriteAttempt,
                        partition: int) -> dict[str, Any]:
        """Step 2, in a task: the partition's rows to one staged file; its name, rows and bytes."""
        return _stage_file(rows, self._own.url, self.storage_options, _staged_dir(attempt),
                           f"part-{partition:05d}.{self.format}", self.format, self.options)

    def write_failed(self, error: Exception, attempt: WriteAttempt) -> Exception:
        return SinkError(
            f"writing batch {attempt.batch.batch_time} to {self.path} failed: {error}. Nothing of the batch is "
            "visible; fix the cause and start the pipeline again, which writes the batch anew")

    def abort(self, messages: list[dict[str, Any]], attempt: WriteAttempt) -> None:
        """Step 3 without rows, or a failed task: the batch's staging goes (listed here, so the
        look ahead is not waited for)."""
        look = self._looks.pop(attempt.id, None)
        if look is not None:
            look.cancel()
        self._drop_staging(attempt.batch_time)

    def commit(self, messages: list[dict[str, Any]], attempt: WriteAttempt) -> None:
        """Steps 3 to 6 of a batch whose tasks staged files."""
        time_ms = attempt.batch_time
        left = self._left(attempt)
        # Step 3
        if left.batch_folder if left is not None else self._storage.has_folder(_target(time_ms)):
            logger.warning("%s/%s exists without its commit record %s (written by an earlier release of batchline, "
                           "or the record was lost after a local publish put the batch there whole); leaving it as "
                           "it is", self.path, _target(time_ms), self._own.full_url(_record_name(time_ms)))
            self._drop_staging(time_ms)
            return
        # Step 4
        record = {"batch_time": time_ms, "format": self.format, "staging": _staged_dir(attempt),
                  "files": sorted(messages, key=lambda staged: staged["file"])}
        _test_kill_point("before-record")
        try:
            if self._own.is_local:  # the staged directory's own entry must outlive a power loss, too
                for parent in (f"{STAGING_DIR}/{time_ms}", STAGING_DIR):
                    fsync_path(self._own.path(parent))
            self._commit(time_ms, record, left)
        except OSError as error:
            raise SinkError(
                f"committing batch {attempt.batch.batch_time} to {self.path} failed: {error}. Start the pipeline "
                "again: it completes the batch if its commit record was written, else writes the batch anew"
            ) from error

    def _commit(self, time_ms: int, record: dict[str, Any], left: _Left | None) -> None:
        fresh = True
        try:
            self._own.write_new(_record_name(time_ms), seal(record))
        except FileExistsError:
            logger.warning("Batch %d was committed to %s by another writer meanwhile; completing its commit and "
                           "discarding this one", time_ms, self.path)
            self._own.delete(record["staging"], recursive=True)
            found = self._find_record(time_ms)
            if found is None:
                raise SinkError(
                    f"the commit record {self._own.full_url(_record_name(time_ms))} of batch {time_ms} "
                    "appeared while this driver committed the batch, then vanished. Make sure one driver runs "
                    "per output path, then start the pipeline again") from None
            record, fresh = found, False
        # Step 5
        self._publish(time_ms, record, fresh=fresh)
        # Step 6
        if fresh and left is not None:  # this attempt's files, and what earlier ones left
            self._own.delete_files([f"{record['staging']}/{entry['file']}" for entry in record["files"]] + left.staged)
        else:
            self._drop_staging(time_ms)
        self._commits_since_compaction += 1
        if self._commits_since_compaction >= COMPACT_EVERY:
            self.compact_in_background()

    # ---------------------------------------------------------------- compaction
    def compact_in_background(self) -> None:
        """Start a compaction on a thread of its own, unless one is running (batches do not wait)."""
        if self._compaction is not None and self._compaction.is_alive():
            return
        self._commits_since_compaction = 0
        self._compaction = threading.Thread(target=self._compact_logged, name="batchline-commit-compaction",
                                            daemon=True)
        self._compaction.start()

    def _compact_logged(self) -> None:
        try:
            self.compact()
            self.compaction_error = None
        except Exception as error:
            self.compaction_error = SinkError(
                f"compacting the commit records of {self.path} in {self._own.full_url(COMMITS_DIR)} failed: {error}; "
                f"batches go on, and it is tried again after {COMPACT_EVERY} more commits. Check the location's "
                "permissions if this repeats")
            logger.warning("%s", self.compaction_error)

    def compact(self) -> int:
        """Fold all but the newest ``keep_commits`` records into the snapshot; returns how many.

        Step 1: list the records (a record this run wrote a moment ago may be missing from the
                listing: it is then kept, which is always safe).
        Step 2: those older than the ``keep_commits`` newest go.
        Step 3: replace the snapshot with the newest of them (``through_ms`` never moves back).
        Step 4: delete them; a crash before this only leaves them for the next compaction.
        """
        # Step 1
        times = sorted(int(n.split(".")[0]) for n in self._own.list_names(COMMITS_DIR) if n.split(".")[0].isdigit())
        # Step 2
        old = times[: max(0, len(times) - self.keep_commits)]
        if not old:
            return 0
        # Step 3
        through = max(old[-1], self._read_compacted_through() or old[-1])
        self._own.replace(COMPACTED_RECORD, seal({"through_ms": through}))
        self._compacted_through = through
        # Step 4
        for time_ms in old:
            self._own.delete(_record_name(time_ms))
        logger.debug("Compacted %d commit records of %s through batch %d", len(old), self.path, through)
        return len(old)

    def wait_for_compaction(self, timeout_s: float) -> bool:
        """Wait for a compaction under way; False when it is still running after ``timeout_s``."""
        thread = self._compaction
        if thread is not None:
            thread.join(timeout_s)
            return not thread.is_alive()
        return True

    def close(self) -> None:
        if self._looking is not None:
            self._looking.shutdown(wait=False, cancel_futures=True)
            self._looking, self._looks = None, {}
        if not self.wait_for_compaction(10.0):
            logger.warning("Compacting the commit records of %s still runs after 10 s; it stops with the process, and "
                           "a later run compacts them again", self.path)

    def _read_compacted_through(self) -> int | None:
        """The snapshot's ``through_ms``, read once per run (this sink updates it itself after)."""
        if not self._compacted_read:
            self._compacted_read = True
            try:
                snapshot = self._own.read_sealed_if_present(COMPACTED_RECORD)
                through = None if snapshot is None else int(snapshot["through_ms"])
            except (CorruptFileError, KeyError, TypeError, ValueError) as error:
                raise SinkError(
                    f"the commit snapshot {self._own.full_url(COMPACTED_RECORD)} is unreadable ({error}); it "
                    "tells which old batches are committed. Restore it from a backup, or write a new one with "
                    'the newest batch time of the deleted records: {"through_ms": <ms>}') from error
            if through is not None and (self._compacted_through is None or through > self._compacted_through):
                self._compacted_through = through
        return self._compacted_through

    def _read_record(self, time_ms: int) -> dict[str, Any] | None:
        """The batch's commit record, in the sink's own directory or (layout 1, see
        ``checkpoint.migrations``) under the output, marked ``under_output``; ``{"compacted": True}`` for a
        batch at or before the snapshot's ``through_ms`` whose record was compacted away."""
        record = self._find_record(time_ms)
        if record is None:
            through = self._read_compacted_through()
            if through is not None and time_ms <= through:
                return {"batch_time": time_ms, "compacted": True}
        return record

    def _find_record(self, time_ms: int) -> dict[str, Any] | None:
        places = [(self._own, _record_name(time_ms))]
        if self._layout_1_records is None:
            self._layout_1_records = self._storage.has_folder(migrations.FILE_SINK_COMMITS_V1)
        if self._layout_1_records:
            places.append((self._storage, migrations.file_sink_record_name_v1(time_ms)))
        for storage, name in places:
            try:
                record = storage.read_sealed_if_present(name)
            except CorruptFileError as error:
                target = self._storage.full_url(_target(time_ms))
                if not self._storage.is_local and self._storage.has_folder(_target(time_ms)):
                    # Publishing had begun, so the record was whole once; on an object store the
                    # batch's files are copied one by one, and which of them are in place is unknown.
                    raise SinkError(
                        f"the commit record {storage.full_url(name)} of batch {time_ms} is damaged ({error}), and "
                        f"{target} was published from it, perhaps in part. Delete {target} and "
                        f"{storage.full_url(name)}, then start the pipeline again: it writes the batch anew"
                    ) from error
                # Torn while being written (publishing had not begun: the batch is written anew), or
                # damaged after a local publish, which renamed the batch's directory into place whole.
                logger.warning("Ignoring the damaged commit record %s of batch %d (%s): the batch is written again, "
                               "unless %s is in place already (a local publish puts it there whole)",
                               storage.full_url(name), time_ms, error, target)
                storage.delete(name)
                return None
            if record is not None:
                return migrations.file_sink_record(record, under_output=storage is self._storage)
        return None

    def _home(self, record: dict[str, Any]) -> CheckpointStorage:
        """Where a record's staged files are."""
        return self._storage if record.get("under_output") else self._own

    def _publish(self, time_ms: int, record: dict[str, Any], fresh: bool) -> None:
        staged_dir, files = record["staging"], [entry["file"] for entry in record["files"]]
        sizes = {entry["file"]: entry.get("bytes") for entry in record["files"]}
        target, home = _target(time_ms), self._home(record)
        if self._storage.is_local:
            source, destination = home.path(staged_dir), self._storage.path(target)
            if not fresh and os.path.isdir(destination):
                return  # renamed before, whole
            if not os.path.isdir(source):
                raise self._lost(time_ms, record, target)
            _test_kill_point("after-record:0")
            os.makedirs(self._storage.path(""), exist_ok=True)
            os.rename(source, destination)  # a sibling directory: the same file system
            fsync_path(os.path.dirname(destination))
            _test_kill_point(f"after-record:{len(files)}")
            logger.debug("Committed batch %d to %s (%d files)", time_ms, destination, len(files))
            return
        in_place = set() if fresh else set(self._storage.list_names(target))
        published = 0
        _test_kill_point("after-record:0")
        for name in files:
            if name not in in_place:
                try:
                    self._storage.copy_in(home.path(f"{staged_dir}/{name}"), f"{target}/{name}", sizes[name])
                except FileNotFoundError as error:
                    if self._storage.has_file(f"{target}/{name}"):
                        continue  # another run of this batch copied it and dropped the staging meanwhile
                    raise self._lost(time_ms, record, target) from error
                published += 1
                _test_kill_point(f"after-record:{published}")
        logger.debug("Committed batch %d to %s/%s (%d files, %d copied now)", time_ms, self.path, target,
                     len(files), published)

    def _lost(self, time_ms: int, record: dict[str, Any], target: str) -> SinkError:
        name = self._record_url(time_ms, bool(record.get("under_output")))
        staged = self._home(record).full_url(record["staging"])
        return SinkError(
            f"batch {time_ms} is committed ({name}) but its staged files under {staged} are gone, so "
            f"{self._storage.full_url(target)} cannot be completed. Restore them, or delete {name} and "
            f"{self._storage.full_url(target)} so that the next run writes the batch again"
        )

    def _record_url(self, time_ms: int, under_output: bool) -> str:
        """Where batch ``time_ms``'s commit record lies: under the output in layout 1."""
        if under_output:
            return self._storage.full_url(migrations.file_sink_record_name_v1(time_ms))
        return self._own.full_url(_record_name(time_ms))

    def _drop_staging(self, time_ms: int, under_output: bool = False) -> None:
        self._own.delete(f"{STAGING_DIR}/{time_ms}", recursive=True)
        if under_output:
            self._storage.delete(migrations.file_sink_staging_v1(time_ms), recursive=True)


@dataclass(frozen=True)
class _Left:
    """What earlier attempts of a batch left on an object store, found while its tasks ran."""

    batch_folder: bool
    """Something is under ``batch_time=<t>/`` (Step 3)."""
    staged: list[str]
    """Files under ``staging/<t>/``, relative to the sink's own directory."""


def own_location(path: str) -> str:
    """The sink's own directory for ``path``: a hidden sibling, ``<parent>/.<name>.batchline``,
    so that no reader of the output (DuckDB's ``**`` globs included) ever meets its staging or
    records, and a local rename from there into the output stays on one file system."""
    scheme, sep, rest = path.rpartition("://")
    parent, _, name = rest.rstrip("/").rpartition("/")
    if not name or (sep and not parent):
        raise ConfigurationError(
            f"file output {path!r} has no parent to keep its staging and commit records beside it; write into a "
            "directory or prefix below it, e.g. " + (f"{path.rstrip('/')}/out" if path.rstrip("/") else "/data/out"))
    return f"{scheme}{sep}{parent}/.{name}.batchline"


def _record_name(time_ms: int) -> str:
    return f"{COMMITS_DIR}/{time_ms:015d}.json"


def _target(time_ms: int) -> str:
    return f"batch_time={time_ms}"


def _checked_options(format: str, options: dict[str, Any]) -> dict[str, Any]:
    supported = {"parquet": ("compression",), "json": ()}[format]
    for key in options:
        if key not in supported:
            raise ConfigurationError(
                f"file output option {key!r} is not supported for {format}; "
                + (f"use one of {', '.join(supported)}" if supported else "leave it out")
            )
    compression = str(options.get("compression", "snappy")).lower()
    if format == "parquet" and compression not in PARQUET_COMPRESSIONS:
        raise ConfigurationError(
            f"parquet compression {compression!r} is not supported; use one of {', '.join(PARQUET_COMPRESSIONS)}"
        )
    return {"compression": compression} if format == "parquet" else {}


def _test_kill_point(point: str) -> None:
    """Test hook: ``BATCHLINE_TEST_KILL_AT=<point>`` kills this process (SIGKILL) at that point."""
    if os.environ.get(TEST_KILL_VARIABLE) == point:
        os.kill(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------------------ in the tasks
def _staged_dir(attempt: WriteAttempt) -> str:
    return f"{STAGING_DIR}/{attempt.batch_time}/{attempt.id}"


def _stage_file(rows: Iterator[pa.RecordBatch], url: str, storage_options: dict[str, Any], staged_dir: str,
                name: str, format: str, options: dict[str, Any]) -> dict[str, Any]:
    """A task's rows (at least one) to the staged file ``<staged_dir>/<name>``, whole or absent;
    its name, rows and bytes. The file system is opened in the task."""
    first = next(rows)
    fs, root = fsspec.core.url_to_fs(url, **storage_options)
    directory = f"{root.rstrip('/')}/{staged_dir}"
    local = isinstance(fs, LocalFileSystem)
    if local:  # next to the staging directory, so that one rename puts it in place
        os.makedirs(directory, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=os.path.dirname(directory))
    else:
        fd, temp = tempfile.mkstemp(prefix="batchline-", suffix=f"-{name}")
    os.close(fd)
    try:
        if format == "parquet":
            count = _write_parquet(first, rows, temp, options)
        else:
            count = _write_json(first, rows, temp)
        size = os.path.getsize(temp)
        if local:
            fsync_path(temp)
            os.replace(temp, f"{directory}/{name}")
            fsync_path(directory)
        else:
            fs.put_file(temp, f"{directory}/{name}")  # one PUT or multipart upload: whole or absent
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return {"file": name, "rows": count, "bytes": size}

def _write_parquet(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch], path: str, options: dict[str, Any]) -> int:
    import pyarrow.parquet as pq

    count = 0
    with pq.ParquetWriter(path, first.schema, compression=options.get("compression", "snappy")) as writer:
        for batch in chain([first], rest):
            writer.write_batch(batch)
            count += batch.num_rows
    return count


def _write_json(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch], path: str) -> int:
    """JSON lines: one object per row, nested values as objects and arrays, timestamps in ISO-8601
    (``Z`` for instants), dates ISO, decimals as exact numbers, binary as base64."""
    convert = _converter(pa.struct(list(first.schema))) or (lambda row: row)
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for batch in chain([first], rest):
            for row in batch.to_pylist():
                handle.write(_dumps(convert(row)))
                handle.write("\n")
            count += batch.num_rows
    return count


Convert = Callable[[Any], Any]


class _Number:
    """A decimal to appear in JSON as the exact number it is (json.dumps knows no Decimal)."""

    __slots__ = ("text",)

    def __init__(self, value: Decimal) -> None:
        self.text = str(value)


_TOKEN = uuid.uuid4().hex


def _dumps(value: Any) -> str:
    numbers: list[str] = []

    def default(item: object) -> object:
        if isinstance(item, _Number):
            numbers.append(item.text)
            return f"{_TOKEN}-{len(numbers) - 1}"
        return str(item)  # e.g. a day-time interval

    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=default)
    for index, number in enumerate(numbers):
        text = text.replace(f'"{_TOKEN}-{index}"', number, 1)
    return text


def _instant(value: datetime) -> str:
    utc = value.astimezone(UTC).replace(tzinfo=None)
    return utc.isoformat(timespec="microseconds" if utc.microsecond % 1000 else "milliseconds") + "Z"


def _local_time(value: datetime) -> str:
    return value.isoformat(timespec="microseconds" if value.microsecond % 1000 else "milliseconds")


def _iso(value: date | time) -> str:
    return value.isoformat()


def _base64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _key(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) else _dumps(value)


def _converter(arrow_type: pa.DataType) -> Convert | None:
    """A function turning a value of this Arrow type (as ``to_pylist`` gives it) into what
    json.dumps writes as intended; None when it writes the value as it is."""
    types = pa.types
    convert: Convert | None = None
    if types.is_timestamp(arrow_type):
        convert = _instant if arrow_type.tz is not None else _local_time
    elif types.is_date(arrow_type) or types.is_time(arrow_type):
        convert = _iso
    elif types.is_decimal(arrow_type):
        convert = _Number
    elif types.is_binary(arrow_type) or types.is_large_binary(arrow_type) or types.is_fixed_size_binary(arrow_type):
        convert = _base64
    elif types.is_map(arrow_type):
        keys = _converter(arrow_type.key_type) or _identity
        items = _converter(arrow_type.item_type) or _identity
        convert = lambda pairs: {_key(keys(k)): items(v) for k, v in pairs}  # noqa: E731
    elif types.is_list(arrow_type) or types.is_large_list(arrow_type) or types.is_fixed_size_list(arrow_type):
        element = _converter(arrow_type.value_type)
        if element is not None:
            convert = lambda values: [element(v) for v in values]  # noqa: E731
    elif types.is_struct(arrow_type):
        fields = [(field.name, _converter(field.type)) for field in arrow_type]
        if any(c is not None for _, c in fields):
            convert = lambda row: {n: (c(row[n]) if c else row[n]) for n, c in fields}  # noqa: E731
    if convert is None:
        return None
    inner = convert
    return lambda value: None if value is None else inner(value)


def _identity(value: Any) -> Any:
    return value
