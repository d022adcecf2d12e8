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

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType, TimestampType

from batchline.choices import choose
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError
from batchline.state.aggregates import Aggregate
from batchline.state.built_in import BuiltInNode
from batchline.state.group_state import GroupState, GroupStateTimeout
from batchline.streams.base import StreamNode, Watermark
from batchline.streams.nodes import TransformNode

__all__ = ["WINDOW_END", "WINDOW_START", "AggregationNode", "MergeIntoState", "OutputMode", "TimeWindow", "window"]

WINDOW_START = "window_start"
WINDOW_END = "window_end"
_ROWS = "__batchline_rows"
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


class _PartialFrame:
    """A batch's partial aggregates, computed by Spark: one row per key (and window)."""

    def __init__(self, keys: tuple[str, ...], time_window: TimeWindow | None, aggregates: tuple[Aggregate, ...],
                 event_time: str | None) -> None:
        self.keys, self.window, self.aggregates, self.event_time = keys, time_window, aggregates, event_time

    def __call__(self, df: DataFrame) -> DataFrame:
        group: list[Column] = [F.col(k) for k in self.keys]
        if self.window is not None:
            df = df.withColumn(_WINDOW, self.window.assign())
            group.append(F.col(_WINDOW))
        elif not group:
            group.append(F.lit(True).alias(_ALL))
        measures = [F.count(F.lit(1)).alias(_ROWS)]
        if self.event_time is not None:
            measures.append(F.max(self.event_time).alias(_NEWEST))
        measures += [p.alias(_partial_name(i, j)) for i, a in enumerate(self.aggregates)
                     for j, p in enumerate(a.partials(self.event_time))]
        partials = df.groupBy(*group).agg(*measures)
        if self.window is None:
            return partials
        rest = [c for c in partials.columns if c not in self.keys and c != _WINDOW]
        return partials.select(*self.keys, F.col(f"{_WINDOW}.start").alias(WINDOW_START),
                               F.unix_millis(F.col(f"{_WINDOW}.end")).alias(_END_MS), *rest)


def _partial_name(aggregate: int, field: int) -> str:
    return f"__batchline_p{aggregate}_{field}"


@dataclasses.dataclass(frozen=True)
class MergeIntoState:
    """The built-in state function: fold each group's partial of the batch into its stored
    one, set its timer, and emit as the output mode says. Plain data, pickled into the tasks.

    A partial row is ``(*key columns, [window_start, window end ms], rows, [newest], *partial
    fields)``; the stored state is ``(*partial fields, [newest])``; a row out is ``(*key
    columns, [window_start, window_end], *results)``."""

    key_count: int
    """Columns of the user's key (without the window)."""
    constant_key: bool
    """No key and no window: one group, keyed by a constant."""
    window_length: dt.timedelta | None
    append: bool
    first_partial: int
    """Index of the first partial field in an input row."""
    fields: tuple[int, ...]
    """How many partial fields each aggregate has, in order."""
    mergers: tuple[Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, ...]], ...]
    finishers: tuple[Callable[[tuple[Any, ...]], Any], ...]
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
        width = sum(self.fields)
        for row in rows:
            batch = row[self.first_partial:self.first_partial + width]
            if self.newest_index is not None:
                batch += (row[self.newest_index],)
            stored = batch if stored is None else self._merge(stored, batch)
            if self.window_length is not None:
                end_ms = row[self.key_count + 1]
        assert stored is not None, "the operator calls a key with rows or with its timer"
        state.update(stored)
        if end_ms is not None:
            state.set_timeout_timestamp(end_ms - 1)  # fires once the watermark reaches the end
        elif self.expire_after_ms is not None:
            if self.newest_index is None:
                state.set_timeout_duration(f"{self.expire_after_ms} ms")
            elif stored[-1] is not None:
                newest_ms = int(stored[-1].replace(tzinfo=dt.UTC).timestamp() * 1000)
                state.set_timeout_timestamp(max(newest_ms + self.expire_after_ms, state.current_watermark_ms()))
        return () if self.append else (self._row_out(key, stored),)

    def _merge(self, stored: tuple[Any, ...], batch: tuple[Any, ...]) -> tuple[Any, ...]:
        merged: list[Any] = []
        at = 0
        for n, merge in zip(self.fields, self.mergers, strict=True):
            merged += merge(stored[at:at + n], batch[at:at + n])
            at += n
        if self.newest_index is not None:
            old, new = stored[-1], batch[-1]
            merged.append(new if old is None or (new is not None and new > old) else old)
        return tuple(merged)

    def _row_out(self, key: Any, stored: tuple[Any, ...]) -> tuple[Any, ...]:
        if self.constant_key:
            head: tuple[Any, ...] = ()
        else:
            head = key if isinstance(key, tuple) and (self.key_count + (self.window_length is not None)) > 1 else (key,)
        if self.window_length is not None:
            head += (head[-1] + self.window_length,)
        results = []
        at = 0
        for n, finish in zip(self.fields, self.finishers, strict=True):
            results.append(finish(stored[at:at + n]))
            at += n
        return (*head, *results)


