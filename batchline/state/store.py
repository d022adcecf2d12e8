"""The state store (SPEC D4): versioned state files per operator and partition, behind a
small interface, with one implementation over the checkpoint location and one in memory.

``StateStore`` is what the operator, its tasks, the DataFrame reader/writer and the offline
tools need of a store. Its unit is one *version file*: the table of one version of one
partition, of one kind (a ``delta``: the keys a batch changed, or a ``snapshot``: every key
at that version), with a typed ``FileHeader``.

- ``FileStateStore`` keeps them at the checkpoint location so that every executor reaches
  them; it travels to Spark tasks as URL and options, and each worker opens its own file
  system. Layout under ``<checkpoint>/state/<operator>/``::

      _metadata.json                                       partition count, schemas (sealed JSON)
      g<generation>/p<partition>/<version>.delta.arrow     the keys one batch changed
      g<generation>/p<partition>/<version>.snapshot.arrow  every key at that version

- ``MemoryStateStore`` keeps the same bytes in a dict of this process, for unit tests and
  for running the per-key path without Spark. It refuses to be pickled, so it can never be
  shipped to Spark workers by mistake.

A version is a batch time. Every batch writes a delta for every partition, empty when
nothing changed, so a re-run batch always overwrites what a failed attempt wrote. Versions
above the last committed batch belong to a batch that will re-run, so loading version ``v``
reads the newest snapshot at or below ``v`` plus the deltas above it. Rescaling writes a new
generation and switches the metadata last.

Files are Arrow IPC: key columns ``key.<name>``, state columns ``state.<field>``,
``__timeout_ms`` (null: none) and ``__removed`` (no state: a removed key, or with a timeout a key
that keeps its timer without state, as Spark allows); the header is JSON under the ``batchline``
key of the schema metadata. The stored state schema travels in each file, so new code reads
old files by field name (schema evolution, SPEC D5).
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import enum
import functools
import io
import json
import logging
import os
import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import pyarrow as pa
import pyarrow.ipc as ipc
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, seal
from batchline.errors import BatchlineError, CarriedError, DamagedFileError
from batchline.state.entries import (
    KEY_PREFIX,
    STATE_PREFIX,
    StateEntries,
    as_entries,
    decode_keys,
    layout_of,
    rows_table,
)
from batchline.state.schema import RowSchema, as_python

__all__ = [
    "DELTA",
    "OUTPUT",
    "KeptOutputLostError",
    "SNAPSHOT",
    "STATE_DIR",
    "FileHeader",
    "FileStateStore",
    "MemoryStateStore",
    "PartitionData",
    "StateFiles",
    "StateMetadata",
    "StateStore",
    "StateStoreError",
    "StateVersionError",
    "VersionFile",
    "apply_tables",
    "entries_table",
]

logger = logging.getLogger(__name__)

STATE_DIR = "state"
READS_AT_ONCE = 4
"""Version files a load reads side by side from an object store (one round trip for up to this many)."""
METADATA = "_metadata.json"


class FileKind(enum.StrEnum):
    """A version's files: the keys the batch changed, every key, and the rows the batch output
    (kept so that a restart reads a finished partition's output back instead of recomputing it).
    A ``StrEnum``: the value is the file name's suffix and the header's ``kind``."""

    DELTA = "delta"
    SNAPSHOT = "snapshot"
    OUTPUT = "output"


DELTA, SNAPSHOT, OUTPUT = FileKind.DELTA, FileKind.SNAPSHOT, FileKind.OUTPUT
KINDS = tuple(FileKind)
HEADER_KEY = b"batchline"
HEADER_FORMAT = 1


class StateVersionError(BatchlineError):
    """A requested state version is not retained (or was never written)."""


class StateStoreError(BatchlineError):
    """The state store was used in a way it cannot support, or holds a file it cannot read."""


class DamagedStateFileError(DamagedFileError):
    """A state file that does not verify."""

    kind = "state file"
    consequence = "batchline stops rather than go on with state it cannot verify"
    remedy = "start the operator afresh from a new checkpoint location (its state is lost)"


class KeptOutputLostError(CarriedError):
    """A partition a restart kept (its rows were left out of the re-run batch's shuffle) cannot
    read back the output it stored: running its function now would see none of its rows and
    lose them. Not retryable (a retry gets the same shuffle); the next start finds the output
    unreadable before it decides what to keep, and runs the partition again whole."""

    retryable = False
    attributes = ("operator", "partition", "batch_time", "path", "problem")

    def __init__(self, operator: str, partition: int, batch_time: int, path: str, problem: str,
                 carry: bool = True) -> None:
        self.operator = operator
        self.partition = partition
        self.batch_time = batch_time
        self.path = path
        self.problem = problem
        super().__init__(
            f"partition {partition} of operator {operator!r} was kept from before the restart in batch {batch_time} "
            f"(its rows were left out of the batch's shuffle), but its stored output {path} can no longer be read: "
            f"{problem}. Nothing was written for the batch. Start the pipeline again: the restart finds the output "
            "unreadable and runs the partition again whole", carry)


# -------------------------------------------------------------------- records
@dataclass(frozen=True)
class StateMetadata:
    """What is fixed for an operator's state: its partition count (SPEC D6) and schemas."""

    operator: str
    num_partitions: int
    generation: int
    key_schema: StructType
    state_schema: StructType
    timeout: str
    state_defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The state dataclass's field defaults (plain JSON), so that an offline read fills a field
    an older version lacks as the state function sees it. Absent from metadata written before
    they were kept: such fields read as null."""

    def to_json(self) -> dict[str, Any]:
        return {
            "operator": self.operator, "num_partitions": self.num_partitions, "generation": self.generation,
            "key_schema": self.key_schema.jsonValue(), "state_schema": self.state_schema.jsonValue(),
            "timeout": self.timeout, "state_defaults": self.state_defaults,
        }

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> StateMetadata:
        return cls(payload["operator"], payload["num_partitions"], payload["generation"],
                   StructType.fromJson(payload["key_schema"]), StructType.fromJson(payload["state_schema"]),
                   payload["timeout"], dict(payload.get("state_defaults") or {}))


@dataclass(frozen=True)
class FileHeader:
    """What a version file says about itself, kept in its Arrow schema metadata."""

    version: int
    partition: int
    kind: FileKind
    initial: bool = False
    """A snapshot written from an initial state: the function is called once for each of its
    keys in the first batch (SPEC D8)."""
    format: int = HEADER_FORMAT
    first: bool | None = None
    """For a delta: whether it was written on no earlier version (the partition's first), so
    that it and the deltas after it hold the whole state; a chain of deltas that starts with
    one that is not first needs the snapshot under it. None: written before deltas said."""

    def __post_init__(self) -> None:
        if self.version < 0 or self.partition < 0:
            raise StateStoreError(f"state versions are batch times and partitions are numbered from 0; got version "
                                  f"{self.version}, partition {self.partition}. Pass the batch time in epoch ms")
        if self.kind not in KINDS:
            raise StateStoreError(f"a state file is one of {tuple(k.value for k in FileKind)}, not {self.kind!r}; "
                                  "pass a FileKind (the store's DELTA, SNAPSHOT or OUTPUT)")
        object.__setattr__(self, "kind", FileKind(self.kind))  # a plain "delta" is taken as the member

    def to_metadata(self) -> dict[bytes, bytes]:
        return {HEADER_KEY: json.dumps(dataclasses.asdict(self), sort_keys=True).encode()}

    @classmethod
    def from_metadata(cls, metadata: dict[bytes, bytes] | None, kind: FileKind, where: str) -> FileHeader:
        """The header of a file read as ``kind``; files written before headers were typed
        carry only version, partition and perhaps ``initial``, and read the same."""
        raw = (metadata or {}).get(HEADER_KEY)
        if raw is None:
            raise StateStoreError(f"{where} has no batchline header; it was not written by batchline's state "
                                  "store. Remove it from the state directory, or restore the original file")
        try:
            payload = json.loads(raw)
            return cls(version=int(payload["version"]), partition=int(payload["partition"]),
                       kind=FileKind(payload.get("kind", kind)), initial=bool(payload.get("initial", False)),
                       format=int(payload.get("format", HEADER_FORMAT)),
                       first=None if payload.get("first") is None else bool(payload["first"]))
        except (ValueError, KeyError, TypeError) as error:
            raise StateStoreError(f"{where} has an unreadable header ({error}); restore the file from a copy "
                                  "of the checkpoint, or remove the operator's state to start it afresh") from error


@dataclass(frozen=True)
class VersionFile:
    """One version file, read back: its header and its table."""

    header: FileHeader
    table: pa.Table


@dataclass
class PartitionData:
    """One partition's state at one version: key -> (state tuple, timeout ms or None). A key
    may hold a timeout and no state (None), as Spark keeps a timeout set after ``remove()``."""

    version: int | None
    entries: StateEntries
    deltas_since_snapshot: int = 0
    initial_keys: frozenset[Any] = frozenset()
    """Keys loaded from an initial state and not yet seen by the function (SPEC D8)."""


_CHECKSUM_TRAILER = b"BLCRC32:"
"""After a version file's Arrow IPC bytes: this, then their CRC-32 (4 bytes, big-endian)."""
_TRAILER_SIZE = len(_CHECKSUM_TRAILER) + 4


def encode_version_file(header: FileHeader, table: pa.Table) -> bytes:
    """A table and its header as the bytes of an Arrow IPC file, then their checksum: a byte
    flipped anywhere (a bad disk, a bad copy) is found when the file is read."""
    table = table.replace_schema_metadata(header.to_metadata())
    sink = io.BytesIO()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    sink.write(_CHECKSUM_TRAILER + struct.pack(">I", zlib.crc32(sink.getbuffer())))
    return sink.getvalue()


def decode_version_file(data: bytes, kind: FileKind, where: str) -> VersionFile:
    """The file's header and table, once its checksum matched. A file without a checksum (as
    releases before checksums wrote them) is read when it is a whole Arrow IPC file."""
    if not data:
        raise _damaged(where, "it is empty (0 bytes)")
    if data[-_TRAILER_SIZE:-4] == _CHECKSUM_TRAILER:
        body = memoryview(data)[:-_TRAILER_SIZE]
        (expected,) = struct.unpack(">I", data[-4:])
        if zlib.crc32(body) != expected:
            raise _damaged(where, "its checksum does not match its content (bytes were changed after it was "
                                  "written)")
    else:
        body = memoryview(data)
    try:
        table = ipc.open_file(pa.BufferReader(body)).read_all()
    except (pa.ArrowInvalid, OSError) as error:
        raise _damaged(where, f"it is cut short or is not an Arrow IPC file ({len(data)} bytes; {error})") from None
    return VersionFile(FileHeader.from_metadata(table.schema.metadata, kind, where), table)


def _damaged(where: str, problem: str) -> DamagedStateFileError:
    """The error for a damaged file: carried to the driver when raised in a Spark task."""
    from pyspark import TaskContext

    return DamagedStateFileError(where, problem, carry=TaskContext.get() is not None)


# -------------------------------------------------------------------- the interface
class StateStore(abc.ABC):
    """One operator's versioned state: metadata, and one file per (generation, partition,
    version, kind). Usable on the driver and, for stores that can travel, in Spark tasks.

    Subclasses implement storage (metadata, write, read, list, delete) and say how they
    travel to Spark tasks (``__reduce__``); loading plans and clean-up are built on those.
    """

    reads_at_once: int = 1
    """How many version files a load reads side by side (``read_versions``): on an object
    store each read is a round trip, and a partition that comes back to a worker several
    versions behind, or loads after a restart, reads several."""

    def __init__(self, operator: str) -> None:
        self.operator = operator

    # ---------------------------------------------------------------- what subclasses provide
    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the state lives, for messages; also identifies the store in a worker's cache
        of resident partitions, so two stores never share one."""

    @abc.abstractmethod
    def __reduce__(self) -> tuple[Any, ...]:
        """How the store travels to Spark tasks inside the task closure, or an error saying
        why it cannot."""

    @abc.abstractmethod
    def read_metadata(self) -> StateMetadata | None:
        """The operator's metadata, or None when it has no state yet."""

    @abc.abstractmethod
    def write_metadata(self, metadata: StateMetadata) -> None:
        """Replace the metadata in one step."""

    @abc.abstractmethod
    def list_versions(self, generation: int, partition: int) -> dict[int, set[FileKind]]:
        """The kinds of file present for each version of a partition."""

    @abc.abstractmethod
    def write_version(self, generation: int, header: FileHeader, table: pa.Table) -> int:
        """Write (or rewrite, for a retried task) the file ``header`` describes; the bytes written."""

    @abc.abstractmethod
    def read_version(self, generation: int, partition: int, version: int, kind: FileKind) -> VersionFile:
        """One version file with its header."""

    @abc.abstractmethod
    def has_version(self, generation: int, partition: int, version: int, kind: FileKind) -> bool:
        """Whether that version file is there, without reading it."""

    @abc.abstractmethod
    def delete_version(self, generation: int, partition: int, version: int, kind: FileKind) -> None:
        """Delete one version file; nothing happens when it is already gone."""

    def delete_versions(self, generation: int, partition: int, files: Sequence[tuple[int, FileKind]]) -> None:
        """Delete these version files of a partition, those already gone included."""
        for version, kind in files:
            self.delete_version(generation, partition, version, kind)

    @abc.abstractmethod
    def delete_generation(self, generation: int) -> None:
        """Delete every file of a generation (an old one after a rescale, or a crashed rescale's)."""

    # ---------------------------------------------------------------- built on them
    def read_versions(self, generation: int, partition: int,
                      steps: Sequence[tuple[int, FileKind]]) -> Iterator[VersionFile]:
        """The version files ``steps`` names, in their order, up to ``reads_at_once`` of them
        read side by side; a read's error is raised where its file comes, and the reads after
        it are dropped."""
        return read_ahead([functools.partial(self.read_version, generation, partition, v, kind) for v, kind in steps],
                          self.reads_at_once)

    def describe_partition(self, partition: int) -> str:
        return f"state of operator {self.operator!r}, partition {partition}"

    def partition_location(self, generation: int, partition: int) -> str:
        """Where a partition's files are, for messages."""
        return f"{self.location}/{STATE_DIR}/{self.operator}/g{generation}/p{partition:05d}"

    def file_location(self, generation: int, partition: int, version: int, kind: FileKind) -> str:
        """Where one version file is (or would be), for messages."""
        return f"{self.partition_location(generation, partition)}/{_file_name(version, kind)}"

    def read_problem(self, generation: int, partition: int, version: int, kind: FileKind) -> tuple[str, str] | None:
        """Where that version file is and why it cannot be read back whole (missing, damaged,
        not batchline's, unreadable); None when it reads whole. It reads the file, checksum
        and all: asked only of the few files a restart means to trust without writing them again."""
        where = self.file_location(generation, partition, version, kind)
        try:
            self.read_version(generation, partition, version, kind)
        except (FileNotFoundError, StateVersionError):
            return where, "it is missing"
        except DamagedStateFileError as error:
            return error.path, error.problem
        except (StateStoreError, OSError) as error:
            # Whatever the reason, the file is not one to build on: running again is exact.
            return where, f"it cannot be read ({error})"
        return None

    def purge(self, generation: int, partition: int, retain: int, committed_through: int | None = None) -> int:
        """Delete files no longer needed to load the newest ``retain`` versions: everything
        below the newest snapshot at or under the oldest retained version; and the outputs of
        versions up to ``committed_through``, which no restart reads again."""
        versions = self.list_versions(generation, partition)
        ordered = sorted(versions)
        going: list[tuple[int, FileKind]] = []
        if committed_through is not None:
            for v in ordered:
                if v <= committed_through and OUTPUT in versions[v]:
                    going.append((v, OUTPUT))
                    versions[v].discard(OUTPUT)
        if len(ordered) > retain:
            oldest_kept = ordered[-retain]
            floors = [v for v in ordered if v <= oldest_kept and SNAPSHOT in versions[v]]
            if floors:
                going += [(v, kind) for v in ordered if v < floors[-1] for kind in sorted(versions[v])]
        self.delete_versions(generation, partition, going)  # on an object store, one request
        return len(going)

    def plan_load(self, generation: int, partition: int, version: int | None, below: int | None = None,
                  since: int | None = None, without_snapshots: frozenset[int] = frozenset()) \
            -> tuple[int | None, list[tuple[int, FileKind]]]:
        """The files to read for a partition: at ``version`` exactly, or (``below``) the newest
        version under that bound. With ``since`` (a version already held) only later deltas are
        read when they follow on from it. Snapshots of ``without_snapshots`` (found damaged) are
        not used: an older snapshot and the deltas after it stand in. Returns (the version
        reached, [(version, kind)])."""
        versions = self.list_versions(generation, partition)
        candidates = sorted(v for v in versions if (below is None or v < below) and (version is None or v <= version))
        if version is not None and version not in versions:
            raise StateVersionError(
                f"{self.describe_partition(partition)} has no version {version} at {self.location}; retained "
                f"versions: {_span(sorted(versions))}. Read one of the retained versions, or restore the "
                "checkpoint's state directory if files were removed by hand"
            )
        if not candidates:
            return None, []
        target = candidates[-1]
        if since is not None and since <= target and since in versions:
            later = [v for v in candidates if v > since]
            if all(DELTA in versions[v] for v in later):
                return target, [(v, DELTA) for v in later]
        snapshots = [v for v in candidates if SNAPSHOT in versions[v] and v not in without_snapshots]
        start = snapshots[-1] if snapshots else None
        steps: list[tuple[int, FileKind]] = [(start, SNAPSHOT)] if start is not None else []
        for v in candidates:
            if start is None or v > start:
                if DELTA not in versions[v]:
                    raise StateVersionError(
                        f"{self.describe_partition(partition)}: version {v} has no delta "
                        f"({self.file_location(generation, partition, v, DELTA)} is missing) and no earlier snapshot "
                        f"covers it at {self.location}; the state files are incomplete. Restore the state "
                        "directory from a copy of the checkpoint"
                    )
                steps.append((v, DELTA))
        return target, steps

    def _check_header(self, found: VersionFile, generation: int, partition: int, version: int, kind: FileKind,
                      where: str) -> VersionFile:
        header = found.header
        if (header.version, header.partition, header.kind) != (version, partition, kind):
            raise StateStoreError(
                f"{where} says it holds {header.kind} version {header.version} of partition {header.partition}, "
                f"not {kind} version {version} of partition {partition} (generation {generation}); state files "
                "were moved or renamed. Put them back where they were written"
            )
        return found


_T = TypeVar("_T")
_read_pool: tuple[int, ThreadPoolExecutor] | None = None
_read_pool_lock = threading.Lock()


def read_ahead(reads: Sequence[Callable[[], _T]], at_once: int) -> Iterator[_T]:
    """The results of ``reads`` in their order, with up to ``at_once`` of them running side
    by side on this process's read threads; each read's error is raised in its place."""
    if at_once <= 1 or len(reads) <= 1:
        return (read() for read in reads)
    return _read_ahead(reads, at_once)


def _read_ahead(reads: Sequence[Callable[[], _T]], at_once: int) -> Iterator[_T]:
    pool, upcoming = _reads_pool(), iter(reads)
    running: collections.deque[Future[_T]] = collections.deque(pool.submit(read) for _, read in zip(
        range(at_once), upcoming, strict=False))
    try:
        while running:
            result = running.popleft().result()
            following = next(upcoming, None)
            if following is not None:
                running.append(pool.submit(following))
            yield result
    finally:
        for left in running:  # after an error, or a caller that stopped reading
            left.cancel()


def _reads_pool() -> ThreadPoolExecutor:
    """The read threads of this process: made by the process that uses them, as a forked
    Python worker has none of its parent's threads."""
    global _read_pool
    with _read_pool_lock:
        if _read_pool is None or _read_pool[0] != os.getpid():
            _read_pool = (os.getpid(), ThreadPoolExecutor(max_workers=8, thread_name_prefix="batchline-state-read"))
        return _read_pool[1]


def _span(versions: list[int]) -> str:
    if not versions:
        return "none"
    return f"{versions[0]} .. {versions[-1]} ({len(versions)} versions)"


def _file_name(version: int, kind: FileKind) -> str:
    """The name a version file has on disk: the kind's value is its suffix, as files always had."""
    return f"{version:015d}.{kind}.arrow"


def _parse_name(name: str) -> tuple[int, FileKind] | None:
    parts = name.split(".")
    if len(parts) == 3 and parts[0].isdigit() and parts[1] in KINDS and parts[2] == "arrow":
        return int(parts[0]), FileKind(parts[1])
    return None


# -------------------------------------------------------------------- at the checkpoint location
class FileStateStore(StateStore):
    """An operator's state files at the checkpoint location (a local path or fsspec URL)."""

    def __init__(self, storage: CheckpointStorage, operator: str) -> None:
        super().__init__(operator)
        self.storage = storage
        self.base = f"{STATE_DIR}/{operator}"
        # A local file is read in a fraction of a thread's hand-over; a remote one in a round trip.
        self.reads_at_once = 1 if storage.is_local else READS_AT_ONCE

    @classmethod
    def open(cls, location: str, operator: str, storage_options: dict[str, Any] | None = None) -> FileStateStore:
        return cls(CheckpointStorage(location, storage_options), operator)

    def __reduce__(self) -> tuple[Any, ...]:
        # The storage travels as URL and options; each worker opens its own file system.
        return (type(self), (self.storage, self.operator))

    def __repr__(self) -> str:
        return f"FileStateStore({self.storage.url!r}, {self.operator!r})"

    @property
    def location(self) -> str:
        return self.storage.url

    def read_metadata(self) -> StateMetadata | None:
        name = f"{self.base}/{METADATA}"
        if not self.storage.exists(name):
            found = self._state_written_without_metadata()
            if found is not None:
                raise StateStoreError(
                    f"the state metadata {self.storage.full_url(name)} of operator {self.operator!r} is missing, but "
                    f"batches wrote its state ({found}): without it the partition count, generation and schemas "
                    "are unknown, and state read under others would be wrong. Restore the file from a copy of the "
                    "checkpoint location; without a copy, start the operator afresh from a new checkpoint location")
            return None
        try:
            return StateMetadata.from_json(self.storage.read_sealed(name))
        except (CorruptFileError, KeyError, TypeError, ValueError) as error:
            raise StateStoreError(
                f"the state metadata of operator {self.operator!r} is damaged: {error}. It holds the partition "
                "count, generation and schemas of the state, so nothing runs without it. Restore the file from a "
                "copy of the checkpoint location; without a copy, start the operator afresh from a new checkpoint "
                "location") from error

    def _state_written_without_metadata(self) -> str | None:
        """A delta of any partition, when there is one: batches ran, so the metadata existed (an
        initial state, written before its metadata, has snapshots only). Listed: only when the
        metadata is missing."""
        for generation in self.storage.list_names(self.base):
            if not (generation.startswith("g") and generation[1:].isdigit()):
                continue
            for partition in self.storage.list_names(f"{self.base}/{generation}"):
                for name in self.storage.list_names(f"{self.base}/{generation}/{partition}"):
                    if name.endswith(f".{DELTA}.arrow"):
                        return self.storage.full_url(f"{self.base}/{generation}/{partition}/{name}")
        return None

    def write_metadata(self, metadata: StateMetadata) -> None:
        self.storage.replace(f"{self.base}/{METADATA}", seal(metadata.to_json()))

    def partition_dir(self, generation: int, partition: int) -> str:
        return f"{self.base}/g{generation}/p{partition:05d}"

    def _path(self, generation: int, partition: int, version: int, kind: FileKind) -> str:
        return f"{self.partition_dir(generation, partition)}/{_file_name(version, kind)}"

    def list_versions(self, generation: int, partition: int) -> dict[int, set[FileKind]]:
        found: dict[int, set[FileKind]] = {}
        for name in self.storage.list_names(self.partition_dir(generation, partition)):
            parsed = _parse_name(name)
            if parsed is not None:
                found.setdefault(parsed[0], set()).add(parsed[1])
        return found

    def write_version(self, generation: int, header: FileHeader, table: pa.Table) -> int:
        data = encode_version_file(header, table)
        self.storage.replace(self._path(generation, header.partition, header.version, header.kind), data)
        return len(data)

    def read_version(self, generation: int, partition: int, version: int, kind: FileKind) -> VersionFile:
        path = self._path(generation, partition, version, kind)
        found = decode_version_file(self.storage.read(path, large=kind is SNAPSHOT), kind,
                                    self.storage.full_url(path))
        return self._check_header(found, generation, partition, version, kind, self.storage.full_url(path))

    def has_version(self, generation: int, partition: int, version: int, kind: FileKind) -> bool:
        return self.storage.has_file(self._path(generation, partition, version, kind))

    def file_location(self, generation: int, partition: int, version: int, kind: FileKind) -> str:
        return self.storage.full_url(self._path(generation, partition, version, kind))

    def delete_version(self, generation: int, partition: int, version: int, kind: FileKind) -> None:
        self.storage.delete(self._path(generation, partition, version, kind))

    def delete_versions(self, generation: int, partition: int, files: Sequence[tuple[int, FileKind]]) -> None:
        self.storage.delete_files([self._path(generation, partition, version, kind) for version, kind in files])

    def delete_generation(self, generation: int) -> None:
        self.storage.delete(f"{self.base}/g{generation}", recursive=True)


StateFiles = FileStateStore
"""The name the file store had before the store interface; kept for existing callers."""


# -------------------------------------------------------------------- in this process
class MemoryStateStore(StateStore):
    """State files as bytes in a dict of this process: for unit tests and for the per-key
    path without Spark. It never leaves the process: pickling it raises ``StateStoreError``."""

    def __init__(self, operator: str) -> None:
        super().__init__(operator)
        self._id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._metadata: dict[str, Any] | None = None
        self._files: dict[tuple[int, int, int, FileKind], bytes] = {}

    def __reduce__(self) -> NoReturn:
        raise StateStoreError(
            f"MemoryStateStore of operator {self.operator!r} holds its state in this Python process only and "
            "cannot be pickled or shipped to Spark workers; use FileStateStore (a checkpoint location) for "
            "anything that runs in Spark, and MemoryStateStore only in-process (tests, StateFunctionTester)"
        )

    def __repr__(self) -> str:
        return f"MemoryStateStore({self.operator!r}, {len(self._files)} files)"

    @property
    def location(self) -> str:
        return f"memory://{self._id}"

    def read_metadata(self) -> StateMetadata | None:
        with self._lock:
            return None if self._metadata is None else StateMetadata.from_json(self._metadata)

    def write_metadata(self, metadata: StateMetadata) -> None:
        payload = json.loads(json.dumps(metadata.to_json()))  # stored as a file would be: no shared objects
        with self._lock:
            self._metadata = payload

    def list_versions(self, generation: int, partition: int) -> dict[int, set[FileKind]]:
        found: dict[int, set[FileKind]] = {}
        with self._lock:
            for g, p, version, kind in self._files:
                if (g, p) == (generation, partition):
                    found.setdefault(version, set()).add(kind)
        return found

    def write_version(self, generation: int, header: FileHeader, table: pa.Table) -> int:
        data = encode_version_file(header, table)
        with self._lock:
            self._files[(generation, header.partition, header.version, header.kind)] = data
        return len(data)

    def read_version(self, generation: int, partition: int, version: int, kind: FileKind) -> VersionFile:
        where = f"{self.location}/g{generation}/p{partition}/{_file_name(version, kind)}"
        with self._lock:
            data = self._files.get((generation, partition, version, kind))
        if data is None:
            raise StateVersionError(f"{self.describe_partition(partition)} has no {kind} at version {version} in "
                                    f"{self.location}; list_versions() shows what the store holds")
        return self._check_header(decode_version_file(data, kind, where), generation, partition, version, kind, where)

    def has_version(self, generation: int, partition: int, version: int, kind: FileKind) -> bool:
        with self._lock:
            return (generation, partition, version, kind) in self._files

    def delete_version(self, generation: int, partition: int, version: int, kind: FileKind) -> None:
        with self._lock:
            self._files.pop((generation, partition, version, kind), None)

    def delete_generation(self, generation: int) -> None:
        with self._lock:
            for name in [name for name in self._files if name[0] == generation]:
                del self._files[name]


# -------------------------------------------------------------------- Arrow codec
def entries_schema(key_schema: StructType, state: RowSchema) -> pa.Schema:
    """The layout of a delta or snapshot table: key columns, state columns, timeout, removed."""
    key_arrow = to_arrow_schema(key_schema, timezone="UTC")
    return layout_of((f.with_name(KEY_PREFIX + f.name) for f in key_arrow), state.arrow)


def entries_table(key_schema: StructType, state: RowSchema,
                  rows: Iterator[tuple[Any, tuple[Any, ...] | None, int | None]], single_key: bool) -> pa.Table:
    """A delta or snapshot table from (key, state tuple or None for no state, timeout): a row
    without state is marked removed, and keeps its timeout if it has one."""
    return rows_table(entries_schema(key_schema, state), rows, single_key)


def stored_state_schema(table: pa.Table) -> StructType:
    fields = [f for f in table.schema if f.name.startswith(STATE_PREFIX)]
    schema = from_arrow_schema(pa.schema([f.with_name(f.name[len(STATE_PREFIX):]) for f in fields]))
    return schema


def apply_tables(entries: StateEntries, tables: Iterable[pa.Table], state: RowSchema, single_key: bool,
                 what: str, into_base: bool = False) -> None:
    """Apply deltas (after a snapshot, if any) read from the files to ``entries``, oldest
    first; ``into_base``: merged into the entries' Arrow base whatever their size (a whole
    load). State written under an earlier schema is read into the current one (SPEC D5). A
    removed row with a timeout is a key that keeps its timeout without state."""
    run: list[pa.Table] = []
    for table in tables:
        if table.num_rows == 0:
            continue
        stored = stored_state_schema(table)
        reader = state.reader_for(stored, what)
        if stored.simpleString() == state.struct.simpleString():
            if entries.blank:
                entries.merge([table])  # the base, as it was read (not held beside the deltas)
            else:
                run.append(table)  # merged as Arrow, a run at a time
            continue
        entries.merge(run, into_base)
        run = []
        # Written under an earlier schema: read into the current one in Python (a later delta
        # of the same load may still replace these values).
        keys = decode_keys(table, single_key)
        values = reader([as_python(table.column(n)) for n in table.column_names if n.startswith(STATE_PREFIX)])
        layout = layout_of((f for f in table.schema if f.name.startswith(KEY_PREFIX)), state.arrow)
        entries.update(as_entries(keys, values, table), layout)
    entries.merge(run, into_base)
