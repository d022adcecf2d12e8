"""flat_map_groups_with_state end to end on real Spark, batch by batch on a manual clock."""

import datetime as dt
import json
from dataclasses import dataclass

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from batchline import BatchFailedError, ConfigurationError, StreamingContext
from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import SystemClock
from batchline.observe.status import read_status
from batchline.state import GroupStateTimeout, StateFunctionError, StateSchemaError, read_state, state_versions
from batchline.state.store import StateFiles
from batchline.testing import BatchHarness, CollectSink, ManualClock
from tests.helpers import Count, event_time_count, running_count, session_fn

SCHEMA = StructType([StructField("key", StringType()), StructField("value", LongType()),
                     StructField("ts", TimestampType())])
START = 100_000


def at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


class Pipeline(BatchHarness):
    """A queue of DataFrames in, a stateful operator, its output collected per batch."""

    def __init__(self, spark, checkpoint, fn, state_schema=Count, output_schema="key string, count long",
                 timeout=GroupStateTimeout.NO_TIMEOUT, start_ms=START, watermark=None, flat=True, **kwargs):
        def build(stream):
            stream = stream.with_watermark("ts", watermark) if watermark else stream
            keyed = stream.group_by_key("key")
            method = keyed.flat_map_groups_with_state if flat else keyed.map_groups_with_state
            return method(fn, state_schema=state_schema, output_schema=output_schema, timeout=timeout, name="op",
                          **kwargs)

        super().__init__(spark, build, SCHEMA, checkpoint=str(checkpoint), start_ms=start_ms)
        self.queue = self.input

    def batch(self, rows=()):
        """Run the next batch with ``rows`` (key, value, ts seconds; None: the batch time) and
        return its output."""
        return super().batch([(k, v, at(ts if ts is not None else self.batch_time / 1000)) for k, v, ts in rows])


def test_state_carries_over_between_batches_per_key(spark, tmp_path):
    p = Pipeline(spark, tmp_path, running_count, num_partitions=3).start()
    try:
        assert p.batch([("a", 1, None), ("b", 2, None), ("a", 3, None)]) == [
            {"key": "a", "count": 2}, {"key": "b", "count": 1}]
        assert p.batch([("a", 5, None)]) == [{"key": "a", "count": 3}]
        assert p.batch() == []  # no data, no timeout: the function is not called
        assert p.batch([("b", 1, None), ("c", 1, None)]) == [{"key": "b", "count": 2}, {"key": "c", "count": 1}]
        progress = p.info().state_operators["op"]
        assert (progress.input_rows, progress.keys_called, progress.state_keys) == (2, 2, 3)
    finally:
        p.stop()
    rows = {r["key"]: (r["count"], r["total"]) for r in read_state(spark, str(tmp_path), "op").collect()}
    assert rows == {"a": (3, 9), "b": (2, 3), "c": (1, 1)}


def test_map_groups_with_state_returns_one_row_per_key(spark, tmp_path):
    def fn(key, rows, state):
        n = sum(1 for _ in rows) + (state.get().count if state.exists else 0)
        state.update(Count(n, 0))
        return (key, n)

    p = Pipeline(spark, tmp_path, fn, flat=False).start()
    try:
        assert p.batch([("a", 1, None), ("a", 1, None)]) == [{"key": "a", "count": 2}]
        assert p.batch([("a", 1, None)]) == [{"key": "a", "count": 3}]
    finally:
        p.stop()


def test_remove_drops_the_key_and_update_after_remove_keeps_it(spark, tmp_path):
    def fn(key, rows, state):
        values = [r.value for r in rows]
        if values == [0]:
            state.remove()
        elif values == [1]:
            state.remove()
            state.update(Count(100, 0))
        else:
            state.update(Count(len(values), 0))
        return []

    p = Pipeline(spark, tmp_path, fn).start()
    try:
        p.batch([("a", 5, None), ("b", 5, None)])
        p.batch([("a", 0, None), ("b", 1, None)])
        assert p.info().state_operators["op"].removed == 1
    finally:
        p.stop()
    rows = {r["key"]: r["count"] for r in read_state(spark, str(tmp_path), "op").collect()}
    assert rows == {"b": 100}


