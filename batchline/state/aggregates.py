"""The aggregates of a running or windowed aggregation (``KeyedStream.aggregate``): the ones
that merge across batches, each in two halves.

- In the JVM, per batch: Spark computes each aggregate's *partial* for every group (key and
  window) from the batch's rows, as ordinary Spark aggregate expressions (``partials``), so
  one row per group and batch reaches Python.
- In the state, per group: ``merge`` folds a batch's partial into the stored one, and
  ``result`` turns the stored partial into the value a row out carries.

Spark's ``first``/``last`` pick by arrival order; these pick by event time (ties by value),
so that a batch that runs again after a crash gives the same answer.

Usage: ``from batchline import aggregates as agg``, then ``agg.count()``,
``agg.sum("amount").alias("total")``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, DoubleType, LongType

from batchline.errors import ConfigurationError

__all__ = [
    "Aggregate",
    "avg",
    "collect_list",
    "collect_set",
    "count",
    "first",
    "last",
    "max",
    "mergeable",
    "min",
    "sum",
]


class _Kind(enum.Enum):
    COUNT = "count"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    FIRST = "first"
    LAST = "last"
    COLLECT_LIST = "collect_list"
    COLLECT_SET = "collect_set"


@dataclasses.dataclass(frozen=True)
class Aggregate:
    """One aggregate of a running or windowed aggregation; make it with this module's
    functions (``count()``, ``sum(column)``, ...) and name its column with ``alias``."""

    kind: _Kind
    column: str | None
    name: str

    def alias(self, name: str) -> Aggregate:
        """The same aggregate, in a column called ``name``."""
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"an aggregate's alias is a column name; got {name!r}")
        return dataclasses.replace(self, name=name)

    # ---------------------------------------------------------------- in the JVM
    def partials(self, event_time: str | None) -> list[Column]:
        """The Spark aggregate expressions of this aggregate's partial, one per stored field."""
        kind, value = self.kind, None if self.column is None else F.col(self.column)
        if kind is _Kind.COUNT:
            return [F.count(F.lit(1)) if value is None else F.count(value)]
        assert value is not None
        if kind is _Kind.SUM:
            return [F.sum(value)]
        if kind is _Kind.MIN:
            return [F.min(value)]
        if kind is _Kind.MAX:
            return [F.max(value)]
        if kind is _Kind.AVG:
            return [F.sum(value).cast("double"), F.count(value)]
        if kind in (_Kind.FIRST, _Kind.LAST):
            assert event_time is not None, "first and last need an event time"
            # Ordered by event time, then by value: the same pick every time the batch runs.
            pair = F.struct(F.col(event_time).alias("t"), value.alias("v"))
            picked = F.min(F.when(value.isNotNull(), pair)) if kind is _Kind.FIRST else F.max(
                F.when(value.isNotNull(), pair))
            return [picked.getField("t"), picked.getField("v")]
        if kind is _Kind.COLLECT_LIST:
            return [F.collect_list(value)]
        return [F.array_sort(F.collect_set(value))]

    def stored_names(self) -> list[str]:
        """The names of the partial's fields in the state (what ``read_state`` shows)."""
        if self.kind is _Kind.AVG:
            return [f"{self.name}_sum", f"{self.name}_count"]
        if self.kind in (_Kind.FIRST, _Kind.LAST):
            return [f"{self.name}_time", f"{self.name}_value"]
        return [self.name]

    @property
    def needs_event_time(self) -> bool:
        return self.kind in (_Kind.FIRST, _Kind.LAST)

    # ---------------------------------------------------------------- in the state
    def merger(self) -> Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, ...]]:
        """``merge(stored, batch)``: both are this aggregate's partial fields; the stored one
        comes first (it is from earlier batches)."""
        return _MERGERS[self.kind]

    def finisher(self) -> Callable[[tuple[Any, ...]], Any]:
        """``result(stored)``: the value of the aggregate's column."""
        return _RESULTS.get(self.kind, _only)

    def columns_merger(self) -> Callable[[list[pa.Array], list[pa.Array]], list[pa.Array]] | None:
        """``merge`` over columns: row by row, as ``merger`` would give (None: only row by row).
        Both sides have the stored fields' types; a stored row of nulls is a group without state."""
        return _COLUMN_MERGERS.get(self.kind)

    def columns_finisher(self) -> Callable[[list[pa.Array]], pa.Array]:
        """``result`` over columns."""
        return _COLUMN_RESULTS.get(self.kind, _first_column)

    def result_type(self, partial_types: list[DataType]) -> DataType:
        """The type of the aggregate's column, from its partial fields' types."""
        if self.kind is _Kind.COUNT:
            return LongType()
        if self.kind is _Kind.AVG:
            return DoubleType()
        if self.kind in (_Kind.FIRST, _Kind.LAST):
            return partial_types[1]
        if self.kind in (_Kind.COLLECT_LIST, _Kind.COLLECT_SET):
            element = partial_types[0]
            return element if isinstance(element, ArrayType) else ArrayType(element)
        return partial_types[0]


