"""The state store's files (SPEC D4): versioned, per operator and partition, at the
checkpoint location so that every executor reaches them.

Layout under ``<checkpoint>/state/<operator>/``::

    _metadata.json                      partition count, key and state schema (sealed JSON)
    g<generation>/p<partition>/<version>.delta.arrow     the keys one batch changed
    g<generation>/p<partition>/<version>.snapshot.arrow  every key at that version

A version is a batch time. Every batch writes a delta for every partition, empty when
nothing changed, so a re-run batch always overwrites what a failed attempt wrote. Versions
above the last committed batch belong to a batch that will re-run, so loading version ``v``
reads the newest snapshot at or below ``v`` plus the deltas above it. Rescaling writes a new
generation and switches the metadata last.

Files are Arrow IPC: key columns ``key.<name>``, state columns ``state.<field>``,
``__timeout_ms`` (null: none) and ``__removed``. The stored state schema travels in each
file, so new code reads old files by field name (schema evolution, SPEC D5).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from batchline.checkpoint.storage import CheckpointStorage, seal
from batchline.errors import BatchlineError
from batchline.state.schema import RowSchema, as_python

__all__ = ["StateMetadata", "StateFiles", "StateVersionError", "PartitionData", "STATE_DIR"]

logger = logging.getLogger(__name__)

STATE_DIR = "state"
METADATA = "_metadata.json"
DELTA, SNAPSHOT = "delta", "snapshot"
KEY_PREFIX, STATE_PREFIX = "key.", "state."
TIMEOUT_COL, REMOVED_COL = "__timeout_ms", "__removed"


class StateVersionError(BatchlineError):
    """A requested state version is not retained (or was never written)."""


@dataclass(frozen=True)
class StateMetadata:
    """What is fixed for an operator's state: its partition count (SPEC D6) and schemas."""

    operator: str
    num_partitions: int
    generation: int
    key_schema: StructType
    state_schema: StructType
    timeout: str

    def to_json(self) -> dict[str, Any]:
        return {
            "operator": self.operator, "num_partitions": self.num_partitions, "generation": self.generation,
            "key_schema": self.key_schema.jsonValue(), "state_schema": self.state_schema.jsonValue(),
            "timeout": self.timeout,
        }

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> StateMetadata:
        return cls(payload["operator"], payload["num_partitions"], payload["generation"],
                   StructType.fromJson(payload["key_schema"]), StructType.fromJson(payload["state_schema"]),
                   payload["timeout"])


@dataclass
class PartitionData:
    """One partition's state at one version: key -> (state tuple, timeout ms or None)."""

    version: int | None
    entries: dict[Any, tuple[tuple[Any, ...], int | None]]
    deltas_since_snapshot: int = 0
    initial_keys: frozenset[Any] = frozenset()
    """Keys loaded from an initial state and not yet seen by the function (SPEC D8)."""


def _file_name(version: int, kind: str) -> str:
    return f"{version:015d}.{kind}.arrow"


def _parse_name(name: str) -> tuple[int, str] | None:
    parts = name.split(".")
    if len(parts) == 3 and parts[0].isdigit() and parts[1] in (DELTA, SNAPSHOT) and parts[2] == "arrow":
        return int(parts[0]), parts[1]
    return None


