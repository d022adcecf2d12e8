"""The job event store: one log at the checkpoint location of what happened (SPEC F1).

Records, per batch, in the order they happen:

- ``started``: the batch's inputs (each input's allocation), written by the driver before
  any job of the batch runs;
- ``operator``: a stateful operator's partition count and state generation for the batch,
  written by the driver when it submits the operator's job;
- ``finished``: one state partition's work is durable (its delta and its output rows),
  written by the task itself, because the driver may die before it hears of the task's end;
- ``completed``: every job succeeded, with the operators' progress (the commit marker).

Every record is a small immutable object with a checksum (``seal``), created exclusively
(``CheckpointStorage.write_new``: ``O_EXCL`` plus fsync on local disks, a conditional PUT on
object stores), and named by its place in the log: ``events/<batch time>/<kind>...json``.
One object per record rather than one appended file, because records come from many
processes at once (the tasks of every executor) and object stores cannot append. A restart
finds records by name, never by listing what was just written: batch times lie on the
interval grid, and it knows each operator's partitions.

A torn or corrupt record at the tail (the newest batch) is what a crash mid-write leaves:
it is dropped with a WARN and the batch runs again. Corruption before the tail is an error
naming the record.

The log stays bounded (SPEC E6): once no retained checkpoint can re-run a batch, its records
are deleted (``purge_before``), by the ``EventPurger``'s thread, off the batches' path. A
purge finds what to delete by name too: ``events/_purged.json`` says where the last one
stopped, and batch times lie on the interval grid, so no restart and no purge lists the
folder, except the first purge of a log that an older release kept (it has no such record,
and may hold every batch of the pipeline's life).
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from batchline.checkpoint.lease import FencedError
from batchline.checkpoint.model import OperatorProgress
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, TornFileError, seal
from batchline.errors import BatchlineError

__all__ = ["JobEventStore", "EventPurger", "CommitMarker", "PurgeRecord", "PartitionFinished", "OperatorInitialized",
           "EVENTS", "PURGE_RECORD"]

logger = logging.getLogger(__name__)

EVENTS = "events"
PURGE_RECORD = f"{EVENTS}/_purged.json"
"""Where the last purge stopped; not a batch folder (those are named by digits only)."""


@dataclass(frozen=True)
class OperatorInitialized:
    """A stateful operator as it ran in a batch: finish records count only under the same layout."""

    operator: str
    num_partitions: int
    generation: int


@dataclass(frozen=True)
class PartitionFinished:
    """One state partition of one batch is durable: its delta and its output are stored."""

    operator: str
    partition: int
    generation: int
    version: int
    """The state version the partition committed (the batch time)."""
    output_rows: int
    stats: dict[str, Any] = field(default_factory=dict)
    token: int | None = None
    """The lease token of the driver whose task wrote it."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> PartitionFinished:
        return cls(str(payload["operator"]), int(payload["partition"]), int(payload["generation"]),
                   int(payload["version"]), int(payload["output_rows"]), dict(payload.get("stats", {})),
                   payload.get("token"))


@dataclass(frozen=True)
class CommitMarker:
    """A batch is committed: every job succeeded. It holds the stateful operators' progress as
    of the batch, by the name each keeps at the checkpoint location, so that a restart takes
    back the newest of it rather than the older one of the last checkpoint."""

    time: int
    token: int | None
    """The lease token of the driver that committed it."""
    operators: dict[str, OperatorProgress] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "token": self.token,
                "operators": {name: progress.to_json() for name, progress in self.operators.items()}}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> CommitMarker:
        token = payload.get("token")
        return cls(int(payload["time"]), None if token is None else int(token),
                   {str(name): OperatorProgress.from_json(p) for name, p in payload.get("operators", {}).items()})


