"""Joining two streams (``Stream.join``): inner, left/right/full outer and left semi joins on
equal keys and, optionally, an event-time range, with Spark's stream-stream join semantics.

A join is one stateful operator with two inputs. Each batch, Spark tags the rows of both
streams with their side and their times and unions them (``_JoinInput``); the operator shuffles
them by the join key into its state partitions, so both sides of a key meet in one task, and
calls ``JoinRows`` per key with the key's new rows and its state: each side's buffered rows.

- A pair of rows that meets the condition is emitted once, in the batch where the second of
  the two arrives (new left rows meet the right rows buffered before, then new right rows
  meet every left row buffered, this batch's included), as Spark's symmetric hash join does.
- ``within=(left_time, right_time, lower, upper)`` keeps pairs whose right time lies in
  ``[left_time + lower, left_time + upper]``. Rows at or before the watermark (the lowest of
  the two streams', Spark's global watermark) are late: dropped and counted. A buffered row
  goes once no row still to come can meet it: a left row once ``left_time + upper`` lies before
  the watermark, a right row once ``right_time - lower`` does (Spark's state watermarks,
  one millisecond on the safe side as Spark's). An outer join emits a row that never met one,
  with nulls for the other side, as it goes; so does every row at the inputs' end.
- Without ``within`` the state is never dropped: an inner join says so at definition, an
  outer or semi join is refused.
- A null key meets nothing (SQL's equality, no null-safe ``<=>``): an outer join emits such a
  row at once, with nulls, where Spark waits for the watermark to pass it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from batchline.choices import choose
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError
from batchline.state.built_in import BuiltInNode
from batchline.state.bulk import BulkResult, DueKeys, TimesOutInBulk
from batchline.state.contract import LATE_AT
from batchline.state.entries import KEY_PREFIX, REMOVED_COL, STATE_PREFIX, TIMEOUT_COL
from batchline.state.group_state import GroupState, GroupStateTimeout, TimeoutNotEnabledError
from batchline.state.schema import RowSchema
from batchline.streams.base import StreamNode, Watermark
from batchline.streams.nodes import TransformNode

__all__ = ["JoinNode", "JoinRows", "JoinType", "Within"]

logger = logging.getLogger(__name__)

LEFT, RIGHT = 0, 1
SIDE = "__batchline_side"
"""Which stream a row of the join's input came from: ``LEFT`` or ``RIGHT``."""
TIME = "__batchline_time_ms"
"""A row's time in the range condition (epoch ms); in a buffered row, the same."""
EVENT_TIME = "__batchline_event_ms"
"""A row's event time (epoch ms) when its stream has a watermark, else null: what the
watermark follows and what makes a row late."""
MATCHED = "__batchline_matched"
"""Whether a buffered row has met a row of the other side (an outer join emits it with nulls
when it goes if not)."""
_PREFIXES = ("__batchline_l_", "__batchline_r_")
KEY = -1
"""An output column that is the key (keys named alike on both sides appear once)."""
SIDE_KEY = (-2, -3)
"""An output column that is one side's key column (named otherwise on the other side): the
key, when the output row has a row of that side."""
_EXACT_KEYS = (LongType, IntegerType, ShortType, ByteType, StringType, BinaryType, BooleanType, DateType,
               TimestampType, TimestampNTZType, DecimalType)
"""Key types whose values equal the key only when they are the same value: a buffered row need
not repeat them. Not floats: -0.0 and 0.0 are one key, and a row keeps its own."""


class JoinType(enum.Enum):
    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    FULL = "full"
    LEFT_SEMI = "left_semi"

    @property
    def keeps_unmatched(self) -> tuple[bool, bool]:
        """Whether a left / right row that never met one is emitted (with nulls)."""
        return self in (JoinType.LEFT, JoinType.FULL), self in (JoinType.RIGHT, JoinType.FULL)


