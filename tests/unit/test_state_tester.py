"""StateFunctionTester: a state function batch by batch, without Spark."""

import datetime as dt
import pickle
from dataclasses import dataclass

import pytest
from pyspark import SparkContext

from batchline.errors import ConfigurationError
from batchline.state import GroupStateTimeout, StateFunctionError, StateFunctionTester, StateStoreError
from batchline.state.contract import ErrorKind
from tests.helpers import Count, event_time_count, running_count, session_fn


def counter(fn=running_count, **kwargs):
    kwargs.setdefault("state_schema", Count)
    kwargs.setdefault("output_schema", "key string, count long")
    return StateFunctionTester(fn, "key", **kwargs)


def rows(*pairs):
    return [{"key": k, "value": v} for k, v in pairs]


def test_it_never_starts_spark():
    already = SparkContext._active_spark_context
    tester = counter(processing_time=100_000)
    assert tester.process(rows(("a", 1), ("b", 2), ("a", 3))) == [{"key": "a", "count": 2}, {"key": "b", "count": 1}]
    if already is None:  # nothing else in this process started Spark: the tester did not either
        assert SparkContext._active_spark_context is None


def test_state_carries_over_between_batches_per_key():
    tester = counter()
    assert tester.process(rows(("a", 1), ("b", 2), ("a", 3))) == [{"key": "a", "count": 2}, {"key": "b", "count": 1}]
    assert tester.process(rows(("a", 5))) == [{"key": "a", "count": 3}]
    assert tester.process() == []  # no data, no timeout: the function is not called
    assert tester.last_stats.keys_called == 0
    assert tester.process(rows(("b", 1), ("c", 1))) == [{"key": "b", "count": 2}, {"key": "c", "count": 1}]
    assert (tester.last_stats.rows, tester.last_stats.keys_called, tester.last_stats.state_keys) == (2, 2, 3)
    assert sorted(tester.keys()) == ["a", "b", "c"]
    assert tester.state("a") == Count(3, 9) and tester.state("nobody") is None


def test_map_groups_with_state_returns_one_row_per_key():
    def fn(key, rows, state):
        n = sum(1 for _ in rows) + (state.get().count if state.exists else 0)
        state.update(Count(n, 0))
        return (key, n)

    tester = counter(fn, flat=False)
    assert tester.process(rows(("a", 1), ("a", 1))) == [{"key": "a", "count": 2}]
    assert tester.process(rows(("a", 1))) == [{"key": "a", "count": 3}]


def test_processing_time_timeouts_fire_as_the_clock_moves():
    tester = counter(session_fn, timeout=GroupStateTimeout.PROCESSING_TIME, processing_time=101_000)
    assert tester.process(rows(("a", 1), ("b", 1))) == []  # deadlines 103 000
    assert tester.timeout_of("a") == 103_000
    tester.advance_processing_time("1 second")
    assert tester.process(rows(("b", 1))) == []  # 102 000: b's deadline moves to 104 000
    tester.advance_processing_time(999)  # milliseconds, as set_timeout_duration reads an int
    assert tester.process() == []  # 102 999: a's deadline is not yet reached
    tester.advance_processing_time(dt.timedelta(milliseconds=1))
    assert tester.process() == [{"key": "a", "count": 1}]  # 103 000: no input at all, a times out at its deadline
    assert tester.last_stats.timed_out == 1 and tester.keys() == ["b"]
    tester.set_processing_time(dt.datetime(1970, 1, 1, 0, 1, 44))  # noqa: DTZ001 - naive is UTC
    assert tester.processing_time_ms == 104_000
    assert tester.process() == [{"key": "b", "count": 2}]
    assert tester.keys() == []
    with pytest.raises(ConfigurationError, match="only moves forward"):
        tester.set_processing_time(1)