def test_processing_time_timeouts_fire_without_any_input(spark, tmp_path):
    p = Pipeline(spark, tmp_path, session_fn, timeout=GroupStateTimeout.PROCESSING_TIME).start()
    try:
        assert p.batch([("a", 1, None), ("b", 1, None)]) == []  # batch 101 000: deadline 103 000
        assert p.batch([("b", 1, None)]) == []                  # 102 000: b's deadline moves to 104 000
        assert p.batch() == [{"key": "a", "count": 1}]           # 103 000: no input at all, a times out at its deadline
        assert p.info().state_operators["op"].timed_out == 1
        assert p.batch() == [{"key": "b", "count": 2}]           # 104 000
        assert p.batch() == []
        assert p.info().state_operators["op"].state_keys == 0
    finally:
        p.stop()


def test_event_time_timeouts_follow_the_watermark_and_late_rows_are_counted(spark, tmp_path):
    fn = event_time_count
    p = Pipeline(spark, tmp_path, fn, timeout=GroupStateTimeout.EVENT_TIME, watermark="10 seconds").start()
    try:
        assert p.batch([("a", 1, 1000)]) == [{"key": "a", "count": 1}]  # a: timeout at 1005 s event time
        assert p.info().state_operators["op"].watermark_ms is None
        assert p.batch([("b", 1, 1012)]) == [{"key": "b", "count": 1}]  # watermark 990 s
        assert p.info().state_operators["op"].watermark_ms == 990_000
        # Watermark 1002 s: a row at 1001 s is late, dropped and counted; a is not due yet.
        assert p.batch([("c", 1, 1001), ("d", 1, 1020)]) == [{"key": "d", "count": 1}]
        assert p.info().late_records == 1
        assert p.batch() == [{"key": "a", "count": -1}]  # watermark 1010 s passed a's 1005 s, no input for a
    finally:
        p.stop()


def test_event_time_timeouts_need_a_watermark(spark, tmp_path):
    ssc = StreamingContext(spark, "1s", checkpoint=str(tmp_path))
    keyed = ssc.queue_stream([], schema=SCHEMA).group_by_key("key")
    with pytest.raises(ConfigurationError, match="with_watermark"):
        keyed.flat_map_groups_with_state(session_fn, state_schema=Count, output_schema="key string",
                                         timeout=GroupStateTimeout.EVENT_TIME)


@pytest.mark.parametrize("misuse, message", [
    (lambda state: state.get(), "NoStateError"),
    (lambda state: state.update(None), "state.update(None) is not allowed"),
    (lambda state: state.set_timeout_duration("1 minute"), "needs timeout=GroupStateTimeout.PROCESSING_TIME"),
])
def test_misuse_fails_the_batch_with_the_key_and_the_python_traceback(spark, tmp_path, misuse, message):
    def fn(key, rows, state):
        if key == "bad":
            misuse(state)
        state.update(Count(1, 0))
        return []

    p = Pipeline(spark, tmp_path, fn).start()
    p.queue.push(spark.createDataFrame([("good", 1, at(1)), ("bad", 1, at(1))], SCHEMA))
    p.clock.advance(1000)
    with pytest.raises(BatchFailedError) as failure:
        p.ssc.await_termination(60)
    text = str(failure.value)
    assert "key 'bad'" in text and "Traceback (most recent call last)" in text and message in text
    assert "in fn" in text  # the user's own frame
    assert isinstance(failure.value.cause, StateFunctionError)
    assert "Py4J" not in text and "at org.apache.spark" not in text