@dataclasses.dataclass(frozen=True)
class Within:
    """Pairs whose right time lies in ``[left_time + lower_ms, left_time + upper_ms]``."""

    left_time: str
    right_time: str
    lower_ms: int
    upper_ms: int

    @classmethod
    def of(cls, value: Within | Sequence[object]) -> Within:
        if isinstance(value, Within):
            return value
        if not isinstance(value, (tuple, list)) or len(value) != 4:
            raise ConfigurationError(
                "within= takes (left_time, right_time, lower, upper): the right row's time lies in "
                "[left_time + lower, left_time + upper], e.g. ('shown_at', 'clicked_at', '0 seconds', '1 hour')")
        left_time, right_time, lower, upper = value
        if not isinstance(left_time, str) or not isinstance(right_time, str):
            raise ConfigurationError(f"within= names the two time columns first; got {left_time!r}, {right_time!r}")
        found = cls(left_time, right_time, _signed_ms(lower, "within's lower bound"),
                    _signed_ms(upper, "within's upper bound"))
        if found.lower_ms > found.upper_ms:
            raise ConfigurationError(f"within's lower bound {lower!r} lies after its upper bound {upper!r}; no row "
                                     "could ever meet another")
        return found


def _signed_ms(value: object, what: str) -> int:
    """A duration that may be negative ("-10 minutes", a negative timedelta or number of seconds)."""
    if isinstance(value, str) and value.strip().startswith("-"):
        return -parse_duration_ms(value.strip()[1:], what, allow_zero=True)
    if isinstance(value, _dt.timedelta) and value < _dt.timedelta(0):
        return -parse_duration_ms(-value, what, allow_zero=True)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        return -parse_duration_ms(-value, what, allow_zero=True)
    return parse_duration_ms(value, what, allow_zero=True)


def _epoch_ms(column: str) -> Column:
    return F.unix_millis(F.col(column).cast("timestamp"))


@dataclasses.dataclass(frozen=True)
class _JoinInput:
    """Both streams' rows of a batch as one frame: the key (under the left's names), the side,
    the times, then each side's columns under a prefix of its own (null on the other side's rows)."""

    key_names: tuple[str, ...]
    right_keys: tuple[str, ...]
    times: tuple[str | None, str | None]
    """Each side's column of the range condition."""
    event_times: tuple[str | None, str | None]
    """Each side's watermark column."""

    def __call__(self, left: DataFrame, right: DataFrame) -> DataFrame:
        sides = []
        for side, (df, keys) in enumerate(((left, self.key_names), (right, self.right_keys))):
            which = "left" if side == LEFT else "right"
            missing = [c for c in (*keys, self.times[side], self.event_times[side]) if c and c not in df.columns]
            if missing:
                raise ConfigurationError(f"join: the {which} stream has no column(s) {missing}; it has {df.columns}")
            time, event = self.times[side], self.event_times[side]
            sides.append(df.select(
                *[F.col(k).alias(n) for k, n in zip(keys, self.key_names, strict=True)],
                F.lit(side).cast("byte").alias(SIDE),
                (_epoch_ms(time) if time else F.lit(None).cast("long")).alias(TIME),
                (_epoch_ms(event) if event else F.lit(None).cast("long")).alias(EVENT_TIME),
                *[F.col(c).alias(_PREFIXES[side] + c) for c in df.columns]))
        left_keys, right_keys = (StructType([s.schema[n] for n in self.key_names]) for s in sides)
        if left_keys.simpleString() != right_keys.simpleString():
            raise ConfigurationError(
                f"join: the key columns have different types on the two sides ({left_keys.simpleString()} and "
                f"{right_keys.simpleString()}); cast one side's with with_column before joining")
        return sides[LEFT].unionByName(sides[RIGHT], allowMissingColumns=True)


