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
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from batchline.checkpoint.lease import FencedError
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, seal

__all__ = ["JobEventStore", "PartitionFinished", "OperatorInitialized", "EVENTS"]

logger = logging.getLogger(__name__)

EVENTS = "events"


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
        """The batch interval, to tell the tail from the records before it (unknown: all is tail)."""

    # ---------------------------------------------------------------- writing
    def batch_started(self, batch_time: int, allocations: dict[str, dict[str, Any]], token: int | None) -> None:
        self._write_once(_started(batch_time), {"time": batch_time, "allocations": allocations, "token": token})

    def operator_initialized(self, batch_time: int, record: OperatorInitialized) -> None:
        """A re-run of the batch finds it written already, the same (a rescale makes a new generation)."""
        name = _operator(batch_time, record.operator, record.generation)
        if self._read(name, batch_time) is None:
            self._write_once(name, asdict(record))

    def partition_finished(self, batch_time: int, record: PartitionFinished) -> None:
        """A retried task finds the record of an earlier attempt and keeps it: both did the same work."""
        name = _finished(batch_time, record.operator, record.generation, record.partition)
        try:
            self.storage.write_new(name, seal(record.to_json()))
        except FileExistsError:
            logger.info("Partition %d of operator %s already recorded its finish of batch %d", record.partition,
                        record.operator, batch_time)

    def batch_completed(self, batch_time: int, token: int | None, operators: dict[str, Any] | None = None) -> None:
        """The commit marker, with the stateful operators' progress (e.g. event time seen)."""
        self._write_once(_completed(batch_time), {"time": batch_time, "token": token, "operators": operators or {}})

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

    def completed(self, batch_time: int) -> dict[str, Any] | None:
        """A commit marker's content; None when the batch is not (validly) committed."""
        return self._read(_completed(batch_time), batch_time)

    def is_completed(self, batch_time: int) -> bool:
        return self.completed(batch_time) is not None

    def _is_tail(self, batch_time: int) -> bool:
        return self.interval_ms is None or not self.storage.exists(_started(batch_time + self.interval_ms))

    def _read(self, name: str, batch_time: int) -> dict[str, Any] | None:
        if not self.storage.exists(name):
            return None
        try:
            return self.storage.read_sealed(name)
        except CorruptFileError as error:
            if not self._is_tail(batch_time):
                raise CorruptFileError(
                    f"{error}; later batches were logged after it, so it is not a crash's torn write. Restore the "
                    "file from a backup, or move the checkpoint location aside and start fresh"
                ) from error
            # Torn while being written: what it records did not happen, and runs again.
            logger.warning("Dropping torn record of batch %d at the tail of the job event log: %s", batch_time, error)
            self.storage.delete(name)
            return None

    def forget_finished(self, batch_time: int, operator: str, generation: int, partitions: int) -> None:
        """Delete a batch's finish records: it runs again whole (an input that cannot replay)."""
        for partition in range(partitions):
            self.storage.delete(_finished(batch_time, operator, generation, partition))

    # ---------------------------------------------------------------- clean-up
    def purge_before(self, threshold_time: int) -> int:
        """Delete the records of batches older than ``threshold_time`` (metadata stays bounded,
        SPEC E6), except the newest commit marker: it tells which state versions are committed
        after the batches that wrote them (a finished operator's last one) were purged."""
        times = sorted((int(name) for name in self.storage.list_names(EVENTS) if name.isdigit()), reverse=True)
        newest_committed = next((t for t in times if self.is_completed(t)), None)
        removed = 0
        for batch_time in times:
            if batch_time < threshold_time and batch_time != newest_committed:
                self.storage.delete(_batch_dir(batch_time), recursive=True)
                removed += 1
        return removed
