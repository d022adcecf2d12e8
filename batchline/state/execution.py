"""A stateful operator's work inside one Spark task: one state partition, one batch.

Runs in the Python worker under ``mapInArrow``. Rows arrive as Arrow batches and are grouped
by key in plain Python; the state function is called once per key with plain row tuples,
never with a DataFrame per key. The partition's state stays resident in the worker between
batches (SPEC D4), keyed by checkpoint location, operator, generation and partition: the
next batch finds it at the version it needs, catches up from the deltas other workers wrote
when it is behind, and loads from the store when the driver is new. A task that fails, or
is abandoned, drops the partition from the cache, so no half-applied batch survives.

``run_partition`` needs no Spark: it takes the ``OperatorSpec``, the ``BatchParams``, Arrow
batches, and a callback for its ``Stats`` (``spark_task`` wraps it for ``mapInArrow`` with a
Spark accumulator; ``StateFunctionTester`` calls it directly over a ``MemoryStateStore``).
A failure of the state function leaves as one ``StateFunctionError``, built in ``_failure``.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import threading
import traceback
from collections.abc import Callable, Container, Iterable, Iterator
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from batchline.checkpoint.events import PartitionFinished
from batchline.checkpoint.lease import check_token
from batchline.errors import ConfigurationError
from batchline.state.bulk import BulkResult, DueKeys, KeyedRows, MergesInBulk, TimesOutInBulk
from batchline.state.collector import paused_collector
from batchline.state.contract import (
    BATCH_PARAMS_PROPERTY,
    MARKER_COLUMN,
    BatchParams,
    ErrorKind,
    OperatorSpec,
    PartitionFacts,
    StateFunctionError,
    Stats,
    batch_params_from_property,
)
from batchline.state.entries import (
    KEY_PREFIX,
    REMOVED_COL,
    TIMEOUT_COL,
    UNKNOWN,
    StateEntries,
    codable,
    give_memory_back,
    key_codes,
)
from batchline.state.group_state import NO_TIMESTAMP, GroupState, last_due
from batchline.state.schema import RowSchema, as_python
from batchline.state.store import (
    DELTA,
    OUTPUT,
    SNAPSHOT,
    DamagedStateFileError,
    FileHeader,
    KeptOutputLostError,
    PartitionData,
    StateStore,
    StateVersionError,
    apply_tables,
    entries_schema,
    entries_table,
)
from batchline.streams.event_time import epoch_ms

__all__ = ["PartitionCache", "PartitionEnd", "StateFunctionError", "StateTask", "Stats", "beside_store",
           "load_partition", "run_partition", "spark_task"]

logger = logging.getLogger(__name__)

SNAPSHOT_EVERY = 10
"""Deltas after which a worker writes a snapshot of a committed version in the background."""
MAX_CACHED_PARTITIONS = 512
_T = TypeVar("_T")


@dataclass
class _Cached:
    token: int
    data: PartitionData
    bytes_per_key: float = 0.0
    """The mean Arrow size of a row of the partition's latest non-empty delta: what a key's
    state is estimated to weigh (progress records' ``state_bytes``)."""


_CacheKey = tuple[str, str, int, int]


class PartitionCache:
    """Partitions resident in a worker between batches, least recently used dropped first.
    Taking a partition removes it: only a task that completes puts it back."""

    def __init__(self, capacity: int = MAX_CACHED_PARTITIONS) -> None:
        self.capacity = capacity
        self._entries: collections.OrderedDict[_CacheKey, _Cached] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, key: _CacheKey) -> _Cached | None:
        with self._lock:
            return self._entries.pop(key, None)

    def peek(self, key: _CacheKey) -> _Cached | None:
        """The partition, left in place."""
        with self._lock:
            return self._entries.get(key)

    def put(self, key: _CacheKey, cached: _Cached) -> None:
        with self._lock:
            self._entries[key] = cached
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


WORKER_CACHE = PartitionCache()
"""The Python worker's cache, shared by every task the worker runs."""


class StateTask:
    """The ``mapInArrow`` function of the operator's DataFrame for one batch: reads its
    ``BatchParams`` from the job's local property and runs its partition. ``report`` is
    called once with the task's ``Stats`` (a Spark accumulator's ``add``). Called as a
    function, it ends once its partition's finish record is durable; ``run`` with a list of
    ``PartitionEnd`` leaves that to a caller that has more to do in the same task first."""

    def __init__(self, spec: OperatorSpec, batch_time: int, report: Callable[[Stats], None]) -> None:
        self.spec, self.batch_time, self.report = spec, batch_time, report

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return self.run(batches, None)

    def run(self, batches: Iterator[pa.RecordBatch], endings: list[PartitionEnd] | None) -> Iterator[pa.RecordBatch]:
        spec, batch_time = self.spec, self.batch_time
        context = TaskContext.get()
        if context is None:
            raise ConfigurationError("a stateful operator's task runs inside Spark; to run a state function "
                                     "without Spark use batchline.state.tester.StateFunctionTester")
        params = batch_params_from_property(context.getLocalProperty(BATCH_PARAMS_PROPERTY), spec.operator)
        if params.batch_time != batch_time:
            raise ConfigurationError(
                f"operator {spec.operator!r}: the job publishes parameters of batch {params.batch_time}, but "
                f"evaluates the DataFrame of batch {batch_time}; read a stateful operator's output only from "
                "the output operations of its own batch"
            )
        # The partition comes from the input's marker row: Spark's task number is another
        # partition's when an output coalesces or unions the operator's DataFrame.
        return run_partition(spec, params, batches, None, self.report, endings=endings)


def spark_task(spec: OperatorSpec, batch_time: int, report: Callable[[Stats], None]) -> StateTask:
    """The operator's ``StateTask`` for ``batch_time``."""
    return StateTask(spec, batch_time, report)


