"""Offline access to an operator's state: its retained versions, reading a version as a
DataFrame (SPEC D7), rescaling it to another partition count (SPEC D6), and writing a
DataFrame as its new state (SPEC D8: bootstrap, fix, migrate)."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from batchline.batch_time import format_batch_time
from batchline.checkpoint.events import EVENTS, JobEventStore
from batchline.checkpoint.lease import CheckpointLockedError, Lease
from batchline.checkpoint.storage import CheckpointStorage
from batchline.checkpoint.writer import load_latest_checkpoint
from batchline.clock import SystemClock
from batchline.errors import ConfigurationError, DuplicateStateKeyError
from batchline.state import operator as operator_settings
from batchline.state.frames import TIMEOUT_COLUMN, read_state_frame, write_state_frame
from batchline.state.group_state import GroupStateTimeout
from batchline.state.schema import RowSchema, StateSchemaError
from batchline.state.store import SNAPSHOT, STATE_DIR, FileStateStore, StateMetadata, StateVersionError

__all__ = [
    "RescaleResult",
    "WriteStateResult",
    "read_state",
    "rescale_state",
    "state_operators",
    "state_versions",
    "write_state",
]

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
    # A partition with no row and no timer due sits a batch out (SPEC E6) and writes no version:
    # its state at that version is its newest below, so a version is held by every partition
    # whose files reach back to it.
    oldest = max((min(p) for p in per_partition if p), default=None)
    if oldest is None or not all(per_partition):
        return []
    held = {v for p in per_partition for v in p if v >= oldest}
    logged = {int(name) for name in files.storage.list_names(EVENTS) if name.isdigit()}
    newest_committed = next((t for t in sorted(logged, reverse=True) if events.is_completed(t)), None)

    def committed(version: int) -> bool:
        if version in logged:
            return events.is_completed(version)
        # Its records were purged, which only happens once later checkpoints no longer need
        # them; and batches with state commit in order. A finished operator's last version
        # lies far behind the idle batches that follow it.
        return newest_committed is not None and version <= newest_committed

    # Readable: committed (a snapshot is only ever written for a committed version) and held by
    # every partition. Clean-up deletes only what lies below a snapshot, so each such version
    # can be built from a snapshot or from the first delta on.
    return [v for v in sorted(held) if any(SNAPSHOT in p.get(v, ()) for p in per_partition) or committed(v)]


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
    # Without a schema given, fields a key's stored version lacks read as the state function sees them.
    schema = (RowSchema.of(state_schema) if state_schema is not None
              else RowSchema.stored(metadata.state_schema, metadata.state_defaults))
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
        state = RowSchema.stored(metadata.state_schema, metadata.state_defaults)  # old keys keep their defaults
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


# -------------------------------------------------------------------- writing state (SPEC D8)
@dataclass(frozen=True)
class WriteStateResult:
    """What ``write_state`` wrote."""

    operator: str
    version: int
    """The new state version (epoch ms): what a pipeline started on the location resumes from."""
    keys: int
    num_partitions: int
    created: bool
    """True when the operator had no state at the location before (a bootstrap)."""


_TIMEOUT_TYPES = frozenset({"bigint", "int", "smallint", "tinyint", "void"})
_GENERATION_DIR = re.compile(r"g(\d+)")


def write_state(
    spark: SparkSession,
    checkpoint: str,
    operator: str,
    df: DataFrame,
    *,
    key_columns: Sequence[str] | None = None,
    state_schema: Any | None = None,
    num_partitions: int | None = None,
    timeout: GroupStateTimeout | None = None,
    storage_options: dict[str, Any] | None = None,
) -> WriteStateResult:
    """Write ``df`` as the whole new state of ``operator`` at ``checkpoint`` (SPEC D8): a new
    state version that a pipeline started on the location resumes from.

    ``df`` has the shape ``read_state`` returns: the key columns, one column per state field
    and, optionally, ``timeout_timestamp_ms`` (a key's timeout deadline in epoch ms, null for
    none). So ``read_state`` -> DataFrame operations -> ``write_state`` fixes bad keys or
    migrates the state to a new schema; keys missing from ``df`` are gone from the state.
    Each key must appear once. ``spark`` is taken for symmetry with ``read_state``; ``df``
    carries its own session.

    It works offline: it takes the checkpoint location's lease, so it is refused
    (``CheckpointLockedError``) while a driver runs there; stop the pipeline first.

    - An operator with state there keeps its key columns (``key_columns``, if given, must name
      them) and its partition count unless ``num_partitions`` is given. Its state schema is
      the stored one, or ``state_schema``: the stored schema then becomes ``state_schema``.
      Because every key is rewritten, the new schema need not be readable from the old one
      (a field may change type): this is the offline rewrite that the schema-evolution error
      points to. ``timeout``, if given, replaces the recorded timeout kind.
    - An operator without state there (bootstrapping from another system, or seeding a
      streaming pipeline's location from a bounded pipeline's final state) needs
      ``key_columns`` and ``state_schema``; it gets ``num_partitions`` partitions (default
      ``batchline.state.operator.DEFAULT_STATE_PARTITIONS``) and ``timeout`` (default
      ``NO_TIMEOUT``). The state function is not called for its keys in the first batch.

    Every column of ``df`` is checked before anything is written: each state field (and
    key column) must be present with the declared Spark type, compared by ``simpleString``
    with nullability ignored (an ``int`` column for a ``long`` field must be cast), and no
    other column than ``timeout_timestamp_ms`` may be present; ``StateSchemaError`` lists
    every mismatch.

    Which version: a restarted pipeline's first batch loads the newest state version below
    its batch time. So the new version lies just above the newest committed batch in the
    location's event log (and above any state version below the next batch, e.g. one an
    earlier ``write_state`` wrote): ``max(newest committed batch, those versions) + 1`` ms,
    and below the first batch a restart runs (the oldest batch logged but not committed, or
    else the batch after the newest logged one). Batches logged but not committed re-run on
    the written state, whole: their partitions' finish records are deleted. A location
    without a checkpoint (nothing ran there) gets the current wall-clock time, at least one
    ms above the versions stored: a pipeline started there later starts fresh, and its first
    batch time is later. It is refused when a batch below the newest committed one was
    logged but never committed (run the pipeline to catch up first), or when no version is
    free below the next batch (after a batch interval's worth of ``write_state`` calls in a
    row; run one batch first).

    Crash-safe as a rescale is: the state goes into a new generation of state files and the
    metadata is switched last, so a crash (or a failed task, e.g. a duplicate key) part-way
    leaves the old state in force. The previous generation's files are kept until the next
    ``write_state``, so a DataFrame read from it (such as ``df`` itself, when it came from
    ``read_state``) can still be evaluated afterwards; older versions are no longer listed
    by ``state_versions`` nor readable with ``read_state``.

    Step 1: take the lease.
    Step 2: the target layout and schema; check ``df`` against them.
    Step 3: read the event log and choose the version.
    Step 4: write one snapshot per partition into the new generation.
    Step 5: switch the metadata to it.
    Step 6: forget the finish records of batches that re-run; delete generations before the previous one.
    """
    if num_partitions is not None and num_partitions < 1:
        raise ConfigurationError(f"num_partitions must be at least 1; got {num_partitions}")
    if timeout is not None and not isinstance(timeout, GroupStateTimeout):
        raise ConfigurationError(f"timeout must be a GroupStateTimeout (e.g. GroupStateTimeout.NO_TIMEOUT); "
                                 f"got {timeout!r}")
    files = FileStateStore.open(checkpoint, operator, storage_options)
    # Step 1
    lease = Lease(files.storage, SystemClock(), 15_000)
    try:
        lease.acquire()
    except CheckpointLockedError as error:
        holder = lease.read()
        raise CheckpointLockedError(
            f"cannot write the state of operator {operator!r}: checkpoint location {files.storage.url} is held by "
            f"driver {holder.describe() if holder else '(unknown)'}, which may change the state at any batch. "
            "write_state works on a stopped pipeline: stop that driver (ssc.stop(graceful=True), or Ctrl-C for "
            "`batchline run`), write the state, then start the pipeline again"
        ) from error
    try:
        return _write_state(files, operator, df, key_columns, state_schema, num_partitions, timeout)
    finally:
        lease.release()


def _write_state(files: FileStateStore, operator: str, df: DataFrame, key_columns: Sequence[str] | None,
                 state_schema: Any | None, num_partitions: int | None,
                 timeout: GroupStateTimeout | None) -> WriteStateResult:
    # Step 2
    stored = files.read_metadata()
    target, state = _target_layout(files, stored, df, key_columns, state_schema, num_partitions, timeout)
    _check_frame(df, target, state, operator)
    # Step 3
    history = _History.read(files.storage)
    version = _new_version(files, stored, history)
    # Step 4
    files.delete_generation(target.generation)  # leftovers of a crashed write or rescale
    try:
        keys = write_state_frame(df, files, target, state, version, initial=False)
    except Exception as error:
        files.delete_generation(target.generation)
        duplicate = DuplicateStateKeyError.carried_in(error)
        if duplicate is None:
            raise
        key_names = target.key_schema.fieldNames()
        raise ConfigurationError(
            f"the DataFrame has key {duplicate.key_repr} more than once, and the state holds one row per key; "
            f"keep one row for each key (e.g. df.dropDuplicates({key_names}), or aggregate by {key_names}). "
            f"Nothing was written: operator {operator!r} keeps its state"
        ) from None
    # Step 5
    files.write_metadata(target)
    # Step 6
    if stored is not None:
        events = JobEventStore(files.storage)
        for batch_time in history.uncommitted:
            events.forget_finished(batch_time, operator, stored.generation, stored.num_partitions)
            logger.info("Batch %s was logged but not committed: it re-runs whole on the written state of "
                        "operator %s", format_batch_time(batch_time), operator)
        _delete_generations_below(files, stored.generation)
    logger.info("Wrote the state of operator %s at %s: %d keys in %d partitions as version %d (%s)%s", operator,
                files.storage.url, keys, target.num_partitions, version, format_batch_time(version),
                "; the operator is new there" if stored is None else "")
    return WriteStateResult(operator, version, keys, target.num_partitions, stored is None)


def _target_layout(files: FileStateStore, stored: StateMetadata | None, df: DataFrame,
                   key_columns: Sequence[str] | None, state_schema: Any | None, num_partitions: int | None,
                   timeout: GroupStateTimeout | None) -> tuple[StateMetadata, RowSchema]:
    """The metadata the written state gets, and its state schema."""
    operator = files.operator
    if stored is None:
        needed = [name for name, value in (("key_columns", key_columns), ("state_schema", state_schema))
                  if value is None]
        if needed:
            known = files.storage.list_names(STATE_DIR)
            raise ConfigurationError(
                f"operator {operator!r} has no state at {files.storage.url}, so write_state creates it and needs "
                f"{' and '.join(needed)}: pass key_columns=[...] (the columns of the DataFrame that key the state) "
                "and state_schema=... (the state schema the pipeline's operator declares: a dataclass, a StructType "
                f"or a DDL string). Operators with state there: {known or 'none'}; check the location and the "
                "operator's name if you meant one of them"
            )
        assert key_columns is not None and state_schema is not None
        keys = list(key_columns)
        if not keys:
            raise ConfigurationError("key_columns must name at least one column of the DataFrame")
        absent = [k for k in keys if k not in df.columns]
        if absent:
            raise StateSchemaError(f"key column(s) {absent} are not columns of the DataFrame ({df.columns}); pass "
                                   "key_columns that name columns of it. Nothing was written")
        state = RowSchema.of(state_schema)
        key_schema = StructType([df.schema[k] for k in keys])
        partitions = num_partitions or operator_settings.DEFAULT_STATE_PARTITIONS
        kind = (timeout or GroupStateTimeout.NO_TIMEOUT).name
        return StateMetadata(operator, partitions, 0, key_schema, state.struct, kind, state.stored_defaults()), state
    stored_keys = stored.key_schema.fieldNames()
    if key_columns is not None and list(key_columns) != stored_keys:
        raise ConfigurationError(
            f"operator {operator!r} at {files.storage.url} is keyed by {stored_keys}, not {list(key_columns)}; "
            "the key columns of stored state cannot change. Leave key_columns out, or write the state under "
            "another operator name (and run the pipeline with that name)"
        )
    state = RowSchema.of(state_schema if state_schema is not None else stored.state_schema)
    target = dataclasses.replace(
        stored, num_partitions=num_partitions or stored.num_partitions, generation=stored.generation + 1,
        state_schema=state.struct, timeout=timeout.name if timeout is not None else stored.timeout,
    )
    return target, state


def _check_frame(df: DataFrame, target: StateMetadata, state: RowSchema, operator: str) -> None:
    """Raise ``StateSchemaError`` naming every column of ``df`` that does not fit the state."""
    types: dict[str, list[str]] = {}
    for field in df.schema.fields:
        types.setdefault(field.name, []).append(field.dataType.simpleString())
    keys, names = target.key_schema.fieldNames(), list(state.names)
    problems = [f"column {name!r} appears {len(found)} times; keep one" for name, found in types.items()
                if len(found) > 1]
    for what, fields in (("key column", target.key_schema.fields), ("state field", state.struct.fields)):
        for field in fields:
            want = field.dataType.simpleString()
            if field.name not in types:
                problems.append(f"{what} {field.name!r} ({want}) is missing; add it as a column")
            elif types[field.name][0] != want:
                problems.append(f"{what} {field.name!r} is {types[field.name][0]} in the DataFrame but {want} in the "
                                f"state; cast it (F.col({field.name!r}).cast({want!r}))")
    timeout_type = types.get(TIMEOUT_COLUMN, [None])[0]
    if timeout_type is not None and timeout_type not in _TIMEOUT_TYPES:
        problems.append(f"column {TIMEOUT_COLUMN!r} is {timeout_type}; it holds epoch milliseconds: cast it to "
                        "bigint, or drop it")
    for name in types:
        if name not in keys and name not in names and name != TIMEOUT_COLUMN:
            problems.append(f"column {name!r} is neither a key column {keys}, a state field {names} nor "
                            f"{TIMEOUT_COLUMN!r}; drop it (df.drop({name!r})), or declare it in state_schema")
    if problems:
        raise StateSchemaError(
            f"the DataFrame does not fit the state of operator {operator!r} (keys "
            f"{target.key_schema.simpleString()}, state {state.struct.simpleString()}; types are compared "
            f"without nullability): {'; '.join(problems)}. Nothing was written"
        )


@dataclass(frozen=True)
class _History:
    """What a checkpoint location's event log and newest checkpoint say about the batches a
    restart runs."""

    committed: int | None
    """The newest committed batch."""
    uncommitted: tuple[int, ...]
    """Batches logged after it but not committed: a restart re-runs them."""
    zero_time: int | None
    next_batch: int | None
    """The first batch a restart runs; None without a checkpoint (a pipeline there starts fresh)."""

    @classmethod
    def read(cls, storage: CheckpointStorage) -> _History:
        checkpoint, _ = load_latest_checkpoint(storage)
        events = JobEventStore(storage, checkpoint.batch_interval_ms if checkpoint is not None else None)
        times = sorted(int(name) for name in storage.list_names(EVENTS) if name.isdigit())
        completed = {t for t in times if events.is_completed(t)}
        logged = [t for t in times if events.started(t) is not None]
        committed = max(completed, default=None)
        uncommitted = [t for t in logged if t not in completed]
        pending = [t for t in (checkpoint.pending_times if checkpoint is not None else ()) if t not in completed]
        behind = sorted(t for t in {*uncommitted, *pending} if committed is not None and t < committed)
        if behind:
            assert committed is not None
            raise ConfigurationError(
                f"batch {format_batch_time(behind[0])} at {storage.url} was logged but never committed, while the "
                f"later batch {format_batch_time(committed)} was; a restart runs it again first, on the state before "
                "it. Start the pipeline, let it catch up, stop it, then write the state"
            )
        if checkpoint is None:
            return cls(committed, tuple(uncommitted), None, None)
        last = max([checkpoint.time, *logged])
        next_batch = min([*uncommitted, *pending, last + checkpoint.batch_interval_ms])
        return cls(committed, tuple(uncommitted), checkpoint.zero_time, next_batch)


def _new_version(files: FileStateStore, stored: StateMetadata | None, history: _History) -> int:
    """The version the written state gets (see ``write_state``)."""
    versions: set[int] = set()
    if stored is not None:
        for partition in range(stored.num_partitions):
            versions.update(files.list_versions(stored.generation, partition))
    bound = history.next_batch
    earlier = [v for v in versions if bound is None or v < bound]
    floor = max([*earlier, *(t for t in (history.committed, history.zero_time) if t is not None)], default=None)
    if bound is None:
        return max(SystemClock().now_ms(), floor + 1 if floor is not None else 0)
    version = (floor if floor is not None else bound - 1) + 1
    if version >= bound:
        raise StateVersionError(
            f"operator {files.operator!r} at {files.storage.url} already has a state version at "
            f"{format_batch_time(version - 1)}, just below the batch a restart runs next "
            f"({format_batch_time(bound)}), so no newer version would be read by it. Start the pipeline for one "
            "batch, stop it, then write the state again"
        )
    return version


def _delete_generations_below(files: FileStateStore, generation: int) -> None:
    """Delete the state files of generations before ``generation`` (left by earlier writes)."""
    for name in files.storage.list_names(files.base):
        match = _GENERATION_DIR.fullmatch(name)
        if match is not None and int(match.group(1)) < generation:
            files.delete_generation(int(match.group(1)))