def test_batches_at_one_time_run_a_millisecond_apart():
    seen = []

    def fn(key, rows, state):
        seen.append(state.current_processing_time_ms())
        yield from running_count(key, rows, state)

    tester = counter(fn, processing_time=5000)
    tester.process(rows(("a", 1)))
    tester.process(rows(("a", 1)))
    assert seen == [5000, 5001] and tester.processing_time_ms == 5001
    assert tester.state("a") == Count(2, 2)


def test_event_time_timeouts_follow_the_watermark_and_late_rows_are_counted():
    fn = event_time_count
    def at(seconds):
        return {"ts": dt.datetime(1970, 1, 1) + dt.timedelta(seconds=seconds)}  # noqa: DTZ001 - naive is UTC

    tester = counter(fn, timeout=GroupStateTimeout.EVENT_TIME, event_time_column="ts", watermark_delay="10 seconds")
    assert tester.process([{"key": "a", **at(1000)}]) == [{"key": "a", "count": 1}]  # a times out at 1005 s
    assert tester.watermark_ms == 990_000
    assert tester.process([{"key": "b", **at(1012)}]) == [{"key": "b", "count": 1}]  # watermark 1002 s next
    assert tester.process([{"key": "c", **at(1001)}, {"key": "d", **at(1020)}]) == [{"key": "d", "count": 1}]
    assert tester.last_stats.late_rows == 1
    assert tester.process() == [{"key": "a", "count": -1}]  # watermark 1010 s passed a's 1005 s
    tester.advance_watermark(dt.datetime(1970, 1, 1, 0, 30))  # noqa: DTZ001 - naive is UTC
    assert sorted(r["key"] for r in tester.process()) == ["b", "d"]
    with pytest.raises(ConfigurationError, match="only moves forward"):
        tester.advance_watermark(0)


def test_event_time_timeouts_with_a_watermark_set_by_hand():
    def fn(key, rows, state):
        if state.has_timed_out:
            state.remove()
            yield {"key": key, "count": -1}
            return
        state.update(Count(1, 0))
        state.set_timeout_timestamp(50_000)

    tester = counter(fn, timeout=GroupStateTimeout.EVENT_TIME)
    tester.process(rows(("a", 1)))
    tester.advance_watermark(50_000)
    assert tester.process() == []  # a deadline at the watermark has not passed it
    tester.advance_watermark(50_001)
    assert tester.process() == [{"key": "a", "count": -1}]


def test_state_can_be_read_set_and_removed_between_batches():
    tester = counter(session_fn, timeout=GroupStateTimeout.PROCESSING_TIME, processing_time=10_000)
    tester.set_state("z", Count(5, 0), timeout_ms=11_000)  # before any batch
    assert tester.state("z") == Count(5, 0) and tester.timeout_of("z") == 11_000
    tester.advance_processing_time("2s")
    assert tester.process(rows(("a", 1))) == [{"key": "z", "count": 5}]  # z was due; the function saw it
    tester.set_state("a", Count(41, 0))  # after a batch: the state the next batch builds on
    tester.set_state("b", (7, 0))  # tuples of the schema's fields work too
    tester.advance_processing_time("1s")
    assert tester.process(rows(("a", 1))) == []
    assert tester.state("a") == Count(42, 0) and tester.state("b") == Count(7, 0)
    assert tester.timeout_of("b") is None
    tester.set_state("b", None)
    assert sorted(tester.keys()) == ["a"]
    with pytest.raises(ConfigurationError, match="does not fit the state schema"):
        tester.set_state("c", "not a count")


def test_initial_state_keys_are_called_once_in_the_first_batch():
    def fn(key, rows, state):
        old = state.get() if state.exists else Count(0, 0)
        n = sum(1 for _ in rows)
        state.update(Count(old.count + n, old.total))
        yield {"key": key, "count": old.count + n}

    tester = counter(fn, initial_state={"a": Count(10, 100), "z": Count(5, 50)}, processing_time=1000)
    assert tester.process(rows(("a", 1), ("b", 1))) == [
        {"key": "a", "count": 11}, {"key": "b", "count": 1}, {"key": "z", "count": 5}]
    assert tester.process(rows(("b", 1))) == [{"key": "b", "count": 2}]  # z is not called again


