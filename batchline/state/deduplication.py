"""Deduplication (``Stream.drop_duplicates``, ``Stream.drop_duplicates_within_watermark``),
built on the stateful operator, with Spark's semantics.

Each batch, the rows are shuffled to the state partitions as they are, in one exchange, as
Spark's own deduplication does. (A partial in the JVM, one row per key and event time, cost a
hash aggregation over a row-wide struct and a second exchange, and reduced little: rows that
repeat a key mostly differ in event time.) The stateful operator drops the rows at or before
the watermark as late (counted) and keeps, for each key, ``KeepFirst``: a key seen before (its
state still kept) drops them all; a new key passes its first row and keeps the key until it
expires:

- ``drop_duplicates(cols)``: when the watermark reaches the key's event time (Spark keeps a
  key while its event-time column, part of the key, is above the watermark); a key without
  the event-time column is kept for ever, as in Spark;
- ``drop_duplicates_within_watermark(cols, within)``: when the watermark reaches the first
  row's event time plus ``within`` (by default the watermark's delay, as Spark's
  ``dropDuplicatesWithinWatermark``).

A key's first row of a batch is the one with the earliest event time; among rows of equal
event time, the smallest by the columns that have an order (in the order of the columns), so
that a batch that runs again passes the same row. (Spark passes whichever its task meets first.)

As in Spark, a key whose time is up in a batch still drops that batch's rows, and goes after it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    LongType,
    NumericType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from batchline.batch_time import epoch_ms
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError
from batchline.state.built_in import BuiltInNode, check_event_time
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
from batchline.state.entries import REMOVED_COL, STATE_PREFIX
from batchline.state.group_state import GroupState, GroupStateTimeout
from batchline.streams.base import StreamNode

__all__ = ["DeduplicationNode", "KeepFirst"]

logger = logging.getLogger(__name__)

_EXPIRES = "expires_at_ms"
_ORDERED = (NumericType, StringType, BinaryType, BooleanType, DateType, TimestampType, TimestampNTZType)
"""Spark types whose values Arrow sorts (and Python compares) the same way."""


def _rank(value: Any) -> tuple[Any, ...]:
    """A value's place in Arrow's ascending sort with nulls at the end: NaN after every number."""
    if value is None:
        return (2,)
    if isinstance(value, float) and math.isnan(value):
        return (1,)
    return (0, value)


@dataclasses.dataclass(frozen=True)
class KeepFirst(MergesInBulk, TimesOutInBulk):
    """The built-in state function of a deduplication; plain data, pickled into the tasks.
    An input row is a row of the stream, and so is a row out; the state is ``(expires at
    ms,)``. It runs in bulk (``merge``, ``time_out``: a partition's keys at once, over Arrow
    columns); ``__call__`` is the same per key."""

    time_index: int | None
    """Index of the event time in an input row; None without a watermark."""
    ordered: tuple[int, ...]
    """Indexes of the columns that have an order: among a key's rows of equal event time, the
    smallest by these passes."""
    expire_after_ms: int | None
    """The key expires at its first row's event time plus this; None: kept for ever."""

    def __call__(self, key: Any, rows: Iterator[tuple[Any, ...]], state: GroupState[tuple[Any, ...]]
                 ) -> Iterable[Any]:
        if state.has_timed_out:
            state.remove()
            return ()
        if state.exists:
            expires = state.get()[0]
            if expires is not None:
                if expires <= state.current_watermark_ms():
                    state.remove()  # its rows of this batch were still duplicates
                else:
                    state.set_timeout_timestamp(expires - 1)
            return ()
        index = self.time_index
        first = min(rows, key=self._rank)
        if self.expire_after_ms is None or index is None:
            state.update((None,))
        else:
            expires = epoch_ms(first[index]) + self.expire_after_ms
            state.update((expires,))
            state.set_timeout_timestamp(expires - 1)  # fires once the watermark reaches it
        return (first,)

    def _rank(self, row: tuple[Any, ...]) -> tuple[tuple[Any, ...], ...]:
        """Where a row stands among its key's rows, as Arrow sorts them (``_first_rows``)."""
        at = () if self.time_index is None else (self.time_index,)
        return tuple(_rank(row[i]) for i in (*at, *self.ordered))

    def merge(self, keyed: KeyedRows) -> BulkResult:
        rows, entries = keyed.rows, keyed.entries
        keys = entries.num_rows
        field = next(f for f in entries.schema if f.name.startswith(STATE_PREFIX))
        known = ~entries.column(REMOVED_COL).to_numpy()
        first = self._first_rows(keyed)
        stored = entries.column(field.name).combine_chunks().cast(pa.int64())
        if self.expire_after_ms is None or self.time_index is None:
            expires = pa.nulls(keys, pa.int64())
        else:
            times_ms = epoch_ms_column(rows.column(self.time_index).combine_chunks().take(pa.array(first)))
            expires = pc.add(times_ms, self.expire_after_ms)
        expires = pc.if_else(pa.array(known), stored, expires)
        # A known key whose time is up still drops the batch's rows, and goes after it.
        watermark = keyed.watermark_ms
        up = known & (pc.fill_null(pc.less_equal(stored, watermark), False).to_numpy(zero_copy_only=False)
                      if watermark is not None else np.zeros(keys, dtype=bool))
        timeouts = pc.if_else(pa.array(up), pa.nulls(keys, pa.int64()), pc.subtract(expires, 1))
        state = state_columns([field], [pc.if_else(pa.array(up), pa.nulls(keys, pa.int64()), expires)], timeouts,
                              up)
        passed = rows.take(pa.array(first[~known]))
        schema = keyed.output_schema
        output = pa.Table.from_arrays([c.cast(f.type) for c, f in zip(passed.columns, schema, strict=True)],
                                      schema=schema)
        return BulkResult(output, state, updated=~known)

    def _first_rows(self, keyed: KeyedRows) -> np.ndarray:
        """Per key (in the order of ``keyed.entries``), the index of its first row: sorted by
        key, event time and the ordered columns; among rows equal in all of them, the first to
        come (the sort is stable)."""
        rows = keyed.rows
        columns = [pa.array(keyed.key_of_row)]
        if self.time_index is not None:
            columns.append(micros_column(rows.column(self.time_index)))
        columns.extend(rows.column(i) for i in self.ordered)
        names = [str(i) for i in range(len(columns))]
        # Arrow places nulls last by default (and NaN just before them).
        order = pc.sort_indices(pa.table(columns, names=names), sort_keys=[(n, "ascending") for n in names]).to_numpy()
        grouped = keyed.key_of_row[order]
        return order[np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])]

    def time_out(self, due: DueKeys) -> BulkResult:
        return BulkResult(due.output_schema.empty_table(), removing_all(due.entries))