class AggregationNode(BuiltInNode):
    """A running or windowed aggregation: its partial frame feeds a stateful operator whose
    state function is ``MergeIntoState``; state and output schemas follow from the partials'
    types."""

    def __init__(self, parent: StreamNode, keys: tuple[str, ...], time_window: TimeWindow | None,
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
        if time_window is not None and watermark is not None and time_window.column != watermark.column:
            raise ConfigurationError(
                f"{what}: the window is on {time_window.column!r} but the watermark on {watermark.column!r}; "
                f"window on the watermark's column, as Spark requires")
        if mode is OutputMode.APPEND and (time_window is None or watermark is None):
            raise ConfigurationError(
                f"{what}: output_mode='append' emits a window once the watermark passes its end, so it needs a "
                "window and a watermark: group by window(column, length) after with_watermark(column, delay), "
                "or use output_mode='update'")
        needs_time = [a.name for a in aggregates if a.needs_event_time]
        if needs_time and watermark is None:
            raise ConfigurationError(f"{what}: {needs_time} pick by event time; call with_watermark(column, delay) "
                                     "first")
        expire_ms = None if expire_after is None else parse_duration_ms(expire_after, "expire_after")
        if expire_ms is not None and time_window is not None:
            raise ConfigurationError(f"{what}: a window's state goes when the watermark passes its end; "
                                     "expire_after is for aggregations without a window")
        if time_window is not None:
            timeout = GroupStateTimeout.EVENT_TIME if watermark is not None else GroupStateTimeout.NO_TIMEOUT
        elif expire_ms is not None:
            timeout = GroupStateTimeout.EVENT_TIME if watermark is not None else GroupStateTimeout.PROCESSING_TIME
        else:
            timeout = GroupStateTimeout.NO_TIMEOUT
        event_time = None if watermark is None else watermark.column
        partials = TransformNode([parent], _PartialFrame(keys, time_window, aggregates, event_time), keeps_empty=True)
        key_names = (*keys, WINDOW_START) if time_window is not None else keys or (_ALL,)
        super().__init__(partials, key_names, timeout=timeout, name=name, num_partitions=num_partitions)
        self.user_keys = keys
        self.window = time_window
        self.aggregates = aggregates
        self.output_mode = mode
        self.expire_after_ms = expire_ms
        # The partials carry the newest event time of each group's rows: the watermark follows it.
        self.event_time = None if watermark is None else Watermark(_NEWEST, watermark.delay_ms)

    @property
    def late_column(self) -> str | None:
        """A partial is late when its window ended at or before the watermark (Spark's ``window.end <= watermark``)."""
        return _END_MS if self.window is not None and self.event_time is not None else None

    rows_column = _ROWS

    def watermark(self) -> Watermark | None:
        """Downstream, event time is the window's end (as Spark's ``window.end``); a running
        aggregation's rows have none."""
        if self.window is None or self.event_time is None:
            return None
        return Watermark(WINDOW_END, self.event_time.delay_ms)

    def derive(self, input_schema: StructType) -> tuple[MergeIntoState, StructType, StructType]:
        fields = {f.name: f.dataType for f in input_schema.fields}
        types = [[fields[_partial_name(i, j)] for j in range(len(a.stored_names()))]
                 for i, a in enumerate(self.aggregates)]
        state = [StructField(stored, t) for a, ts in zip(self.aggregates, types, strict=True)
                 for stored, t in zip(a.stored_names(), ts, strict=True)]
        keeps_newest = self.expire_after_ms is not None and self.event_time is not None
        if keeps_newest:
            state.append(StructField(_NEWEST, TimestampType()))
        out = [StructField(k, fields[k]) for k in self.user_keys]
        if self.window is not None:
            out += [StructField(WINDOW_START, TimestampType()), StructField(WINDOW_END, TimestampType())]
        out += [StructField(a.name, a.result_type(ts)) for a, ts in zip(self.aggregates, types, strict=True)]
        names = input_schema.fieldNames()
        merge = MergeIntoState(
            key_count=len(self.user_keys), constant_key=not self.user_keys and self.window is None,
            window_length=None if self.window is None else dt.timedelta(milliseconds=self.window.length_ms),
            append=self.output_mode is OutputMode.APPEND, first_partial=names.index(_partial_name(0, 0)),
            fields=tuple(len(ts) for ts in types), mergers=tuple(a.merger() for a in self.aggregates),
            finishers=tuple(a.finisher() for a in self.aggregates),
            newest_index=names.index(_NEWEST) if keeps_newest else None, expire_after_ms=self.expire_after_ms)
        return merge, StructType(state), StructType(out)