def test_a_failing_function_raises_with_the_key_and_traceback_and_leaves_no_trace():
    def fn(key, rows, state):
        if key == "bad":
            state.get()
        yield from running_count(key, rows, state)

    tester = counter(fn)
    tester.process(rows(("good", 1)))
    with pytest.raises(StateFunctionError) as failure:
        tester.process(rows(("good", 1), ("bad", 1)))
    error = failure.value
    assert (error.kind, error.operator, error.key_repr) == (ErrorKind.RAISED, "tester", "'bad'")
    text = str(error)
    assert "key 'bad'" in text and "Traceback (most recent call last)" in text and "NoStateError" in text
    assert "in fn" in text
    assert tester.state("good") == Count(1, 1)  # the failed batch changed nothing
    assert tester.process(rows(("good", 1))) == [{"key": "good", "count": 2}]


def test_outputs_and_state_of_the_wrong_shape_name_the_key():
    tester = counter(lambda key, rows, state: [{"key": key, "count": "many"}])
    with pytest.raises(StateFunctionError, match="for key 'x'.*does not fit the output schema") as failure:
        tester.process(rows(("x", 1)))
    assert failure.value.kind is ErrorKind.OUTPUT_SCHEMA

    def wrong_state(key, rows, state):
        state.update("text")
        return []

    with pytest.raises(StateFunctionError, match="wrong type for key 'y'"):
        counter(wrong_state).process(rows(("y", 1)))


def test_input_schema_rows_and_compound_keys():
    @dataclass
    class Click:
        user: str
        day: int
        value: int

    def fn(key, rows, state):
        total = sum(r.value for r in rows) + (state.get()[0] if state.exists else 0)
        state.update((total,))
        yield {"user": key[0], "day": key[1], "total": total}

    tester = StateFunctionTester(fn, ("user", "day"), state_schema="total long",
                                 output_schema="user string, day long, total long", input_schema=Click)
    assert tester.process([Click("u", 1, 2), ("u", 1, 3), {"user": "v", "day": 2, "value": 1}]) == [
        {"user": "u", "day": 1, "total": 5}, {"user": "v", "day": 2, "total": 1}]
    assert tester.state(("u", 1)) == (5,)
    tester.set_state(("w", 3), (9,))
    assert sorted(tester.keys()) == [("u", 1), ("v", 2), ("w", 3)]


def test_misuse_of_the_tester_says_what_to_do():
    with pytest.raises(ConfigurationError, match="together"):
        counter(event_time_column="ts")
    with pytest.raises(ConfigurationError, match="rows are dicts"):
        counter().process([("a", 1)])
    with pytest.raises(ConfigurationError, match=r"lack column\(s\) \['key'\]"):
        counter().process([{"value": 1}])
    with pytest.raises(ConfigurationError, match="names of the key columns"):
        StateFunctionTester(running_count, [], state_schema=Count, output_schema="key string")
    with pytest.raises(ConfigurationError, match="positive"):
        counter().advance_processing_time(0)
    if SparkContext._active_spark_context is None:  # else Spark's own parser reads any DDL
        with pytest.raises(ConfigurationError, match="give a dataclass or a StructType instead"):
            counter(output_schema="key string COMMENT 'the key'")


def test_its_store_stays_in_this_process():
    tester = counter()
    tester.process(rows(("a", 1)))
    with pytest.raises(StateStoreError, match="cannot be pickled or shipped to Spark workers"):
        pickle.dumps(tester.store)


def test_the_module_example_runs():
    import textwrap

    import batchline.state.tester as module

    doc = module.__doc__
    example = doc[doc.index("    from batchline.state import"):doc.index("Each ``process`` call")]
    exec(compile(textwrap.dedent(example), "tester-example", "exec"), {})  # noqa: S102 - our own docstring
