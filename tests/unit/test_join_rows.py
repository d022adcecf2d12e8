"""The join's state function alone, on GroupStates built by hand: which pairs and unmatched
rows a key's call emits, and what it keeps."""

from batchline.state.group_state import GroupState, GroupStateTimeout
from batchline.state.join import LEFT, MATCHED, RIGHT, TIME, JoinRows, JoinType

# Input rows: (key, side, time ms, value); each side's one column is "v".
COLUMNS = ((("v", 3),), (("v", 3),))


def rows_fn(how, within=(0, 10_000), evict=(10_001, 1)):
    output = ((-1, 0), (LEFT, "v"), (RIGHT, "v")) if how is not JoinType.LEFT_SEMI else ((-1, 0), (LEFT, "v"))
    return JoinRows(how, 1, 2, COLUMNS, output, within, evict)


def call(fn, key, rows, state=None, watermark=0, timed_out=False, deadline=-1):
    group = GroupState(state, GroupStateTimeout.EVENT_TIME, 0, watermark, timed_out, deadline)
    out = list(fn(key, iter(rows), group))
    return out, group


def test_pairs_come_once_when_the_second_row_arrives():
    fn = rows_fn(JoinType.INNER)
    out, state = call(fn, "k", [("k", LEFT, 1_000, "a")])
    assert out == [] and state.updated
    out, state = call(fn, "k", [("k", RIGHT, 5_000, "x"), ("k", RIGHT, 20_000, "late-range")], state.get())
    assert out == [("k", "a", "x")]  # 20 s lies outside [1 s, 11 s]
    out, state = call(fn, "k", [("k", LEFT, 12_000, "b")], state.get())
    assert out == [("k", "b", "late-range")]  # 20 s lies in [12 s, 22 s]; "x" does not


def test_an_outer_row_without_a_match_goes_out_once_when_the_watermark_passes_it():
    fn = rows_fn(JoinType.FULL)
    out, state = call(fn, "k", [("k", LEFT, 1_000, "a"), ("k", RIGHT, 50_000, "x")])
    assert out == []
    assert state.timeout_timestamp_ms == 1_000 + 10_001 - 1  # the earliest row to go: the left one
    out, state = call(fn, "k", [], state.get(), watermark=11_001, timed_out=True)
    assert out == [("k", "a", None)]
    left, right = state.get()
    assert left == [] and [r["v"] for r in right] == ["x"]
    out, state = call(fn, "k", [], state.get(), watermark=60_000, timed_out=True)
    assert out == [("k", None, "x")] and state.removed


def test_a_matched_row_goes_silently_and_an_inner_join_keeps_nothing_past_the_watermark():
    fn = rows_fn(JoinType.LEFT)
    out, state = call(fn, "k", [("k", LEFT, 1_000, "a"), ("k", RIGHT, 2_000, "x")])
    assert out == [("k", "a", "x")]
    left, right = state.get()
    assert left[0][MATCHED] and right[0][MATCHED] and left[0][TIME] == 1_000
    out, state = call(fn, "k", [], state.get(), watermark=100_000, timed_out=True)
    assert out == [] and state.removed


def test_a_left_semi_join_emits_each_left_row_once_however_many_rows_it_meets():
    fn = rows_fn(JoinType.LEFT_SEMI)
    out, state = call(fn, "k", [("k", LEFT, 1_000, "a"), ("k", LEFT, 30_000, "b")])
    assert out == []
    out, state = call(fn, "k", [("k", RIGHT, 2_000, "x"), ("k", RIGHT, 3_000, "y")], state.get())
    assert out == [("k", "a")]
    out, state = call(fn, "k", [("k", RIGHT, 4_000, "z"), ("k", RIGHT, 35_000, "w")], state.get())
    assert out == [("k", "b")]
    out, state = call(fn, "k", [("k", LEFT, 1_500, "c")], state.get())
    assert out == [("k", "c")]  # met at once: emitted and never kept
    assert [r["v"] for r in state.get()[0]] == ["a", "b"]


def test_a_null_key_meets_nothing_and_an_outer_side_emits_it_at_once():
    fn = rows_fn(JoinType.LEFT)
    out, state = call(fn, None, [(None, LEFT, 1_000, "a"), (None, RIGHT, 1_000, "x")])
    assert out == [(None, "a", None)] and not state.exists and not state.updated


def test_without_a_time_range_every_pair_of_equal_keys_meets_and_nothing_goes():
    fn = JoinRows(JoinType.INNER, 1, 2, COLUMNS, ((-1, 0), (LEFT, "v"), (RIGHT, "v")), None, (None, None))
    out, state = call(fn, "k", [("k", LEFT, None, "a"), ("k", RIGHT, None, "x")], watermark=None)
    assert out == [("k", "a", "x")]
    out, state = call(fn, "k", [("k", RIGHT, None, "y")], state.get(), watermark=None)
    assert out == [("k", "a", "y")] and state.timeout_timestamp_ms == -1
