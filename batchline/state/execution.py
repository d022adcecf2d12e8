"""A stateful operator's work inside one Spark task: one state partition, one batch.

Runs in the Python worker under ``mapInArrow``. Rows arrive as Arrow batches and are grouped
by key in plain Python; the state function is called once per key with plain row tuples,
never with a DataFrame per key. The partition's state stays resident in the worker between
batches (SPEC D4), keyed by checkpoint location, operator, generation and partition: the
next batch finds it at the version it needs, catches up from the deltas other workers wrote
when it is behind, and loads from the store when the driver is new. A task that fails, or
is abandoned, drops the partition from the cache, so no half-applied batch survives.
"""

from __future__ import annotations

import collections
import gc
import logging
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from batchline.errors import BatchlineError
from batchline.state.group_state import NO_TIMESTAMP, GroupState, GroupStateTimeout
from batchline.state.schema import RowSchema, as_python
from batchline.state.store import DELTA, SNAPSHOT, PartitionData, StateFiles, apply_table, entries_table
from batchline.state.timeouts import TimeoutIndex

__all__ = ["TaskSpec", "StateFunctionError", "run_partition", "ERROR_START", "ERROR_END", "Stats"]

logger = logging.getLogger(__name__)

ERROR_START, ERROR_END = "<<batchline-state-error>>", "<<end-batchline-state-error>>"
SNAPSHOT_EVERY = 10
"""Deltas after which a worker writes a snapshot of a committed version in the background."""
MAX_CACHED_PARTITIONS = 512


class StateFunctionError(BatchlineError):
    """The state function raised (or returned something unusable) for a key."""


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, shipped with the task (never written to a checkpoint)."""

    files: StateFiles
    """The operator's state files; shipped by URL and options, each worker opens its own."""
    generation: int
    key_names: tuple[str, ...]
    key_schema: StructType
    state: RowSchema
    output: RowSchema
    fn: Callable[..., Any]
    flat: bool
    timeout: GroupStateTimeout
    batch_time: int
    prev_version: int | None
    """The operator's last committed version, or None when the driver has just started."""
    token: int
    """The driver's lease token: a cache built under another driver is never trusted."""
    watermark_ms: int | None
    event_time_column: str | None
    stats: Any
    """A Spark accumulator that sums ``Stats`` fields (max for the event time)."""

    @property
    def operator(self) -> str:
        return self.files.operator


