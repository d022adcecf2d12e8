"""State functions ported from Structured Streaming (issue 20): the two behaviours that broke
ported code, and each difference the README's "Coming from Structured Streaming" decides,
at the per-key level (``StateFunctionTester``, the code the tasks run) and end to end on Spark.

The port of Spark's own GroupState and flatMapGroupsWithState tests is in
``test_spark_group_state_port.py``."""

import datetime as dt
import decimal
import math
import re
from dataclasses import dataclass

import numpy as np
import pytest

from batchline.errors import ConfigurationError
from batchline.state import GroupState, GroupStateTimeout, StateFunctionError, read_state
from batchline.state.group_state import NO_TIMESTAMP, TimeoutNotEnabledError
from batchline.testing import StateFunctionTester
from tests.spark.test_stateful import Pipeline

EPOCH = dt.datetime(1970, 1, 1)  # noqa: DTZ001 - rows carry naive UTC datetimes, as PySpark hands them out


@dataclass
class Seen:
    watermark: int


def at(seconds: float) -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=seconds)


def watermark_reader(key, rows, state):
    """Spark's event-time test function reads the watermark on every call, batch 1 included."""
    watermark = state.current_watermark_ms()
    newest = max(row.ts for row in rows)
    state.update(Seen(watermark))
    state.set_timeout_timestamp(newest.replace(tzinfo=dt.UTC), "1 minute")
    yield (key, watermark)


def reader_tester(delay):
    """The watermark reader under event-time timeouts, per key, with ``delay``."""
    return StateFunctionTester(watermark_reader, "key", state_schema=Seen, output_schema="key string, wm long",
                               timeout=GroupStateTimeout.EVENT_TIME, event_time_column="ts", watermark_delay=delay)


def watermarks_on_spark(spark, tmp_path, delay):
    """What the watermark reader reads in two batches on Spark: events at 1000 s, then 1001 s."""
    p = Pipeline(spark, tmp_path, watermark_reader, state_schema=Seen, output_schema="key string, wm long",
                 timeout=GroupStateTimeout.EVENT_TIME, watermark=delay).start()
    try:
        return p.batch([("a", 1, 1000)]), p.batch([("b", 1, 1001)])
    finally:
        p.stop()


# -------------------------------------------------------------------- bug 1: the first batch's watermark
def test_the_watermark_reads_0_in_the_first_batch_as_in_spark():
    tester = reader_tester("10 seconds")
    assert tester.process([{"key": "a", "ts": at(100)}]) == [{"key": "a", "wm": 0}]
    assert tester.process([{"key": "b", "ts": at(101)}]) == [{"key": "b", "wm": 90_000}]


@pytest.mark.parametrize("timeout", [GroupStateTimeout.NO_TIMEOUT, GroupStateTimeout.PROCESSING_TIME])
def test_the_watermark_is_readable_under_any_timeout_kind_once_with_watermark_is_set(timeout):
    def fn(key, rows, state):
        list(rows)
        yield (key, state.current_watermark_ms())

    tester = StateFunctionTester(fn, "key", state_schema=Seen, output_schema="key string, wm long", timeout=timeout,
                                 event_time_column="ts", watermark_delay="5 seconds")
    assert tester.process([{"key": "a", "ts": at(100)}]) == [{"key": "a", "wm": 0}]
    assert tester.process([{"key": "a", "ts": at(100)}]) == [{"key": "a", "wm": 95_000}]


def test_without_with_watermark_reading_it_still_fails_and_says_what_to_call():
    def fn(key, rows, state):
        state.current_watermark_ms()
        return []

    tester = StateFunctionTester(fn, "key", state_schema=Seen, output_schema="key string")
    with pytest.raises(StateFunctionError, match=r"has no event-time watermark; call stream.with_watermark") as raised:
        tester.process([{"key": "a"}])
    assert "TimeoutNotEnabledError" in raised.value.python_traceback


def test_the_first_batch_reads_watermark_0_on_spark(spark, tmp_path):
    assert watermarks_on_spark(spark, tmp_path, "10 seconds") == ([{"key": "a", "wm": 0}],
                                                                  [{"key": "b", "wm": 990_000}])


