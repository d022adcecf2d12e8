"""Spark's own GroupState and (flat)MapGroupsWithState tests, ported to batchline (issue 20).

One test per Spark test of ``GroupStateSuite``, ``FlatMapGroupsWithStateSuite`` and
``FlatMapGroupsWithStateWithInitialStateSuite`` on per-key semantics (tests Spark generates in a
loop are the cases of one parametrized test), its docstring naming the suite and the test, and
saying "batchline differs" where batchline deliberately does. Spark's ``Int``/``RunningCount``
state is a one-field tuple; a restart (StopStream, StartStream) just continues with the tester.

Not ported (plumbing, batch mode or not expressible without Spark): state format versions,
checkpoint recovery, metrics (SPARK-35896), UNION partition IDs (SPARK-29438), output partitioning,
"disallow complete mode" (no output modes), SPARK-49070, every batch-mode query, the streaming
initial state, and "initial state - duplicate keys" (the tester's initial state is a mapping; the
pipeline's refusal of a DataFrame with a key twice is tested with Spark in test_write_state).
"""

import collections
import datetime as dt

import pytest

from batchline.errors import ConfigurationError
from batchline.state import GroupState, GroupStateTimeout, NoStateError, StateFunctionError, TimeoutNotEnabledError
from batchline.state.group_state import NO_TIMESTAMP
from batchline.testing import StateFunctionTester

NT, PT, ET = GroupStateTimeout.NO_TIMEOUT, GroupStateTimeout.PROCESSING_TIME, GroupStateTimeout.EVENT_TIME
SPARK_NAME = {NT: "NoTimeout", PT: "ProcessingTimeTimeout", ET: "EventTimeTimeout"}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
NOT_POSITIVE = r"positive|negative|zero or more"


def date(ms):
    """Java's ``new Date(ms)``."""
    return EPOCH + dt.timedelta(milliseconds=ms)


def at(seconds):
    """An event time as rows carry it (a naive UTC datetime), Spark's ``timestamp_seconds``."""
    return (EPOCH + dt.timedelta(seconds=seconds)).replace(tzinfo=None)


def count_of(state):
    return state.get()[0] if state.exists else 0


def by_key(rows):
    return sorted(rows, key=lambda row: str(row["key"]))


def timeout_after(state, method, *args):
    getattr(state, method)(*args)
    return state.timeout_timestamp_ms


def assert_no_watermark(state):
    with pytest.raises(TimeoutNotEnabledError, match="has no event-time watermark"):
        state.current_watermark_ms()


def assert_not_allowed(state, method):
    """Spark's testTimeoutDurationNotAllowed / testTimeoutTimestampNotAllowed."""
    before = state.timeout_timestamp_ms
    calls = ([(1000,), ("2 second",)] if method == "set_timeout_duration"
             else [(2000,), (2000, "1 second"), (date(2000),), (date(2000), "1 second")])
    for args in calls:
        with pytest.raises(TimeoutNotEnabledError, match=f"{method} needs timeout="):
            getattr(state, method)(*args)
        assert state.timeout_timestamp_ms == before


def count_to_two(key, rows, state):
    """Spark's "running count up to 2, and then remove the count": (key, "-1") as it reaches 3."""
    assert state.current_processing_time_ms() >= 0
    assert_no_watermark(state)
    count = count_of(state) + sum(1 for _ in rows)
    if count == 3:
        state.remove()
        return (key, "-1")
    state.update((count,))
    return (key, str(count))


def count_with_ten_second_timeout(key, rows, state):
    """Spark's processing-time test function: -1 once timed out, else the count, 10 s timeout."""
    if state.has_timed_out:
        state.remove()
        return [(key, "-1")]
    count = count_of(state) + sum(1 for _ in rows)
    state.update((count,))
    state.set_timeout_duration("10 seconds")
    return [(key, str(count))]


def running_count(key, rows, state):
    """Spark's fruitCountFunc (one row per call; flat functions return ``[running_count(...)]``)."""
    state.update((count_of(state) + sum(1 for _ in rows),))
    return (key, state.get()[0])


def fruit_count(key, rows, state):
    return [running_count(key, rows, state)]


def counter(fn, timeout=NT, **kwargs):
    kwargs.setdefault("output_schema", "key string, count string")
    return StateFunctionTester(fn, "key", state_schema="count long", timeout=timeout, **kwargs)


def keys(*names):
    return [{"key": name} for name in names]


def out(*pairs):
    return [{"key": k, "count": c} for k, c in pairs]


def run(tester, rows=(), at_ms=None):
    """A batch (at ``at_ms``): its output, the keys with state and the keys updated (assertNumStateRows)."""
    if at_ms is not None:
        tester.set_processing_time(at_ms)
    output = tester.process(rows)
    return output, tester.last_stats.state_keys, tester.last_stats.updated


