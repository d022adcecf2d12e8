"""Timeouts in bulk (``TimesOutInBulk``): a function that times a partition's due keys out at
once over Arrow leaves exactly what its per-key calls leave: the same output rows, the same
deltas, the same state and the same stats. The join's, against its own per-key path."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import ByteType, DoubleType, LongType, StringType, StructField, StructType, TimestampType

from batchline.state.bulk import BulkResult, DueKeys, TimesOutInBulk
from batchline.state.contract import StateFunctionError
from batchline.state.entries import REMOVED_COL, STATE_PREFIX, TIMEOUT_COL, StateEntries
from batchline.state.group_state import GroupState
from batchline.state.join import EVENT_TIME, MATCHED, SIDE, TIME, JoinNode, JoinType, Within
from batchline.state.schema import StateSchemaError
from tests.unit.partition_run import PartitionRun, per_key

T0 = 1_700_000_000_000
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def join_node(how: JoinType, key_type: Any = LongType(), right_key: str = "k") -> tuple[JoinNode, StructType]:
    """A join as ``Stream.join`` builds it (without streams), for two sides keyed by ``k`` (the
    right's named ``right_key``): left ``(k, v string)``, right ``(right_key, at timestamp)``,
    right time within [-2 s, +5 s]; and its input's schema."""
    node = JoinNode.__new__(JoinNode)
    node.how, node.within, node.name = how, Within("t", "at", -2_000, 5_000), "joined"
    node.pairs, node.evict_after, node._input_schema = (("k", right_key),), (5_001, 2_001), None
    schema = StructType([StructField("k", key_type), StructField(SIDE, ByteType()), StructField(TIME, LongType()),
                         StructField(EVENT_TIME, LongType()), StructField("__batchline_l_k", key_type),
                         StructField("__batchline_l_v", StringType()),
                         StructField(f"__batchline_r_{right_key}", key_type),
                         StructField("__batchline_r_at", TimestampType())])
    return node, schema


def join_function(how: JoinType, key_type: Any = LongType(), right_key: str = "k", keys_in_rows: bool = False
                  ) -> tuple[Any, StructType, StructType, StructType]:
    """The join's state function and schemas as ``Stream.join`` derives them (``join_node``)."""
    node, schema = join_node(how, key_type, right_key)
    fn, state, output = JoinNode.derive(node, schema, keys_in_rows)
    return fn, state, output, schema


def Run(fn: Any, state: StructType, output: StructType, input: StructType,  # noqa: N802 - reads as a class
        input_column: str | None = SIDE) -> PartitionRun:
    """A join's partition (or a function's keyed the same way), keyed by ``k``."""
    return PartitionRun(fn, state, output, input, ("k",), event_time=EVENT_TIME, late=EVENT_TIME,
                        input_column=input_column)


def rows_of(seed: int, batches: int, keys: int, key_of: Any = int) -> list[list[tuple[Any, ...]]]:
    """Batches of both sides' rows for a few keys, in event time order with some disorder, some
    rows of a key meeting, some never."""
    rng = random.Random(seed)
    out = []
    for b in range(batches):
        rows = []
        for _ in range(rng.randint(5, 40)):
            k = rng.randrange(keys)
            key = key_of(k)
            side = rng.randrange(2)
            t = T0 + b * 4_000 + rng.randrange(-1_500, 4_000)
            if side == 0:
                rows.append((key, 0, t, t, key, f"v{rng.randrange(1000)}", None, None))
            else:
                rows.append((key, 1, t, t, None, None, key, EPOCH + dt.timedelta(milliseconds=t)))
        out.append(rows)
    return out


def compare(how: JoinType, key_type: Any = LongType(), key_of: Any = int, seed: int = 1, right_key: str = "k",
            keys_in_rows: bool = False) -> int:
    fn, state, output, schema = join_function(how, key_type, right_key, keys_in_rows)
    bulk, plain = Run(fn, state, output, schema), Run(per_key(fn), state, output, schema)
    timed_out = 0
    watermark: int | None = None
    batches = rows_of(seed, 12, 30, key_of)
    for index, rows in enumerate([*batches, [], []]):
        end = index == len(batches) + 1
        if end:
            watermark = T0 + 10**7  # past every row: the state empties
        found = bulk.batch(index + 1, rows, watermark, end)
        expected = plain.batch(index + 1, rows, watermark, end)
        assert found[0] == expected[0], f"output of batch {index + 1}"
        assert found[1] == expected[1], f"stats of batch {index + 1}"
        key_column = "key.k"
        assert sorted(found[2], key=lambda r: repr(r[key_column])) == \
            sorted(expected[2], key=lambda r: repr(r[key_column])), f"delta of batch {index + 1}"
        timed_out += found[1].timed_out
        times = [row[2] for row in rows]
        watermark = max(times) - 3_000 if times else (watermark or 0) + 4_000
    assert found[1].state_keys == 0
    return timed_out


@pytest.mark.parametrize("how", list(JoinType))
def test_the_join_times_keys_out_in_bulk_as_it_does_per_key(how):
    assert compare(how) > 20  # enough keys timed out for the comparison to say something


def test_string_keys_and_a_null_key_time_out_in_bulk_as_per_key():
    assert compare(JoinType.FULL, StringType(), lambda k: None if k == 0 else f"k{k}", seed=7) > 20


@pytest.mark.parametrize("how", [JoinType.FULL, JoinType.LEFT_SEMI])
def test_keys_named_otherwise_on_each_side_time_out_in_bulk_as_per_key(how):
    assert compare(how, right_key="rk", seed=3) > 20


@pytest.mark.parametrize("keys_in_rows", [True, False])
def test_the_older_layout_and_float_keys_time_out_in_bulk_as_per_key(keys_in_rows):
    assert compare(JoinType.FULL, right_key="rk", seed=5, keys_in_rows=keys_in_rows) > 20
    assert compare(JoinType.FULL, DoubleType(), float, seed=5, keys_in_rows=keys_in_rows) > 20


def test_buffered_rows_leave_out_exact_key_columns_but_not_float_ones():
    def sides(state):
        return [[f.name for f in state[side].dataType.elementType.fields] for side in ("left", "right")]

    assert sides(join_function(JoinType.FULL, right_key="rk")[1]) == [["v", TIME, MATCHED], ["at", TIME, MATCHED]]
    assert sides(join_function(JoinType.FULL, right_key="rk", keys_in_rows=True)[1]) == [
        ["k", "v", TIME, MATCHED], ["rk", "at", TIME, MATCHED]]
    assert sides(join_function(JoinType.FULL, DoubleType())[1]) == [["k", "v", TIME, MATCHED],
                                                                     ["k", "at", TIME, MATCHED]]


def test_a_right_only_row_shows_only_the_right_key_when_the_keys_are_named_otherwise():
    fn, state, output, schema = join_function(JoinType.FULL, right_key="rk")
    assert [f.name for f in output.fields] == ["k", "v", "rk", "at"]
    run = Run(fn, state, output, schema)
    at = EPOCH + dt.timedelta(milliseconds=T0)
    out, _, _ = run.batch(1, [(7, 0, T0, T0, 7, "a", None, None), (8, 1, T0, T0, None, None, 8, at)], 0)
    assert out == []
    out, _, _ = run.batch(2, [], T0 + 10_000)  # both rows pass the watermark: out with nulls, in bulk
    assert sorted(out, key=repr) == sorted([{"k": 7, "v": "a", "rk": None, "at": None},
                                            {"k": None, "v": None, "rk": 8, "at": at}], key=repr)


def test_a_join_whose_state_repeats_the_keys_keeps_that_layout_and_refuses_others():
    node, schema = join_node(JoinType.LEFT, right_key="rk")
    node.resolved = False
    node.resolve(schema)
    lean = node.state_schema.struct
    older = join_function(JoinType.LEFT, right_key="rk", keys_in_rows=True)[1]
    assert lean != older
    node.check_stored_state(lean)
    assert node.state_schema.struct == lean
    node.check_stored_state(older)  # a checkpoint written before: read, and written on, as it was
    assert node.state_schema.struct == older
    assert [name for name, _ in node.fn.columns[0]] == ["k", "v"]
    with pytest.raises(StateSchemaError):
        node.check_stored_state(StructType([StructField("left", LongType())]))


def test_bulk_and_per_key_join_differ_on_a_seeded_bug(monkeypatch):
    """The comparison can fail: a bulk timeout that forgot the outer rows is caught."""
    fn, *_ = join_function(JoinType.LEFT)
    original = type(fn)._timed_out_rows
    monkeypatch.setattr(type(fn), "_timed_out_rows",
                        lambda self, entries, sides, schema: original(self, entries, sides, schema).slice(0, 0))
    with pytest.raises(AssertionError, match="output"):
        compare(JoinType.LEFT)


# ---------------------------------------------------------------- the engine's side of the hook

@dataclasses.dataclass(frozen=True)
class Countdown(TimesOutInBulk):
    """Counts each key's rows; a key times out one second of event time after its last row,
    then emits its count and, if the count is even, keeps half of it with a new timer."""

    calls: list[DueKeys] = dataclasses.field(default_factory=list, compare=False)

    def __call__(self, key: Any, rows: Any, state: GroupState[Any]) -> list[tuple[Any, ...]]:
        (count,) = state.get() if state.exists else (0,)
        state.update((count + sum(1 for _ in rows),))
        state.set_timeout_timestamp(state.current_watermark_ms() + 1_000)
        return []

    def time_out(self, due: DueKeys) -> BulkResult:
        self.calls.append(due)
        keys = due.entries.column("key.k").to_pylist()
        counts = due.entries.column(STATE_PREFIX + "count").to_pylist()
        kept = [c // 2 if c % 2 == 0 else None for c in counts]
        deadline = (due.watermark_ms or 0) + 1_000
        state = pa.table({STATE_PREFIX + "count": pa.array(kept, pa.int64()),
                          TIMEOUT_COL: pa.array([deadline if k is not None else None for k in kept], pa.int64()),
                          REMOVED_COL: pa.array([k is None for k in kept])})
        output = pa.Table.from_pylist([{"k": k, "count": c} for k, c in zip(keys, counts, strict=True)],
                                      schema=due.output_schema)
        return BulkResult(output, state)


def countdown_run(fn: Any) -> PartitionRun:
    state = StructType([StructField("count", LongType())])
    output = StructType([StructField("k", StringType()), StructField("count", LongType())])
    schema = StructType([StructField("k", StringType()), StructField(EVENT_TIME, LongType())])
    return Run(fn, state, output, schema, None)


def test_the_engine_hands_due_keys_without_rows_to_the_hook_once_and_applies_its_changes():
    fn = Countdown()
    run = countdown_run(fn)
    run.batch(1, [("a", 10), ("a", 11), ("b", 12), ("c", 13), ("c", 14), ("c", 15)], 0)
    assert fn.calls == []
    out, stats, delta = run.batch(2, [("c", 6_000)], 5_000)  # a, b and c due; c has a row: called per key
    assert len(fn.calls) == 1
    assert fn.calls[0].entries.column("key.k").to_pylist() == ["a", "b"]
    assert fn.calls[0].watermark_ms == 5_000 and fn.calls[0].batch_time == 2 and not fn.calls[0].input_ended
    assert sorted(map(tuple, (r.values() for r in out))) == [("a", 2), ("b", 1)]
    assert (stats.timed_out, stats.keys_called, stats.updated, stats.removed, stats.output_rows) == (2, 3, 2, 1, 2)
    assert {r["key.k"]: (r["state.count"], r[TIMEOUT_COL], r[REMOVED_COL]) for r in delta} == {
        "a": (1, 6_000, False), "b": (None, None, True), "c": (4, 6_000, False)}
    assert stats.state_keys == 2  # a (halved) and c
    out, stats, delta = run.batch(3, [], 10_000, end=True)  # every timer; the deadlines set now are dropped
    assert sorted(map(tuple, (r.values() for r in out))) == [("a", 1), ("c", 4)]
    assert {r["key.k"]: (r["state.count"], r[TIMEOUT_COL]) for r in delta} == {"a": (None, None), "c": (2, None)}
    assert fn.calls[-1].input_ended and stats.state_keys == 1


def test_a_failing_hook_fails_the_batch_as_a_failing_state_function_does():
    class Broken(Countdown):
        def time_out(self, due: DueKeys) -> BulkResult:
            raise RuntimeError("boom")

    run = countdown_run(Broken())
    run.batch(1, [("a", 10)], 0)
    with pytest.raises(StateFunctionError, match="timing out 1 keys"):
        run.batch(2, [], 5_000)


def test_state_entries_give_the_entries_of_keys_as_a_table_in_their_order():
    layout = pa.schema([pa.field("key.k", pa.int64()), pa.field("state.n", pa.int64()),
                        pa.field(TIMEOUT_COL, pa.int64()), pa.field(REMOVED_COL, pa.bool_())])
    entries = StateEntries(single_key=True)
    entries.merge([pa.table({"key.k": [1, 2, 3, 4], "state.n": [10, 20, 30, 40], TIMEOUT_COL: [None, 5, 6, None],
                             REMOVED_COL: [False] * 4}, schema=layout)])
    entries.update({2: ((21,), 7), 5: ((50,), None)}, layout)  # in ``recent``, beside the base
    table = entries.table_of([5, 3, 2, 1])
    assert table.schema.names == layout.names
    assert table.to_pydict() == {"key.k": [5, 3, 2, 1], "state.n": [50, 30, 21, 10], TIMEOUT_COL: [None, 6, 7, None],
                                 REMOVED_COL: [False] * 4}
    with pytest.raises(KeyError):
        entries.table_of([1, 9])