# -------------------------------------------------------------------- bug 2: durations are milliseconds
def state(now=1_000_000):
    return GroupState(None, GroupStateTimeout.PROCESSING_TIME, processing_time_ms=now)


@pytest.mark.parametrize("duration", [1500, 1500.0, np.int64(1500), np.float64(1500.0), decimal.Decimal(1500),
                                      "1500 ms", "1.5 seconds", dt.timedelta(milliseconds=1500)])
def test_every_number_is_milliseconds_as_in_pyspark(duration):
    s = state()
    s.set_timeout_duration(duration)
    assert s.timeout_timestamp_ms == 1_001_500


def test_a_fraction_of_a_millisecond_rounds_up_so_a_timeout_is_never_early():
    s = state()
    s.set_timeout_duration(0.25)
    assert s.timeout_timestamp_ms == 1_000_001


@pytest.mark.parametrize("duration", [math.nan, math.inf, -math.inf, np.float64("nan"), 0.0, -1.0, 0, True,
                                      b"1500", [1500], None, "fast"])
def test_anything_else_is_refused_with_what_to_pass(duration):
    with pytest.raises(ConfigurationError, match=r"milliseconds|duration"):
        state().set_timeout_duration(duration)


def test_a_float_duration_times_out_after_that_many_milliseconds_in_a_batch():
    def fn(key, rows, state):
        if state.has_timed_out:
            state.remove()
            return [(key, "timed out")]
        list(rows)
        state.update(Seen(0))
        state.set_timeout_duration(1500.0)
        return []

    tester = StateFunctionTester(fn, "key", state_schema=Seen, output_schema="key string, what string",
                                 timeout=GroupStateTimeout.PROCESSING_TIME, processing_time=10_000)
    assert tester.process([{"key": "a"}]) == []
    assert tester.timeout_of("a") == 11_500
    tester.advance_processing_time(1501)
    assert tester.process() == [{"key": "a", "what": "timed out"}]


# -------------------------------------------------------------------- differences decided: match Spark
def timer_then_callback(key, rows, state):
    """Removes the state but asks to be called again in 5 s (a cooldown), as Spark allows."""
    if state.has_timed_out:
        yield (key, f"timed out, exists={state.exists}")
        return
    list(rows)
    if state.exists:
        state.set_timeout_duration("5 seconds")
        state.remove()
        yield (key, "removed, timer kept")
    else:
        state.update(Seen(1))
        yield (key, "created")


def test_remove_after_set_timeout_keeps_the_timer_and_calls_again_without_state():
    tester = StateFunctionTester(timer_then_callback, "key", state_schema=Seen, output_schema="key string, what string",
                                 timeout=GroupStateTimeout.PROCESSING_TIME, processing_time=10_000)
    assert tester.process([{"key": "a"}]) == [{"key": "a", "what": "created"}]
    tester.advance_processing_time(1000)
    assert tester.process([{"key": "a"}]) == [{"key": "a", "what": "removed, timer kept"}]
    assert tester.state("a") is None and tester.keys() == [] and tester.timeout_of("a") == 16_000
    tester.advance_processing_time(4999)  # 1 ms before the deadline
    assert tester.process() == []
    tester.advance_processing_time(1)  # 16 s: at the deadline
    assert tester.process() == [{"key": "a", "what": "timed out, exists=False"}]
    assert tester.timeout_of("a") is None and tester.last_stats.state_keys == 0


@pytest.mark.parametrize("timeout", [GroupStateTimeout.PROCESSING_TIME, GroupStateTimeout.EVENT_TIME])
def test_a_timeout_on_a_key_without_state_is_stored_as_in_spark(timeout):
    def fn(key, rows, state):
        if state.has_timed_out:
            return [(key, f"timed out, exists={state.exists}")]
        list(rows)
        if timeout is GroupStateTimeout.PROCESSING_TIME:
            state.set_timeout_duration(1000)
        else:
            state.set_timeout_timestamp(200_000)
        return []

    watermark = {"event_time_column": "ts", "watermark_delay": "0 seconds"}
    tester = StateFunctionTester(fn, "key", state_schema=Seen, output_schema="key string, what string",
                                 timeout=timeout, processing_time=10_000, **watermark)
    assert tester.process([{"key": "a", "ts": at(100)}]) == []
    assert tester.keys() == [] and tester.timeout_of("a") == (11_000 if timeout is GroupStateTimeout.PROCESSING_TIME
                                                            else 200_000)
    tester.advance_processing_time(1001)
    tester.advance_watermark(200_001)
    assert tester.process() == [{"key": "a", "what": "timed out, exists=False"}]


