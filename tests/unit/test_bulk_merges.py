"""Merges in bulk (``MergesInBulk``): a built-in aggregation or deduplication that folds a
partition's rows of a batch into its state at once, over Arrow, leaves exactly what its
per-key calls leave: the same output rows, the same state (as a restart reads it from the
files) and the same counts, batch after batch, with windows closing and keys expiring."""

from __future__ import annotations

import datetime as dt
import random
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from batchline.state import aggregates as agg
from batchline.state.aggregation import _ALL, _END_MS, _NEWEST, AggregationNode, OutputMode, SessionWindow, TimeWindow
from batchline.state.built_in import ROWS
from batchline.state.contract import StateFunctionError
from batchline.state.deduplication import DeduplicationNode
from batchline.state.group_state import GroupStateTimeout
from batchline.streams.base import Watermark
from tests.unit.partition_run import PartitionRun, per_key

T0 = 1_700_000_000_000
EPOCH = dt.datetime.fromtimestamp(0, dt.UTC).replace(tzinfo=None)  # naive UTC, as rows carry it
MINUTE = 60_000


def at(ms: int) -> dt.datetime:
    return EPOCH + dt.timedelta(milliseconds=ms)


def compare(make: Any, batches: list[list[dict[str, Any]]], watermarks: list[int | None], *,
            bulk_expected: bool = True, rows_column: str | None = ROWS) -> dict[str, int]:
    """Runs the batches through the bulk function and its per-key twin, comparing output, state
    files and counts after each; returns the totals."""
    fn, state, output, schema, keys, timeout, event_time, late = make()
    assert fn.merges_in_bulk is bulk_expected
    bulk, plain = (PartitionRun(f, state, output, schema, keys, timeout, event_time, late, rows_column=rows_column)
                   for f in (fn, per_key(fn)))
    totals: dict[str, int] = {"output_rows": 0, "timed_out": 0, "late_rows": 0}
    for index, (rows, watermark) in enumerate(zip(batches, watermarks, strict=True)):
        end = index == len(batches) - 1
        batch_time = T0 + index * 1_000
        found, found_stats, _ = bulk.batch(batch_time, rows, watermark, end)
        expected, expected_stats, _ = plain.batch(batch_time, rows, watermark, end)
        assert sorted(map(repr, found)) == sorted(map(repr, expected)), f"output of batch {index}"  # NaN != NaN
        for name in COUNTS:
            assert getattr(found_stats, name) == getattr(expected_stats, name), f"{name} of batch {index}"
        assert bulk.stored() == plain.stored(), f"state after batch {index}"
        for name in totals:
            totals[name] += getattr(found_stats, name)
    return totals


COUNTS = ("rows", "late_rows", "timed_out", "removed", "updated", "keys_called", "output_rows", "state_keys")
AGGREGATES = (agg.count(), agg.count("v").alias("values"), agg.sum("v"), agg.min("v"), agg.max("v"),
              agg.avg("v"), agg.first("v"), agg.last("v"))


def partial_schema(keys: tuple[str, ...], aggregates: tuple[agg.Aggregate, ...], windowed: bool,
                   newest: bool) -> StructType:
    """The partial frame's columns (``_PartialFrame``) for long values ``v`` and string keys."""
    fields = [StructField(k, StringType()) for k in keys]
    if not keys and not windowed:
        fields.append(StructField(_ALL, BooleanType()))  # one group: the operator's key is a constant
    if windowed:
        fields += [StructField("window_start", TimestampType()), StructField(_END_MS, LongType())]
    fields.append(StructField(ROWS, LongType()))
    if newest:
        fields.append(StructField(_NEWEST, TimestampType()))
    types = {"count": [LongType()], "sum": [LongType()], "min": [LongType()], "max": [LongType()],
             "avg": [DoubleType(), LongType()], "first": [TimestampType(), LongType()],
             "last": [TimestampType(), LongType()], "collect_list": [ArrayType(LongType())]}
    for i, a in enumerate(aggregates):
        fields += [StructField(f"__batchline_p{i}_{j}", t) for j, t in enumerate(types[a.kind.value])]
    return StructType(fields)