class PartitionEnd:
    """What is left of a partition's batch once its output rows are out: its finish record,
    being written, then the partition back in the worker's cache and its statistics reported.
    The task completes it before it ends; a task that fails settles it first, so that none of
    its writes lands after it ended."""

    def __init__(self, recorded: Future[Any] | None, then: Callable[[], None]) -> None:
        self._recorded, self._then = recorded, then

    def complete(self) -> None:
        if self._recorded is not None:
            self._recorded.result()
        self._then()

    def settle(self) -> None:
        if self._recorded is None:
            return
        futures.wait([self._recorded])
        failed = self._recorded.exception()
        if failed is not None:  # the task's own failure is raised; this one would go unseen
            logger.warning("The finish record of a failed task could not be written either: %s", failed)


def load_partition(files: StateStore, spec_state: RowSchema, single_key: bool, generation: int, partition: int,
                   version: int | None, below: int | None = None,
                   held: PartitionData | None = None, without_snapshots: frozenset[int] = frozenset(),
                   notes: list[str] | None = None) -> PartitionData:
    """A partition's state at ``version`` (or the newest below ``below``); catches ``held`` up
    with deltas when it can. A damaged snapshot is read around: the state is rebuilt, exactly,
    from an older snapshot and the deltas after it, when they are all retained; the WARN saying
    so is also added to ``notes`` (for the driver's log)."""
    target, steps = files.plan_load(generation, partition, version, below,
                                    since=held.version if held is not None else None,
                                    without_snapshots=without_snapshots)
    what = files.describe_partition(partition)
    if held is not None and steps and steps[0][1] == DELTA and held.version is not None:
        assert target is not None
        return _with_deltas(held, (found.table for found in files.read_versions(generation, partition, steps)),
                            len(steps), target, spec_state, single_key, what)
    if held is not None and not steps and held.version == target:
        return held
    entries = StateEntries(single_key)
    initial = False

    def tables() -> Iterator[pa.Table]:
        nonlocal initial
        reads = files.read_versions(generation, partition, steps)
        for index, (v, kind) in enumerate(steps):
            try:
                found = next(reads)
            except DamagedStateFileError as damage:
                if kind == SNAPSHOT:
                    raise _DamagedSnapshot(v, damage) from None
                raise
            if index == 0 and kind == DELTA:
                _check_chain_start(files, generation, partition, v, found.header.first, without_snapshots)
            initial = initial or (index == 0 and found.header.initial)
            yield found.table

    try:
        apply_tables(entries, tables(), spec_state, single_key, what, into_base=True)
    except _DamagedSnapshot as damaged:
        avoid = without_snapshots | {damaged.version}
        try:
            # From an older snapshot, or from the partition's first delta: deltas that start
            # after purged versions do not hold the whole state (_check_chain_start).
            rebuilt = load_partition(files, spec_state, single_key, generation, partition, version, below, None,
                                     avoid, notes)
        except StateVersionError:
            raise damaged.error from None  # the deltas it stood for are gone: nothing to rebuild from
        note = (f"{what}: the snapshot of version {damaged.version} is damaged ({damaged.error.problem}); its state "
                f"was rebuilt from the older files, which verified. Restore or delete the damaged file "
                f"{damaged.error.path}")
        logger.warning("%s", note)
        if notes is not None:
            notes.append(note)
        return rebuilt
    entries.compact()
    give_memory_back()  # loading built and dropped copies of the partition
    deltas = sum(1 for _, kind in steps if kind == DELTA)
    initial_keys = frozenset(key for key, _ in entries.items()) if deltas == 0 and initial else frozenset()
    return PartitionData(target, entries, deltas, initial_keys)


def _with_deltas(held: PartitionData, deltas: Iterable[pa.Table], count: int, target: int, spec_state: RowSchema,
                 single_key: bool, what: str) -> PartitionData:
    """``held`` with ``count`` deltas applied, now at version ``target``."""
    apply_tables(held.entries, deltas, spec_state, single_key, what)
    held.version = target
    held.deltas_since_snapshot += count
    held.initial_keys = frozenset()
    return held


def _caught_up_by_name(spec: OperatorSpec, params: BatchParams, partition: int,
                       held: PartitionData) -> PartitionData | None:
    """``held`` caught up with the deltas of the versions after it that the driver names
    (``BatchParams.recent_versions``), read without listing the partition's files; None when
    those do not reach back to it, or one is not there (the partition sat that batch out):
    the caller lists them."""
    target, named = params.version_of(partition), params.recent_versions
    if not named or named[-1] != target or held.version not in named or partition in params.behind:
        return None
    later = named[named.index(held.version) + 1:]
    try:
        # All read (side by side) before any is applied: a missing one leaves ``held`` as it was.
        deltas = [found.table for found in spec.store.read_versions(spec.generation, partition,
                                                                    [(v, DELTA) for v in later])]
    except (FileNotFoundError, StateVersionError):
        return None
    return _with_deltas(held, deltas, len(deltas), target, spec.state, spec.single_key,
                        spec.store.describe_partition(partition))


def _check_chain_start(files: StateStore, generation: int, partition: int, version: int, first: bool | None,
                       without_snapshots: frozenset[int]) -> None:
    """Raise StateVersionError unless a chain of deltas that starts at ``version`` holds the
    whole state: its first delta was the partition's first, so no snapshot lies under it. A
    delta from before deltas said so is trusted as a plain load always did, but not to stand
    in for a damaged snapshot."""
    if first or (first is None and not without_snapshots):
        return
    raise StateVersionError(
        f"{files.describe_partition(partition)}: its oldest retained delta "
        f"{files.file_location(generation, partition, version, DELTA)} builds on a snapshot that is no longer there "
        "(older files were purged after a newer snapshot)")


class _DamagedSnapshot(Exception):  # noqa: N818 - an internal signal, never raised out of load_partition
    def __init__(self, version: int, error: DamagedStateFileError) -> None:
        super().__init__(str(error))
        self.version = version
        self.error = error