class DeduplicationNode(BuiltInNode):
    """``drop_duplicates`` / ``drop_duplicates_within_watermark``: rows out are input rows."""

    rows_column = None  # each input row counts one

    def __init__(self, parent: StreamNode, columns: tuple[str, ...], *, within: object | None, within_watermark: bool,
                 name: str, num_partitions: int | None) -> None:
        watermark = parent.watermark()
        what = f"deduplication {name!r}"
        if not columns:
            raise ConfigurationError(f"{what} needs the columns that make a row a duplicate")
        if within_watermark and watermark is None:
            raise ConfigurationError(f"{what}: drop_duplicates_within_watermark needs a watermark; call "
                                     "with_watermark(column, delay) first")
        if within is not None and not within_watermark:
            raise ConfigurationError(f"{what}: within= is for drop_duplicates_within_watermark")
        time = None if watermark is None else watermark.column
        if within_watermark:
            assert watermark is not None
            expire_ms: int | None = watermark.delay_ms if within is None else parse_duration_ms(within, "within")
        elif time is not None and time in columns:
            expire_ms = 0
        else:
            expire_ms = None
            logger.warning("Deduplication %s keeps every key for ever: %s", name,
                           "its columns do not include the watermark's column "
                           f"{time!r} (add it, or use drop_duplicates_within_watermark)" if time is not None
                           else "its stream has no watermark (call with_watermark(column, delay) first)")
        timeout = GroupStateTimeout.EVENT_TIME if expire_ms is not None else GroupStateTimeout.NO_TIMEOUT
        super().__init__(parent, columns, timeout=timeout, name=name, num_partitions=num_partitions)
        self.expire_after_ms = expire_ms

    @property
    def rows_node(self) -> StreamNode:
        return self.parents[0]  # the operator takes the stream's rows as they are

    @property
    def late_column(self) -> str | None:
        """A row at or before the watermark is late, as Spark's ``eventTime <= watermark``."""
        return None if self.event_time is None else self.event_time.column

    def derive(self, input_schema: StructType) -> tuple[KeepFirst, StructType, StructType]:
        check_event_time(self, input_schema)
        names = input_schema.fieldNames()
        time = None if self.event_time is None else names.index(self.event_time.column)
        ordered = tuple(i for i, f in enumerate(input_schema.fields) if isinstance(f.dataType, _ORDERED))
        return (KeepFirst(time, ordered, self.expire_after_ms), StructType([StructField(_EXPIRES, LongType())]),
                input_schema)
