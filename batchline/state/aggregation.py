"""Running and event-time windowed aggregations (``KeyedStream.aggregate``), built on the
stateful operator.

Each batch, Spark computes the partial aggregates in the JVM: one row per key and window
(``_PartialFrame``), with how many rows it stands for and the newest event time among them.
The stateful operator shuffles those rows into its state partitions, and ``MergeIntoState``,
its built-in state function, folds each into the stored partial of its group. So the per-key
Python path sees one row per group and batch, never the batch's rows.

A windowed aggregation keeps one state key per key and window (the key columns and
``window_start``); the window's event-time timer is its end. As in Spark:

- a partial whose window ended at or before the watermark is late: dropped and counted;
- ``append`` emits a window once, final, in the batch where the watermark passes its end;
- ``update`` emits every window whose aggregates changed in the batch, and forgets a window
  silently once the watermark passes its end.

A session-window aggregation (``MergeSessions``) keeps a key's open sessions in one state
key. Its partials are one row per key and event time instead, so that each is late or not as
a whole, as Spark filters a session window's rows one by one.

A running aggregation (no window) keeps one state key per key and emits it in ``update``
mode when it changes; ``expire_after`` forgets a key that long after its newest event time
(against the watermark) or, without a watermark, after its last update.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import SparkContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StructField, StructType, TimestampType

from batchline.batch_time import epoch_ms
from batchline.choices import choose
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError
from batchline.state.aggregates import Aggregate, greatest_columns
from batchline.state.built_in import ROWS, BuiltInNode, check_event_time
from batchline.state.bulk import (
    BulkResult,
    DueKeys,
    KeyedRows,
    MergesInBulk,
    TimesOutInBulk,
    epoch_ms_column,
    micros_column,
    removing_all,
    state_columns,
)
from batchline.state.contract import LATE_AT
from batchline.state.entries import KEY_PREFIX, REMOVED_COL, STATE_PREFIX
from batchline.state.group_state import GroupState, GroupStateTimeout
from batchline.streams.base import StreamNode, Watermark
from batchline.streams.nodes import TransformNode

__all__ = [
    "WINDOW_END",
    "WINDOW_START",
    "AggregationNode",
    "MergeIntoState",
    "MergeSessions",
    "OutputMode",
    "SessionWindow",
    "TimeWindow",
    "session_window",
    "window",
]

WINDOW_START = "window_start"
WINDOW_END = "window_end"
_NEWEST = "__batchline_newest"
_END_MS = "__batchline_window_end_ms"
_ALL = "__batchline_all"
_WINDOW = "__batchline_window"


class OutputMode(enum.Enum):
    """Which rows an aggregation emits, as Spark's output modes."""

    APPEND = "append"
    """A window's row once, final, when the watermark passes its end."""
    UPDATE = "update"
    """Every batch, the groups whose aggregates changed in it."""


@dataclasses.dataclass(frozen=True)
class TimeWindow:
    """Tumbling or sliding windows on event time, as Spark's ``window()``: ``[start, end)``
    of ``length_ms``, starting every ``slide_ms``, offset by ``start_ms`` from the epoch."""

    column: str
    length_ms: int
    slide_ms: int
    start_ms: int = 0

    def assign(self) -> Column:
        """The rows' windows, computed by Spark (a sliding window gives a row each)."""
        return F.window(self.column, f"{self.length_ms} milliseconds", f"{self.slide_ms} milliseconds",
                        f"{self.start_ms} milliseconds")


def window(column: str, length: object, slide: object | None = None, start: object | None = None) -> TimeWindow:
    """Windows of ``length`` on the event time in ``column``, every ``slide`` (default:
    ``length``, tumbling), offset by ``start``; durations as ``"5 minutes"``, ``"30s"`` or a
    timedelta. Group by it: ``stream.group_by_key(window("ts", "5 minutes"), "user")``."""
    if not isinstance(column, str):
        raise ConfigurationError(f"window() takes the event-time column's name; got {column!r}")
    length_ms = parse_duration_ms(length, "window length")
    slide_ms = length_ms if slide is None else parse_duration_ms(slide, "window slide")
    if slide_ms > length_ms:
        raise ConfigurationError(f"a window's slide ({slide_ms} ms) cannot be longer than its length ({length_ms} ms), "
                                 "or rows would fall between windows")
    start_ms = 0 if start is None else parse_duration_ms(start, "window start", allow_zero=True)
    if start_ms >= slide_ms:
        raise ConfigurationError(f"a window's start offset ({start_ms} ms) must be shorter than its slide "
                                 f"({slide_ms} ms)")
    return TimeWindow(column, length_ms, slide_ms, start_ms)