# ====================================================================== GroupStateSuite
def test_the_group_state_the_tester_passes_behaves_as_one_built_directly():
    """GroupStateSuite: "SPARK-35800: ensure TestGroupState creates instances the same as prod"."""
    def observe(state):
        seen = [(state.removed, state.updated, state.exists, state.get(), state.timeout_timestamp_ms,
                 state.has_timed_out, state.current_processing_time_ms(), state.current_watermark_ms())]
        state.update((6,))
        seen.append((state.updated, state.exists, state.get()))
        state.remove()
        return [*seen, (state.exists, state.removed)]

    observed = []
    tester = counter(lambda key, rows, state: observed.append(observe(state)), ET, processing_time=1)
    tester.advance_watermark(1)
    tester.set_state("k", (5,))
    assert tester.process(keys("k")) == []
    direct = observe(GroupState((5,), ET, 1, watermark_ms=1))
    assert direct == [(False, False, True, (5,), NO_TIMESTAMP, False, 1, 1), (True, True, (6,)), (False, True)]
    assert observed == [direct]


def test_get_exists_update_and_remove():
    """GroupStateSuite: "GroupState - get, exists, update, remove"."""
    def check(state, expected, updated=False, removed=False):
        if expected is None:
            assert not state.exists
            with pytest.raises(NoStateError, match="this key has no state"):
                state.get()
        else:
            assert state.exists and state.get() == expected
        assert state.get_option() == expected
        assert (state.updated, state.removed) == (updated, removed)

    state = GroupState(None, NT, 1)
    check(state, None)
    state.update("")
    check(state, "", updated=True)
    state = GroupState("2", NT, 1)
    check(state, "2")
    state.update("3")
    check(state, "3", updated=True)
    state.remove()
    check(state, None, removed=True)
    state.remove()  # still callable
    state.update("4")
    check(state, "4", updated=True)
    with pytest.raises(ValueError, match=r"state.update\(None\) is not allowed"):
        state.update(None)


def test_set_timeout_with_no_timeout():
    """GroupStateSuite: "GroupState - setTimeout - with NoTimeout" (its batch-query states are batch mode)."""
    for value in (None, 5):
        state = GroupState(value, NT, 1000)
        assert_not_allowed(state, "set_timeout_duration")
        assert_not_allowed(state, "set_timeout_timestamp")
        assert state.timeout_timestamp_ms == NO_TIMESTAMP


def test_set_timeout_with_processing_time_timeout():
    """GroupStateSuite: "GroupState - setTimeout - with ProcessingTimeTimeout" (its batch-query part is
    batch mode). Spark's "-1 month 31 days 1 second" (a month is 31 days) is checked last, on a
    fresh state, with the other interval strings Spark takes."""
    state = GroupState(None, PT, 1000)
    assert state.timeout_timestamp_ms == NO_TIMESTAMP
    assert timeout_after(state, "set_timeout_duration", 500) == 1500  # can be set without state
    assert_not_allowed(state, "set_timeout_timestamp")
    state.update(5)
    assert state.timeout_timestamp_ms == 1500  # does not change
    assert timeout_after(state, "set_timeout_duration", 1000) == 2000
    assert timeout_after(state, "set_timeout_duration", "2 second") == 3000
    assert_not_allowed(state, "set_timeout_timestamp")
    state.remove()
    assert state.timeout_timestamp_ms == 3000  # does not change
    assert timeout_after(state, "set_timeout_duration", 500) == 1500  # can still be set
    assert_not_allowed(state, "set_timeout_timestamp")
    for text, ms in (("-1 month 31 days 1 second", 1000), ("1  hour", 3_600_000), ("1 day", 86_400_000),
                     ("1 hour 30 minutes", 5_400_000), ("interval 1 hour", 3_600_000)):
        assert timeout_after(GroupState(None, PT, 1000), "set_timeout_duration", text) == 1000 + ms, text


def test_set_timeout_with_event_time_timeout():
    """GroupStateSuite: "GroupState - setTimeout - with EventTimeTimeout" (its batch-query part is batch mode)."""
    state = GroupState(None, ET, 1000, watermark_ms=1000)
    assert state.timeout_timestamp_ms == NO_TIMESTAMP
    assert_not_allowed(state, "set_timeout_duration")
    assert timeout_after(state, "set_timeout_timestamp", 5000) == 5000  # can be set without state
    state.update(5)
    assert state.timeout_timestamp_ms == 5000  # does not change
    assert timeout_after(state, "set_timeout_timestamp", 10000) == 10000
    assert timeout_after(state, "set_timeout_timestamp", date(20000)) == 20000
    assert_not_allowed(state, "set_timeout_duration")
    state.remove()
    assert state.timeout_timestamp_ms == 20000
    assert timeout_after(state, "set_timeout_timestamp", 5000) == 5000  # can be set after removing the state
    assert_not_allowed(state, "set_timeout_duration")