@dataclass(frozen=True)
class PurgeRecord:
    """Where the last purge of the log stopped."""

    next_ms: int
    """The oldest batch time not purged, on the interval grid: the next purge starts there."""
    kept_ms: int | None = None
    """A batch below ``next_ms`` whose records were kept: the newest commit marker, while no
    later batch has one (it says which state versions are committed)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> PurgeRecord:
        kept = payload.get("kept_ms")
        return cls(int(payload["next_ms"]), None if kept is None else int(kept))


def _batch_dir(batch_time: int) -> str:
    return f"{EVENTS}/{batch_time:015d}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _started(batch_time: int) -> str:
    return f"{_batch_dir(batch_time)}/started.json"


def _completed(batch_time: int) -> str:
    return f"{_batch_dir(batch_time)}/completed.json"


def _operator(batch_time: int, operator: str, generation: int) -> str:
    return f"{_batch_dir(batch_time)}/operator-{_safe(operator)}-g{generation}.json"


def _finished(batch_time: int, operator: str, generation: int, partition: int) -> str:
    return f"{_batch_dir(batch_time)}/finished-{_safe(operator)}-g{generation}-p{partition:05d}.json"


class JobEventStore:
    """Reads and writes the event records of one checkpoint location; usable in tasks too
    (it pickles by the storage's URL and options)."""

    def __init__(self, storage: CheckpointStorage, interval_ms: int | None = None) -> None:
        self.storage = storage
        self.interval_ms = interval_ms
        """The batch interval, to tell the tail from the records before it (unknown: all is tail),
        and to find the batches a purge deletes by name."""
        self._newest_completed: int | None = None
        """The newest commit marker this store wrote or read: a purge below it need not keep one."""

    def __getstate__(self) -> dict[str, Any]:
        # Tasks get the store pickled; what this driver wrote last is no business of theirs.
        return {"storage": self.storage, "interval_ms": self.interval_ms, "_newest_completed": None}

    # ---------------------------------------------------------------- writing
    def batch_started(self, batch_time: int, allocations: dict[str, dict[str, Any]], token: int | None) -> None:
        self._write_once(_started(batch_time), {"time": batch_time, "allocations": allocations, "token": token})

    def operator_initialized(self, batch_time: int, record: OperatorInitialized) -> None:
        """A re-run of the batch finds it written already, the same (a rescale makes a new generation)."""
        name = _operator(batch_time, record.operator, record.generation)
        try:  # written first, read only when it is there: a batch's first run makes one request
            self.storage.write_new(name, seal(asdict(record)))
        except FileExistsError:
            if self._read(name, batch_time) is None:  # torn by a crash while it was written: dropped
                self._write_once(name, asdict(record))

    def partition_finished(self, batch_time: int, record: PartitionFinished) -> None:
        """A retried task finds the record of an earlier attempt and keeps it: both did the same work."""
        name = _finished(batch_time, record.operator, record.generation, record.partition)
        try:
            self.storage.write_new(name, seal(record.to_json()))
        except FileExistsError:
            try:
                self.storage.read_sealed(name)
            except TornFileError:  # an attempt killed while writing it: this attempt's record replaces it
                self.storage.delete(name)
                self.storage.write_new(name, seal(record.to_json()))
                return
            logger.info("Partition %d of operator %s already recorded its finish of batch %d", record.partition,
                        record.operator, batch_time)

    def batch_completed(self, batch_time: int, token: int | None,
                        operators: dict[str, OperatorProgress] | None = None) -> None:
        """The commit marker, with the stateful operators' progress (e.g. event time seen)."""
        self._write_once(_completed(batch_time), CommitMarker(batch_time, token, dict(operators or {})).to_json())
        if self._newest_completed is None or batch_time > self._newest_completed:
            self._newest_completed = batch_time

    def _write_once(self, name: str, payload: dict[str, Any]) -> None:
        try:
            self.storage.write_new(name, seal(payload))
        except FileExistsError as error:
            raise FencedError(
                f"{self.storage.full_url(name)} was already written by another driver; this driver stops "
                "without committing. Run one driver per checkpoint location"
            ) from error

    # ---------------------------------------------------------------- reading
    def started(self, batch_time: int) -> dict[str, dict[str, Any]] | None:
        """The logged allocations of a batch; None when it was never logged (or torn at the tail)."""
        payload = self._read(_started(batch_time), batch_time)
        return None if payload is None else dict(payload["allocations"])

    def operator(self, batch_time: int, operator: str, generation: int) -> OperatorInitialized | None:
        payload = self._read(_operator(batch_time, operator, generation), batch_time)
        return None if payload is None else OperatorInitialized(**payload)

    def finished(self, batch_time: int, operator: str, generation: int, partition: int) -> PartitionFinished | None:
        """A partition's finish record; a torn one counts as not finished (the partition runs again)."""
        payload = self._read(_finished(batch_time, operator, generation, partition), batch_time)
        return None if payload is None else PartitionFinished.from_json(payload)

    def completed(self, batch_time: int) -> CommitMarker | None:
        """A batch's commit marker; None when the batch is not (validly) committed."""
        payload = self._read(_completed(batch_time), batch_time)
        if payload is not None and (self._newest_completed is None or batch_time > self._newest_completed):
            self._newest_completed = batch_time  # a restart reads the newest marker: purges need not keep one
        return None if payload is None else CommitMarker.from_json(payload)

    def is_completed(self, batch_time: int) -> bool:
        return self.completed(batch_time) is not None

    def _in_flight(self, batch_time: int) -> bool:
        """Whether a crash could have cut a write of this batch's records short: no later batch
        is committed. Batches commit in order, but later ones are logged, and their tasks write,
        while this one still runs."""
        return self.interval_ms is None or not self.storage.has_file(_completed(batch_time + self.interval_ms))

    def _read(self, name: str, batch_time: int) -> dict[str, Any] | None:
        try:
            return self.storage.read_sealed_if_present(name)
        except CorruptFileError as error:
            later = self._written_after(name, batch_time) if isinstance(error, TornFileError) else None
            if not isinstance(error, TornFileError) or not self._in_flight(batch_time) or later:
                why = ("a crash cuts a write short but does not change its bytes"
                       if not isinstance(error, TornFileError)
                       else f"{later} was written after it" if later else "a later batch was committed after it")
                raise CorruptFileError(
                    f"{error}; {why}, so it is not a crash's torn write. Restore the file from a backup, or move "
                    "the checkpoint location aside and start fresh"
                ) from error
            # Torn while being written: what it records did not happen, and runs again.
            logger.warning("Dropping torn record of batch %d, which no later commit follows: %s", batch_time, error)
            self.storage.delete(name)
            return None

    def _written_after(self, name: str, batch_time: int) -> str | None:
        """A record of the batch that is only ever written after ``name`` was written whole, if
        one is there: then ``name`` was cut short later (a bad disk, a bad copy), not by a crash
        while it was written, and what it records did happen. Listed: only ever for a torn record."""
        kind = name.rsplit("/", 1)[-1]
        if kind == "started.json":
            followers = [n for n in self.storage.list_names(_batch_dir(batch_time)) if n != kind]
        elif kind.startswith("operator-"):
            prefix = "finished-" + kind[len("operator-"):-len(".json")] + "-p"
            followers = [n for n in self.storage.list_names(_batch_dir(batch_time)) if n.startswith(prefix)]
        else:
            return None  # finish records and commit markers are the last records of their kind
        return self.storage.full_url(f"{_batch_dir(batch_time)}/{followers[0]}") if followers else None

    def check_logged(self, batch_time: int) -> None:
        """Raise CorruptFileError when the batch's ``started`` record is missing while records
        written after it are there: the batch ran with inputs no longer known, and running it
        with others could contradict what it already wrote (its output's commit, its state)."""
        name = _started(batch_time)
        if self.storage.has_file(name):
            return
        later = [n for n in self.storage.list_names(_batch_dir(batch_time)) if n != "started.json"]
        if later:
            raise CorruptFileError(
                f"{self.storage.full_url(name)} is missing, but the batch's later records are there (such as "
                f"{self.storage.full_url(f'{_batch_dir(batch_time)}/{later[0]}')}): the batch ran, and its inputs "
                "are no longer known. Restore the file from a backup, or move the checkpoint location aside and "
                "start fresh")

    def forget_finished(self, batch_time: int, operator: str, generation: int, partitions: int) -> None:
        """Delete a batch's finish records: it runs again whole (an input that cannot replay)."""
        for partition in range(partitions):
            self.storage.delete(_finished(batch_time, operator, generation, partition))

    def forget_partition_finished(self, batch_time: int, operator: str, generation: int, partition: int) -> None:
        """Delete one partition's finish record of a batch: it runs again (what it stored cannot be read back)."""
        self.storage.delete(_finished(batch_time, operator, generation, partition))

    # ---------------------------------------------------------------- clean-up
    def purge_before(self, threshold_time: int) -> int:
        """Delete the records of batches older than ``threshold_time`` (metadata stays bounded,
        SPEC E6), except the newest commit marker while no later batch has one: it tells which
        state versions are committed after the batches that wrote them (a finished operator's
        last one) were purged. Returns how many batches' records were deleted.

        Step 1: read where the last purge stopped (``events/_purged.json``, by name).
        Step 2: the batches to delete: the interval grid from there up to the threshold, by
                name; without a record (a log an older release kept) or an interval, a listing.
        Step 3: choose the commit marker to keep, if one must be kept.
        Step 4: delete the batches' folders, oldest first.
        Step 5: replace the record with where this purge stopped; a crash before it only
                makes the next purge try the same deletes again.
        """
        # Step 1
        record = self._purge_record()
        # Step 2
        if record is not None and self.interval_ms:
            times = list(range(record.next_ms, threshold_time, self.interval_ms))
            listed = None
        else:
            listed = sorted(int(name) for name in self.storage.list_names(EVENTS) if name.isdigit())
            times = [t for t in listed if t < threshold_time]
        if not times:
            return 0
        # Step 3
        kept = self._marker_to_keep(times, listed, record, threshold_time)
        # Step 4
        removed = 0
        for batch_time in times:
            if batch_time != kept and self.storage.delete(_batch_dir(batch_time), recursive=True):
                removed += 1
        if record is not None and record.kept_ms is not None and record.kept_ms != kept:
            self.storage.delete(_batch_dir(record.kept_ms), recursive=True)  # a newer marker supersedes it
        # Step 5
        next_ms = self._next_on_grid(times[-1], threshold_time)
        if next_ms is not None:
            self.storage.replace(PURGE_RECORD, seal(PurgeRecord(next_ms, kept).to_json()))
        return removed

    def _purge_record(self) -> PurgeRecord | None:
        try:
            payload = self.storage.read_sealed_if_present(PURGE_RECORD)
            return None if payload is None else PurgeRecord.from_json(payload)
        except (CorruptFileError, KeyError, TypeError, ValueError) as error:
            # Only a hint of where to start: a listing finds everything it would have.
            logger.warning("Ignoring the unreadable purge record %s (%s); this purge lists the event log",
                           self.storage.full_url(PURGE_RECORD), error)
            return None

    def _marker_to_keep(self, times: list[int], listed: list[int] | None, record: PurgeRecord | None,
                        threshold_time: int) -> int | None:
        """The newest commit marker among ``times`` (or the one kept before), unless a batch at
        or after the threshold is known to be committed."""
        if self._newest_completed is not None and self._newest_completed >= threshold_time:
            return None
        if listed is not None:  # the whole log is known: as before, the newest marker in it
            newest = next((t for t in reversed(listed) if self.is_completed(t)), None)
            return newest if newest is not None and newest < threshold_time else None
        # Most batches commit: the search from the top usually stops at once.
        found = next((t for t in reversed(times) if self.is_completed(t)), None)
        return found if found is not None else (record.kept_ms if record is not None else None)

    def _next_on_grid(self, last: int, threshold_time: int) -> int | None:
        """The first batch time on the grid of ``last`` at or after the threshold (None without an interval)."""
        if not self.interval_ms:
            return None
        return last + max(1, -(-(threshold_time - last) // self.interval_ms)) * self.interval_ms


class PurgeError(BatchlineError):
    """A purge of the job event log failed (it is tried again with the next request)."""


class EventPurger:
    """Runs ``JobEventStore.purge_before`` on a thread of its own, so no batch waits for the
    deletes (an object store answers each in tens of milliseconds, and the first purge of a
    log an older release kept may delete a year of batches). Requests coalesce: the newest
    threshold wins; a failed purge is logged and tried again with the next request."""

    def __init__(self, events: JobEventStore) -> None:
        self._events = events
        self._condition = threading.Condition()
        self._wanted: int | None = None
        self._done: int | None = None
        self._busy = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.last_error: BaseException | None = None

    def request(self, threshold_time: int) -> None:
        """Purge the records of batches before ``threshold_time``, soon, off this thread."""
        with self._condition:
            if self._stopping:
                return
            if self._wanted is None or threshold_time > self._wanted:
                self._wanted = threshold_time
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="batchline-event-purge", daemon=True)
                self._thread.start()
            self._condition.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every request so far is done; False when ``timeout_s`` passed first."""
        with self._condition:
            return self._condition.wait_for(
                lambda: not self._busy and (self._wanted is None or self._wanted == self._done), timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Finish the purge under way (not the ones requested after it) and end the thread."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning("The job event log purge is still running after %.0f s; it stops with the process, "
                               "and the next run finishes it", timeout_s)

    def _run(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(lambda: self._stopping or self._wanted != self._done)
                if self._stopping:
                    return
                threshold = self._wanted
                self._busy = True
            assert threshold is not None
            try:
                removed = self._events.purge_before(threshold)
                if removed:
                    logger.debug("Purged the job event records of %d batches before %d ms", removed, threshold)
                self.last_error = None
            except Exception as error:
                self.last_error = PurgeError(
                    f"purging the job event log at {self._events.storage.full_url(EVENTS)} before {threshold} ms "
                    f"failed: {error}; it is tried again after the next checkpoint. Check the location's "
                    "permissions if this repeats")
                logger.warning("%s", self.last_error)
            with self._condition:
                self._busy = False
                self._done = threshold
                self._condition.notify_all()