def _cache_key(spec: OperatorSpec, partition: int) -> _CacheKey:
    return (spec.store.location, spec.operator, spec.generation, partition)


def _cached_partition(spec: OperatorSpec, params: BatchParams, partition: int, cache: PartitionCache,
                      notes: list[str]) -> _Cached:
    try:
        return _load_cached(spec, params, partition, cache, notes)
    except StateVersionError as error:
        # Files the committed version needs are gone: as damaging as a changed byte, and the
        # same every attempt. Carried, so that the driver names the partition's files.
        raise DamagedStateFileError(spec.store.partition_location(spec.generation, partition),
                                    f"files that committed version {params.version_of(partition)} needs are "
                                    f"missing ({error})", carry=TaskContext.get() is not None) from None


def _load_cached(spec: OperatorSpec, params: BatchParams, partition: int, cache: PartitionCache,
                 notes: list[str]) -> _Cached:
    store = spec.store
    version = params.version_of(partition)
    cached = cache.take(_cache_key(spec, partition))
    if cached is not None and cached.token != params.token:
        cached = None
    if cached is not None and version is not None and cached.data.version == version:
        return cached
    if version is None:
        data = load_partition(store, spec.state, spec.single_key, spec.generation, partition, None,
                              below=params.batch_time, notes=notes)
        return _Cached(params.token, data)
    held = cached.data if cached is not None and (cached.data.version or 0) < version else None
    named = _caught_up_by_name(spec, params, partition, held) if held is not None else None
    data = named if named is not None else load_partition(
        store, spec.state, spec.single_key, spec.generation, partition, version, held=held, notes=notes)
    if cached is not None and data is cached.data:
        return cached
    return _Cached(params.token, data)


def _write_snapshot(spec: OperatorSpec, partition: int, data: PartitionData, background: bool) -> None:
    """Write a snapshot of a committed version from a copy of the entries; in the background
    (off the task's path), unless told otherwise."""
    version = data.version
    assert version is not None
    # Taken now, built in the snapshot's thread: this version's view while later batches change the keys.
    build = (data.entries.frozen() if not data.entries.blank
             else lambda: entries_table(spec.key_schema, spec.state, iter(()), spec.single_key))

    def write() -> None:
        try:
            spec.store.write_version(spec.generation, FileHeader(version, partition, SNAPSHOT), build())
        except Exception:
            logger.exception("Snapshot of operator %s partition %d at %d failed; deltas remain",
                             spec.operator, partition, version)

    data.deltas_since_snapshot = 0
    if background:
        threading.Thread(target=write, name=f"batchline-snapshot-{partition}", daemon=True).start()
    else:
        write()


def _without_markers(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, set[int]]:
    """The batch's data rows without the marker column, and the partitions its marker rows name."""
    index = batch.schema.get_field_index(MARKER_COLUMN)
    if index < 0:
        return batch, set()
    markers = batch.column(index)
    data = batch.remove_column(index)
    if markers.null_count == len(markers):
        return data, set()
    return data.filter(pc.is_null(markers)), set(pc.drop_null(markers).to_pylist())


def _input_rows(spec: OperatorSpec, params: BatchParams, batches: Iterable[pa.RecordBatch],
                stats: Stats) -> tuple[list[pa.RecordBatch], int | None]:
    """The batch's data rows, counted, and the state partition the input's marker row names;
    rows whose ``late_column`` is at or before the watermark are late (as Spark's
    ``eventTime <= watermark``): dropped and counted."""
    rows: list[pa.RecordBatch] = []
    named: set[int] = set()
    for marked in batches:
        batch, found = _without_markers(marked)
        named |= found
        if batch.num_rows == 0:
            continue
        weights = None if spec.rows_column is None else batch.column(spec.rows_column)
        stats.rows += batch.num_rows if weights is None else pc.sum(weights).as_py() or 0
        if spec.event_time_column is not None:
            _count_event_times(spec, batch, stats)
        if spec.late_column is not None and params.watermark_ms is not None:
            column = batch.column(spec.late_column)
            if pa.types.is_integer(column.type):  # epoch milliseconds
                late = pc.less_equal(column, pa.scalar(params.watermark_ms, column.type))
            else:
                late = pc.less_equal(pc.cast(column, pa.timestamp("us", tz="UTC")),
                                     pa.scalar(params.watermark_ms * 1000, pa.timestamp("us", tz="UTC")))
            late = pc.fill_null(late, False)
            if pc.any(late).as_py():
                stats.late_rows += pc.sum(late if weights is None else pc.if_else(late, weights, 0)).as_py() or 0
                batch = batch.filter(pc.invert(late))
        if batch.num_rows:
            rows.append(batch)
    if len(named) > 1:
        raise ConfigurationError(f"one task got the marker rows of state partitions {sorted(named)}; this is a bug "
                                 "in batchline: report it with the pipeline's description")
    return rows, named.pop() if named else None


def _keys_of(spec: OperatorSpec, batch: pa.RecordBatch | pa.Table) -> Iterable[Any]:
    """Each row's key as the per-key path sees it: a value, or a tuple of the key columns."""
    columns = [as_python(batch.column(name)) for name in spec.key_names]
    return columns[0] if len(columns) == 1 else zip(*columns, strict=True)


def _by_key(spec: OperatorSpec, rows: list[pa.RecordBatch]) -> dict[Any, list[tuple[Any, ...]]]:
    """Rows by key, as named tuples, in the order the keys' first rows came."""
    groups: dict[Any, list[tuple[Any, ...]]] = {}
    if not rows:
        return groups
    make = _row_maker(rows[0].schema.names)
    if len(spec.key_names) == 1 and _groups_on_arrow(rows[0].schema.field(spec.key_names[0]).type):
        return _by_key_on_arrow(spec.key_names[0], rows, make)
    for batch in rows:
        columns = [as_python(column) for column in batch.columns]
        for key, row in zip(_keys_of(spec, batch), zip(*columns, strict=True), strict=True):
            group = groups.get(key)
            if group is None:
                groups[key] = [make(row)]
            else:
                group.append(make(row))
    return groups