def test_illegal_params_to_set_timeout():
    """GroupStateSuite: "GroupState - illegal params to setTimeout". A zero additional duration is
    allowed (Spark refuses only negative ones)."""
    calls = [(GroupState((5,), PT, 1000), "set_timeout_duration", (duration,))
             for duration in (-1000, 0, "-2 second", "-1 month", "1 month -31 day")]
    event_time = GroupState((5,), ET, 1000, watermark_ms=1000)
    calls += [(event_time, "set_timeout_timestamp", (timestamp, *extra))
              for timestamp in (-10000, 10000, date(-10000))
              for extra in ((), ("-3 second",), ("-1 month",), ("1 month -32 day",))
              if (timestamp, extra) != (10000, ())]
    for state, method, args in calls:
        with pytest.raises(ConfigurationError, match=NOT_POSITIVE):
            getattr(state, method)(*args)
        assert state.timeout_timestamp_ms == NO_TIMESTAMP, args
    assert timeout_after(event_time, "set_timeout_timestamp", 10000, "0 seconds") == 10000


def test_illegal_params_to_create():
    """GroupStateSuite: "SPARK-35800: illegal params to create": no negative watermark, no negative
    processing time, no timed-out call without a timeout kind; checked where the tester makes these
    values, then on GroupState's constructor, as Spark checks them on TestGroupState's."""
    watermarks = []
    tester = counter(lambda key, rows, state: watermarks.append(state.current_watermark_ms()), ET,
                     event_time_column="ts", watermark_delay="10 seconds")
    tester.process([{"key": "a", "ts": at(3)}])
    tester.process([{"key": "a", "ts": at(4)}])
    assert watermarks == [0, 0]  # 3 s - 10 s is clamped at 0
    with pytest.raises(ConfigurationError, match="processing time starts at or after the epoch"):
        counter(fruit_count, PT, processing_time=-100)
    tester = counter(fruit_count, NT, processing_time=1000)
    tester.set_state("a", (5,), timeout_ms=100)
    tester.advance_processing_time(5000)
    assert tester.process() == [] and tester.last_stats.keys_called == 0
    with pytest.raises(ConfigurationError, match="watermark"):
        GroupState((5,), ET, 100, watermark_ms=-1000)
    with pytest.raises(ConfigurationError, match="processing time"):
        GroupState((5,), ET, -100, watermark_ms=1000)
    with pytest.raises(TimeoutNotEnabledError, match="timeout"):
        GroupState((5,), NT, 100, has_timed_out=True)


def test_has_timed_out():
    """GroupStateSuite: "GroupState - hasTimedOut"."""
    for kind in (NT, PT, ET):
        for value in (None, 5):
            assert GroupState(value, kind, 1000).has_timed_out is False
            if kind is not NT:
                assert GroupState(value, kind, 1000, has_timed_out=True).has_timed_out is True


def test_get_current_watermark_ms():
    """GroupStateSuite: "GroupState - getCurrentWatermarkMs" (its batch-query states are batch mode)."""
    for kind in (NT, ET, PT):
        assert_no_watermark(GroupState(None, kind, 1000))
        for watermark in (0, 1000, 2000):
            assert GroupState(None, kind, 1000, watermark_ms=watermark).current_watermark_ms() == watermark


def test_get_current_processing_time_ms():
    """GroupStateSuite: "GroupState - getCurrentProcessingTimeMs" (its batch-query states are batch mode)."""
    for kind in (NT, ET, PT):
        for watermark in (None, 1000):
            for now in (0, 1000, 2000):
                assert GroupState(1000, kind, now, watermark_ms=watermark).current_processing_time_ms() == now


def test_primitive_type():
    """GroupStateSuite: "GroupState - primitive type"."""
    state = GroupState(None, NT, 1000)
    with pytest.raises(NoStateError):
        state.get()
    assert state.get_option() is None
    state = GroupState(10, NT, 1000)
    assert state.get() == 10
    state.update(0)
    assert state.exists and state.get() == 0
    state.remove()
    with pytest.raises(NoStateError):
        state.get()


# ====================================================================== FlatMapGroupsWithStateSuite: InputProcessor
# Spark's harness: key 0, Int state, batch time 1000, watermark 1000 under event-time timeouts (set
# by the tester). A case's updates are (method, *args) steps; "before watermark" expects a refusal.
UPDATE, REMOVE = ("update", (5,)), ("remove",)