def test_a_failing_function_commits_nothing_and_a_restart_with_fixed_code_resumes(spark, tmp_path):
    def broken(key, rows, state):
        count = state.get() if state.exists else Count(0, 0)
        n = sum(1 for _ in rows)
        if count.count and key == "b":
            raise ValueError("bug for b")
        state.update(Count(count.count + n, 0))
        yield {"key": key, "count": count.count + n}

    p = Pipeline(spark, tmp_path, broken).start()
    p.batch([("a", 1, None), ("b", 1, None)])
    p.queue.push(spark.createDataFrame([("a", 1, at(1)), ("b", 1, at(1))], SCHEMA))
    p.clock.advance(1000)
    with pytest.raises(BatchFailedError, match="bug for b"):
        p.ssc.await_termination(60)
    failed_batch = p.batch_time + 1000
    assert state_versions(str(tmp_path), "op") == [p.batch_time]  # a's delta of the failed batch is not a version

    # The restarted driver re-runs the failed batch (its input is gone with the queue, as a
    # non-replayable source's is), starting from the last committed state.
    fixed = Pipeline(spark, tmp_path, running_count, start_ms=failed_batch).start()
    try:
        fixed.batch_time = failed_batch
        fixed.recorder.wait_for_batch(failed_batch)
        assert fixed.batch([("a", 1, None), ("b", 1, None)]) == [{"key": "a", "count": 2}, {"key": "b", "count": 2}]
    finally:
        fixed.stop()


def test_state_is_resumed_by_a_restarted_driver(spark, tmp_path):
    p = Pipeline(spark, tmp_path, running_count).start()
    p.batch([("a", 1, None)])
    p.batch([("a", 1, None), ("b", 1, None)])
    p.stop()
    q = Pipeline(spark, tmp_path, running_count, start_ms=p.batch_time + 500).start()
    try:
        q.batch_time = p.batch_time
        assert q.batch([("a", 1, None)]) == [{"key": "a", "count": 3}]
    finally:
        q.stop()


@dataclass
class CountV2:
    count: int
    total: int
    label: str = "new"


@dataclass
class CountV3:
    label: str
    count: int


@dataclass
class CountBadType:
    count: str
    total: int


def test_state_schema_evolves_by_adding_a_field_with_a_default_and_dropping_one(spark, tmp_path):
    p = Pipeline(spark, tmp_path, running_count).start()
    p.batch([("a", 1, None), ("a", 2, None)])
    p.stop()

    def v2(key, rows, state):
        old = state.get()
        assert isinstance(old, CountV2) and old.label == "new"
        state.update(CountV2(old.count + sum(1 for _ in rows), old.total, f"v2-{key}"))
        yield {"key": key, "count": old.count}

    q = Pipeline(spark, tmp_path, v2, state_schema=CountV2, start_ms=p.batch_time + 500).start()
    q.batch_time = p.batch_time
    assert q.batch([("a", 1, None)]) == [{"key": "a", "count": 2}]
    q.stop()

    def v3(key, rows, state):
        old = state.get()
        state.update(CountV3(old.label, old.count + 1))
        yield {"key": key, "count": old.count}

    r = Pipeline(spark, tmp_path, v3, state_schema=CountV3, start_ms=q.batch_time + 500).start()
    r.batch_time = q.batch_time
    assert r.batch([("a", 1, None)]) == [{"key": "a", "count": 3}]
    r.stop()
    rows = read_state(spark, str(tmp_path), "op").collect()
    assert [(row["key"], row["label"], row["count"]) for row in rows] == [("a", "v2-a", 4)]
    assert "total" not in rows[0].asDict()

    with pytest.raises(StateSchemaError, match="'count' changed type from bigint to string"):
        Pipeline(spark, tmp_path, running_count, state_schema=CountBadType, start_ms=r.batch_time + 500).start()