def test_a_timer_without_state_survives_the_store_and_a_restart_on_spark(spark, tmp_path):
    p = Pipeline(spark, tmp_path, timer_then_callback, state_schema=Seen, output_schema="key string, what string",
                 timeout=GroupStateTimeout.PROCESSING_TIME, num_partitions=2).start()
    try:
        assert p.batch([("a", 1, None), ("b", 1, None)]) == [{"key": "a", "what": "created"},
                                                             {"key": "b", "what": "created"}]
        assert p.batch([("a", 1, None)]) == [{"key": "a", "what": "removed, timer kept"}]
        assert [r["key"] for r in read_state(spark, str(tmp_path), "op").collect()] == ["b"]  # a has no state
    finally:
        p.stop()
    # A new driver: the worker caches are not trusted, the timer comes back from the store.
    deadline = p.batch_time + 5000
    p = Pipeline(spark, tmp_path, timer_then_callback, state_schema=Seen, output_schema="key string, what string",
                 timeout=GroupStateTimeout.PROCESSING_TIME, num_partitions=2, start_ms=p.batch_time).start()
    try:
        while p.batch_time + 1000 < deadline:  # before the deadline
            assert p.batch() == []
        assert p.batch() == [{"key": "a", "what": "timed out, exists=False"}]
        assert p.info().state_operators["op"].state_keys == 1  # b
    finally:
        p.stop()


def test_a_watermark_delay_of_0_seconds_is_accepted_as_in_spark(spark, tmp_path):
    tester = reader_tester("0 seconds")
    tester.process([{"key": "a", "ts": at(100)}])
    assert tester.watermark_ms == 100_000
    assert watermarks_on_spark(spark, tmp_path, "0 seconds") == ([{"key": "a", "wm": 0}],
                                                                 [{"key": "b", "wm": 1_000_000}])
    with pytest.raises(ConfigurationError, match="must be zero or more"):
        StateFunctionTester(watermark_reader, "key", state_schema=Seen, output_schema="key string, wm long",
                            event_time_column="ts", watermark_delay=dt.timedelta(seconds=-1))


@pytest.mark.parametrize("timeout, late_dropped", [(GroupStateTimeout.EVENT_TIME, True),
                                                   (GroupStateTimeout.PROCESSING_TIME, False),
                                                   (GroupStateTimeout.NO_TIMEOUT, False)])
def test_late_rows_are_dropped_only_under_event_time_timeouts(timeout, late_dropped):
    def fn(key, rows, state):
        yield (key, len(list(rows)))

    tester = StateFunctionTester(fn, "key", state_schema=Seen, output_schema="key string, rows long",
                                 timeout=timeout, event_time_column="ts", watermark_delay="10 seconds")
    tester.process([{"key": "a", "ts": at(100)}])  # the watermark becomes 90 s
    out = tester.process([{"key": "late", "ts": at(50)}, {"key": "a", "ts": at(95)}])
    assert out == ([{"key": "a", "rows": 1}] if late_dropped else [{"key": "late", "rows": 1}, {"key": "a", "rows": 1}])
    assert tester.last_stats.late_rows == int(late_dropped)


@pytest.mark.parametrize("spark_name, ours", [("getOption", "get_option()"), ("hasTimedOut", "has_timed_out"),
                                              ("setTimeoutDuration", "set_timeout_duration"),
                                              ("getCurrentWatermarkMs", "current_watermark_ms()")])
def test_spark_method_names_say_the_batchline_name(spark_name, ours):
    with pytest.raises(AttributeError, match=re.escape(ours)):
        getattr(state(), spark_name)
    with pytest.raises(AttributeError, match="has no attribute 'nonsense'"):
        state().nonsense  # noqa: B018 - the attribute access is the test