def aggregation(keys: tuple[str, ...], grouping: Any, mode: OutputMode, *, watermark: bool,
                expire_after_ms: int | None = None, aggregates: tuple[agg.Aggregate, ...] = AGGREGATES) -> Any:
    """An aggregation's state function and schemas as ``KeyedStream.aggregate`` derives them."""
    def make() -> tuple[Any, ...]:
        node = AggregationNode.__new__(AggregationNode)
        node.user_keys, node.grouping, node.aggregates, node.output_mode = keys, grouping, aggregates, mode
        node.expire_after_ms, node.name = expire_after_ms, "agg"
        node.event_time = Watermark(_NEWEST, 10_000) if watermark else None
        node.parents = [SimpleNamespace(watermark=lambda: None)]
        windowed = isinstance(grouping, TimeWindow)
        schema = partial_schema(keys, aggregates, windowed, newest=watermark)
        fn, state, output = node.derive(schema)
        key_names = (*keys, "window_start") if windowed else keys or (_ALL,)
        if grouping is not None or expire_after_ms is not None:
            timeout = GroupStateTimeout.EVENT_TIME if watermark else GroupStateTimeout.PROCESSING_TIME
        else:
            timeout = GroupStateTimeout.NO_TIMEOUT
        return (fn, state, output, schema, key_names, timeout, _NEWEST if watermark else None,
                _END_MS if windowed and watermark else None)
    return make


def partial_rows(seed: int, batches: int, keys: int, *, windowed: bool, newest: bool, repeat: float = 0.1,
                 key_names: tuple[str, ...] = ("k",), aggregates: tuple[agg.Aggregate, ...] = AGGREGATES
                 ) -> list[list[dict[str, Any]]]:
    """Batches of partial rows: a row per key and window mostly, sometimes two (folded in
    order), values with nulls, windows of a minute moving on with the batches."""
    rng = random.Random(seed)
    out = []
    for b in range(batches):
        rows = []
        for _ in range(rng.randint(0, 60)):
            k = rng.randrange(keys)
            row: dict[str, Any] = {name: f"{name}{k % (3 + i)}" for i, name in enumerate(key_names)}
            if not key_names and not windowed:
                row[_ALL] = True
            time = T0 + b * 20_000 + rng.randrange(-30_000, 40_000)
            if windowed:
                start = time - time % MINUTE
                row["window_start"], row[_END_MS] = at(start), start + MINUTE
            row[ROWS] = rng.randint(1, 4)
            if newest:
                row[_NEWEST] = at(time)
            for i, a in enumerate(aggregates):
                value = None if rng.random() < 0.15 else rng.randrange(-50, 50)
                kind = a.kind.value
                if kind == "count":
                    parts: list[Any] = [rng.randint(0, 4)]
                elif kind == "avg":
                    parts = [None if value is None else float(value), 0 if value is None else rng.randint(1, 3)]
                elif kind in ("first", "last"):
                    # Equal times now and then: the tie rules are compared too.
                    parts = [None, None] if value is None else [at(time - rng.randrange(3) * 1_000), value]
                elif kind == "collect_list":
                    parts = [[value]]
                else:
                    parts = [value]
                row.update({f"__batchline_p{i}_{j}": p for j, p in enumerate(parts)})
            rows.append(row)
            if rng.random() < repeat:
                rows.append(dict(row, **{ROWS: 1}))
        out.append(rows)
    return out


def moving_watermarks(batches: list[list[dict[str, Any]]], column: str | None) -> list[int | None]:
    """Each batch's watermark: the newest event time of the batches before it, less 10 s; past
    everything in the last batch (the input ended)."""
    marks: list[int | None] = []
    newest = 0
    for rows in batches:
        marks.append(max(0, newest - 10_000))
        for row in rows:
            if column is not None and row.get(column) is not None:
                newest = max(newest, int((row[column] - EPOCH).total_seconds() * 1000))
    marks[-1] = newest + 10 * MINUTE
    return marks