def _groups_on_arrow(key_type: pa.DataType) -> bool:
    """Whether Arrow groups a key column as a dict would: integers and strings (a float's NaNs
    would fall into one group, and a dict keeps each NaN apart)."""
    return pa.types.is_integer(key_type) or pa.types.is_string(key_type) or pa.types.is_large_string(key_type)


def _by_key_on_arrow(key_name: str, rows: list[pa.RecordBatch], make: Callable[[Iterable[Any]], tuple[Any, ...]]
                     ) -> dict[Any, list[tuple[Any, ...]]]:
    """``_by_key`` for one integer or string key column: the rows sorted by key on Arrow
    (the dictionary's codes number the keys in the order their first rows came), then sliced
    per key, without a dict lookup per row."""
    table = pa.Table.from_batches(rows).combine_chunks()
    if not table.num_rows:
        return {}
    codes = pc.dictionary_encode(table.column(key_name), null_encoding="encode").chunk(0)
    numbers = codes.indices.to_numpy(zero_copy_only=False)
    ends = np.cumsum(np.bincount(numbers, minlength=len(codes.dictionary)))
    grouped = table.take(pa.array(np.argsort(numbers, kind="stable")))
    made = list(map(make, zip(*[as_python(column) for column in grouped.columns], strict=True)))
    starts = [0, *ends[:-1].tolist()]
    return {key: made[start:end]
            for key, start, end in zip(as_python(codes.dictionary), starts, ends.tolist(), strict=True)}


def _count_event_times(spec: OperatorSpec, batch: pa.RecordBatch, stats: Stats) -> None:
    """The batch's newest event time (timestamps, or epoch ms in an integer column), and, for
    an operator that reads several inputs, each input's."""
    assert spec.event_time_column is not None
    times = epoch_ms(batch.column(spec.event_time_column))
    newest = pc.max(times).as_py()
    if newest is None:
        return
    stats.max_event_time_ms = max(stats.max_event_time_ms or newest, newest)
    if spec.input_column is None:
        return
    inputs = batch.column(spec.input_column)
    for which in pc.unique(inputs).to_pylist():
        found = pc.max(times.filter(pc.equal(inputs, which))).as_py()
        if found is not None:
            known = stats.input_max_event_time_ms.get(which)
            stats.input_max_event_time_ms[which] = found if known is None else max(known, found)


def _row_maker(names: list[str]) -> Callable[[Iterable[Any]], tuple[Any, ...]]:
    """Rows as named tuples of the input's columns."""
    row_type = collections.namedtuple("Row", names, rename=True)  # type: ignore[misc]
    # ``tuple.__new__`` bound to the type: ``_make`` does the same through a Python call per row.
    return functools.partial(tuple.__new__, row_type)


def _failure(spec: OperatorSpec, params: BatchParams, kind: ErrorKind, key: Any, message: str,
             with_traceback: bool = True) -> StateFunctionError:
    """The one place a task describes a failure of the state function for the driver. Call
    it inside the ``except`` block of the failure to carry its Python traceback."""
    return StateFunctionError(
        kind, spec.operator, None if key is _NO_KEY else repr(key), params.batch_time, message,
        traceback.format_exc() if with_traceback else "", carry=True)


_NO_KEY = object()


def run_partition(spec: OperatorSpec, params: BatchParams, batches: Iterable[pa.RecordBatch], partition: int | None,
                  report: Callable[[Stats], None], *, cache: PartitionCache | None = None,
                  background_snapshots: bool = True, endings: list[PartitionEnd] | None = None
                  ) -> Iterator[pa.RecordBatch]:
    """Run one batch of one state partition: call the function, write the batch's delta, and
    yield the output rows. ``report`` receives the task's ``Stats`` once the batch succeeded.
    The partition stays resident in ``cache`` (the worker's, by default) for the next batch.
    The partition is the one the input's marker row names (``MARKER_COLUMN``); ``partition``
    is for input without markers (the state-function tester), and None requires a marker.
    Failures of the state function raise ``StateFunctionError``, carried to the driver in Spark's error.
    With ``endings``, the rows come while the partition's finish record is still being
    written: the partition's ``PartitionEnd`` is appended there, for the caller to complete."""
    with paused_collector():  # state tuples form no cycles: see batchline.state.collector
        output, end = _run_marked(spec, params, batches, partition, report, cache, background_snapshots)
        if endings is None:
            end.complete()
        else:
            endings.append(end)
    if output is not None:
        yield from output.to_batches()


def _run_marked(spec: OperatorSpec, params: BatchParams, batches: Iterable[pa.RecordBatch], partition: int | None,
                report: Callable[[Stats], None], cache: PartitionCache | None,
                background_snapshots: bool) -> tuple[pa.Table | None, PartitionEnd]:
    """``run_partition``'s work: its output (None when it has none) and what is left of it."""
    stats = Stats()
    rows, marked = _input_rows(spec, params, batches, stats)
    if marked is None and partition is None:
        raise ConfigurationError(
            f"a task of operator {spec.operator!r} got no marker row naming its state partition in batch "
            f"{params.batch_time}; this is a bug in batchline: report it with the pipeline's description. "
            "Restart the pipeline: the batch runs again")
    partition = marked if marked is not None else partition
    assert partition is not None
    if params.skip or partition in params.finished_partitions or partition in params.idle_partitions:
        # Drained for good (its input has ended and it holds no timeout), or sitting this batch
        # out (no row, no timer due): nothing to load, call or write.
        if stats.rows and partition in params.idle_partitions:
            raise ConfigurationError(
                f"partition {partition} of operator {spec.operator!r} was to sit batch {params.batch_time} out "
                f"(its input was known to be empty) but {stats.rows} rows came; this is a bug in batchline: report "
                "it with the pipeline's description. Restart the pipeline: the batch runs again")
        sat_out = Stats() if params.skip else Stats(partitions=1 << partition)
        return None, PartitionEnd(None, lambda: report(sat_out))
    cache = WORKER_CACHE if cache is None else cache
    looked, cached, notes = _looked_up_and_cached(spec, params, partition, cache)
    if looked is not None:
        record, table = looked
        if cached is not None:  # caught up beside the lookup: at the committed version, still good
            cache.put(_cache_key(spec, partition), cached)
        return table, PartitionEnd(None, lambda: report(Stats.from_json(record.stats)))
    assert cached is not None
    stats.warnings = tuple(notes)
    result, recorded = _run_loaded(spec, params, rows, stats, partition, cached, background_snapshots)

    def then() -> None:
        report(stats)
        # Only a batch that succeeded puts its partition back: no half-applied batch survives.
        cache.put(_cache_key(spec, partition), cached)

    return (result if result.num_rows else None), PartitionEnd(recorded, then)