@dataclass
class Stats:
    rows: int = 0
    late_rows: int = 0
    keys_called: int = 0
    updated: int = 0
    removed: int = 0
    timed_out: int = 0
    output_rows: int = 0
    state_keys: int = 0
    max_event_time_ms: int | None = None
    partitions: int = 0
    """A bit per state partition that ran, to prove none was coalesced away."""

    def merge(self, other: Stats) -> Stats:
        def newest(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else max(a, b)

        return Stats(
            self.rows + other.rows, self.late_rows + other.late_rows, self.keys_called + other.keys_called,
            self.updated + other.updated, self.removed + other.removed, self.timed_out + other.timed_out,
            self.output_rows + other.output_rows, self.state_keys + other.state_keys,
            newest(self.max_event_time_ms, other.max_event_time_ms), self.partitions | other.partitions,
        )


@dataclass
class _Cached:
    token: int
    data: PartitionData
    index: TimeoutIndex[Any]


_CACHE: collections.OrderedDict[tuple[str, str, int, int], _Cached] = collections.OrderedDict()
_CACHE_LOCK = threading.Lock()

def load_partition(files: StateFiles, spec_state: RowSchema, single_key: bool, generation: int, partition: int,
                   version: int | None, below: int | None = None,
                   held: PartitionData | None = None) -> tuple[PartitionData, list[Any] | None]:
    """A partition's state at ``version`` (or the newest below ``below``); catches ``held`` up
    with deltas when it can. Returns the data and, after a catch-up, the keys it changed."""
    target, steps = files.plan_load(generation, partition, version, below,
                                    since=held.version if held is not None else None)
    what = f"state of operator {files.operator!r}, partition {partition}"
    if held is not None and steps and steps[0][1] == DELTA and held.version is not None:
        changed: list[Any] = []
        for v, kind in steps:
            changed += apply_table(held.entries, files.read(generation, partition, v, kind), spec_state,
                                   single_key, what)
        held.version = target
        held.deltas_since_snapshot += len(steps)
        held.initial_keys = frozenset()
        return held, changed
    if held is not None and not steps and held.version == target:
        return held, []
    entries: dict[Any, tuple[tuple[Any, ...], int | None]] = {}
    initial: frozenset[Any] = frozenset()
    for v, kind in steps:
        table = files.read(generation, partition, v, kind)
        apply_table(entries, table, spec_state, single_key, what)
        if kind == SNAPSHOT and b'"initial": true' in (table.schema.metadata or {}).get(b"batchline", b""):
            initial = frozenset(entries)
    deltas = sum(1 for _, kind in steps if kind == DELTA)
    return PartitionData(target, entries, deltas, initial if deltas == 0 else frozenset()), None


def _index_of(entries: dict[Any, tuple[tuple[Any, ...], int | None]]) -> TimeoutIndex[Any]:
    index: TimeoutIndex[Any] = TimeoutIndex()
    for key, (_, timeout) in entries.items():
        if timeout is not None:
            index.set(key, timeout)
    return index


def _cached_partition(spec: TaskSpec, files: StateFiles, partition: int) -> _Cached:
    cache_key = (files.storage.url, spec.operator, spec.generation, partition)
    single_key = len(spec.key_names) == 1
    with _CACHE_LOCK:
        cached = _CACHE.pop(cache_key, None)
    if cached is not None and cached.token != spec.token:
        cached = None
    if cached is not None and spec.prev_version is not None and cached.data.version == spec.prev_version:
        return cached
    if spec.prev_version is None:
        data, changed = load_partition(files, spec.state, single_key, spec.generation, partition, None,
                                       below=spec.batch_time)
        cached = None
    else:
        held = cached.data if cached is not None and (cached.data.version or 0) < spec.prev_version else None
        data, changed = load_partition(files, spec.state, single_key, spec.generation, partition,
                                       spec.prev_version, held=held)
    if changed is not None and cached is not None:
        for key in changed:
            entry = data.entries.get(key)
            if entry is None or entry[1] is None:
                cached.index.remove(key)
            else:
                cached.index.set(key, entry[1])
        cached.data = data
        return cached
    return _Cached(spec.token, data, _index_of(data.entries))


def _remember(spec: TaskSpec, partition: int, cached: _Cached) -> None:
    with _CACHE_LOCK:
        _CACHE[(spec.files.storage.url, spec.operator, spec.generation, partition)] = cached
        while len(_CACHE) > MAX_CACHED_PARTITIONS:
            _CACHE.popitem(last=False)


def _snapshot_in_background(files: StateFiles, spec: TaskSpec, partition: int, data: PartitionData) -> None:
    """Write a snapshot of a committed version from a copy of the entries, off the task's path."""
    version = data.version
    assert version is not None
    frozen = dict(data.entries)  # values are immutable tuples: a shallow copy is a consistent view
    single_key = len(spec.key_names) == 1

    def write() -> None:
        try:
            rows = ((k, v, t) for k, (v, t) in frozen.items())
            files.write(spec.generation, partition, version, SNAPSHOT,
                        entries_table(spec.key_schema, spec.state, rows, single_key))
        except Exception:
            logger.exception("Snapshot of operator %s partition %d at %d failed; deltas remain",
                             spec.operator, partition, version)

    data.deltas_since_snapshot = 0
    threading.Thread(target=write, name=f"batchline-snapshot-{partition}", daemon=True).start()


def _grouped(spec: TaskSpec, batches: Iterable[pa.RecordBatch], stats: Stats) -> dict[Any, list[tuple[Any, ...]]]:
    """Rows by key, as named tuples; rows older than the watermark are dropped and counted."""
    groups: dict[Any, list[tuple[Any, ...]]] = {}
    row_type: Any = None
    for batch in batches:
        if batch.num_rows == 0:
            continue
        stats.rows += batch.num_rows
        if spec.event_time_column is not None:
            times = batch.column(spec.event_time_column)
            newest = pc.max(times).as_py()
            if newest is not None:
                newest_ms = int(newest.timestamp() * 1000)
                stats.max_event_time_ms = max(stats.max_event_time_ms or newest_ms, newest_ms)
            if spec.watermark_ms is not None:
                late = pc.less(pc.cast(times, pa.timestamp("us", tz="UTC")),
                               pa.scalar(spec.watermark_ms * 1000, pa.timestamp("us", tz="UTC")))
                late_count = pc.sum(late).as_py() or 0
                if late_count:
                    stats.late_rows += late_count
                    batch = batch.filter(pc.invert(pc.fill_null(late, False)))
        if row_type is None:
            row_type = collections.namedtuple("Row", batch.schema.names, rename=True)  # type: ignore[misc]
        columns = [as_python(column) for column in batch.columns]
        key_columns = [columns[batch.schema.get_field_index(n)] for n in spec.key_names]
        keys = key_columns[0] if len(key_columns) == 1 else zip(*key_columns, strict=True)
        make = row_type._make
        for key, row in zip(keys, zip(*columns, strict=True), strict=True):
            group = groups.get(key)
            if group is None:
                groups[key] = [make(row)]
            else:
                group.append(make(row))
    return groups


def _fail(spec: TaskSpec, key: Any, what: str) -> StateFunctionError:
    trace = traceback.format_exc()
    message = (f"the state function of operator {spec.operator!r} {what} for key {key!r} in batch "
               f"{spec.batch_time}:\n{trace}")
    return StateFunctionError(f"{ERROR_START}{message}{ERROR_END}")


def run_partition(spec: TaskSpec, batches: Iterator[pa.RecordBatch], partition: int) -> Iterator[pa.RecordBatch]:
    files = spec.files
    cached = _cached_partition(spec, files, partition)
    completed = False
    # The cyclic collector would walk the whole resident state again and again while a batch
    # allocates its rows (40% of the task's time); state tuples form no cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        stats = Stats()
        groups = _grouped(spec, batches, stats)
        outputs, delta = _call_function(spec, cached, groups, stats)
        files.write(spec.generation, partition, spec.batch_time, DELTA,
                    _delta_table(spec, cached, delta))
        if (spec.prev_version is not None and cached.data.version == spec.prev_version
                and cached.data.deltas_since_snapshot >= SNAPSHOT_EVERY):
            _snapshot_in_background(files, spec, partition, cached.data)
        _apply_delta(cached, delta)
        cached.data.version = spec.batch_time
        cached.data.deltas_since_snapshot += 1
        cached.data.initial_keys = frozenset()
        stats.state_keys = len(cached.data.entries)
        stats.output_rows = len(outputs)
        stats.partitions = 1 << partition
        spec.stats.add(stats)
        result = _output_batch(spec, outputs)
        completed = True
    finally:
        if collecting:
            gc.enable()
        if completed:
            _remember(spec, partition, cached)
    if result.num_rows:
        yield result


_Delta = dict[Any, tuple[tuple[Any, ...] | None, int | None]]


def _call_function(spec: TaskSpec, cached: _Cached, groups: dict[Any, list[tuple[Any, ...]]],
                   stats: Stats) -> tuple[list[tuple[tuple[Any, ...], Any]], _Delta]:
    """Call the function for keys with data, then initial-state keys, then due keys. The
    cached entries stay untouched: changes are collected in the returned delta."""
    entries = cached.data.entries
    outputs: list[tuple[tuple[Any, ...], Any]] = []
    delta: _Delta = {}
    timeout = spec.timeout
    make, unmake = spec.state.make, spec.output.unmake

    def call(key: Any, rows: list[tuple[Any, ...]], timed_out: bool) -> None:
        current = entries.get(key)
        state = GroupState(make(current[0]) if current is not None else None, timeout, spec.batch_time,
                           spec.watermark_ms, has_timed_out=timed_out)
        stats.keys_called += 1
        try:
            result = spec.fn(key, iter(rows), state)
            produced = (result if result is not None else ()) if spec.flat else (result,)
            for row in produced:
                outputs.append((unmake(row), key))
        except Exception:
            raise _fail(spec, key, "raised") from None
        if state.removed or state.updated:
            stats.updated += state.updated
            stats.removed += state.removed and current is not None
        deadline = state.timeout_timestamp_ms if state.timeout_timestamp_ms != NO_TIMESTAMP else None
        if state.updated:
            try:
                value = spec.state.unmake(state.get())
            except TypeError:
                raise _fail(spec, key, "updated the state with a value of the wrong type") from None
            delta[key] = (value, deadline)
        elif state.removed or current is None:
            if deadline is not None:
                raise StateFunctionError(
                    f"{ERROR_START}the state function of operator {spec.operator!r} set a timeout for key {key!r} "
                    f"in batch {spec.batch_time} without state; call state.update(...) before setting a timeout"
                    f"{ERROR_END}")
            if current is not None:
                delta[key] = (None, None)
        elif deadline != current[1]:
            delta[key] = (current[0], deadline)

    for key, rows in groups.items():
        call(key, rows, False)
    for key in cached.data.initial_keys:
        if key not in groups:
            call(key, [], False)
    threshold = (spec.batch_time if timeout is GroupStateTimeout.PROCESSING_TIME
                 else spec.watermark_ms if timeout is GroupStateTimeout.EVENT_TIME else None)
    if threshold is not None:
        # Strictly before the threshold, as in Spark. Popping changes the cached index, which
        # is safe: a task that fails drops its partition from the cache.
        for key, deadline in cached.index.pop_due(threshold - 1):
            if key not in groups and key not in delta:
                stats.timed_out += 1
                call(key, [], True)
            elif key not in delta:
                cached.index.set(key, deadline)  # called with data and left its deadline as it was
    return outputs, delta


def _delta_table(spec: TaskSpec, cached: _Cached, delta: _Delta) -> pa.Table:
    rows = ((key, value, deadline) for key, (value, deadline) in delta.items())
    try:
        return entries_table(spec.key_schema, spec.state, rows, len(spec.key_names) == 1)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as error:
        for key, (value, deadline) in delta.items():
            try:
                entries_table(spec.key_schema, spec.state, iter([(key, value, deadline)]), len(spec.key_names) == 1)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as bad:
                raise StateFunctionError(
                    f"{ERROR_START}the state function of operator {spec.operator!r} stored a value for key {key!r} "
                    f"in batch {spec.batch_time} that does not fit the state schema {spec.state.describe()}: "
                    f"{bad} (value: {value!r}){ERROR_END}") from None
        raise StateFunctionError(f"{ERROR_START}cannot encode the state of batch {spec.batch_time}: {error}"
                                 f"{ERROR_END}") from error


def _apply_delta(cached: _Cached, delta: _Delta) -> None:
    entries, index = cached.data.entries, cached.index
    for key, (value, deadline) in delta.items():
        if value is None:
            entries.pop(key, None)
            index.remove(key)
        else:
            entries[key] = (value, deadline)
            if deadline is None:
                index.remove(key)
            else:
                index.set(key, deadline)


def _output_batch(spec: TaskSpec, outputs: list[tuple[tuple[Any, ...], Any]]) -> pa.RecordBatch:
    schema = spec.output.arrow
    rows = [row for row, _ in outputs]
    columns = list(map(list, zip(*rows, strict=True))) if rows else [[] for _ in schema]
    try:
        arrays = [pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)]
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        for row, key in outputs:
            try:
                for value, field in zip(row, schema, strict=True):
                    pa.array([value], type=field.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as bad:
                raise StateFunctionError(
                    f"{ERROR_START}the state function of operator {spec.operator!r} returned a row for key {key!r} "
                    f"in batch {spec.batch_time} that does not fit the output schema "
                    f"{spec.output.describe()}: {bad} (row: {row!r}){ERROR_END}") from None
        raise
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