def test_get_without_state_raises_what_pyspark_code_catches():
    with pytest.raises(ValueError, match="check state.exists first"):
        state().get()
    assert NO_TIMESTAMP == -1
    with pytest.raises(TimeoutNotEnabledError):
        GroupState(None, GroupStateTimeout.NO_TIMEOUT, 0).current_watermark_ms()


# -------------------------------------------------------------------- found in Spark's code, matched
def test_a_row_at_the_watermark_is_late_as_in_spark():
    def fn(key, rows, state):
        yield (key, len(list(rows)))

    tester = StateFunctionTester(fn, "key", state_schema=Seen, output_schema="key string, rows long",
                                 timeout=GroupStateTimeout.EVENT_TIME, event_time_column="ts",
                                 watermark_delay="10 seconds")
    tester.process([{"key": "a", "ts": at(100)}])  # the watermark becomes 90 s
    assert tester.process([{"key": "at", "ts": at(90)}, {"key": "after", "ts": at(90.001)}]) == [
        {"key": "after", "rows": 1}]
    assert tester.last_stats.late_rows == 1


def test_the_watermark_never_goes_below_0_as_in_spark():
    tester = reader_tester("10 seconds")
    tester.process([{"key": "a", "ts": at(3)}])
    assert tester.watermark_ms == 0
    assert tester.process([{"key": "b", "ts": at(4)}]) == [{"key": "b", "wm": 0}]


@pytest.mark.parametrize(("duration", "ms"), [("1 day", 86_400_000), ("2 days", 172_800_000),
                                              ("1 hour 30 minutes", 5_400_000), ("interval 1 hour", 3_600_000),
                                              ("-1 month 31 days 1 second", 1000), ("1 week", 604_800_000)])
def test_interval_strings_read_as_spark_reads_them(duration, ms):
    s = state()
    s.set_timeout_duration(duration)
    assert s.timeout_timestamp_ms == 1_000_000 + ms


def test_an_additional_duration_may_be_zero_but_not_negative():
    s = GroupState(None, GroupStateTimeout.EVENT_TIME, 0, watermark_ms=1000)
    s.set_timeout_timestamp(5000, "0 seconds")
    assert s.timeout_timestamp_ms == 5000
    s.set_timeout_timestamp(5000, 0)
    assert s.timeout_timestamp_ms == 5000
    with pytest.raises(ConfigurationError, match="zero or more"):
        s.set_timeout_timestamp(5000, "-3 seconds")


def test_a_timer_set_while_the_input_ends_is_dropped_and_the_pipeline_finishes(spark, tmp_path):
    """batchline alone times every key out when a bounded input ends (Spark never does); a
    ported function that re-arms its event-time timer when timed out must not fail or loop."""
    from batchline import StreamingContext
    from batchline.testing import END, CollectSink, list_stream

    def rearm(key, rows, state):
        if state.has_timed_out:
            state.set_timeout_timestamp(state.current_watermark_ms() + 1000)  # what Spark code may do
            yield (key, "timed out")
            return
        newest = max(row.ts for row in rows)
        state.update(Seen(0))
        state.set_timeout_timestamp(newest.replace(tzinfo=dt.UTC), "5 seconds")
        yield (key, "data")

    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "checkpoint"))
    events = list_stream(ssc, [[("a", at(100))], [("b", at(101))], END], "key string, ts timestamp", bounded=True)
    sink = CollectSink()
    events.with_watermark("ts", "1 second").group_by_key("key").flat_map_groups_with_state(
        rearm, state_schema=Seen, output_schema="key string, what string", timeout=GroupStateTimeout.EVENT_TIME,
        name="rearm", num_partitions=2).foreach_batch(sink)
    try:
        assert ssc.run_until_finished(timeout=120)
    finally:
        ssc.stop()
    rows = sorted((r["key"], r["what"]) for batch in sink.batches.values() for r in batch)
    assert rows == [("a", "data"), ("a", "timed out"), ("b", "data"), ("b", "timed out")]