def _looked_up_and_cached(spec: OperatorSpec, params: BatchParams, partition: int, cache: PartitionCache
                          ) -> tuple[tuple[PartitionFinished, pa.Table] | None, _Cached | None, list[str]]:
    """The partition's kept output when it recorded its finish of the batch before, else its
    state at the version the batch builds on; and the notes of both. A partition the worker
    holds from an earlier batch of this driver is caught up while its finish record is looked
    for (on an object store, both are round trips); any other is loaded only when the lookup
    found nothing, as a restart's kept partitions need no state."""
    lookup_notes: list[str] = []
    cache_notes: list[str] = []
    if spec.journal is None or not params.keep_finished:
        return None, _cached_partition(spec, params, partition, cache, cache_notes), cache_notes
    held = cache.peek(_cache_key(spec, partition))
    version = params.version_of(partition)
    if (held is None or held.token != params.token or version is None or held.data.version is None
            or held.data.version > version):
        # Not held from an earlier batch of this driver (not at all, another driver's, or ahead:
        # a stage attempt after one that finished), or nothing to build on: looked up first.
        looked = _finished_output(spec, params, partition, lookup_notes)
        if looked is not None:
            return looked, None, lookup_notes
        return None, _cached_partition(spec, params, partition, cache, cache_notes), lookup_notes + cache_notes
    lookup = beside_store(lambda: _finished_output(spec, params, partition, lookup_notes))
    cached: _Cached | None = None
    try:
        cached = _cached_partition(spec, params, partition, cache, cache_notes)
    except Exception:
        looked = lookup.result()
        if looked is not None:  # kept: the state it could not catch up with is not needed
            return looked, None, lookup_notes
        raise
    looked = lookup.result()
    return looked, cached, lookup_notes + cache_notes


def _run_loaded(spec: OperatorSpec, params: BatchParams, rows: list[pa.RecordBatch], stats: Stats,
                partition: int, cached: _Cached, background_snapshots: bool) -> tuple[pa.Table, Future[Any] | None]:
    """The batch over a loaded partition: call, write the delta, apply it, start recording the
    finish; returns the output rows and the finish record's write (None: no journal)."""
    outputs, delta, bulk = _call_function(spec, params, cached, rows, stats)
    changes = _delta_table(spec, params, delta)
    delta_table = (changes if bulk is None
                   else pa.concat_tables([changes, bulk.changes.cast(changes.schema)]).combine_chunks())
    version = params.version_of(partition)
    delta_written = beside_store(lambda: spec.store.write_version(
        spec.generation, FileHeader(params.batch_time, partition, DELTA, first=version is None), delta_table))
    if delta_table.num_rows:
        cached.bytes_per_key = delta_table.nbytes / delta_table.num_rows
    if (version is not None and cached.data.version == version
            and cached.data.deltas_since_snapshot >= SNAPSHOT_EVERY):
        # Twice the deltas: a background snapshot was lost with its process (a driver or
        # executor that did not live long), and every restart reads all those deltas; this
        # one is written before the task finishes, so restarts stay short however often they come.
        behind = cached.data.deltas_since_snapshot >= 2 * SNAPSHOT_EVERY
        _write_snapshot(spec, partition, cached.data, background_snapshots and not behind)
    if bulk is not None:
        # First: the merge of many changes into the base is quickest while ``recent`` is
        # empty; the keys of the two parts are distinct.
        cached.data.entries.apply(bulk.changes, bulk.rows, bulk.keys)
    cached.data.entries.update(delta, changes.schema, encoded=changes)
    cached.data.version = params.batch_time
    cached.data.deltas_since_snapshot += 1
    cached.data.initial_keys = frozenset()
    stats.state_keys = len(cached.data.entries)
    stats.state_bytes = int(stats.state_keys * cached.bytes_per_key)
    stats.output_rows = len(outputs) + (bulk.output.num_rows if bulk is not None else 0)
    stats.partitions = 1 << partition
    next_deadline = cached.data.entries.next_deadline()
    stats.timers = (1 << partition) if next_deadline is not None else 0
    stats.partitions_after = {partition: PartitionFacts(stats.state_keys, stats.state_bytes, next_deadline)}
    result = pa.Table.from_batches([_output_batch(spec, params, outputs)])
    if bulk is not None and bulk.output.num_rows:
        result = pa.concat_tables([result, bulk.output])
    return result, _record_finish(spec, params, partition, stats, result, delta_written)