@dataclasses.dataclass(frozen=True)
class JoinRows(TimesOutInBulk):
    """The join's state function; plain data, pickled into the tasks. The state is
    ``(left rows, right rows)``: each a list of the side's buffered rows as dicts of its columns,
    ``TIME`` and ``MATCHED``. Keys that only time out (most keys, once, when their rows pass
    the watermark) go in bulk over Arrow columns (``time_out``), exactly as ``__call__``
    would have left them."""

    how: JoinType
    side_index: int
    time_index: int
    columns: tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]
    """Per side: (column name, index in an input row) of each of its columns."""
    output: tuple[tuple[int, Any], ...]
    """Per output column: where it comes from (``KEY``: the key, at the index given; LEFT or
    RIGHT: that side's row, the column named; ``SIDE_KEY[side]``: the key at the index given,
    as that side's own key column, which its buffered rows do not repeat: null when the row
    has no row of that side)."""
    within: tuple[int, int] | None
    """(lower, upper) ms of the range condition, or None: every pair of equal keys meets."""
    evict_after: tuple[int | None, int | None]
    """Per side: a buffered row goes once its time is at or before the watermark minus this;
    None: it stays (its state grows for ever)."""

    def __call__(self, key: Any, rows: Iterator[tuple[Any, ...]], state: GroupState[Any]) -> Iterable[Any]:
        left, right = state.get() if state.exists else ([], [])
        left, right = list(left), list(right)
        out: list[tuple[Any, ...]] = []
        if not state.has_timed_out:
            arrived: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
            for row in rows:
                side = row[self.side_index]
                row_dict = {name: row[i] for name, i in self.columns[side]}
                row_dict[TIME], row_dict[MATCHED] = row[self.time_index], False
                arrived[side].append(row_dict)
            if key is None or (isinstance(key, tuple) and None in key):
                # A null key meets nothing (as SQL's equality): an outer side's row goes out alone.
                for side in (LEFT, RIGHT):
                    if self.how.keeps_unmatched[side]:
                        out.extend(self._row(key, *((r, None) if side == LEFT else (None, r))) for r in arrived[side])
                return out
            self._meet(key, arrived, left, right, out)
        watermark = _watermark_ms(state)
        deadline: int | None = None
        if watermark is not None:
            keeps_unmatched = self.how.keeps_unmatched  # a property: read once, not per row
            for side, rows_of_side in ((LEFT, left), (RIGHT, right)):
                after = self.evict_after[side]
                if after is None:
                    continue
                keep = []
                for stored in rows_of_side:
                    time = stored[TIME]
                    if time is not None and time <= watermark - after:
                        if keeps_unmatched[side] and not stored[MATCHED]:
                            out.append(self._row(key, *((stored, None) if side == LEFT else (None, stored))))
                    else:
                        keep.append(stored)
                        if time is not None:
                            due = time + after - 1  # fires once the watermark passes it: when the row goes
                            deadline = due if deadline is None else min(deadline, due)
                rows_of_side[:] = keep
        if left or right:
            state.update((left, right))
            if deadline is not None:
                state.set_timeout_timestamp(max(deadline, watermark or 1, 1))
        elif state.exists:
            state.remove()
        return out

    def time_out(self, due: DueKeys) -> BulkResult:
        """``__call__`` for keys that timed out, over all of them at once: each side's rows at
        or before the watermark minus ``evict_after`` go (an outer side's unmatched ones out,
        with nulls), the others stay and set the key's deadline; a key left with no row goes."""
        entries, watermark = due.entries, due.watermark_ms
        count = entries.num_rows
        sides = [_Side.of(entries.column(STATE_PREFIX + name), self.evict_after[side], watermark)
                 for side, name in ((LEFT, "left"), (RIGHT, "right"))]
        deadline = np.full(count, _NO_DEADLINE, dtype=np.int64)
        for part in sides:
            part.lower_deadlines(deadline)
        held = sides[LEFT].kept_per_key(count) + sides[RIGHT].kept_per_key(count)
        removed = held == 0
        has_deadline = (deadline != _NO_DEADLINE) & ~removed
        # As __call__'s set_timeout_timestamp(max(deadline, watermark or 1, 1)).
        deadline = np.maximum(deadline, max(watermark or 1, 1))
        state_columns = [part.kept_lists(entries.schema.field(STATE_PREFIX + name).type, removed)
                         for part, name in zip(sides, ("left", "right"), strict=True)]
        state = pa.table({STATE_PREFIX + "left": state_columns[LEFT], STATE_PREFIX + "right": state_columns[RIGHT],
                          TIMEOUT_COL: pa.array(deadline, type=pa.int64(), mask=~has_deadline),
                          REMOVED_COL: pa.array(removed, type=pa.bool_())})
        return BulkResult(self._timed_out_rows(entries, sides, due.output_schema), state)

    def _timed_out_rows(self, entries: pa.Table, sides: list[_Side], schema: pa.Schema) -> pa.Table:
        """The outer sides' unmatched rows that go, with nulls for the other side: key by key
        in the due keys' order, each key's left rows before its right rows."""
        emitted = [part.emitted(self.how.keeps_unmatched[side]) for side, part in enumerate(sides)]
        parents = np.concatenate([parent for _, parent in emitted])
        if not len(parents):
            return schema.empty_table()
        order = pa.array(np.argsort(parents, kind="stable"))
        keys = [entries.column(name) for name in entries.column_names if name.startswith(KEY_PREFIX)]
        columns = []
        for (source, where), field in zip(self.output, schema, strict=True):
            if source < 0:
                key = keys[where if len(keys) > 1 else 0]
                column: pa.Array | pa.ChunkedArray = pa.concat_arrays([
                    key.take(pa.array(parent)).combine_chunks().cast(field.type)
                    if source in (KEY, SIDE_KEY[side]) else pa.nulls(len(parent), field.type)
                    for side, (_, parent) in enumerate(emitted)])
            else:
                rows, parent = emitted[source]
                other = len(parents) - len(parent)
                mine = rows.field(where).cast(field.type)
                nulls = pa.nulls(other, field.type)
                column = pa.concat_arrays([mine, nulls] if source == LEFT else [nulls, mine])
            columns.append(column.take(order).cast(field.type))
        return pa.Table.from_arrays(columns, schema=schema)

    def _meet(self, key: Any, arrived: tuple[list[dict[str, Any]], list[dict[str, Any]]],
              left: list[dict[str, Any]], right: list[dict[str, Any]], out: list[tuple[Any, ...]]) -> None:
        """New left rows meet the buffered right rows, then new right rows meet every left row."""
        semi = self.how is JoinType.LEFT_SEMI
        for new in arrived[LEFT]:
            for other in right:
                if self._meets(new, other):
                    new[MATCHED] = other[MATCHED] = True
                    if not semi:
                        out.append(self._row(key, new, other))
            if semi and new[MATCHED]:
                out.append(self._row(key, new, None))  # emitted once; no later row needs it
            else:
                left.append(new)
        for new in arrived[RIGHT]:
            for other in left:
                if self._meets(other, new):
                    if semi:
                        if not other[MATCHED]:
                            out.append(self._row(key, other, None))
                    else:
                        out.append(self._row(key, other, new))
                    new[MATCHED] = other[MATCHED] = True
            right.append(new)

    def _meets(self, left: dict[str, Any], right: dict[str, Any]) -> bool:
        if self.within is None:
            return True
        lt, rt = left[TIME], right[TIME]
        return lt is not None and rt is not None and lt + self.within[0] <= rt <= lt + self.within[1]

    def _row(self, key: Any, left: dict[str, Any] | None, right: dict[str, Any] | None) -> tuple[Any, ...]:
        values = []
        for source, where in self.output:
            if source < 0:
                present = source == KEY or (left if source == SIDE_KEY[LEFT] else right) is not None
                values.append((key[where] if isinstance(key, tuple) else key) if present else None)
            else:
                row = left if source == LEFT else right
                values.append(None if row is None else row[where])
        return tuple(values)