class StateFiles:
    """Reads and writes one operator's state files; usable on the driver and on executors."""

    def __init__(self, storage: CheckpointStorage, operator: str) -> None:
        self.storage = storage
        self.operator = operator
        self.base = f"{STATE_DIR}/{operator}"

    @classmethod
    def open(cls, location: str, operator: str, storage_options: dict[str, Any] | None = None) -> StateFiles:
        return cls(CheckpointStorage(location, storage_options), operator)

    # ---------------------------------------------------------------- metadata
    def read_metadata(self) -> StateMetadata | None:
        name = f"{self.base}/{METADATA}"
        if not self.storage.exists(name):
            return None
        return StateMetadata.from_json(self.storage.read_sealed(name))

    def write_metadata(self, metadata: StateMetadata) -> None:
        self.storage.replace(f"{self.base}/{METADATA}", seal(metadata.to_json()))

    def partition_dir(self, generation: int, partition: int) -> str:
        return f"{self.base}/g{generation}/p{partition:05d}"

    # ---------------------------------------------------------------- versions
    def list_versions(self, generation: int, partition: int) -> dict[int, set[str]]:
        """Kinds of file present for each version of a partition."""
        found: dict[int, set[str]] = {}
        for name in self.storage.list_names(self.partition_dir(generation, partition)):
            parsed = _parse_name(name)
            if parsed is not None:
                found.setdefault(parsed[0], set()).add(parsed[1])
        return found

    def write(self, generation: int, partition: int, version: int, kind: str, table: pa.Table,
              extra: dict[str, str] | None = None) -> None:
        """Write (or rewrite, for a retried task) one version's file of a partition."""
        metadata = {b"batchline": json.dumps({"version": version, "partition": partition, **(extra or {})}).encode()}
        table = table.replace_schema_metadata(metadata)
        sink = io.BytesIO()
        with ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        self.storage.replace(f"{self.partition_dir(generation, partition)}/{_file_name(version, kind)}",
                             sink.getvalue())

    def purge(self, generation: int, partition: int, retain: int) -> int:
        """Delete files no longer needed to load the newest ``retain`` versions: everything
        below the newest snapshot at or under the oldest retained version."""
        versions = self.list_versions(generation, partition)
        ordered = sorted(versions)
        if len(ordered) <= retain:
            return 0
        oldest_kept = ordered[-retain]
        floors = [v for v in ordered if v <= oldest_kept and SNAPSHOT in versions[v]]
        if not floors:
            return 0
        removed = 0
        for v in ordered:
            if v >= floors[-1]:
                break
            for kind in versions[v]:
                self.storage.delete(f"{self.partition_dir(generation, partition)}/{_file_name(v, kind)}")
                removed += 1
        return removed

    def read(self, generation: int, partition: int, version: int, kind: str) -> pa.Table:
        data = self.storage.read(f"{self.partition_dir(generation, partition)}/{_file_name(version, kind)}")
        return ipc.open_file(pa.BufferReader(data)).read_all()

    def plan_load(self, generation: int, partition: int, version: int | None, below: int | None = None,
                  since: int | None = None) -> tuple[int | None, list[tuple[int, str]]]:
        """The files to read for a partition: at ``version`` exactly, or (``below``) the newest
        version under that bound. With ``since`` (a version already held) only later deltas are
        read when they follow on from it. Returns (the version reached, [(version, kind)])."""
        versions = self.list_versions(generation, partition)
        candidates = sorted(v for v in versions if (below is None or v < below) and (version is None or v <= version))
        if version is not None and version not in versions:
            raise StateVersionError(
                f"state of operator {self.operator!r}, partition {partition}, has no version {version} at "
                f"{self.storage.url}; retained versions: {_span(sorted(versions))}"
            )
        if not candidates:
            return None, []
        target = candidates[-1]
        if since is not None and since <= target and since in versions:
            later = [v for v in candidates if v > since]
            if all(DELTA in versions[v] for v in later):
                return target, [(v, DELTA) for v in later]
        snapshots = [v for v in candidates if SNAPSHOT in versions[v]]
        start = snapshots[-1] if snapshots else None
        steps: list[tuple[int, str]] = [(start, SNAPSHOT)] if start is not None else []
        for v in candidates:
            if start is None or v > start:
                if DELTA not in versions[v]:
                    raise StateVersionError(
                        f"state of operator {self.operator!r}, partition {partition}: version {v} has no delta "
                        "and no earlier snapshot covers it; the state files are incomplete"
                    )
                steps.append((v, DELTA))
        return target, steps


def _span(versions: list[int]) -> str:
    if not versions:
        return "none"
    return f"{versions[0]} .. {versions[-1]} ({len(versions)} versions)"


# -------------------------------------------------------------------- Arrow codec
def entries_table(key_schema: StructType, state: RowSchema,
                  rows: Iterator[tuple[Any, tuple[Any, ...] | None, int | None]], single_key: bool) -> pa.Table:
    """A delta or snapshot table from (key, state tuple or None for removed, timeout)."""
    keys: list[Any] = []
    states: list[tuple[Any, ...] | None] = []
    timeouts: list[int | None] = []
    for key, value, timeout in rows:
        keys.append(key)
        states.append(value)
        timeouts.append(timeout)
    key_arrow = to_arrow_schema(key_schema, timezone="UTC")
    state_arrow = state.arrow
    columns: list[pa.Array] = []
    names: list[str] = []
    key_columns = [keys] if single_key else (list(map(list, zip(*keys, strict=True))) if keys else
                                             [[] for _ in key_schema.fields])
    for field, values in zip(key_arrow, key_columns, strict=True):
        columns.append(pa.array(values, type=field.type))
        names.append(KEY_PREFIX + field.name)
    width = len(state_arrow)
    filled = [s if s is not None else (None,) * width for s in states]
    state_columns = list(map(list, zip(*filled, strict=True))) if filled else [[] for _ in range(width)]
    for field, values in zip(state_arrow, state_columns, strict=True):
        columns.append(pa.array(values, type=field.type))
        names.append(STATE_PREFIX + field.name)
    columns.append(pa.array(timeouts, type=pa.int64()))
    names.append(TIMEOUT_COL)
    columns.append(pa.array([s is None for s in states], type=pa.bool_()))
    names.append(REMOVED_COL)
    return pa.Table.from_arrays(columns, names=names)


def stored_state_schema(table: pa.Table) -> StructType:
    fields = [f for f in table.schema if f.name.startswith(STATE_PREFIX)]
    schema = from_arrow_schema(pa.schema([f.with_name(f.name[len(STATE_PREFIX):]) for f in fields]))
    return schema


def apply_table(entries: dict[Any, tuple[tuple[Any, ...], int | None]], table: pa.Table, state: RowSchema,
                single_key: bool, what: str) -> list[Any]:
    """Apply a delta or snapshot to ``entries`` (a snapshot to an empty dict); returns the keys."""
    if table.num_rows == 0:
        return []
    key_columns = [as_python(table.column(n)) for n in table.column_names if n.startswith(KEY_PREFIX)]
    keys = key_columns[0] if single_key else list(zip(*key_columns, strict=True))
    reader = state.reader_for(stored_state_schema(table), what)
    state_columns = [as_python(table.column(n)) for n in table.column_names if n.startswith(STATE_PREFIX)]
    values = reader(state_columns)
    timeouts = table.column(TIMEOUT_COL).to_pylist()
    removed = table.column(REMOVED_COL).to_pylist()
    for key, value, timeout, gone in zip(keys, values, timeouts, removed, strict=True):
        if gone:
            entries.pop(key, None)
        else:
            entries[key] = (value, timeout)
    return keys