def test_the_state_reader_shows_a_field_added_with_a_default_as_the_function_sees_it(spark, tmp_path):
    p = Pipeline(spark, tmp_path, running_count).start()
    p.batch([("a", 1, None), ("b", 5, None)])
    p.stop()

    def v2(key, rows, state):
        old = state.get()
        state.update(CountV2(old.count + sum(1 for _ in rows), old.total, f"{old.label}-{key}"))
        yield {"key": key, "count": old.count}

    q = Pipeline(spark, tmp_path, v2, state_schema=CountV2, start_ms=p.batch_time + 500).start()
    q.batch_time = p.batch_time
    assert q.batch([("a", 1, None)]) == [{"key": "a", "count": 1}]
    q.stop()
    # b's stored version predates label: it reads as the default, as v2 sees it ("new-a" for a).
    rows = read_state(spark, str(tmp_path), "op").collect()
    assert sorted((row["key"], row["label"], row["count"]) for row in rows) == [("a", "new-a", 2), ("b", "new", 1)]
    # The default is kept as plain JSON beside the state, for readers without the dataclass.
    assert StateFiles(CheckpointStorage(str(tmp_path)), "op").read_metadata().state_defaults == {"label": "new"}


def test_a_new_field_without_a_default_is_refused_naming_it(spark, tmp_path):
    p = Pipeline(spark, tmp_path, running_count).start()
    p.batch([("a", 1, None)])
    p.stop()

    @dataclass
    class Stricter:
        count: int
        total: int
        owner: str

    with pytest.raises(StateSchemaError, match="'owner' is new and has no default"):
        Pipeline(spark, tmp_path, running_count, state_schema=Stricter, start_ms=p.batch_time + 500).start()
    # The refused start is recorded at the location: status names it instead of "stopped".
    status = read_status(CheckpointStorage(str(tmp_path), warn=False), SystemClock())
    assert status.state == "failed" and status.lease is not None and status.lease.released
    assert "  last stop: failed (start refused: operator 'op'" in status.describe()
    assert "'owner' is new and has no default" in status.describe()


def test_the_state_reader_reads_any_retained_version(spark, tmp_path):
    p = Pipeline(spark, tmp_path, running_count, num_partitions=2).start()
    first = p.batch_time + 1000
    p.batch([("a", 1, None)])
    p.batch([("a", 10, None), ("b", 2, None)])
    p.stop()
    versions = state_versions(str(tmp_path), "op")
    assert versions == [first, first + 1000]
    old = read_state(spark, str(tmp_path), "op", version=first).collect()
    assert [(r["key"], r["count"], r["total"], r["timeout_timestamp_ms"]) for r in old] == [("a", 1, 1, None)]
    latest = sorted((r["key"], r["total"]) for r in read_state(spark, str(tmp_path), "op").collect())
    assert latest == [("a", 11), ("b", 2)]


def test_initial_state_is_where_the_operator_starts(spark, tmp_path):
    calls = StructType([StructField("key", StringType()), StructField("count", LongType()),
                        StructField("total", LongType())])
    initial = spark.createDataFrame([("a", 10, 100), ("z", 5, 50)], calls)

    def fn(key, rows, state):
        old = state.get() if state.exists else Count(0, 0)
        n = sum(1 for _ in rows)
        state.update(Count(old.count + n, old.total))
        yield {"key": key, "count": old.count + n}

    p = Pipeline(spark, tmp_path, fn, initial_state=initial).start()
    try:
        # First batch: a has data, z is called once without data (as carried-over state).
        assert p.batch([("a", 1, None), ("b", 1, None)]) == [
            {"key": "a", "count": 11}, {"key": "b", "count": 1}, {"key": "z", "count": 5}]
        assert p.batch([("b", 1, None)]) == [{"key": "b", "count": 2}]  # z is not called again
    finally:
        p.stop()
    # A restart keeps the stored state and does not apply the initial state again.
    q = Pipeline(spark, tmp_path, fn, initial_state=initial, start_ms=p.batch_time + 500).start()
    try:
        q.batch_time = p.batch_time
        assert q.batch([("a", 1, None)]) == [{"key": "a", "count": 12}]
    finally:
        q.stop()