@dataclasses.dataclass(frozen=True)
class SessionWindow:
    """Session windows on event time, as Spark's ``session_window()``: a key's session lasts
    while its events come less than ``gap_ms`` apart, and ends ``gap_ms`` after its last one."""

    column: str
    gap_ms: int


def session_window(column: str, gap: object) -> SessionWindow:
    """Sessions of each key on the event time in ``column`` that close after ``gap`` without
    an event (``"30 seconds"``, a timedelta); group by it:
    ``stream.group_by_key(session_window("ts", "30 seconds"), "user")``. Sessions merge when
    an event bridges them, also across batches."""
    if not isinstance(column, str):
        raise ConfigurationError(f"session_window() takes the event-time column's name; got {column!r}")
    return SessionWindow(column, parse_duration_ms(gap, "session gap"))


class _PartialFrame:
    """A batch's partial aggregates, computed by Spark: one row per key and window (per key
    and event time for session windows, so that each row is late or not as a whole)."""

    def __init__(self, keys: tuple[str, ...], grouping: TimeWindow | SessionWindow | None,
                 aggregates: tuple[Aggregate, ...], event_time: str | None) -> None:
        self.keys, self.grouping, self.aggregates, self.event_time = keys, grouping, aggregates, event_time
        self._built: tuple[SparkContext, _PartialColumns] | None = None

    def __call__(self, df: DataFrame) -> DataFrame:
        columns = self._columns(df.sparkSession.sparkContext)
        partials = df.groupBy(*columns.group).agg(*columns.measures)
        return partials if columns.out is None else partials.select(*columns.out)

    def _columns(self, context: SparkContext) -> _PartialColumns:
        """The frame's expressions, built once per Spark context: each costs a round trip to
        the JVM, and the frame is built every batch."""
        if self._built is None or self._built[0] is not context:
            self._built = context, self._build()
        return self._built[1]

    def _build(self) -> _PartialColumns:
        group: list[Column] = [F.col(k) for k in self.keys]
        grouping = self.grouping
        if isinstance(grouping, TimeWindow):
            group.append(grouping.assign().alias(_WINDOW))
        elif not group:
            group.append(F.lit(True).alias(_ALL))  # one group: the operator's key is a constant
        if isinstance(grouping, SessionWindow):
            group.append(F.col(grouping.column))
        measures = [F.count(F.lit(1)).alias(ROWS)]
        if self.event_time is not None:
            measures.append(F.max(self.event_time).alias(_NEWEST))
        names = [ROWS, *([_NEWEST] if self.event_time is not None else [])]
        for i, aggregate in enumerate(self.aggregates):
            for j, partial in enumerate(aggregate.partials(self.event_time)):
                measures.append(partial.alias(_partial_name(i, j)))
                names.append(_partial_name(i, j))
        rest = [F.col(name) for name in names]
        if isinstance(grouping, TimeWindow):
            return _PartialColumns(group, measures, [
                *(F.col(k) for k in self.keys), F.col(f"{_WINDOW}.start").alias(WINDOW_START),
                F.unix_millis(F.col(f"{_WINDOW}.end")).alias(_END_MS), *rest])
        if isinstance(grouping, SessionWindow):
            # Each row's own session ends a gap after it: the row is late once that end is not
            # after the watermark (as Spark filters a session window's input rows).
            return _PartialColumns(group, measures, [
                *(F.col(k) for k in self.keys or (_ALL,)), F.col(grouping.column).alias(WINDOW_START),
                (F.unix_millis(F.col(grouping.column)) + F.lit(grouping.gap_ms)).alias(_END_MS), *rest])
        return _PartialColumns(group, measures, None)


@dataclasses.dataclass(frozen=True)
class _PartialColumns:
    group: list[Column]
    measures: list[Column]
    out: list[Column] | None
    """The columns of the frame, from the grouped rows; None: those rows as they are."""


def _partial_name(aggregate: int, field: int) -> str:
    return f"__batchline_p{aggregate}_{field}"