def _finished_output(spec: OperatorSpec, params: BatchParams, partition: int, notes: list[str]
                     ) -> tuple[PartitionFinished, pa.Table] | None:
    """A partition that recorded its finish of this batch (before a driver crash, or in an
    earlier attempt of this task) keeps it: its output is read back, its delta is written.
    One whose output cannot be read back runs again, if its rows came to it: a partition the
    restart kept (its rows left out of the shuffle) fails instead of losing them."""
    if spec.journal is None or not params.keep_finished:
        return None
    record = spec.journal.finished(params.batch_time, spec.operator, spec.generation, partition)
    if record is None:
        return None
    problem = None
    try:
        table = spec.store.read_version(spec.generation, partition, params.batch_time, OUTPUT).table
    except DamagedStateFileError as error:
        problem = error.path, error.problem
    except (FileNotFoundError, StateVersionError):
        problem = spec.store.file_location(spec.generation, partition, params.batch_time, OUTPUT), "it is missing"
    if problem is not None:
        where, why = problem
        if partition in params.left_out:
            raise KeptOutputLostError(spec.operator, partition, params.batch_time, where, why)
        note = (f"partition {partition} of operator {spec.operator!r} recorded its finish of batch "
                f"{params.batch_time}, but its output {where} cannot be read back ({why}); running it again on its "
                "rows, which came to it")
        logger.warning("%s", note)
        notes.append(note)
        return None
    logger.info("Partition %d of operator %s keeps its finished batch %d (%d output rows)", partition,
                spec.operator, params.batch_time, table.num_rows)
    return record, table.cast(spec.output.arrow)


def _record_finish(spec: OperatorSpec, params: BatchParams, partition: int, stats: Stats,
                   output: pa.Table, delta_written: Future[int]) -> Future[Any] | None:
    """The partition's output beside its delta, then its finish record: from here on a restart
    does not run the function for this partition and batch again (SPEC F2). The delta (being
    written since before the resident state took it in), the output and the lease's check go
    to the store side by side (on an object store, one round trip each); the finish record
    waits for all three, and is written beside what the task does next (returned: the task
    ends once it is written)."""
    if spec.journal is None:
        stats.delta_bytes = delta_written.result()
        return None
    journal = spec.journal
    output_written = beside_store(lambda: spec.store.write_version(
        spec.generation, FileHeader(params.batch_time, partition, OUTPUT), output))
    try:
        check_token(journal.storage, params.token,
                    f"partition {partition} of operator {spec.operator!r} finished batch {params.batch_time}")
    finally:
        stats.delta_bytes = delta_written.result()
        output_written.result()
    finished = PartitionFinished(spec.operator, partition, spec.generation, params.batch_time, output.num_rows,
                                 stats.to_json(), params.token)
    return beside_store(lambda: journal.partition_finished(params.batch_time, finished))


_store_threads: ThreadPoolExecutor | None = None
_store_threads_lock = threading.Lock()


def beside_store(work: Callable[[], _T]) -> Future[_T]:
    """``work`` (a read or a write of the store) on a thread of this process, beside the
    caller's own work (a task's, or the driver's job); the caller waits for it."""
    global _store_threads
    with _store_threads_lock:
        if _store_threads is None:  # made in the worker that uses it: a forked worker has no threads of its parent
            _store_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="batchline-state-io")
    return _store_threads.submit(work)


_Delta = dict[Any, tuple[tuple[Any, ...] | None, int | None]]


@dataclass(frozen=True)
class _Bulk:
    """What calls in bulk (``MergesInBulk``, ``TimesOutInBulk``) gave: output rows and the
    keys' changes, as Arrow, beside the per-key calls' Python ones."""

    output: pa.Table
    changes: pa.Table
    """In the state files' layout."""
    rows: np.ndarray
    """Per change, the key's base row in the resident entries (-1: none)."""
    keys: list[Any]
    """Per change, the key (``UNKNOWN`` for a base row's, not decoded)."""

    @staticmethod
    def joined(parts: list[_Bulk]) -> _Bulk | None:
        if len(parts) < 2:
            return parts[0] if parts else None
        return _Bulk(pa.concat_tables([part.output for part in parts]),
                     pa.concat_tables([part.changes for part in parts]),
                     np.concatenate([part.rows for part in parts]), [key for part in parts for key in part.keys])