def test_the_partition_count_is_locked_and_rescale_keeps_every_key(spark, tmp_path):
    p = Pipeline(spark, tmp_path, running_count, num_partitions=4).start()
    keys = [(f"k{i}", i, None) for i in range(40)]
    p.batch(keys)
    p.batch(keys[:10])
    p.stop()
    before = sorted(tuple(r) for r in read_state(spark, str(tmp_path), "op").collect())

    with pytest.raises(ConfigurationError, match="batchline state rescale"):
        Pipeline(spark, tmp_path, running_count, num_partitions=3, start_ms=p.batch_time + 500).start()

    from batchline.state import rescale_state

    result = rescale_state(spark, str(tmp_path), "op", 3)
    assert (result.old_partitions, result.new_partitions, result.keys) == (4, 3, 40)
    assert sorted(tuple(r) for r in read_state(spark, str(tmp_path), "op").collect()) == before
    files = StateFiles(CheckpointStorage(str(tmp_path)), "op")
    assert files.read_metadata().num_partitions == 3

    q = Pipeline(spark, tmp_path, running_count, num_partitions=3, start_ms=p.batch_time + 500).start()
    try:
        q.batch_time = p.batch_time
        assert q.batch([("k0", 1, None), ("k39", 1, None)]) == [{"key": "k0", "count": 3}, {"key": "k39", "count": 2}]
    finally:
        q.stop()


def test_an_operator_missing_from_the_new_code_is_refused(spark, tmp_path):
    p = Pipeline(spark, tmp_path, running_count).start()
    p.batch([("a", 1, None)])
    p.stop()
    ssc = StreamingContext(spark, "1s", clock=ManualClock(p.batch_time + 500), checkpoint=str(tmp_path))
    ssc.queue_stream([], schema=SCHEMA).group_by_key("key").flat_map_groups_with_state(
        running_count, state_schema=Count, output_schema="key string, count long", name="renamed"
    ).foreach_batch(lambda df, t: None)
    with pytest.raises(ConfigurationError, match=r"operator\(s\) \['op'\], which this pipeline does not have"):
        ssc.start()


def test_stateful_operators_need_a_checkpoint(spark):
    ssc = StreamingContext(spark, "1s", clock=ManualClock(START))
    ssc.queue_stream([], schema=SCHEMA).group_by_key("key").flat_map_groups_with_state(
        running_count, state_schema=Count, output_schema="key string, count long"
    ).foreach_batch(lambda df, t: None)
    with pytest.raises(ConfigurationError, match="checkpoint="):
        ssc.start()


def test_outputs_of_the_wrong_shape_name_the_key(spark, tmp_path):
    def fn(key, rows, state):
        yield {"key": key, "count": "many"}

    p = Pipeline(spark, tmp_path, fn).start()
    p.queue.push(spark.createDataFrame([("x", 1, at(1))], SCHEMA))
    p.clock.advance(1000)
    with pytest.raises(BatchFailedError, match="for key 'x'.*does not fit the output schema"):
        p.ssc.await_termination(60)


def test_a_recomputed_batch_gives_the_same_version_and_output(spark, tmp_path):
    """The operator's cached output is dropped and recomputed (as after a lost executor): the
    batch's state function runs again on the state before the batch, not on its own result."""
    recomputed = []

    def output(df, batch_time):
        first = sorted(tuple(r) for r in df.collect())
        df.unpersist()  # what a lost cached block looks like
        recomputed.append((first, sorted(tuple(r) for r in df.collect())))

    p = Pipeline(spark, tmp_path, running_count)
    p.output.foreach_batch(output, name="recompute")
    p.start()
    try:
        p.batch([("a", 1, None)])
        p.batch([("a", 1, None)])
    finally:
        p.stop()
    assert recomputed == [([("a", 1)], [("a", 1)]), ([("a", 2)], [("a", 2)])]
    rows = read_state(spark, str(tmp_path), "op").collect()
    assert [(r["key"], r["count"]) for r in rows] == [("a", 2)]