def _new_data_cases():
    """Spark's loops over prior state, prior timeout and timeout kind, named as Spark names them."""
    basic = (("no update", (), "prior"), ("state updated", (UPDATE,), 5), ("state removed", (REMOVE,), None))
    cases = [(f"NoTimeout - {'prior state set' if prior is not None else 'no prior state'} - {suffix}", NT, prior,
              None, steps, prior if expected == "prior" else expected, None)
             for prior in (None, 0) for suffix, steps, expected in basic]
    for prior, prior_timeout in ((None, None), (0, None), (0, 1000)):
        name = ("no prior state" if prior is None else
                "prior state set, " + ("prior timeout set" if prior_timeout else "no prior timeout"))
        cases += [(f"{SPARK_NAME[kind]} - {name} - {suffix}", kind, prior, prior_timeout, steps,
                   prior if expected == "prior" else expected, None)
                  for kind in (PT, ET) for suffix, steps, expected in basic]
        duration, timestamp = ("set_timeout_duration", 5000), ("set_timeout_timestamp", 5000)
        specific = [("ProcessingTimeTimeout", "timeout updated without initializing state", PT, (duration,), None,
                     6000)] if prior is None else []
        specific += [
            ("ProcessingTimeTimeout", "state and timeout duration updated", PT, (UPDATE, duration), 5, 6000),
            ("ProcessingTimeTimeout", "timeout updated after state removed", PT, (REMOVE, duration), None, 6000)]
        if prior is None:
            specific.append(("EventTimeTimeout", "setting timeout without init state not allowed", ET,
                             (("set_timeout_timestamp", 10000),), None, 10000))
        specific += [
            ("EventTimeTimeout", "state and timeout timestamp updated", ET, (UPDATE, timestamp), 5, 5000),
            ("EventTimeTimeout", "timeout timestamp updated to before watermark", ET, (UPDATE, ("before watermark",)),
             5, None),
            ("EventTimeTimeout", "setting timeout with state removal not allowed", ET,
             (REMOVE, ("set_timeout_timestamp", 10000)), None, 10000)]
        cases += [(f"{kind_name} - {name} - {suffix}", kind, prior, prior_timeout, steps, expected, timeout)
                  for kind_name, suffix, kind, steps, expected, timeout in specific]
    return [pytest.param(*case[1:], id=case[0]) for case in cases]


def _timed_out_cases():
    cases = [(f"{SPARK_NAME[kind]} - {suffix}", kind, prior_timeout, steps, expected, timeout)
             for kind in (PT, ET)
             for suffix, prior_timeout, steps, expected, timeout in (
                 ("should not timeout", 1001, None, 5, 1001),
                 ("should timeout - no update/remove", 999, (), 5, None),
                 ("should timeout - update state", 999, (UPDATE,), 5, None),
                 ("should timeout - remove state", 999, (REMOVE,), None, None))]
    cases += [
        ("ProcessingTimeTimeout - should timeout - timeout duration updated", PT, 999,
         (("set_timeout_duration", 2000),), 5, 3000),
        ("ProcessingTimeTimeout - should timeout - timeout duration and state updated", PT, 999,
         (UPDATE, ("set_timeout_duration", 2000)), 5, 3000),
        ("EventTimeTimeout - should timeout - timeout timestamp updated", ET, 999,
         (("set_timeout_timestamp", 5000),), 5, 5000),
        ("EventTimeTimeout - should timeout - timeout and state updated", ET, 999,
         (UPDATE, ("set_timeout_timestamp", 5000)), 5, 5000)]
    return [pytest.param(*case[1:], id=case[0]) for case in cases]


def _harness(seen, steps, kind, state, timeout_ms):
    def fn(key, rows, group_state):
        try:
            watermark = group_state.current_watermark_ms()
        except TimeoutNotEnabledError:
            watermark = None
        seen.append((key, group_state.has_timed_out, len(list(rows)), group_state.current_processing_time_ms(),
                     watermark))
        for method, *args in steps:
            if method == "before watermark":
                with pytest.raises(ConfigurationError, match="lies before the current watermark"):
                    group_state.set_timeout_timestamp(999)
            else:
                getattr(group_state, method)(*args)
        return []

    tester = counter(fn, kind, processing_time=1000)
    if kind is ET:
        tester.advance_watermark(1000)
    if state is not None or timeout_ms is not None:
        tester.set_state(0, None if state is None else (state,), timeout_ms=timeout_ms)
    return tester


@pytest.mark.parametrize("kind, prior, prior_timeout, steps, expected, expected_timeout", _new_data_cases())
def test_input_processor_process_new_data(kind, prior, prior_timeout, steps, expected, expected_timeout):
    """FlatMapGroupsWithStateSuite: "InputProcessor - process new data - <case id>". batchline differs:
    under event-time timeouts the watermark (1000) is readable, the tester having declared it, where
    Spark's harness has one but no watermark column, and reading it raises."""
    seen = []
    tester = _harness(seen, steps, kind, prior, prior_timeout)
    assert tester.process([{"key": 0}]) == []
    assert seen == [(0, False, 1, 1000, 1000 if kind is ET else None)]
    assert tester.state(0) == (None if expected is None else (expected,))
    assert tester.timeout_of(0) == expected_timeout