def _call_function(spec: OperatorSpec, params: BatchParams, cached: _Cached, rows: list[pa.RecordBatch],
                   stats: Stats) -> tuple[list[tuple[tuple[Any, ...], Any]], _Delta, _Bulk | None]:
    """Call the function for keys with data (all at once when it merges in bulk), then
    initial-state keys, then due keys (all at once when it times out in bulk). The cached
    entries stay untouched: changes are collected in the returned delta (and bulk changes)."""
    timeout = spec.timeout
    batch_time = params.batch_time
    # Spark's GroupState reads 0 until the first event time was seen; None: no watermark at all.
    watermark = params.watermark_ms if params.watermark_ms is not None or spec.event_time_column is None else 0
    bulk: list[_Bulk] = []
    groups: dict[Any, list[tuple[Any, ...]]] = {}
    called: dict[Any, Any]
    called_rows: np.ndarray | None = None
    if isinstance(spec.fn, MergesInBulk) and spec.fn.merges_in_bulk and not cached.data.initial_keys:
        merged, called, called_rows = _merge_in_bulk(spec, params, cached, rows, watermark, stats)
        bulk += [merged] if merged is not None else []
    else:
        called = groups = _by_key(spec, rows)
    last = last_due(timeout, batch_time, params.watermark_ms, params.end_of_input)
    times_out = isinstance(spec.fn, TimesOutInBulk)
    due = cached.data.entries.due(last, skip=called) if last is not None and not times_out else []
    initial = [key for key in sorted(cached.data.initial_keys, key=repr) if key not in groups]
    # Every key the batch calls, looked up once (due keys timed out in bulk are read as Arrow).
    entries = cached.data.entries.get_many(itertools.chain(groups, initial, (key for key, _ in due)))
    outputs: list[tuple[tuple[Any, ...], Any]] = []
    delta: _Delta = {}
    # Looked up once: the call below runs for every key of the batch.
    make, unmake, stored, fn, flat = spec.state.make, spec.output.unmake, spec.state.unmake, spec.fn, spec.flat
    ended = params.end_of_input
    where = f"the state function of operator {spec.operator!r}"

    def call(key: Any, rows: list[tuple[Any, ...]], timed_out: bool) -> None:
        current = entries.get(key)
        value, old_deadline = current if current is not None else (None, None)
        # Positional: keywords cost a third of the construction, once per key.
        state = GroupState(make(value) if value is not None else None, timeout, batch_time, watermark, timed_out,
                           NO_TIMESTAMP, ended)
        try:
            result = fn(key, iter(rows), state)
            produced = (result if result is not None else ()) if flat else (result,)
            for row in produced:
                outputs.append((unmake(row), key))
        except Exception:
            raise _failure(spec, params, ErrorKind.RAISED, key,
                           f"{where} raised for key {key!r} in batch {batch_time}; fix the function and start "
                           "the pipeline again (the batch re-runs from the state before it):") from None
        stats.updated += state.updated
        stats.removed += state.removed and value is not None
        deadline = state.timeout_timestamp_ms if state.timeout_timestamp_ms != NO_TIMESTAMP else None
        if ended:
            deadline = None  # the inputs ended: the timer could only fire at once, again and again
        if state.updated:
            try:
                updated = stored(state.get())
            except TypeError:
                raise _failure(spec, params, ErrorKind.WRONG_STATE_TYPE, key,
                               f"{where} updated the state with a value of the wrong type for key {key!r} in batch "
                               f"{batch_time}; pass state.update() a {spec.state.describe()}:") from None
            delta[key] = (updated, deadline)
            return
        # As in Spark: a key without state keeps a timeout set in the call (a timer alone), and
        # a key left with neither state nor timeout is dropped.
        kept = None if state.removed else value
        if (kept, deadline) != (value, old_deadline) and (current is not None or deadline is not None):
            delta[key] = (kept, deadline)

    for key, key_rows in groups.items():
        call(key, key_rows, False)
    for key in initial:  # a frozenset, sorted: the same order in every process
        call(key, [], False)
    stats.keys_called += len(groups) + len(initial)
    if times_out and last is not None:
        skip_keys = called if not initial else {**called, **dict.fromkeys(initial)}
        if called_rows is None:
            called_rows = cached.data.entries.locate(list(skip_keys))
        timed_out = _time_out_in_bulk(spec, params, cached, last, called_rows, skip_keys, watermark, stats)
        bulk += [timed_out] if timed_out is not None else []
        return outputs, delta, _Bulk.joined(bulk)
    timed_out_keys = [key for key, _ in due if key not in delta]  # ``due`` left the called keys out already
    stats.timed_out += len(timed_out_keys)
    stats.keys_called += len(timed_out_keys)
    for key in timed_out_keys:
        call(key, [], True)
    return outputs, delta, _Bulk.joined(bulk)


def _merge_in_bulk(spec: OperatorSpec, params: BatchParams, cached: _Cached, rows: list[pa.RecordBatch],
                   watermark: int | None, stats: Stats) -> tuple[_Bulk | None, dict[Any, None], np.ndarray]:
    """The keys with rows of a function that merges in bulk: one call over the batch's rows
    and their keys' entries as Arrow, instead of a GroupState and a call per key. Returns the
    result, the keys it called and their base rows."""
    assert isinstance(spec.fn, MergesInBulk)
    if not rows:
        return None, {}, np.empty(0, dtype=np.int64)
    table = pa.Table.from_batches(rows)
    keys, key_of_row = _numbered_keys(spec, table)
    called = dict.fromkeys(keys)
    located = cached.data.entries.locate(keys)
    first_rows = np.unique(key_of_row, return_index=True)[1]  # keys are numbered as they first come
    entries = cached.data.entries.table_of(keys, located, missing_ok=True,
                                           layout=entries_schema(spec.key_schema, spec.state),
                                           key_columns=table.select(list(spec.key_names)).take(pa.array(first_rows)))
    where = f"merging {table.num_rows} rows of {len(called)} keys in bulk"
    done = _in_bulk(spec, params, where, lambda fn: fn.merge(
        KeyedRows(table, key_of_row, entries, watermark, params.batch_time, spec.output.arrow)), entries)
    return _bulk_changes(params, entries, done, located, keys, stats), called, located


def _numbered_keys(spec: OperatorSpec, table: pa.Table) -> tuple[list[Any], np.ndarray]:
    """The batch's distinct keys in the order they first come, and each row's key number.
    Keys of plain types are numbered by Arrow, and only the distinct ones become Python keys."""
    if len(spec.key_names) == 1:
        column = table.column(spec.key_names[0]).combine_chunks()
        if codable(column.type):
            encoded = pc.dictionary_encode(column, null_encoding="encode")
            return as_python(encoded.dictionary), encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    codes = key_codes([table.column(name) for name in spec.key_names])
    if codes is not None:  # numbered by Arrow; only each key's first row becomes a Python key
        first, inverse = np.unique(codes, return_index=True, return_inverse=True)[1:]
        order = np.argsort(first, kind="stable")  # the keys in the order they first come
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order), dtype=np.int64)
        return list(_keys_of(spec, table.take(pa.array(first[order])))), rank[inverse.reshape(-1)]
    numbers: dict[Any, int] = {}
    key_of_row = np.fromiter((numbers.setdefault(key, len(numbers)) for key in _keys_of(spec, table)),
                             dtype=np.int64, count=table.num_rows)
    return list(numbers), key_of_row