_NO_DEADLINE = np.iinfo(np.int64).max


@dataclasses.dataclass
class _Side:
    """One side's buffered rows of a bulk timeout's keys, flattened: the rows, the key (row of
    the due keys) each belongs to, and which of them go."""

    lists: pa.ListArray
    rows: pa.StructArray
    parents: np.ndarray
    goes: np.ndarray
    times: np.ndarray
    """Each row's time (0 where it has none: ``timed`` says which have one)."""
    timed: np.ndarray
    after: int | None

    @classmethod
    def of(cls, column: pa.ChunkedArray, after: int | None, watermark: int | None) -> _Side:
        lists = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        rows = lists.flatten()  # a null list (a key without state) holds no row
        parents = pc.list_parent_indices(lists).to_numpy()
        time_column = rows.field(TIME)
        timed = ~np.asarray(time_column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        times = pc.fill_null(time_column, 0).to_numpy()
        if after is None or watermark is None:
            # Kept for ever, and no deadline: as __call__, which evicts nothing without a watermark.
            return cls(lists, rows, parents, np.zeros(len(rows), dtype=bool), times, timed, None)
        return cls(lists, rows, parents, timed & (times <= watermark - after), times, timed, after)

    def lower_deadlines(self, deadline: np.ndarray) -> None:
        """Each key's deadline down to its kept rows' (``time + after - 1``: the watermark
        passes it when the row goes)."""
        if self.after is None:
            return
        dated = ~self.goes & self.timed
        np.minimum.at(deadline, self.parents[dated], self.times[dated] + (self.after - 1))

    def kept_per_key(self, count: int) -> np.ndarray:
        return np.bincount(self.parents[~self.goes], minlength=count)

    def kept_lists(self, list_type: pa.DataType, removed: np.ndarray) -> pa.Array:
        """The side's state column after the timeout: its kept rows, a null for a removed key."""
        offsets = np.zeros(len(removed) + 1, dtype=np.int32)
        np.cumsum(self.kept_per_key(len(removed)), out=offsets[1:])
        kept = self.rows.filter(pa.array(~self.goes)) if self.goes.any() else self.rows
        return pa.ListArray.from_arrays(pa.array(offsets), kept, type=list_type, mask=pa.array(removed))

    def emitted(self, keeps_unmatched: bool) -> tuple[pa.StructArray, np.ndarray]:
        """The rows that go out without a match (if the side keeps them), and their keys."""
        if not keeps_unmatched:
            return self.rows.slice(0, 0), np.empty(0, dtype=np.int64)
        matched = pc.fill_null(self.rows.field(MATCHED), False).to_numpy(zero_copy_only=False)
        out = self.goes & ~np.asarray(matched, dtype=bool)
        return self.rows.filter(pa.array(out)), self.parents[out].astype(np.int64)


def _column(watermark: Watermark | None) -> str | None:
    return None if watermark is None else watermark.column


def _watermark_ms(state: GroupState[Any]) -> int | None:
    try:
        return state.current_watermark_ms()
    except TimeoutNotEnabledError:
        return None  # no event time seen yet


class JoinNode(BuiltInNode):
    """``Stream.join``: a stateful operator over both streams' rows, keyed by the join key."""

    rows_column = None  # each input row counts one

    def __init__(self, left: StreamNode, right: StreamNode, on: str | Sequence[str | tuple[str, str]], *,
                 how: JoinType | str, within: Within | Sequence[object] | None, name: str,
                 num_partitions: int | None) -> None:
        self.how = choose(JoinType, how, "how")
        pairs = _key_pairs(on)
        self.within = None if within is None else Within.of(within)
        watermarks = (left.watermark(), right.watermark())
        what = f"join {name!r}"
        times = (None, None) if self.within is None else (self.within.left_time, self.within.right_time)
        for side, watermark in enumerate(watermarks):
            if watermark is not None and times[side] is not None and times[side] != watermark.column:
                which = "left" if side == LEFT else "right"
                raise ConfigurationError(
                    f"{what}: within= compares the {which} stream's {times[side]!r}, but its watermark follows "
                    f"{watermark.column!r}; compare the watermark's column (or put the watermark on "
                    f"{times[side]!r}), so that the watermark says which rows can still meet")
        # A left row can go once no right row to come can meet it: right rows behind the
        # watermark are dropped, so that needs the right stream's watermark; and the reverse.
        evict: tuple[int | None, int | None] = (None, None)
        if self.within is not None:
            evict = (self.within.upper_ms + 1 if watermarks[RIGHT] is not None else None,
                     1 - self.within.lower_ms if watermarks[LEFT] is not None else None)
        self._check_bounded(what, watermarks, evict)
        inputs = TransformNode([left, right], _JoinInput(
            tuple(lk for lk, _ in pairs), tuple(rk for _, rk in pairs), times,
            (_column(watermarks[LEFT]), _column(watermarks[RIGHT]))), keeps_empty=True)
        timeout = GroupStateTimeout.EVENT_TIME if evict != (None, None) else GroupStateTimeout.NO_TIMEOUT
        super().__init__(inputs, tuple(lk for lk, _ in pairs), timeout=timeout, name=name,
                         num_partitions=num_partitions)
        self.pairs = pairs
        self.evict_after = evict
        self.input_column = SIDE
        self.input_watermarks = watermarks
        self.event_time = None if watermarks == (None, None) else Watermark(EVENT_TIME, 0)
        self._input_schema: StructType | None = None
        """The schema ``derive`` was given (``check_stored_state`` derives the older layout from it)."""

    def check_stored_state(self, stored: StructType) -> None:
        """State written before buffered rows left their key columns out is read in its own
        layout: the operator keeps that layout for as long as its state lives."""
        current = self.state_schema.struct.simpleString()
        if stored.simpleString() != current and self._input_schema is not None:
            fn, state, output = self.derive(self._input_schema, keys_in_rows=True)
            if stored.simpleString() == state.simpleString():
                logger.info("Join %r keeps its stored state's layout, whose buffered rows repeat the key columns",
                            self.name)
                self.fn, self.state_schema, self.output_schema = fn, RowSchema.of(state), RowSchema.of(output)
                return
        super().check_stored_state(stored)

    def _check_bounded(self, what: str, watermarks: tuple[Watermark | None, Watermark | None],
                       evict: tuple[int | None, int | None]) -> None:
        needs = [side for side in (LEFT, RIGHT)
                 if (self.how.keeps_unmatched[side] or (self.how is JoinType.LEFT_SEMI and side == LEFT))
                 and evict[side] is None]
        if needs:
            other = "right" if needs[0] == LEFT else "left"
            raise ConfigurationError(
                f"{what}: a {self.how.value} join emits a row without a match only once no match can come, so it "
                f"needs within=(left_time, right_time, lower, upper) and a watermark on the {other} stream "
                f"(with_watermark(column, delay) on both streams is simplest), as Spark requires")
        kept = [("left", "right")[side] for side in (LEFT, RIGHT) if evict[side] is None]
        if kept:
            reason = ("it has no within=(left_time, right_time, lower, upper)" if self.within is None
                      else f"the {('right', 'left')[LEFT if kept[0] == 'left' else RIGHT]} stream has no watermark")
            logger.warning("%s keeps every %s row for ever (%s), as Spark does: its state grows without bound. Add "
                           "within= and with_watermark on both streams to bound it", what.capitalize(),
                           " and every ".join(kept), reason)

    @property
    def rows_node(self) -> StreamNode:
        return self.parents[0]

    @property
    def late_column(self) -> str | None:
        """A row at or before the watermark is late, as Spark drops it from a join's input;
        rows of a stream without a watermark never are."""
        return None if self.event_time is None else EVENT_TIME

    def late_rows(self, rows: DataFrame) -> DataFrame:
        sides = []
        for side, prefix in enumerate(_PREFIXES):
            columns = [c for c in rows.columns if c.startswith(prefix)]
            sides.append(F.when(F.col(SIDE) == side, F.struct(*[F.col(c).alias(c[len(prefix):]) for c in columns])))
        return rows.select(F.when(F.col(SIDE) == LEFT, "left").otherwise("right").alias("side"),
                           *self.key_names, sides[LEFT].alias("left"), sides[RIGHT].alias("right"),
                           F.col(EVENT_TIME).alias(LATE_AT))

    def derive(self, input_schema: StructType, keys_in_rows: bool = False) -> tuple[JoinRows, StructType, StructType]:
        """The state function and schemas. A buffered row keeps its side's columns but the key
        columns, which the state's key holds already (``keys_in_rows``: it keeps them too, the
        layout of the state written before, see ``check_stored_state``)."""
        self._input_schema = input_schema
        names = input_schema.fieldNames()
        fields: list[list[StructField]] = [[], []]
        columns: list[tuple[tuple[str, int], ...]] = []
        stored_fields: list[list[StructField]] = [[], []]
        dropped: list[dict[str, int]] = [{}, {}]
        for side, prefix in enumerate(_PREFIXES):
            found = [(f.name[len(prefix):], names.index(f.name), f) for f in input_schema.fields
                     if f.name.startswith(prefix)]
            fields[side] = [StructField(n, f.dataType, True) for n, _, f in found]
            if not keys_in_rows:
                dropped[side] = {pair[side]: index for index, pair in enumerate(self.pairs)
                                 if isinstance(input_schema[pair[0]].dataType, _EXACT_KEYS)}
            columns.append(tuple((n, i) for n, i, _ in found if n not in dropped[side]))
            stored_fields[side] = [f for f in fields[side] if f.name not in dropped[side]]
        output, out_fields = self._output_plan(fields)
        output = tuple((SIDE_KEY[source], dropped[source][where])
                       if source >= 0 and where in dropped[source] else (source, where) for source, where in output)
        stored = [StructType([*stored_fields[side], StructField(TIME, LongType()),
                              StructField(MATCHED, BooleanType())]) for side in (LEFT, RIGHT)]
        state = StructType([StructField("left", ArrayType(stored[LEFT], False)),
                            StructField("right", ArrayType(stored[RIGHT], False))])
        fn = JoinRows(self.how, names.index(SIDE), names.index(TIME), (columns[LEFT], columns[RIGHT]), output,
                      None if self.within is None else (self.within.lower_ms, self.within.upper_ms),
                      self.evict_after)
        return fn, state, StructType(out_fields)

    def _output_plan(self, fields: list[list[StructField]]) -> tuple[tuple[tuple[int, Any], ...], list[StructField]]:
        """The output's columns: the keys once (joined on names alike), then the left stream's
        columns, then the right's (none for a semi join)."""
        plan: list[tuple[int, Any]] = []
        out: list[StructField] = []
        keys = set()
        if self.how is not JoinType.LEFT_SEMI:
            # A key named alike on both sides appears once, as in Spark's join(on=[names]).
            for i, (name, other) in enumerate(self.pairs):
                if name == other:
                    plan.append((KEY, i))
                    out.append(next(f for f in fields[LEFT] if f.name == name))
                    keys.add(name)
        sides = (LEFT,) if self.how is JoinType.LEFT_SEMI else (LEFT, RIGHT)
        for side in sides:
            for f in fields[side]:
                if f.name in keys:
                    continue
                if any(o.name == f.name for o in out):
                    raise ConfigurationError(
                        f"join {self.name!r}: both streams have a column {f.name!r}; rename one side's before "
                        "joining (select with an alias), so that the joined rows name each once")
                plan.append((side, f.name))
                out.append(f)
        return tuple(plan), out


def _key_pairs(on: str | Sequence[str | tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    items = [on] if isinstance(on, str) else list(on)
    pairs = []
    for item in items:
        if isinstance(item, str):
            pairs.append((item, item))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(c, str) for c in item):
            pairs.append((item[0], item[1]))
        else:
            raise ConfigurationError(f"join on= takes column names, or (left column, right column) pairs; got {item!r}")
    if not pairs:
        raise ConfigurationError("join needs on=: the columns whose values must be equal on both sides")
    bad = [c for pair in pairs for c in pair if c.startswith("__batchline_")]
    if bad:
        raise ConfigurationError(f"join on= names batchline's own column(s) {bad}")
    return tuple(pairs)