@dataclasses.dataclass(frozen=True)
class _Partials:
    """The aggregates' partial fields, side by side in a tuple: merged and finished together."""

    fields: tuple[int, ...]
    """How many partial fields each aggregate has, in order."""
    mergers: tuple[Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, ...]], ...]
    finishers: tuple[Callable[[tuple[Any, ...]], Any], ...]
    column_mergers: tuple[Callable[[list[pa.Array], list[pa.Array]], list[pa.Array]], ...] | None
    """The mergers over columns; None when an aggregate merges only row by row."""
    column_finishers: tuple[Callable[[list[pa.Array]], pa.Array], ...]

    @classmethod
    def of(cls, aggregates: tuple[Aggregate, ...]) -> _Partials:
        column_mergers = [a.columns_merger() for a in aggregates]
        return cls(tuple(len(a.stored_names()) for a in aggregates), tuple(a.merger() for a in aggregates),
                   tuple(a.finisher() for a in aggregates),
                   None if None in column_mergers else tuple(m for m in column_mergers if m is not None),
                   tuple(a.columns_finisher() for a in aggregates))

    @property
    def width(self) -> int:
        return sum(self.fields)

    def merge(self, stored: tuple[Any, ...], batch: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(value for merge, old, new in zip(self.mergers, self._each(stored), self._each(batch), strict=True)
                     for value in merge(old, new))

    def results(self, stored: tuple[Any, ...]) -> list[Any]:
        return [finish(fields) for finish, fields in zip(self.finishers, self._each(stored), strict=True)]

    def merge_columns(self, stored: list[pa.Array], batch: list[pa.Array]) -> list[pa.Array]:
        assert self.column_mergers is not None
        return [column for merge, old, new in zip(self.column_mergers, self._each(stored), self._each(batch),
                                                  strict=True) for column in merge(old, new)]

    def result_columns(self, stored: list[pa.Array]) -> list[pa.Array]:
        return [finish(fields) for finish, fields in zip(self.column_finishers, self._each(stored), strict=True)]

    def _each(self, values: Any) -> Iterator[Any]:
        """Each aggregate's slice of the partial fields (a tuple of values, or a list of columns)."""
        at = 0
        for count in self.fields:
            yield values[at:at + count]
            at += count


def _key_columns(key: Any, columns: int) -> tuple[Any, ...]:
    """The key as the tuple of its columns (a key of one column is its value)."""
    return key if columns > 1 else (key,)


@dataclasses.dataclass(frozen=True)
class MergeIntoState(MergesInBulk, TimesOutInBulk):
    """The state function of a running or tumbling/sliding-window aggregation: fold each
    group's partial of the batch into its stored one, set its timer, and emit as the output
    mode says. Plain data, pickled into the tasks. It runs in bulk (``merge``, ``time_out``:
    a partition's groups at once, over Arrow columns) unless an aggregate merges only row by
    row (lists); ``__call__`` is the same per key.

    A partial row is ``(*key columns, [window_start, window end ms], rows, [newest], *partial
    fields)``; the stored state is ``(*partial fields, [newest])``; a row out is ``(*key
    columns, [window_start, window_end], *results)``."""

    key_count: int
    """Columns of the user's key (without the window)."""
    constant_key: bool
    """No key and no window: one group, keyed by a constant."""
    window_length: dt.timedelta | None
    windows_close: bool
    """Whether a window closes when the watermark passes its end (without a watermark, never: as Spark)."""
    append: bool
    first_partial: int
    """Index of the first partial field in an input row."""
    partials: _Partials
    newest_index: int | None
    """Index of the newest event time in an input row, when it is kept (event-time expiry)."""
    expire_after_ms: int | None

    def __call__(self, key: Any, rows: Iterator[tuple[Any, ...]], state: GroupState[tuple[Any, ...]]
                 ) -> Iterable[tuple[Any, ...]]:
        if state.has_timed_out:
            closed = state.get()
            state.remove()
            return (self._row_out(key, closed),) if self.append else ()
        stored = state.get_option()
        end_ms = None
        width = self.partials.width
        for row in rows:
            batch = row[self.first_partial:self.first_partial + width]
            if self.newest_index is not None:
                batch += (row[self.newest_index],)
            stored = batch if stored is None else self._merge(stored, batch)
            if self.window_length is not None:
                end_ms = row[self.key_count + 1]
        assert stored is not None, "the operator calls a key with rows or with its timer"
        state.update(stored)
        if end_ms is not None and self.windows_close:
            state.set_timeout_timestamp(end_ms - 1)  # fires once the watermark reaches the end
        elif self.expire_after_ms is not None:
            if self.newest_index is None:
                state.set_timeout_duration(f"{self.expire_after_ms} ms")
            elif stored[-1] is not None:
                state.set_timeout_timestamp(max(epoch_ms(stored[-1]) + self.expire_after_ms,
                                                state.current_watermark_ms()))
        return () if self.append else (self._row_out(key, stored),)

    # ---------------------------------------------------------------- in bulk
    @property
    def merges_in_bulk(self) -> bool:
        return self.partials.column_mergers is not None

    def merge(self, keyed: KeyedRows) -> BulkResult:
        rows, entries = keyed.rows, keyed.entries
        fields = [f for f in entries.schema if f.name.startswith(STATE_PREFIX)]
        at = list(range(self.first_partial, self.first_partial + self.partials.width))
        at += [] if self.newest_index is None else [self.newest_index]
        batch = [rows.column(i).combine_chunks().cast(f.type) for i, f in zip(at, fields, strict=True)]
        folded, first_rows = _fold_by_key(keyed.key_of_row, entries.num_rows, batch, self._merge_columns)
        # A group without state has nulls for its fields, which every merger takes as nothing yet.
        stored = self._merge_columns([entries.column(f.name).combine_chunks() for f in fields], folded)
        keys = entries.num_rows
        if self.window_length is not None and self.windows_close:
            ends = rows.column(self.key_count + 1).combine_chunks().take(pa.array(first_rows))
            timeouts = pc.subtract(pc.cast(ends, pa.int64()), 1)
        elif self.expire_after_ms is None:
            timeouts = pa.nulls(keys, pa.int64())
        elif self.newest_index is None:
            timeouts = pa.array(np.full(keys, keyed.batch_time + self.expire_after_ms, dtype=np.int64))
        else:
            assert keyed.watermark_ms is not None, "an event-time expiry has a watermark"
            expiry = pc.add(epoch_ms_column(stored[-1]), self.expire_after_ms)
            timeouts = pc.max_element_wise(expiry, pa.scalar(keyed.watermark_ms, pa.int64()), skip_nulls=False)
        state = state_columns(fields, stored, timeouts, removed=False)
        if self.append:
            return BulkResult(keyed.output_schema.empty_table(), state)
        heads = [] if self.constant_key else [
            rows.column(i).combine_chunks().take(pa.array(first_rows))
            for i in range(self.key_count + (self.window_length is not None))]
        return BulkResult(self._rows_out(heads, stored, keyed.output_schema), state)

    def time_out(self, due: DueKeys) -> BulkResult:
        entries = due.entries
        state = removing_all(entries)
        if not self.append:
            return BulkResult(due.output_schema.empty_table(), state)
        heads = [entries.column(name).combine_chunks() for name in entries.column_names
                 if name.startswith(KEY_PREFIX)]
        stored = [entries.column(name).combine_chunks() for name in entries.column_names
                  if name.startswith(STATE_PREFIX)]
        return BulkResult(self._rows_out(heads, stored, due.output_schema), state)

    def _merge_columns(self, stored: list[pa.Array], batch: list[pa.Array]) -> list[pa.Array]:
        if self.newest_index is None:
            return self.partials.merge_columns(stored, batch)
        return [*self.partials.merge_columns(stored[:-1], batch[:-1]), greatest_columns(stored[-1], batch[-1])]

    def _rows_out(self, heads: list[pa.Array], stored: list[pa.Array], schema: pa.Schema) -> pa.Table:
        """Rows out of groups whose key columns (with the window's start) are ``heads``."""
        columns = list(heads)
        if self.window_length is not None:
            columns.append(pc.add(heads[-1], pa.scalar(self.window_length, pa.duration("us"))))
        columns += self.partials.result_columns(stored[:self.partials.width])
        return pa.Table.from_arrays([c.cast(f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)

    # ---------------------------------------------------------------- per key
    def _merge(self, stored: tuple[Any, ...], batch: tuple[Any, ...]) -> tuple[Any, ...]:
        merged = self.partials.merge(stored, batch)
        if self.newest_index is None:
            return merged
        old, new = stored[-1], batch[-1]
        return (*merged, new if old is None or (new is not None and new > old) else old)

    def _row_out(self, key: Any, stored: tuple[Any, ...]) -> tuple[Any, ...]:
        windowed = self.window_length is not None
        head = () if self.constant_key else _key_columns(key, self.key_count + windowed)
        if self.window_length is not None:
            head += (head[-1] + self.window_length,)
        return (*head, *self.partials.results(stored))


def _fold_by_key(key_of_row: np.ndarray, keys: int, columns: list[pa.Array],
                 merge: Callable[[list[pa.Array], list[pa.Array]], list[pa.Array]]
                 ) -> tuple[list[pa.Array], np.ndarray]:
    """Each key's rows folded into one, in the order they came (as the per-key call folds
    them), and each key's first row; ``key_of_row`` numbers the keys 0 to ``keys - 1``."""
    order = np.argsort(key_of_row, kind="stable")
    grouped = key_of_row[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    first_rows = order[starts]
    folded = [column.take(pa.array(first_rows)) for column in columns]
    if len(order) == keys:  # a row per key, the usual case: nothing to fold
        return folded, first_rows
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    for layer in range(1, int(rank.max()) + 1):
        taken = order[rank == layer]
        owners = key_of_row[taken]
        merged = merge([c.take(pa.array(owners)) for c in folded], [c.take(pa.array(taken)) for c in columns])
        where = np.arange(keys, dtype=np.int64)
        where[owners] = keys + np.arange(len(owners), dtype=np.int64)
        folded = [pa.concat_arrays([old, new]).take(pa.array(where)) for old, new in zip(folded, merged, strict=True)]
    return folded, first_rows


def _naive(values: list[Any]) -> list[Any]:
    """Timestamps in a stored list come back time-zone aware; batchline's rows carry naive UTC."""
    first = next((v for v in values if v is not None), None)
    if isinstance(first, dt.datetime) and first.tzinfo is not None:
        return [None if v is None else v.astimezone(dt.UTC).replace(tzinfo=None) for v in values]
    return values


def _running_max(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """At each position, the largest of ``values`` up to it within its group; ``groups`` is
    sorted, so a group's positions are together. In numpy (pandas' ``cummax`` by group did
    the same, and cost a worker a third of a second to import): values become ranks, and each
    group's ranks are lifted above every earlier group's, so one running maximum resets at
    each group."""
    if not len(values):
        return values
    distinct, ranks = np.unique(values, return_inverse=True)
    group = np.cumsum(np.r_[0, groups[1:] != groups[:-1]]).astype(np.int64) * len(distinct)
    return distinct[np.maximum.accumulate(group + ranks) - group]


@dataclasses.dataclass(frozen=True)
class MergeSessions(MergesInBulk, TimesOutInBulk):
    """The state function of a session-window aggregation. A key's state is its open
    sessions, as columns: ``(starts, ends, *one list per partial field)``. Each partial row
    of the batch is a session of its own, ``[event time, event time + gap)``; sessions merge
    while one starts at or before another's end (as Spark's); a session whose end is at or
    before the watermark closes (emitted in append mode) and leaves the state. It runs in bulk
    (``merge``, ``time_out``: every session of a partition's keys at once, over Arrow columns)
    unless an aggregate merges only row by row (lists); ``__call__`` is the same per key.

    A partial row is ``(*key columns, event time, its session's end ms, rows, newest,
    *partial fields)`` (a constant for the key columns when there are none); a row out is
    ``(*key columns, window_start, window_end, *results)``."""

    key_count: int
    time_index: int
    """Index of the event time (``window_start``) in an input row."""
    gap: dt.timedelta
    append: bool
    first_partial: int
    partials: _Partials

    def __call__(self, key: Any, rows: Iterator[tuple[Any, ...]], state: GroupState[tuple[Any, ...]]
                 ) -> Iterable[tuple[Any, ...]]:
        stored = state.get_option()
        sessions: list[tuple[Any, Any, tuple[Any, ...], bool]] = []  # start, end, partial, changed
        if stored is not None:
            starts, ends, *columns = (_naive(column) for column in stored)
            sessions = [(start, end, tuple(c[i] for c in columns), False)
                        for i, (start, end) in enumerate(zip(starts, ends, strict=True))]
        width, at = self.partials.width, self.first_partial
        time = self.time_index
        sessions += [(row[time], row[time] + self.gap, row[at:at + width], True) for row in rows]
        sessions.sort(key=lambda s: s[0])  # stable: a stored session before a new one of the same start
        merged: list[tuple[Any, Any, tuple[Any, ...], bool]] = []
        for session in sessions:
            if merged and session[0] <= merged[-1][1]:
                start, end, partial, changed = merged[-1]
                merged[-1] = (start, max(end, session[1]), self.partials.merge(partial, session[2]),
                              changed or session[3])
            else:
                merged.append(session)
        watermark = state.current_watermark_ms()
        open_sessions = [s for s in merged if epoch_ms(s[1]) > watermark]
        emitted = [s for s in merged if epoch_ms(s[1]) <= watermark] if self.append else [s for s in merged if s[3]]
        if open_sessions:
            state.update((
                [s[0] for s in open_sessions], [s[1] for s in open_sessions],
                *([s[2][i] for s in open_sessions] for i in range(width))))
            state.set_timeout_timestamp(min(epoch_ms(s[1]) for s in open_sessions) - 1)
        elif stored is not None:
            state.remove()
        head = _key_columns(key, self.key_count) if self.key_count else ()
        return [(*head, start, end, *self.partials.results(partial)) for start, end, partial, _ in emitted]


    # ---------------------------------------------------------------- in bulk
    @property
    def merges_in_bulk(self) -> bool:
        return self.partials.column_mergers is not None

    def merge(self, keyed: KeyedRows) -> BulkResult:
        rows = keyed.rows
        starts = rows.column(self.time_index).combine_chunks()
        fields = [rows.column(self.first_partial + i).combine_chunks() for i in range(self.partials.width)]
        return self._sessions(keyed.entries, keyed.key_of_row, starts, fields, keyed.watermark_ms,
                              keyed.output_schema)

    def time_out(self, due: DueKeys) -> BulkResult:
        return self._sessions(due.entries, np.empty(0, dtype=np.int64), None, None, due.watermark_ms,
                              due.output_schema)

    def _sessions(self, entries: pa.Table, key_of_row: np.ndarray, starts: pa.Array | None,
                  fields: list[pa.Array] | None, watermark_ms: int | None, schema: pa.Schema) -> BulkResult:
        """The keys' stored sessions and the batch's rows (each a session of its own) merged,
        closed and emitted as ``__call__`` does for each key, over columns."""
        keys = entries.num_rows
        state_fields = [f for f in entries.schema if f.name.startswith(STATE_PREFIX)]
        lists = [entries.column(f.name).combine_chunks() for f in state_fields]
        element_types = [f.type.value_type for f in state_fields]
        # Every session, stored ones first (each key's in order), then the batch's rows as they came.
        owner = np.concatenate([pc.list_parent_indices(lists[0]).to_numpy(zero_copy_only=False).astype(np.int64),
                                key_of_row])
        columns = [pc.list_flatten(column) for column in lists]
        if starts is not None and fields is not None:
            times = starts.cast(element_types[0])
            new = [times, pc.add(times, pa.scalar(self.gap, pa.duration("us"))).cast(element_types[1]), *fields]
            columns = [pa.concat_arrays([old, add.cast(t)])
                       for old, add, t in zip(columns, new, element_types, strict=True)]
        changed = np.r_[np.zeros(len(owner) - len(key_of_row), dtype=bool), np.ones(len(key_of_row), dtype=bool)]
        begins, ends = (micros_column(c).to_numpy(zero_copy_only=False) for c in columns[:2])
        # By key, then start; a stored session before a new one of the same start (a stable sort).
        order = np.lexsort((begins, owner))
        owner, begins, ends, changed = owner[order], begins[order], ends[order], changed[order]
        columns = [c.take(pa.array(order)) for c in columns]
        # A session starts where its key's rows start, or after a gap: after every end before it.
        reach = _running_max(ends, owner)
        first = np.r_[True, (owner[1:] != owner[:-1]) | (begins[1:] > reach[:-1])] if len(owner) else \
            np.empty(0, dtype=bool)
        session = np.cumsum(first) - 1
        heads = np.flatnonzero(first)
        count = len(heads)
        partial = _fold_by_key(session, count, columns[2:], self.partials.merge_columns)[0] if count else \
            [c.slice(0, 0) for c in columns[2:]]
        session_owner, session_start = owner[heads], columns[0].take(pa.array(heads))
        session_end_us = np.maximum.reduceat(ends, heads) if count else np.empty(0, dtype=np.int64)
        session_changed = np.logical_or.reduceat(changed, heads) if count else np.empty(0, dtype=bool)
        session_end = pa.array(session_end_us, pa.timestamp("us", tz="UTC")).cast(element_types[1])
        closed = np.floor_divide(session_end_us, 1000) <= (watermark_ms if watermark_ms is not None else 0)
        # The open sessions, as each key's lists; the earliest end sets the key's timer.
        open_at = np.flatnonzero(~closed)
        open_owner = session_owner[open_at]
        offsets = np.r_[0, np.cumsum(np.bincount(open_owner, minlength=keys))].astype(np.int32)
        kept = [session_start, session_end, *partial]
        state_lists = [pa.ListArray.from_arrays(pa.array(offsets), column.take(pa.array(open_at)))
                       for column in kept]
        holds = np.bincount(open_owner, minlength=keys) > 0
        earliest = np.full(keys, np.iinfo(np.int64).max)
        np.minimum.at(earliest, open_owner, np.floor_divide(session_end_us[open_at], 1000))
        timeouts = pa.array(earliest - 1, mask=~holds)
        had = ~entries.column(REMOVED_COL).to_numpy()
        state = state_columns(state_fields, [pc.if_else(pa.array(holds), column, pa.nulls(keys, column.type))
                                             for column in state_lists], timeouts, ~holds & had)
        emitted = np.flatnonzero(closed if self.append else session_changed)
        out_heads = [entries.column(name).combine_chunks().take(pa.array(session_owner[emitted]))
                     for name in entries.column_names if name.startswith(KEY_PREFIX)][:self.key_count]
        out = [*out_heads, session_start.take(pa.array(emitted)), session_end.take(pa.array(emitted)),
               *self.partials.result_columns([c.take(pa.array(emitted)) for c in partial])]
        output = pa.Table.from_arrays([c.cast(f.type) for c, f in zip(out, schema, strict=True)], schema=schema)
        return BulkResult(output, state, updated=holds)


class AggregationNode(BuiltInNode):
    """A running or windowed aggregation: its partial frame feeds a stateful operator whose
    state function is ``MergeIntoState`` (``MergeSessions`` for session windows); state and
    output schemas follow from the partials' types."""

    def __init__(self, parent: StreamNode, keys: tuple[str, ...], grouping: TimeWindow | SessionWindow | None,
                 aggregates: tuple[Aggregate, ...], *, output_mode: OutputMode | str, name: str,
                 num_partitions: int | None, expire_after: object | None) -> None:
        mode = choose(OutputMode, output_mode, "output_mode")
        watermark = parent.watermark()
        what = f"aggregation {name!r}"
        for reserved in (WINDOW_START, WINDOW_END):
            if reserved in keys or reserved in [a.name for a in aggregates]:
                raise ConfigurationError(f"{what}: {reserved!r} is the window's column in rows out; rename the "
                                         "key or alias the aggregate")
        clash = sorted(set(keys) & {a.name for a in aggregates})
        if clash:
            raise ConfigurationError(f"{what}: aggregate(s) {clash} are called like key columns; alias them")
        if grouping is not None and watermark is not None and grouping.column != watermark.column:
            raise ConfigurationError(
                f"{what}: the window is on {grouping.column!r} but the watermark on {watermark.column!r}; "
                f"window on the watermark's column, as Spark requires")
        if isinstance(grouping, SessionWindow) and watermark is None:
            raise ConfigurationError(f"{what}: a session closes when the watermark passes its end; call "
                                     "with_watermark(column, delay) first")
        if mode is OutputMode.APPEND and (grouping is None or watermark is None):
            raise ConfigurationError(
                f"{what}: output_mode='append' emits a window once the watermark passes its end, so it needs a "
                "window and a watermark: group by window(column, length) after with_watermark(column, delay), "
                "or use output_mode='update'")
        needs_time = [a.name for a in aggregates if a.needs_event_time]
        if needs_time and watermark is None:
            raise ConfigurationError(f"{what}: {needs_time} pick by event time; call with_watermark(column, delay) "
                                     "first")
        expire_ms = None if expire_after is None else parse_duration_ms(expire_after, "expire_after")
        if expire_ms is not None and grouping is not None:
            raise ConfigurationError(f"{what}: a window's state goes when the watermark passes its end; "
                                     "expire_after is for aggregations without a window")
        if grouping is not None or expire_ms is not None:
            timeout = GroupStateTimeout.EVENT_TIME if watermark is not None else GroupStateTimeout.PROCESSING_TIME
        else:
            timeout = GroupStateTimeout.NO_TIMEOUT
        if isinstance(grouping, TimeWindow) and watermark is None:
            timeout = GroupStateTimeout.NO_TIMEOUT  # windows without a watermark never close, as in Spark
        event_time = None if watermark is None else watermark.column
        partials = TransformNode([parent], _PartialFrame(keys, grouping, aggregates, event_time), keeps_empty=True)
        key_names = (*keys, WINDOW_START) if isinstance(grouping, TimeWindow) else keys or (_ALL,)
        super().__init__(partials, key_names, timeout=timeout, name=name, num_partitions=num_partitions)
        self.user_keys = keys
        self.grouping = grouping
        self.aggregates = aggregates
        self.output_mode = mode
        self.expire_after_ms = expire_ms
        # The partials carry the newest event time of each group's rows: the watermark follows it.
        self.event_time = None if watermark is None else dataclasses.replace(watermark, column=_NEWEST)

    @property
    def late_column(self) -> str | None:
        """A partial is late when its window ended at or before the watermark (Spark's
        ``window.end <= watermark``; for a session window, the row's own session's end)."""
        return _END_MS if self.grouping is not None and self.event_time is not None else None

    def late_rows(self, rows: DataFrame) -> DataFrame:
        """Each row once per window it missed, with that window's start and end; a row of a
        session window when its own session (the row's time plus the gap) ended."""
        grouping = self.grouping  # a running aggregation (no window) drops no row
        assert grouping is not None
        if isinstance(grouping, SessionWindow):
            return rows.withColumn(LATE_AT, F.unix_millis(F.col(grouping.column).cast("timestamp"))
                                   + F.lit(grouping.gap_ms))
        windows = rows.withColumn(_WINDOW, grouping.assign())
        return windows.select(*[F.col(c) for c in rows.columns], F.col(f"{_WINDOW}.start").alias(WINDOW_START),
                              F.col(f"{_WINDOW}.end").alias(WINDOW_END),
                              F.unix_millis(F.col(f"{_WINDOW}.end")).alias(LATE_AT))

    def watermark(self) -> Watermark | None:
        """Downstream, event time is the window's end (as Spark's ``window.end``); a running
        aggregation's rows have none."""
        if self.grouping is None or self.event_time is None:
            return None
        return dataclasses.replace(self.event_time, column=WINDOW_END)

    def derive(self, input_schema: StructType) -> tuple[MergeIntoState | MergeSessions, StructType, StructType]:
        check_event_time(self, input_schema)
        fields = {f.name: f.dataType for f in input_schema.fields}
        types = [[fields[_partial_name(i, j)] for j in range(len(a.stored_names()))]
                 for i, a in enumerate(self.aggregates)]
        stored = [StructField(name, t) for a, ts in zip(self.aggregates, types, strict=True)
                  for name, t in zip(a.stored_names(), ts, strict=True)]
        out = [StructField(k, fields[k]) for k in self.user_keys]
        if self.grouping is not None:
            out += [StructField(WINDOW_START, TimestampType()), StructField(WINDOW_END, TimestampType())]
        out += [StructField(a.name, a.result_type(ts)) for a, ts in zip(self.aggregates, types, strict=True)]
        first_partial = input_schema.fieldNames().index(_partial_name(0, 0))
        partials = _Partials.of(self.aggregates)
        append = self.output_mode is OutputMode.APPEND
        if isinstance(self.grouping, SessionWindow):
            sessions = [StructField("session_start", ArrayType(TimestampType())),
                        StructField("session_end", ArrayType(TimestampType()))]
            sessions += [StructField(f.name, ArrayType(f.dataType)) for f in stored]
            merge_sessions = MergeSessions(len(self.user_keys), input_schema.fieldNames().index(WINDOW_START),
                                           dt.timedelta(milliseconds=self.grouping.gap_ms), append, first_partial,
                                           partials)
            return merge_sessions, StructType(sessions), StructType(out)
        keeps_newest = self.expire_after_ms is not None and self.event_time is not None
        if keeps_newest:
            stored.append(StructField(_NEWEST, TimestampType()))
        length = None if self.grouping is None else dt.timedelta(milliseconds=self.grouping.length_ms)
        merge = MergeIntoState(
            key_count=len(self.user_keys), constant_key=not self.user_keys and self.grouping is None,
            window_length=length, windows_close=self.event_time is not None, append=append,
            first_partial=first_partial, partials=partials,
            newest_index=input_schema.fieldNames().index(_NEWEST) if keeps_newest else None,
            expire_after_ms=self.expire_after_ms)
        return merge, StructType(stored), StructType(out)