@pytest.mark.parametrize("mode", list(OutputMode))
def test_tumbling_windows_merge_and_close_in_bulk_as_per_key(mode):
    batches = partial_rows(1, 14, 40, windowed=True, newest=True) + [[]]
    totals = compare(aggregation(("k",), TimeWindow("ts", MINUTE, MINUTE), mode, watermark=True),
                     batches, moving_watermarks(batches, _NEWEST))
    assert totals["timed_out"] > 10 and totals["late_rows"] > 0  # windows closed, partials came too late
    assert totals["output_rows"] > 10


def test_windows_of_two_key_columns_and_of_no_key_merge_in_bulk_as_per_key():
    batches = partial_rows(2, 10, 30, windowed=True, newest=True, key_names=("a", "b")) + [[]]
    assert compare(aggregation(("a", "b"), TimeWindow("ts", MINUTE, MINUTE), OutputMode.APPEND, watermark=True),
                   batches, moving_watermarks(batches, _NEWEST))["output_rows"] > 10
    batches = partial_rows(3, 10, 30, windowed=True, newest=True, key_names=()) + [[]]
    assert compare(aggregation((), TimeWindow("ts", MINUTE, MINUTE), OutputMode.UPDATE, watermark=True),
                   batches, moving_watermarks(batches, _NEWEST))["output_rows"] > 10


def test_windows_without_a_watermark_merge_in_bulk_and_never_close():
    batches = partial_rows(4, 8, 30, windowed=True, newest=False)
    totals = compare(aggregation(("k",), TimeWindow("ts", MINUTE, MINUTE), OutputMode.UPDATE, watermark=False),
                     batches, [None] * len(batches))
    assert totals["timed_out"] == 0 and totals["output_rows"] > 30


@pytest.mark.parametrize("watermark", [True, False])
def test_running_aggregations_that_expire_merge_in_bulk_as_per_key(watermark):
    batches = partial_rows(5, 14, 25, windowed=False, newest=watermark, repeat=0.3) + [[]]
    marks = moving_watermarks(batches, _NEWEST) if watermark else [None] * len(batches)
    totals = compare(aggregation(("k",), None, OutputMode.UPDATE, watermark=watermark, expire_after_ms=30_000),
                     batches, marks)
    assert totals["output_rows"] > 30
    if watermark:
        assert totals["timed_out"] > 2


def test_a_running_aggregation_of_the_whole_stream_merges_in_bulk_as_per_key():
    batches = partial_rows(6, 6, 1, windowed=False, newest=False, key_names=(), repeat=0.5)
    totals = compare(aggregation((), None, OutputMode.UPDATE, watermark=False), batches, [None] * len(batches))
    assert totals["output_rows"] == sum(1 for rows in batches if rows)


def test_an_aggregation_of_lists_runs_per_key():
    aggregates = (agg.count(), agg.collect_list("v"))
    batches = partial_rows(7, 5, 10, windowed=False, newest=False, aggregates=aggregates)
    compare(aggregation(("k",), None, OutputMode.UPDATE, watermark=False, aggregates=aggregates),
            batches, [None] * len(batches), bulk_expected=False)


GAP = 30_000


def sessions(keys: tuple[str, ...], mode: OutputMode, aggregates: tuple[agg.Aggregate, ...] = AGGREGATES) -> Any:
    """A session-window aggregation's state function and schemas as ``KeyedStream.aggregate``
    derives them: partial rows per key and event time, each its own session of ``GAP``."""
    def make() -> tuple[Any, ...]:
        node = AggregationNode.__new__(AggregationNode)
        node.user_keys, node.grouping, node.aggregates = keys, SessionWindow("ts", GAP), aggregates
        node.output_mode, node.expire_after_ms, node.event_time = mode, None, Watermark(_NEWEST, 10_000)
        node.parents, node.name = [SimpleNamespace(watermark=lambda: None)], "sessions"
        schema = partial_schema(keys, aggregates, windowed=True, newest=True)
        if not keys:  # one group: the operator's key is a constant
            schema = StructType([StructField(_ALL, BooleanType()), *schema.fields])
        fn, state, output = node.derive(schema)
        return fn, state, output, schema, keys or (_ALL,), GroupStateTimeout.EVENT_TIME, _NEWEST, _END_MS
    return make