@pytest.mark.parametrize("kind, prior_timeout, steps, expected, expected_timeout", _timed_out_cases())
def test_input_processor_process_timed_out_state(kind, prior_timeout, steps, expected, expected_timeout):
    """FlatMapGroupsWithStateSuite: "InputProcessor - process timed out state - <case id>"; prior state
    5; with steps None the function must not be called."""
    seen = []
    tester = _harness(seen, steps, kind, 5, prior_timeout)
    assert tester.process() == []
    assert seen == ([] if steps is None else [(0, True, 0, 1000, 1000 if kind is ET else None)])
    assert tester.last_stats.timed_out == len(seen)
    assert tester.state(0) == (None if expected is None else (expected,))
    assert tester.timeout_of(0) == expected_timeout


# ====================================================================== FlatMapGroupsWithStateSuite: queries
def test_flat_map_groups_with_state_streaming():
    """FlatMapGroupsWithStateSuite: "flatMapGroupsWithState - streaming"."""
    def fn(key, rows, state):
        row = count_to_two(key, rows, state)
        return [] if row[1] == "-1" else [row]

    tester = counter(fn)
    assert run(tester, keys("a")) == (out(("a", "1")), 1, 1)
    assert run(tester, keys("a", "b")) == (out(("a", "2"), ("b", "1")), 2, 2)
    assert run(tester, keys("a", "b")) == (out(("b", "2")), 1, 1)  # a reaches 3: removed, no output
    assert (tester.last_stats.late_rows, tester.last_stats.removed) == (0, 1)
    assert run(tester, keys("a", "c")) == (out(("a", "1"), ("c", "1")), 3, 2)  # a starts over


def test_flat_map_groups_with_state_streaming_with_a_lazy_iterator_that_updates_state():
    """FlatMapGroupsWithStateSuite: "flatMapGroupsWithState - streaming + func returns iterator that
    updates state lazily"."""
    def fn(key, rows, state):
        for _ in rows:
            count = count_of(state) + 1
            if count == 3:
                state.remove()
            else:
                state.update((count,))
                yield (key, str(count))

    tester = counter(fn)
    assert tester.process(keys("a", "a", "b")) == out(("a", "1"), ("a", "2"), ("b", "1"))
    assert tester.process(keys("a", "b")) == out(("b", "2"))
    assert tester.state("a") is None
    assert tester.process(keys("a", "c")) == out(("a", "1"), ("c", "1"))


def test_flat_map_groups_with_state_streaming_and_aggregation():
    """FlatMapGroupsWithStateSuite: "flatMapGroupsWithState - streaming + aggregation". batchline
    differs: there are no output modes, and the tester has no operator after the function; the
    count by key Spark runs downstream (Complete mode) is taken of the batches' outputs."""
    tester = counter(lambda key, rows, state: [count_to_two(key, rows, state)])
    totals = collections.Counter()
    for batch, output, expected in (
            (("a",), out(("a", "1")), {"a": 1}),
            (("a", "b"), out(("a", "2"), ("b", "1")), {"a": 2, "b": 1}),
            (("a", "b"), out(("a", "-1"), ("b", "2")), {"a": 3, "b": 2}),
            (("a", "c"), out(("a", "1"), ("c", "1")), {"a": 4, "b": 2, "c": 1})):
        rows = tester.process(keys(*batch))
        assert rows == output
        totals.update(row["key"] for row in rows)
        assert totals == expected


def test_flat_map_groups_with_state_streaming_with_processing_time_timeout():
    """FlatMapGroupsWithStateSuite: "flatMapGroupsWithState - streaming with processing time timeout": a
    1 s trigger on a manual clock from 0. batchline differs: keys with data are called before
    timed-out keys (Spark's CheckNewAnswer ignores the order)."""
    def fn(key, rows, state):
        assert_no_watermark(state)
        return count_with_ten_second_timeout(key, rows, state)

    tester = counter(fn, PT, processing_time=1000)
    assert run(tester, keys("a")) == (out(("a", "1")), 1, 1)
    assert run(tester, keys("b"), at_ms=2000) == (out(("b", "1")), 2, 1)
    assert run(tester, keys("b"), at_ms=12000) == (out(("b", "2"), ("a", "-1")), 1, 1)  # a was due at 11 s
    assert (tester.last_stats.removed, tester.last_stats.timed_out) == (1, 1)
    assert run(tester, keys("c"), at_ms=23000) == (out(("c", "1"), ("b", "-1")), 1, 1)  # restarted; b due at 22 s
    assert tester.last_stats.removed == 1
    assert run(tester, at_ms=35000) == (out(("c", "-1")), 0, 0)
    assert tester.last_stats.removed == 1 and tester.timeout_of("c") is None