def test_the_cli_reads_lists_and_rescales_state(spark, tmp_path, capsys):
    from batchline.cli.main import main

    p = Pipeline(spark, tmp_path, running_count, num_partitions=2).start()
    p.batch([("a", 1, None), ("b", 2, None)])
    p.stop()
    assert main(["state", "list", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert "op" in listed and "2 partitions" in listed and str(p.batch_time) in listed
    assert main(["state", "read", str(tmp_path), "--operator", "op", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted((r["key"], r["total"]) for r in rows) == [("a", 1), ("b", 2)]
    assert main(["state", "rescale", str(tmp_path), "--operator", "op", "--partitions", "5"]) == 0
    assert "2 -> 5 partitions, 2 keys" in capsys.readouterr().out


def test_snapshots_are_written_in_the_background_and_old_versions_purged(spark, tmp_path, monkeypatch):
    from batchline.state import operator

    monkeypatch.setattr(operator, "RETAINED_VERSIONS", 3)
    monkeypatch.setattr(operator, "PURGE_EVERY", 1)
    p = Pipeline(spark, tmp_path, running_count, num_partitions=1).start()
    try:
        for i in range(14):
            p.batch([("a", i, None)])
    finally:
        p.stop()
    files = StateFiles(CheckpointStorage(str(tmp_path)), "op")
    versions = files.list_versions(0, 0)
    snapshots = [v for v, kinds in versions.items() if "snapshot" in kinds]
    assert snapshots, "a worker snapshots after ten deltas"
    assert min(versions) == snapshots[0] and len(versions) < 14  # nothing older than the snapshot is kept
    rows = read_state(spark, str(tmp_path), "op").collect()  # loads from the snapshot plus deltas
    assert [(r["key"], r["count"], r["total"]) for r in rows] == [("a", 14, sum(range(14)))]


def test_keys_and_state_that_differ_only_in_nullability_are_the_same_schema(spark, tmp_path):
    """spark.range gives non-null columns, other sources nullable ones: neither is a change."""
    initial = spark.range(3).selectExpr("cast(id as string) as key", "1L as count", "0L as total")
    p = Pipeline(spark, tmp_path, running_count, initial_state=initial).start()
    try:
        assert p.batch([("1", 1, None)]) == [{"key": "0", "count": 1}, {"key": "1", "count": 2},
                                             {"key": "2", "count": 1}]
    finally:
        p.stop()


def test_a_timeout_fires_in_real_time_without_more_input(spark, tmp_path):
    """End to end on the system clock: one event, then nothing; the session closes on its own."""
    ssc = StreamingContext(spark, "500ms", checkpoint=str(tmp_path))
    queue = ssc.queue_stream([spark.createDataFrame([("solo", 1, at(1))], SCHEMA)], schema=SCHEMA)

    def fn(key, rows, state):
        if state.has_timed_out:
            state.remove()
            yield {"key": key, "count": -1}
            return
        state.update(Count(sum(1 for _ in rows), 0))
        state.set_timeout_duration("1 second")

    sink = CollectSink()
    queue.group_by_key("key").flat_map_groups_with_state(
        fn, state_schema=Count, output_schema="key string, count long", timeout=GroupStateTimeout.PROCESSING_TIME
    ).foreach_batch(sink)
    ssc.start()
    try:
        sink.wait_for_rows(lambda rows: rows == [{"key": "solo", "count": -1}], timeout=60)
        timed_out_in = [t for t, rows in sink.batches.items() if rows]
        first = min(sink.batches)
        # Deadline: first batch + 1 s; it fires in the batch at its deadline.
        assert timed_out_in == [first + 1000]
    finally:
        ssc.stop(graceful=False)
