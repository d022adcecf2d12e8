"""Offline access to an operator's state: its retained versions, reading a version as a
DataFrame (SPEC D7), and rescaling it to another partition count (SPEC D6)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from batchline.checkpoint.events import JobEventStore
from batchline.checkpoint.lease import Lease
from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import SystemClock
from batchline.errors import ConfigurationError
from batchline.state.frames import read_state_frame, write_state_frame
from batchline.state.schema import RowSchema
from batchline.state.store import SNAPSHOT, STATE_DIR, FileStateStore, StateMetadata, StateVersionError

__all__ = ["read_state", "state_versions", "rescale_state", "RescaleResult", "state_operators"]

logger = logging.getLogger(__name__)


def _open(checkpoint: str, operator: str,
          storage_options: dict[str, Any] | None) -> tuple[FileStateStore, StateMetadata]:
    files = FileStateStore.open(checkpoint, operator, storage_options)
    metadata = files.read_metadata()
    if metadata is None:
        known = state_operators(checkpoint, storage_options)
        raise ConfigurationError(
            f"no state of operator {operator!r} at {files.storage.url}; operators with state there: "
            f"{known or 'none'}"
        )
    return files, metadata


def state_operators(checkpoint: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """Names of the stateful operators that keep state at a checkpoint location."""
    return CheckpointStorage(checkpoint, storage_options).list_names(STATE_DIR)


def state_versions(checkpoint: str, operator: str, storage_options: dict[str, Any] | None = None) -> list[int]:
    """The retained versions that can be read: committed batches (and snapshots) whose files
    every partition still holds, oldest first."""
    files, metadata = _open(checkpoint, operator, storage_options)
    return _versions(files, metadata)


def _versions(files: FileStateStore, metadata: StateMetadata) -> list[int]:
    events = JobEventStore(files.storage)
    per_partition = [files.list_versions(metadata.generation, p) for p in range(metadata.num_partitions)]
    common = set(per_partition[0]).intersection(*per_partition[1:])
    # Readable: committed (a snapshot is only ever written for a committed version) and held by
    # every partition. Clean-up deletes only what lies below a snapshot, so each such version
    # can be built from a snapshot or from the first delta on.
    return [v for v in sorted(common)
            if any(SNAPSHOT in p[v] for p in per_partition) or events.is_completed(v)]


def _latest(files: FileStateStore, metadata: StateMetadata) -> int:
    versions = _versions(files, metadata)
    if not versions:
        raise StateVersionError(f"operator {files.operator!r} has no committed state version at {files.storage.url}")
    return versions[-1]


def read_state(
    spark: SparkSession,
    checkpoint: str,
    operator: str,
    version: int | None = None,
    state_schema: Any | None = None,
    storage_options: dict[str, Any] | None = None,
) -> DataFrame:
    """An operator's state at ``version`` (default: the latest committed) as a DataFrame of
    key columns, state fields and ``timeout_timestamp_ms``. ``state_schema`` reads the stored
    state through a newer schema (default: the stored one)."""
    files, metadata = _open(checkpoint, operator, storage_options)
    if version is None:
        version = _latest(files, metadata)
    elif version not in _versions(files, metadata):
        raise StateVersionError(
            f"operator {operator!r} has no readable version {version} at {files.storage.url}; "
            f"retained: {_versions(files, metadata) or 'none'}"
        )
    schema = RowSchema.of(state_schema if state_schema is not None else metadata.state_schema)
    schema.check_compatible(metadata.state_schema, f"operator {operator!r}")
    return read_state_frame(spark, files, metadata, schema, version)


@dataclass(frozen=True)
class RescaleResult:
    operator: str
    version: int
    old_partitions: int
    new_partitions: int
    keys: int


def rescale_state(
    spark: SparkSession,
    checkpoint: str,
    operator: str,
    num_partitions: int,
    storage_options: dict[str, Any] | None = None,
) -> RescaleResult:
    """Move an operator's latest state into ``num_partitions`` partitions, keeping every key.

    Offline: it takes the checkpoint's lease, so it refuses to run next to a live driver. The
    new partitions are written as a new generation and the metadata is switched last, so a
    crash part-way leaves the old state in force."""
    if num_partitions < 1:
        raise ConfigurationError(f"the partition count must be at least 1; got {num_partitions}")
    files, metadata = _open(checkpoint, operator, storage_options)
    lease = Lease(files.storage, SystemClock(), 15_000)
    lease.acquire()
    try:
        version = _latest(files, metadata)
        state = RowSchema.of(metadata.state_schema)
        before = read_state_frame(spark, files, metadata, state, version).persist()  # read once, count and write
        expected = before.count()
        new = dataclasses.replace(metadata, num_partitions=num_partitions, generation=metadata.generation + 1)
        files.delete_generation(new.generation)  # leftovers of a crashed rescale
        written = write_state_frame(before, files, new, state, version, initial=False)
        if written != expected:
            raise ConfigurationError(f"rescale wrote {written} keys but the state holds {expected}; nothing changed")
        before.unpersist()
        files.write_metadata(new)
        files.delete_generation(metadata.generation)
        logger.info("Rescaled operator %s from %d to %d partitions at version %d (%d keys)", operator,
                    metadata.num_partitions, num_partitions, version, written)
        return RescaleResult(operator, version, metadata.num_partitions, num_partitions, written)
    finally:
        lease.release()