def test_flat_map_groups_with_state_streaming_with_event_time_timeout_and_watermark():
    """FlatMapGroupsWithStateSuite: "flatMapGroupsWithState - streaming w/ event time timeout +
    watermark". Spark checks the batch with (b, 31) and the no-data batch after it together."""
    watermarks = []

    def sample_test_function(key, rows, state):  # the newest event time (s) as state, a timeout 5 s after it
        watermarks.append(state.current_watermark_ms())
        if state.has_timed_out:
            state.remove()
            return [(key, -1)]
        newest = max(max(int(row.eventTime.replace(tzinfo=dt.UTC).timestamp()) for row in rows), count_of(state))
        state.update((newest,))
        state.set_timeout_timestamp((newest + 5) * 1000)
        return [(key, newest)]

    tester = counter(sample_test_function, ET, output_schema="key string, count int", event_time_column="eventTime",
                     watermark_delay="10 seconds")

    def events(*pairs):
        return [{"key": k, "eventTime": at(s)} for k, s in pairs]

    assert tester.process(events(("a", 11), ("a", 13), ("a", 15))) == out(("a", 15))  # watermark 15 - 10 = 5 s
    assert tester.timeout_of("a") == 20000
    assert tester.process(events(("a", 4))) == []  # older than the watermark: dropped
    assert tester.last_stats.late_rows == 1 and tester.last_stats.keys_called == 0
    assert tester.process(events(("a", 10))) == out(("a", 15))
    assert tester.process(events(("b", 31))) == out(("b", 31))  # the watermark becomes 21 s after it
    assert tester.process() == out(("a", -1))
    assert watermarks == [0, 5000, 5000, 21000]
    assert tester.keys() == ["b"]


def test_a_function_that_raises_fails_the_query():
    """FlatMapGroupsWithStateSuite: "[SPARK-49474] flatMapGroupsWithState - user NPE is classified"."""
    def fn(key, rows, state):
        return None.count  # Python's NullPointerException

    with pytest.raises(StateFunctionError, match=r"raised for key 'a'(.|\n)*AttributeError"):
        counter(fn).process(keys("a"))


def test_a_flat_function_returning_none_returns_no_rows():
    """FlatMapGroupsWithStateSuite: "[SPARK-49474] flatMapGroupsWithState - NPE from user iterator is
    classified". batchline differs: ``None`` is no rows (what a Python function that ends without
    ``return`` returns), where Spark fails the query on a null iterator."""
    def fn(key, rows, state):
        state.update((1,))

    tester = counter(fn)
    assert tester.process(keys("a")) == []
    assert tester.state("a") == (1,)


def test_map_groups_with_state_streaming():
    """FlatMapGroupsWithStateSuite: "mapGroupsWithState - streaming"."""
    tester = counter(count_to_two, flat=False)
    assert run(tester, keys("a")) == (out(("a", "1")), 1, 1)
    assert run(tester, keys("a", "b")) == (out(("a", "2"), ("b", "1")), 2, 2)
    assert run(tester, keys("a", "b")) == (out(("a", "-1"), ("b", "2")), 1, 1)
    assert run(tester, keys("a", "c")) == (out(("a", "1"), ("c", "1")), 3, 2)


def test_a_failing_batch_leaves_the_state_as_before_it():
    """FlatMapGroupsWithStateSuite: "StateStore.abort on task failure handling": the third batch
    fails; once the function no longer fails, the batch runs again from the count of 2."""
    fail = False

    def fn(key, rows, state):
        if fail:
            raise RuntimeError("expected failure")
        return running_count(key, rows, state)

    tester = counter(fn, flat=False, output_schema="key string, count long")
    assert tester.process(keys("a")) == out(("a", 1))
    assert tester.process(keys("a")) == out(("a", 2))
    fail = True
    with pytest.raises(StateFunctionError, match="expected failure"):
        tester.process(keys("a"))
    assert tester.state("a") == (2,)
    fail = False
    assert tester.process(keys("a")) == out(("a", 3))