def session_rows(seed: int, batches: int, keys: int, key_names: tuple[str, ...] = ("k",),
                 aggregates: tuple[agg.Aggregate, ...] = AGGREGATES) -> list[list[dict[str, Any]]]:
    rows = partial_rows(seed, batches, keys, windowed=True, newest=True, key_names=key_names,
                        aggregates=aggregates)
    rng = random.Random(seed)
    for batch in rows:
        for row in batch:
            row.update({name: f"{name}{rng.randrange(keys)}" for name in key_names})
            time = int((row[_NEWEST] - EPOCH).total_seconds() * 1000)
            row["window_start"], row[_END_MS] = row[_NEWEST], time + GAP  # a session of its own
            if not key_names:
                row[_ALL] = True
    return rows


@pytest.mark.parametrize("mode", list(OutputMode))
def test_session_windows_merge_close_and_emit_in_bulk_as_per_key(mode):
    batches = session_rows(13, 14, 40) + [[]]
    totals = compare(sessions(("k",), mode), batches, moving_watermarks(batches, _NEWEST))
    assert totals["timed_out"] > 5 and totals["output_rows"] > 10 and totals["late_rows"] > 0


def test_sessions_of_two_key_columns_and_of_none_merge_in_bulk_as_per_key():
    batches = session_rows(14, 10, 12, key_names=("a", "b")) + [[]]
    compare(sessions(("a", "b"), OutputMode.APPEND), batches, moving_watermarks(batches, _NEWEST))
    batches = session_rows(15, 10, 1, key_names=()) + [[]]
    assert compare(sessions((), OutputMode.UPDATE), batches, moving_watermarks(batches, _NEWEST))["output_rows"] > 5


def test_sessions_of_lists_run_per_key():
    aggregates = (agg.count(), agg.collect_list("v"))
    batches = session_rows(16, 5, 5, aggregates=aggregates) + [[]]
    compare(sessions(("k",), OutputMode.APPEND, aggregates), batches, moving_watermarks(batches, _NEWEST),
            bulk_expected=False)


def test_a_sum_that_overflows_fails_the_batch_in_bulk_as_per_key():
    aggregates = (agg.sum("v"),)
    make = aggregation(("k",), None, OutputMode.UPDATE, watermark=False, aggregates=aggregates)
    fn, state, output, schema, keys, timeout, event_time, late = make()
    big = {"k": "a", ROWS: 1, "__batchline_p0_0": 2**62}
    for function in (fn, per_key(fn)):
        run = PartitionRun(function, state, output, schema, keys, timeout, event_time, late, rows_column=ROWS)
        run.batch(T0, [big], None)
        with pytest.raises(StateFunctionError):
            run.batch(T0 + 1_000, [big, big], None)


# ---------------------------------------------------------------- deduplication
def deduplication(columns: tuple[str, ...], *, watermark: bool, within_watermark: bool = False) -> Any:
    def make() -> tuple[Any, ...]:
        node = DeduplicationNode.__new__(DeduplicationNode)
        node.name = "dedup"
        node.event_time = Watermark("ts", 10_000) if watermark else None
        node.parents = [SimpleNamespace(watermark=lambda: None)]
        if within_watermark:
            node.expire_after_ms = 20_000
        elif watermark and "ts" in columns:
            node.expire_after_ms = 0
        else:
            node.expire_after_ms = None
        schema = StructType([StructField("k", StringType()), StructField("ts", TimestampType()),
                             StructField("v", LongType()), StructField("f", DoubleType()),
                             StructField("tags", ArrayType(StringType()))])
        fn, state, output = node.derive(schema)
        timeout = GroupStateTimeout.EVENT_TIME if node.expire_after_ms is not None else GroupStateTimeout.NO_TIMEOUT
        return fn, state, output, schema, columns, timeout, "ts" if watermark else None, "ts" if watermark else None
    return make