def _time_out_in_bulk(spec: OperatorSpec, params: BatchParams, cached: _Cached, last: int, skip_rows: np.ndarray,
                      skip_keys: Container[Any], watermark: int | None, stats: Stats) -> _Bulk | None:
    """The due keys (deadline at or before ``last``) the batch did not call, of a function
    that times keys out in bulk: one call over their entries' Arrow columns instead of a
    GroupState and a call per key, without decoding their keys."""
    due = cached.data.entries.due_in_bulk(last, skip_rows, skip_keys)
    if due is None:
        return None
    entries, rows, fresh = due
    stats.timed_out += entries.num_rows
    keys: list[Any] = [UNKNOWN] * (len(rows) - len(fresh)) + fresh
    done = _in_bulk(spec, params, f"timing out {entries.num_rows} keys", lambda fn: fn.time_out(
        DueKeys(entries, watermark, params.batch_time, params.end_of_input, spec.output.arrow)), entries)
    return _bulk_changes(params, entries, done, rows, keys, stats)


def _in_bulk(spec: OperatorSpec, params: BatchParams, what: str, call: Callable[[Any], BulkResult],
             entries: pa.Table) -> BulkResult:
    try:
        done = call(spec.fn)
    except _ENCODING_ERRORS as bad:  # values the state's types cannot hold (a sum beyond a long)
        raise _failure(spec, params, ErrorKind.STATE_SCHEMA, _NO_KEY,
                       f"operator {spec.operator!r} cannot keep its state in batch {params.batch_time} in the state "
                       f"schema {spec.state.describe()}: {bad}; aggregate a column of a wider type (cast it before "
                       "aggregating), then start the pipeline again (the batch re-runs from the state before it)"
                       ) from None
    except Exception:
        raise _failure(spec, params, ErrorKind.RAISED, _NO_KEY,
                       f"the state function of operator {spec.operator!r} raised {what} in batch "
                       f"{params.batch_time}; this is a bug in batchline: report it. Restart the pipeline: "
                       "the batch re-runs from the state before it:") from None
    if done.state.num_rows != entries.num_rows or done.output.schema != spec.output.arrow:
        raise ConfigurationError(
            f"operator {spec.operator!r} gave {done.state.num_rows} entries {what} for {entries.num_rows} keys, "
            "or output of another schema; this is a bug in batchline: report it")
    return done


def _bulk_changes(params: BatchParams, entries: pa.Table, done: BulkResult, rows: np.ndarray, keys: list[Any],
                  stats: Stats) -> _Bulk:
    """A call in bulk's result as changes in the state files' layout, counted in ``stats``."""
    layout = entries.schema
    state = done.state
    if params.end_of_input:  # the inputs ended: a timer could only fire at once, again and again
        state = state.set_column(state.schema.get_field_index(TIMEOUT_COL), pa.field(TIMEOUT_COL, pa.int64()),
                                 pa.nulls(state.num_rows, pa.int64()))
    columns = [entries.column(name) if name.startswith(KEY_PREFIX) else state.column(name).cast(field.type)
               for name, field in zip(layout.names, layout, strict=True)]
    changes = pa.Table.from_arrays(columns, schema=layout)
    removed = state.column(REMOVED_COL).to_numpy()
    held = ~entries.column(REMOVED_COL).to_numpy()
    updated = ~removed if done.updated is None else done.updated
    stats.keys_called += entries.num_rows
    stats.removed += int((removed & held).sum())
    stats.updated += int(updated.sum())
    # As the per-key path: a key neither updated nor removed is written only if its deadline changed.
    moved = pc.fill_null(pc.not_equal(state.column(TIMEOUT_COL), entries.column(TIMEOUT_COL)),
                         True).to_numpy(zero_copy_only=False)
    both_none = (state.column(TIMEOUT_COL).is_null().to_numpy(zero_copy_only=False)
                 & entries.column(TIMEOUT_COL).is_null().to_numpy(zero_copy_only=False))
    written = updated | (removed & held) | (moved & ~both_none)
    if not written.all():
        changes = changes.filter(pa.array(written))
        rows = rows[written]
        keys = [key for key, write in zip(keys, written.tolist(), strict=True) if write]
    return _Bulk(done.output, changes, rows, keys)


_ENCODING_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)


def _delta_table(spec: OperatorSpec, params: BatchParams, delta: _Delta) -> pa.Table:
    rows = ((key, value, deadline) for key, (value, deadline) in delta.items())
    try:
        return entries_table(spec.key_schema, spec.state, rows, spec.single_key)
    except _ENCODING_ERRORS:
        for key, (value, deadline) in delta.items():
            try:
                entries_table(spec.key_schema, spec.state, iter([(key, value, deadline)]), spec.single_key)
            except _ENCODING_ERRORS as bad:
                raise _failure(spec, params, ErrorKind.STATE_SCHEMA, key,
                               f"the state function of operator {spec.operator!r} stored a value for key {key!r} "
                               f"in batch {params.batch_time} that does not fit the state schema "
                               f"{spec.state.describe()}: {bad} (value: {value!r}); store values of that "
                               "schema") from None
        raise _failure(spec, params, ErrorKind.STATE_ENCODING, _NO_KEY,
                       f"cannot encode the state of operator {spec.operator!r} in batch {params.batch_time}; "
                       "check the key columns' types against the stored key schema:") from None


def _output_batch(spec: OperatorSpec, params: BatchParams,
                  outputs: list[tuple[tuple[Any, ...], Any]]) -> pa.RecordBatch:
    schema = spec.output.arrow
    rows = [row for row, _ in outputs]
    columns = list(map(list, zip(*rows, strict=True))) if rows else [[] for _ in schema]
    try:
        arrays = [pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)]
    except _ENCODING_ERRORS:
        for row, key in outputs:
            try:
                for value, field in zip(row, schema, strict=True):
                    pa.array([value], type=field.type)
            except _ENCODING_ERRORS as bad:
                raise _failure(spec, params, ErrorKind.OUTPUT_SCHEMA, key,
                               f"the state function of operator {spec.operator!r} returned a row for key {key!r} "
                               f"in batch {params.batch_time} that does not fit the output schema "
                               f"{spec.output.describe()}: {bad} (row: {row!r}); return rows of that schema",
                               with_traceback=False) from None
        raise
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