def test_a_key_with_data_is_not_called_as_timed_out():
    """FlatMapGroupsWithStateSuite: "SPARK-38320 - flatMapGroupsWithState state with data should not
    timeout": the second batch's watermark (1 s) is past the key's 500 ms deadline, but the key has
    data, so it is called with its data, and the call clears the timeout."""
    def fn(key, rows, state):
        assert not state.has_timed_out, "the state should not have timed out"
        list(rows)
        if not state.exists:
            state.update((0,))
            state.set_timeout_timestamp(500)
        return (0,)

    tester = StateFunctionTester(fn, "key", state_schema="count long", output_schema="value int", timeout=ET,
                                 flat=False, event_time_column="value", watermark_delay="0 seconds")
    assert tester.process([{"key": 0, "value": at(1)}]) == [{"value": 0}]
    assert tester.timeout_of(0) == 500 and tester.watermark_ms == 1000
    assert tester.process([{"key": 0, "value": at(2)}]) == [{"value": 0}]
    assert tester.last_stats.timed_out == 0 and tester.timeout_of(0) is None and tester.state(0) == (0,)
    assert tester.process() == [] and tester.last_stats.keys_called == 0


@pytest.mark.parametrize("kind", [NT, PT], ids=SPARK_NAME.get)
def test_a_watermark_does_not_fail_the_query(kind):
    """FlatMapGroupsWithStateSuite: "SPARK-20714: watermark does not fail query when timeout = <id>"
    (Spark's query runs with ProcessingTimeTimeout in both; here each runs with the kind it names,
    setting the 10 s timeout only under processing time). Late rows reach the function: they are
    dropped only under event-time timeouts."""
    def fn(key, rows, state):
        if kind is PT:
            return count_with_ten_second_timeout(key, rows, state)
        return [(key, str(running_count(key, rows, state)[1]))]

    tester = counter(fn, kind, processing_time=1000, event_time_column="timestamp", watermark_delay="10 second")
    assert tester.process([{"key": "a", "timestamp": at(1)}]) == out(("a", "1"))
    assert tester.process([{"key": "a", "timestamp": at(30)}]) == out(("a", "2"))  # the watermark becomes 20 s
    assert tester.process([{"key": "a", "timestamp": at(5)}]) == out(("a", "3"))
    assert tester.last_stats.late_rows == 0


# ====================================================================== FlatMapGroupsWithStateWithInitialStateSuite
def count_with_values(key, rows, state):
    """Spark's flatMapGroupsWithStateFunc: the key, its values (the rows' first column) and the new count."""
    values = [row[0] for row in rows]
    if not values:
        assert state.exists  # called for the initial state alone
    assert state.current_processing_time_ms() >= 0 and not state.has_timed_out
    assert_no_watermark(state)
    count = count_of(state) + len(values)
    if "NoUpdate" not in str(key):
        state.update((count,))
    yield (*key, values, str(count)) if isinstance(key, tuple) else (key, values, str(count))


def with_values(initial_state):
    return counter(count_with_values, output_schema="key string, vals array<string>, count string",
                   initial_state=initial_state)


def test_initial_state_all_cases():
    """FlatMapGroupsWithStateWithInitialStateSuite: "flatMapGroupsWithState - initial state - all cases -
    shuffle partitions {1, 2, 6}" (the tester runs one partition). batchline differs: keys with data
    are called first, then initial-state keys, in no defined order (Spark's is the key order)."""
    tester = with_values({"keyInStateAndData-1": (1,), "keyInStateAndData-2": (2,), "keyNoUpdate": (2,),
                          "keyOnlyInState-1": (1,)})
    rows = tester.process(keys("keyOnlyInData", "keyInStateAndData-2"))
    assert rows[:2] == [{"key": "keyOnlyInData", "vals": ["keyOnlyInData"], "count": "1"},
                        {"key": "keyInStateAndData-2", "vals": ["keyInStateAndData-2"], "count": "3"}]
    assert by_key(rows[2:]) == [{"key": "keyInStateAndData-1", "vals": [], "count": "1"},
                                {"key": "keyNoUpdate", "vals": [], "count": "2"},
                                {"key": "keyOnlyInState-1", "vals": [], "count": "1"}]
    assert (tester.last_stats.state_keys, tester.last_stats.updated) == (5, 4)
    assert tester.state("keyNoUpdate") == (2,)  # kept without update()
    assert run(tester, keys("keyInStateAndData-1")) == (  # the initial state is not applied again
        [{"key": "keyInStateAndData-1", "vals": ["keyInStateAndData-1"], "count": "2"}], 5, 1)


def test_initial_state_with_a_compound_key():
    """FlatMapGroupsWithStateWithInitialStateSuite: "flatMapGroupsWithState - initial state - case class
    key": a key of two columns is a tuple, as a case class key is an object in Scala."""
    initial = {("keyInStateAndData", "1"): (1,), ("keyOnlyInState", "1"): (1,), ("keyNoUpdate", "2"): (2,)}
    tester = StateFunctionTester(count_with_values, ("name", "id"), state_schema="count long", initial_state=initial,
                                 output_schema="name string, id string, vals array<string>, count string")

    def user(name, id_, vals, count):
        return {"name": name, "id": id_, "vals": vals, "count": count}

    rows = tester.process([{"name": "keyInStateAndData", "id": "1"}, {"name": "keyOnlyInData", "id": "1"}])
    assert rows[:2] == [user("keyInStateAndData", "1", ["keyInStateAndData"], "2"),
                        user("keyOnlyInData", "1", ["keyOnlyInData"], "1")]
    assert sorted(rows[2:], key=lambda row: row["name"]) == [user("keyNoUpdate", "2", [], "2"),
                                                             user("keyOnlyInState", "1", [], "1")]
    assert (tester.last_stats.state_keys, tester.last_stats.updated) == (4, 3)
    assert run(tester, [{"name": "keyOnlyInData", "id": "1"}]) == (
        [user("keyOnlyInData", "1", ["keyOnlyInData"], "2")], 4, 1)