def _add(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else a + b


def _least(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None or a <= b else b


def _greatest(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None or a >= b else b


def _union(a: list[Any] | None, b: list[Any] | None) -> list[Any] | None:
    if not a or not b:
        return a or b
    merged = list(a)
    merged.extend(v for v in b if v not in a)
    try:
        merged.sort()
    except TypeError:
        pass  # values with no order (maps) keep first-seen order
    return merged


def _only(stored: tuple[Any, ...]) -> Any:
    return stored[0]


def _earlier(stored: tuple[Any, ...], batch: tuple[Any, ...]) -> tuple[Any, ...]:
    # Ties keep the stored pick: it came from an earlier batch.
    return batch if stored[0] is None or (batch[0] is not None and batch[0] < stored[0]) else stored


def _later(stored: tuple[Any, ...], batch: tuple[Any, ...]) -> tuple[Any, ...]:
    return batch if stored[0] is None or (batch[0] is not None and batch[0] >= stored[0]) else stored


_MERGERS: dict[_Kind, Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, ...]]] = {
    _Kind.COUNT: lambda s, b: (_add(s[0], b[0]),),
    _Kind.SUM: lambda s, b: (_add(s[0], b[0]),),
    _Kind.MIN: lambda s, b: (_least(s[0], b[0]),),
    _Kind.MAX: lambda s, b: (_greatest(s[0], b[0]),),
    _Kind.AVG: lambda s, b: (_add(s[0], b[0]), _add(s[1], b[1])),
    _Kind.FIRST: _earlier,
    _Kind.LAST: _later,
    _Kind.COLLECT_LIST: lambda s, b: ((s[0] or []) + (b[0] or []),),
    _Kind.COLLECT_SET: lambda s, b: (_union(s[0], b[0]),),
}

_RESULTS: dict[_Kind, Callable[[tuple[Any, ...]], Any]] = {
    _Kind.AVG: lambda s: s[0] / s[1] if s[1] else None,
    _Kind.FIRST: lambda s: s[1],
    _Kind.LAST: lambda s: s[1],
    _Kind.COLLECT_LIST: lambda s: s[0] or [],
    _Kind.COLLECT_SET: lambda s: s[0] or [],
}


# The same, over Arrow columns: a built-in aggregation merges a batch's partials into its state
# at once (``MergeIntoState.merge``). Where the row-wise merger keeps ``a`` on a tie or a null,
# these keep it too. Lists have no column-wise merge: their aggregations run row by row.
def _when(condition: pa.Array, a: pa.Array, b: pa.Array) -> pa.Array:
    return pc.if_else(pc.fill_null(condition, False), a, b)


def _add_columns(a: pa.Array, b: pa.Array) -> pa.Array:
    # Checked: a long that overflows fails the batch, as the row-wise sum fails to store it.
    total = (pc.add_checked(a, b) if pa.types.is_integer(a.type) else pc.add(a, b)).cast(a.type)
    return _when(pc.is_null(a), b, _when(pc.is_null(b), a, total))


def least_columns(a: pa.Array, b: pa.Array) -> pa.Array:
    return _when(pc.and_kleene(pc.is_valid(a), pc.or_kleene(pc.is_null(b), pc.less_equal(a, b))), a, b)


def greatest_columns(a: pa.Array, b: pa.Array) -> pa.Array:
    return _when(pc.and_kleene(pc.is_valid(a), pc.or_kleene(pc.is_null(b), pc.greater_equal(a, b))), a, b)


def _picked(take_batch: pa.Array, stored: list[pa.Array], batch: list[pa.Array]) -> list[pa.Array]:
    return [_when(take_batch, b, s) for s, b in zip(stored, batch, strict=True)]


def _earlier_columns(stored: list[pa.Array], batch: list[pa.Array]) -> list[pa.Array]:
    sooner = pc.and_kleene(pc.is_valid(batch[0]), pc.less(batch[0], stored[0]))
    return _picked(pc.or_kleene(pc.is_null(stored[0]), sooner), stored, batch)


def _later_columns(stored: list[pa.Array], batch: list[pa.Array]) -> list[pa.Array]:
    later = pc.and_kleene(pc.is_valid(batch[0]), pc.greater_equal(batch[0], stored[0]))
    return _picked(pc.or_kleene(pc.is_null(stored[0]), later), stored, batch)


def _first_column(stored: list[pa.Array]) -> pa.Array:
    return stored[0]


def _average_column(stored: list[pa.Array]) -> pa.Array:
    total, rows = stored
    average = pc.divide(pc.cast(total, pa.float64()), pc.cast(rows, pa.float64()))
    return _when(pc.not_equal(rows, 0), average, pa.nulls(len(rows), pa.float64()))


_COLUMN_MERGERS: dict[_Kind, Callable[[list[pa.Array], list[pa.Array]], list[pa.Array]]] = {
    _Kind.COUNT: lambda s, b: [_add_columns(s[0], b[0])],
    _Kind.SUM: lambda s, b: [_add_columns(s[0], b[0])],
    _Kind.MIN: lambda s, b: [least_columns(s[0], b[0])],
    _Kind.MAX: lambda s, b: [greatest_columns(s[0], b[0])],
    _Kind.AVG: lambda s, b: [_add_columns(s[0], b[0]), _add_columns(s[1], b[1])],
    _Kind.FIRST: _earlier_columns,
    _Kind.LAST: _later_columns,
}

_COLUMN_RESULTS: dict[_Kind, Callable[[list[pa.Array]], pa.Array]] = {
    _Kind.AVG: _average_column,
    _Kind.FIRST: lambda s: s[1],
    _Kind.LAST: lambda s: s[1],
}


# -------------------------------------------------------------------- the user's functions
def _of(kind: _Kind, column: str | None) -> Aggregate:
    if column is not None and not isinstance(column, str):
        raise ConfigurationError(
            f"{kind.value}() takes a column name; got {type(column).__name__} {column!r}. Compute a column "
            "first with with_column(name, expression)")
    return Aggregate(kind, column, kind.value if column is None else f"{kind.value}_{column}")


def count(column: str | None = None) -> Aggregate:
    """Rows (``count()``, column ``count``), or rows where ``column`` is not null."""
    return _of(_Kind.COUNT, column)


def sum(column: str) -> Aggregate:  # noqa: A001 - Spark's name
    return _of(_Kind.SUM, column)


def min(column: str) -> Aggregate:  # noqa: A001 - Spark's name
    return _of(_Kind.MIN, column)


def max(column: str) -> Aggregate:  # noqa: A001 - Spark's name
    return _of(_Kind.MAX, column)


def avg(column: str) -> Aggregate:
    return _of(_Kind.AVG, column)


def first(column: str) -> Aggregate:
    """The value of the row with the earliest event time (needs ``with_watermark``)."""
    return _of(_Kind.FIRST, column)


def last(column: str) -> Aggregate:
    """The value of the row with the latest event time (needs ``with_watermark``)."""
    return _of(_Kind.LAST, column)


def collect_list(column: str) -> Aggregate:
    return _of(_Kind.COLLECT_LIST, column)


def collect_set(column: str) -> Aggregate:
    """The distinct values, sorted where they have an order."""
    return _of(_Kind.COLLECT_SET, column)


def mergeable() -> list[str]:
    """The names of the aggregates that merge across batches: every function of this module."""
    return [kind.value for kind in _Kind]


def check_aggregates(aggregates: tuple[object, ...], where: str) -> tuple[Aggregate, ...]:
    """The aggregates, or a ``ConfigurationError`` naming the one that cannot merge across
    batches (e.g. a Spark ``Column``) and the ones that can."""
    if not aggregates:
        raise ConfigurationError(f"{where} needs at least one aggregate, e.g. aggregates.count()")
    checked: list[Aggregate] = []
    for found in aggregates:
        if not isinstance(found, Aggregate):
            raise ConfigurationError(
                f"{where} takes batchline's aggregates, which merge across batches: "
                f"{', '.join(f'aggregates.{n}()' for n in mergeable())} (from batchline import aggregates); got "
                f"{type(found).__name__} {found!r}. A Spark expression cannot be merged across batches; to "
                "aggregate each batch on its own, use group_by_key(...).agg(...)")
        checked.append(found)
    names = [a.name for a in checked]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise ConfigurationError(f"{where}: two aggregates are called {doubled}; name them apart with .alias(name)")
    return tuple(checked)
