"""The batch log: each batch's input allocation, written before its jobs run, and a commit
marker written after they all succeeded.

A restarted driver re-runs a logged but uncommitted batch with exactly the logged inputs,
so outputs that are idempotent per batch time (the file sink, a foreach_batch keyed on the
batch id) see every record exactly once. Batch times are on the interval grid and every
grid time gets an entry, so recovery finds entries by name, never by listing.
"""

from __future__ import annotations

import logging
from typing import Any

from batchline.checkpoint.lease import FencedError
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, seal

__all__ = ["BatchLog"]

logger = logging.getLogger(__name__)

BATCHES = "batches"
COMMITS = "commits"


def _name(folder: str, batch_time: int) -> str:
    return f"{folder}/{batch_time:015d}.json"


class BatchLog:
    def __init__(self, storage: CheckpointStorage) -> None:
        self._storage = storage

    def write_batch(self, batch_time: int, allocations: dict[str, dict[str, Any]], token: int | None) -> None:
        self._write_once(_name(BATCHES, batch_time), {"time": batch_time, "allocations": allocations, "token": token})

    def read_batch(self, batch_time: int) -> dict[str, dict[str, Any]] | None:
        """The logged allocations of a batch; None when it was never logged (or torn while written)."""
        name = _name(BATCHES, batch_time)
        if not self._storage.exists(name):
            return None
        try:
            return self._storage.read_sealed(name)["allocations"]
        except CorruptFileError as error:
            # Torn while being written: the batch never ran, so it is generated anew.
            logger.warning("Ignoring torn batch log entry for %d: %s", batch_time, error)
            self._storage.delete(name)
            return None

    def commit(self, batch_time: int, token: int | None, operators: dict[str, Any] | None = None) -> None:
        """Mark a batch done, with its stateful operators' progress (e.g. event time seen)."""
        self._write_once(_name(COMMITS, batch_time),
                         {"time": batch_time, "token": token, "operators": operators or {}})

    def read_commit(self, batch_time: int) -> dict[str, Any] | None:
        """A commit marker's content; None when the batch is not (validly) committed."""
        name = _name(COMMITS, batch_time)
        if not self._storage.exists(name):
            return None
        try:
            return self._storage.read_sealed(name)
        except CorruptFileError:
            return None

    def _write_once(self, name: str, payload: dict[str, Any]) -> None:
        try:
            self._storage.write_new(name, seal(payload))
        except FileExistsError as error:
            raise FencedError(
                f"{self._storage.full_url(name)} was already written by another driver; this driver stops "
                "without committing. Run one driver per checkpoint location"
            ) from error

    def is_committed(self, batch_time: int) -> bool:
        name = _name(COMMITS, batch_time)
        if not self._storage.exists(name):
            return False
        try:
            self._storage.read_sealed(name)
        except CorruptFileError:
            self._storage.delete(name)
            return False
        return True

    def purge_before(self, threshold_time: int) -> int:
        """Delete entries older than ``threshold_time`` (metadata stays bounded, SPEC E6)."""
        removed = 0
        for folder in (BATCHES, COMMITS):
            for name in self._storage.list_names(folder):
                stem = name.split(".", 1)[0]
                if stem.isdigit() and int(stem) < threshold_time:
                    self._storage.delete(f"{folder}/{name}")
                    removed += 1
        return removed