def test_initial_state_made_by_map_groups_with_state():
    """FlatMapGroupsWithStateWithInitialStateSuite: "flatMapGroupsWithState - initial state - initial
    state has flatMapGroupsWithState": the initial state is the output of another mapGroupsWithState."""
    source = counter(lambda key, rows, state: (key, next(rows).count), flat=False,
                     output_schema="key string, count long")
    initial = {row["key"]: (row["count"],) for row in source.process([{"key": "keyInStateAndData", "count": 1}])}
    assert initial == {"keyInStateAndData": (1,)}
    assert with_values(initial).process(keys("keyInStateAndData")) == [
        {"key": "keyInStateAndData", "vals": ["keyInStateAndData"], "count": "2"}]


def test_initial_state_with_a_null_key():
    """FlatMapGroupsWithStateWithInitialStateSuite: "mapGroupsWithState - initial state - null key"."""
    tester = counter(running_count, flat=False, output_schema="key string, count long",
                     initial_state={"key": (5,), None: (2,)})
    assert run(tester, keys("key", None)) == (out(("key", 6), (None, 3)), 2, 2)
    assert tester.state(None) == (3,)


def test_initial_state_with_processing_time_timeout():
    """FlatMapGroupsWithStateWithInitialStateSuite: "flatMapGroupsWithState - initial state - processing
    time timeout": an initial-state key has no timeout until its first call sets one. batchline
    differs: a processing-time timer fires in the batch at its deadline (README, "Timeouts and the
    watermark"), so a and c time out in the no-data batch at 11 s, where Spark's fires them in
    that batch or the next (its trigger timestamps land a few ms after the grid); Spark's check
    after the batch at 12 s reads both batches' rows."""
    tester = counter(count_with_ten_second_timeout, PT, processing_time=1000, initial_state={"c": (2,)},
                     event_time_column="timestamp", watermark_delay="10 second")
    assert tester.timeout_of("c") is None
    assert tester.process([{"key": "a", "timestamp": at(1)}]) == out(("a", "1"), ("c", "2"))
    assert (tester.timeout_of("a"), tester.timeout_of("c")) == (11000, 11000)
    timed_out, state_keys, updated = run(tester, at_ms=11000)
    assert (by_key(timed_out), state_keys, updated) == (out(("a", "-1"), ("c", "-1")), 0, 0)
    assert tester.last_stats.removed == 2
    assert run(tester, [{"key": "b", "timestamp": at(1)}], at_ms=12000) == (out(("b", "1")), 1, 1)
    assert tester.keys() == ["b"]


# "flatMapGroupsWithState - initial state - skipEmittingInitialStateKeys=true" and "... - initial state and
# initial batch have same keys and skipEmittingInitialStateKeys=true": not applicable, batchline has no
# skipEmittingInitialStateKeys; it always calls the function for initial-state keys, as Spark's default.
def test_initial_state_keys_are_emitted():
    """FlatMapGroupsWithStateWithInitialStateSuite: "flatMapGroupsWithState - initial state -
    skipEmittingInitialStateKeys=false" (Spark's two AddData before one check run as one batch)."""
    tester = counter(fruit_count, output_schema="key string, count long",
                     initial_state={"apple": (1,), "orange": (2,), "mango": (5,)})
    rows = tester.process(keys("apple", "banana"))
    assert rows[:2] == out(("apple", 2), ("banana", 1)) and by_key(rows[2:]) == out(("mango", 5), ("orange", 2))
    assert tester.process(keys("orange")) == out(("orange", 3))


def test_initial_state_and_first_batch_with_the_same_keys():
    """FlatMapGroupsWithStateWithInitialStateSuite: "flatMapGroupsWithState - initial state and initial
    batch have same keys and skipEmittingInitialStateKeys=false"."""
    tester = counter(fruit_count, output_schema="key string, count long", initial_state={"apple": (1,), "orange": (2,)})
    assert tester.process(keys("apple", "apple", "orange")) == out(("apple", 3), ("orange", 3))
    assert tester.process(keys("orange")) == out(("orange", 4))