def dedup_rows(seed: int, batches: int, keys: int) -> list[list[dict[str, Any]]]:
    """Rows with keys repeating, in and across batches; event times in whole seconds, so that a
    key's rows often share their earliest one and the smallest row passes (a double with NaN and
    null, and a list, which has no order: among rows equal in all else, the first to come)."""
    rng = random.Random(seed)
    out = []
    for b in range(batches):
        rows = []
        for _ in range(rng.randint(0, 50)):
            k = None if rng.random() < 0.03 else f"k{rng.randrange(keys)}"  # a null key is a key too
            time = at(T0 + b * 5_000 + rng.randrange(-16_000, 6_000) // 1_000 * 1_000)
            f = rng.choice([None, float("nan"), 0.5, -1.0, 2.0])
            rows.append({"k": k, "ts": time, "v": rng.randrange(3), "f": f, "tags": [str(rng.randrange(9))]})
        out.append(rows)
    return out


@pytest.mark.parametrize("columns, within", [(("k",), True), (("k", "ts"), False), (("k",), False)])
def test_deduplication_keeps_first_rows_and_expires_keys_in_bulk_as_per_key(columns, within):
    make = deduplication(columns, watermark=True, within_watermark=within)
    batches = dedup_rows(8, 16, 30) + [[]]
    totals = compare(make, batches, moving_watermarks(batches, "ts"), rows_column=None)
    assert totals["output_rows"] > 20 and totals["late_rows"] > 0
    if within or "ts" in columns:
        assert totals["timed_out"] > 10


def test_deduplication_without_a_watermark_keeps_the_smallest_row_in_bulk_as_per_key():
    batches = dedup_rows(9, 8, 20)
    totals = compare(deduplication(("k",), watermark=False), batches, [None] * len(batches), rows_column=None)
    assert totals["output_rows"] == len({row["k"] for rows in batches for row in rows})
    assert any(row["k"] is None for rows in batches for row in rows)


def test_bulk_and_per_key_merges_differ_on_a_seeded_bug(monkeypatch):
    """The comparison can fail: a bulk merge that takes the last row of a key instead of its first is caught."""
    from batchline.state import aggregates
    monkeypatch.setitem(aggregates._COLUMN_MERGERS, aggregates._Kind.FIRST, aggregates._later_columns)
    batches = partial_rows(1, 6, 20, windowed=True, newest=True) + [[]]
    with pytest.raises(AssertionError, match="batch"):
        compare(aggregation(("k",), TimeWindow("ts", MINUTE, MINUTE), OutputMode.UPDATE, watermark=True),
                batches, moving_watermarks(batches, _NEWEST))


@pytest.mark.parametrize("mode", list(OutputMode))
def test_changes_go_into_the_arrow_base_or_beside_it_in_bulk_as_per_key(monkeypatch, mode):
    """With a low bar for a batch's changes to be merged into the entries' Arrow base (rather
    than held beside it as Python values), both ways of applying them are compared."""
    from batchline.state import entries
    monkeypatch.setattr(entries, "_MIN_RECENT", 4)
    batches = partial_rows(11, 14, 40, windowed=True, newest=True) + [[]]
    compare(aggregation(("k",), TimeWindow("ts", MINUTE, MINUTE), mode, watermark=True),
            batches, moving_watermarks(batches, _NEWEST))
    batches = dedup_rows(12, 16, 30) + [[]]
    compare(deduplication(("k",), watermark=True, within_watermark=True), batches, moving_watermarks(batches, "ts"),
            rows_column=None)
    batches = session_rows(17, 14, 40) + [[]]
    compare(sessions(("k",), mode), batches, moving_watermarks(batches, _NEWEST))
