"""The state store interface (SPEC D4) against every implementation, and the per-key path
``run_partition`` driven without Spark over each of them."""

import dataclasses
import datetime as dt
import itertools
import pickle

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from batchline.errors import BatchlineError, ConfigurationError
from batchline.state import GroupStateTimeout, StateFunctionError, StateVersionError
from batchline.state.contract import (
    BATCH_PARAMS_PROPERTY,
    MARKER_COLUMN,
    BatchParams,
    ErrorKind,
    OperatorSpec,
    Stats,
    batch_params_from_property,
    with_batch_params,
)
from batchline.state.execution import PartitionCache, load_partition, run_partition
from batchline.state.schema import RowSchema
from batchline.state.stateful import StatefulNode
from batchline.state.store import (
    DELTA,
    SNAPSHOT,
    FileHeader,
    FileStateStore,
    MemoryStateStore,
    StateMetadata,
    StateStore,
    StateStoreError,
    entries_table,
)
from batchline.streams.base import StreamNode, Watermark
from batchline.streams.nodes import WatermarkNode
from tests.helpers import Count, running_count


class _Root(StreamNode):
    def create_runtime(self, env, parents):
        raise NotImplementedError

KEYS = StructType([StructField("key", StringType())])
INPUT = pa.schema([pa.field("key", pa.string()), pa.field("value", pa.int64()),
                   pa.field("ts", pa.timestamp("us", tz="UTC"))])
_names = itertools.count()


STATE = RowSchema.of(Count)


@pytest.fixture(params=["memory", "file-local", "file-s3"])
def store(request, tmp_path) -> StateStore:
    if request.param == "memory":
        return MemoryStateStore("op")
    if request.param == "file-local":
        return FileStateStore.open(str(tmp_path), "op")
    options = request.getfixturevalue("s3_endpoint")
    return FileStateStore.open(f"s3://batchline-test/store-{next(_names)}", "op", options)


def table(*entries):
    """A delta/snapshot table from (key, (count, total) or None, timeout)."""
    return entries_table(KEYS, STATE, iter(entries), True)


def write(store, version, kind, *entries, partition=0, initial=False):
    store.write_version(0, FileHeader(version, partition, kind, initial=initial), table(*entries))


def load(store, version, **kwargs):
    data = load_partition(store, STATE, True, 0, 0, version, **kwargs)
    return {k: (Count(*v), t) for k, (v, t) in data.entries.items()}


# -------------------------------------------------------------------- the interface
def test_metadata_round_trips(store):
    assert store.read_metadata() is None
    metadata = StateMetadata("op", 3, 0, KEYS, STATE.struct, "NO_TIMEOUT")
    store.write_metadata(metadata)
    assert store.read_metadata() == metadata
    store.write_metadata(StateMetadata("op", 5, 1, KEYS, STATE.struct, "PROCESSING_TIME"))
    assert store.read_metadata().num_partitions == 5


def test_versions_are_written_listed_and_read_with_their_headers(store):
    write(store, 1000, DELTA, ("a", (1, 1), None))
    write(store, 2000, DELTA, ("a", (2, 3), 5000), ("b", (1, 2), None))
    write(store, 2000, SNAPSHOT, ("a", (2, 3), 5000), ("b", (1, 2), None), initial=True)
    write(store, 1000, DELTA, ("z", (9, 9), None), partition=1)
    assert store.list_versions(0, 0) == {1000: {DELTA}, 2000: {DELTA, SNAPSHOT}}
    assert store.list_versions(0, 1) == {1000: {DELTA}}
    assert store.list_versions(1, 0) == {}

    found = store.read_version(0, 0, 2000, SNAPSHOT)
    assert found.header == FileHeader(2000, 0, SNAPSHOT, initial=True)
    assert found.table.num_rows == 2
    assert store.read_version(0, 0, 2000, DELTA).header.initial is False
    assert store.read_version(0, 1, 1000, DELTA).header.partition == 1

    write(store, 1000, DELTA, ("a", (5, 5), None))  # a retried task rewrites its version
    assert load(store, 1000) == {"a": (Count(5, 5), None)}

    store.delete_version(0, 0, 2000, SNAPSHOT)
    store.delete_version(0, 0, 2000, SNAPSHOT)  # already gone: nothing happens
    assert store.list_versions(0, 0) == {1000: {DELTA}, 2000: {DELTA}}
    store.delete_generation(0)
    assert store.list_versions(0, 0) == {} and store.list_versions(0, 1) == {}


def test_a_header_must_say_what_it_is():
    with pytest.raises(StateStoreError, match="one of \\('delta', 'snapshot', 'output'\\), not 'full'"):
        FileHeader(1, 0, "full")
    with pytest.raises(StateStoreError, match="epoch ms"):
        FileHeader(-1, 0, DELTA)
    assert FileHeader.from_metadata({b"batchline": b'{"version": 7, "partition": 2, "initial": true}'}, SNAPSHOT,
                                    "old file") == FileHeader(7, 2, SNAPSHOT, initial=True)  # before typed headers
    with pytest.raises(StateStoreError, match="no batchline header"):
        FileHeader.from_metadata({}, DELTA, "foreign.arrow")


def test_a_file_in_the_wrong_place_is_refused(tmp_path):
    store = FileStateStore.open(str(tmp_path), "op")
    write(store, 1000, DELTA, ("a", (1, 1), None))
    moved = tmp_path / "state/op/g0/p00000/000000000002000.delta.arrow"
    (tmp_path / "state/op/g0/p00000/000000000001000.delta.arrow").rename(moved)
    with pytest.raises(StateStoreError, match="holds delta version 1000 of partition 0, not delta version 2000"):
        store.read_version(0, 0, 2000, DELTA)


def test_plan_load_reads_the_newest_snapshot_and_the_deltas_after_it(store):
    for version in range(1, 6):
        write(store, version, DELTA, ("a", (version, version), None))
    write(store, 3, SNAPSHOT, ("a", (3, 3), None))
    write(store, 7, DELTA, ("b", (1, 1), None))  # a batch that failed: above the committed version
    assert store.plan_load(0, 0, 5) == (5, [(3, SNAPSHOT), (4, DELTA), (5, DELTA)])
    assert store.plan_load(0, 0, 2) == (2, [(1, DELTA), (2, DELTA)])
    assert store.plan_load(0, 0, None, below=7) == (5, [(3, SNAPSHOT), (4, DELTA), (5, DELTA)])
    assert store.plan_load(0, 0, None, below=1) == (None, [])
    assert load(store, 5) == {"a": (Count(5, 5), None)}


def test_plan_load_catches_a_held_version_up_with_deltas_only(store):
    write(store, 1, DELTA, ("a", (1, 1), None))
    write(store, 2, DELTA, ("b", (1, 1), 9000))
    write(store, 2, SNAPSHOT, ("a", (1, 1), None), ("b", (1, 1), 9000))
    write(store, 3, DELTA, ("a", None, None))
    assert store.plan_load(0, 0, 3, since=1) == (3, [(2, DELTA), (3, DELTA)])
    assert store.plan_load(0, 0, 3, since=3) == (3, [])

    held = load_partition(store, STATE, True, 0, 0, 1)
    caught_up = load_partition(store, STATE, True, 0, 0, 3, held=held)
    assert caught_up is held and caught_up.version == 3
    assert dict(caught_up.entries.items()) == {"b": ((1, 1), 9000)}


def test_a_version_that_is_not_there_says_what_is(store):
    write(store, 10, DELTA, ("a", (1, 1), None))
    write(store, 20, DELTA, ("a", (2, 2), None))
    with pytest.raises(StateVersionError, match=r"no version 15 .* retained versions: 10 \.\. 20 \(2 versions\)"):
        store.plan_load(0, 0, 15)
    store.purge(0, 0, retain=1)  # no snapshot yet: nothing can go
    assert sorted(store.list_versions(0, 0)) == [10, 20]
    empty = MemoryStateStore("other")
    with pytest.raises(StateVersionError, match=r"no version 1 .* retained versions: none"):
        empty.plan_load(0, 0, 1)
    with pytest.raises(StateVersionError, match="list_versions"):
        empty.read_version(0, 0, 1, DELTA)


def test_purge_keeps_what_the_retained_versions_need(store):
    for version in range(1, 16):
        write(store, version, DELTA, ("a", (version, sum(range(1, version + 1))), None))
    write(store, 4, SNAPSHOT, ("a", (4, 10), None))
    write(store, 9, SNAPSHOT, ("a", (9, 45), None))
    write(store, 13, SNAPSHOT, ("a", (13, 91), None))
    assert store.purge(0, 0, retain=20) == 0  # fewer versions than retained
    removed = store.purge(0, 0, retain=5)  # keeps 11..15, which need the snapshot at 9
    versions = store.list_versions(0, 0)
    assert min(versions) == 9 and SNAPSHOT in versions[9]
    assert removed == 8 + 1  # deltas 1..8 and the snapshot at 4
    for version in range(11, 16):
        assert load(store, version) == {"a": (Count(version, sum(range(1, version + 1))), None)}
    assert store.purge(0, 0, retain=5) == 0


# -------------------------------------------------------------------- travelling to tasks
def test_the_memory_store_refuses_to_travel(tmp_path):
    store = MemoryStateStore("op")
    for dump in (pickle.dumps, cloudpickle.dumps):
        with pytest.raises(StateStoreError, match="cannot be pickled or shipped to Spark workers"):
            dump(store)
    spec = OperatorSpec(store, 0, ("key",), KEYS, STATE, RowSchema.of("key string"), running_count, True,
                        GroupStateTimeout.NO_TIMEOUT)
    with pytest.raises(StateStoreError, match="use FileStateStore"):
        cloudpickle.dumps(spec)


def test_the_file_store_travels_by_location(tmp_path):
    store = FileStateStore.open(str(tmp_path), "op")
    write(store, 1, DELTA, ("a", (1, 1), None))
    spec = OperatorSpec(store, 0, ("key",), KEYS, STATE, RowSchema.of("key string"), running_count, True,
                        GroupStateTimeout.NO_TIMEOUT)
    shipped = pickle.loads(cloudpickle.dumps(spec))
    assert shipped.store is not store and shipped.store.location == store.location == str(tmp_path)
    assert load(shipped.store, 1) == {"a": (Count(1, 1), None)}


# -------------------------------------------------------------------- the contract
def test_batch_params_cross_as_json_and_each_operator_reads_its_own():
    params = BatchParams(batch_time=3000, prev_version=2000, token=7, watermark_ms=None)
    assert BatchParams.from_json(params.to_json()) == params
    value = with_batch_params(None, "a", params)
    value = with_batch_params(value, "b", BatchParams(3000, None, 7, 1500))
    assert batch_params_from_property(value, "a") == params
    assert batch_params_from_property(value, "b").watermark_ms == 1500
    with pytest.raises(ConfigurationError, match="no batch parameters for stateful operator 'c'"):
        batch_params_from_property(value, "c")
    with pytest.raises(ConfigurationError, match="lack an integer 'token'"):
        BatchParams.from_json({"batch_time": 1, "prev_version": None, "watermark_ms": None})
    assert BATCH_PARAMS_PROPERTY.startswith("batchline.")


def test_stats_merge_by_field():
    a = Stats(rows=2, late_rows=1, keys_called=2, state_keys=5, max_event_time_ms=None, partitions=0b01)
    b = Stats(rows=3, updated=1, removed=1, timed_out=1, output_rows=4, state_keys=6, max_event_time_ms=900,
              partitions=0b10)
    merged = a.merge(b)
    assert merged == Stats(rows=5, late_rows=1, keys_called=2, updated=1, removed=1, timed_out=1, output_rows=4,
                           state_keys=11, max_event_time_ms=900, partitions=0b11)
    assert merged.merge(Stats(max_event_time_ms=500)).max_event_time_ms == 900
    assert Stats().merge(Stats()) == Stats()


def test_a_state_function_error_survives_the_text_of_a_spark_error():
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom'
    key = "'ключ <<batchline-error {\"a\": 1} end-batchline-error>>'"
    failure = StateFunctionError(ErrorKind.RAISED, "op", key, 5000, "the state function raised for key 'ключ'",
                                 trace)
    spark_text = (f"An error occurred while calling o81.count.\norg.apache.spark.SparkException: Job aborted\n"
                  f"Traceback (most recent call last):\n  ...\nbatchline.state.contract.StateFunctionError: "
                  f"{failure}\n\tat org.apache.spark.api.python.BasePythonRunner")
    error = StateFunctionError.carried_in(RuntimeError(spark_text))
    assert isinstance(error, StateFunctionError) and isinstance(error, BatchlineError) and not error.carry
    assert (error.kind, error.operator, error.key_repr, error.batch_time) == (ErrorKind.RAISED, "op", key, 5000)
    assert error.python_traceback == trace
    assert str(error) == "the state function raised for key 'ключ'\n" + trace
    assert pickle.loads(pickle.dumps(error)).key_repr == key
    assert StateFunctionError.carried_in(RuntimeError("Py4JJavaError: something else")) is None
    assert str(StateFunctionError.carried_in(failure)) == str(error)  # raised in this process: the same, clean
    assert "org.apache.spark" not in str(error) and "<<batchline-error " not in str(error)


# -------------------------------------------------------------------- the per-key path without Spark

def sessions(key, rows, state):
    """Counts a key's rows; ``stop`` removes it; times out two seconds after its last data."""
    if state.has_timed_out:
        yield {"key": key, "count": -state.get().count}
        state.remove()
        return
    values = [row.value for row in rows]
    if values == [0]:
        state.remove()
        yield {"key": key, "count": 0}
        return
    count = (state.get_option() or Count(0, 0)).count + len(values)
    state.update(Count(count, sum(values)))
    state.set_timeout_duration("2 seconds")
    yield {"key": key, "count": count}


def arrow_batch(rows):
    return pa.RecordBatch.from_pylist([{"key": k, "value": v, "ts": None} for k, v in rows], schema=INPUT)


class Worker:
    """Runs batches of one operator's partitions like a Python worker, with its own cache."""

    def __init__(self, spec):
        self.spec = spec
        self.cache = PartitionCache()

    def run(self, params, rows, partition=0):
        reported = []
        batches = [arrow_batch(rows)] if rows else []
        out = list(run_partition(self.spec, params, batches, partition, reported.append, cache=self.cache,
                                 background_snapshots=False))
        output = sorted(r for b in out for r in zip(*(c.to_pylist() for c in b.columns), strict=True))
        return output, reported[0]


def spec_for(store, fn, timeout=GroupStateTimeout.PROCESSING_TIME):
    return OperatorSpec(store=store, generation=0, key_names=("key",), key_schema=KEYS, state=STATE,
                        output=RowSchema.of("key string, count long"), fn=fn, flat=True, timeout=timeout)


def test_run_partition_carries_state_over_times_out_and_removes_keys(store):
    worker = Worker(spec_for(store, sessions))
    out, stats = worker.run(BatchParams(1000, None, 1, None), [("a", 1), ("b", 2), ("c", 3)])
    assert out == [("a", 1), ("b", 1), ("c", 1)]
    assert (stats.rows, stats.keys_called, stats.updated, stats.state_keys, stats.partitions) == (3, 3, 3, 3, 1)

    out, stats = worker.run(BatchParams(2000, 1000, 1, None), [("a", 5), ("b", 0)])  # b removed, a moves on
    assert out == [("a", 2), ("b", 0)]
    assert (stats.removed, stats.state_keys) == (1, 2)

    # 3000 ms: no data; a processing-time timer fires at its deadline: c's (3000), not a's (4000).
    out, stats = worker.run(BatchParams(3000, 2000, 1, None), [])
    assert out == [("c", -1)] and (stats.timed_out, stats.state_keys) == (1, 1)
    out, stats = worker.run(BatchParams(3999, 3000, 1, None), [])  # 1 ms before a's deadline
    assert out == [] and stats.timed_out == 0
    assert load(store, 3999) == {"a": (Count(2, 5), 4000)}


def marked(rows, *partitions, at=0):
    """``rows`` as the shuffle hands them to a task: with the marker rows of ``partitions`` at ``at``."""
    records = [{"key": k, "value": v, "ts": ts, MARKER_COLUMN: None} for k, v, ts in
               (row if len(row) == 3 else (*row, None) for row in rows)]
    records[at:at] = [{"key": None, "value": None, "ts": None, MARKER_COLUMN: p} for p in partitions]
    return pa.RecordBatch.from_pylist(records, schema=INPUT.append(pa.field(MARKER_COLUMN, pa.int32())))


def run_marked(spec, params, batches, cache, partition=None):
    reported = []
    out = list(run_partition(spec, params, batches, partition, reported.append, cache=cache,
                             background_snapshots=False))
    return sorted(r for b in out for r in zip(*(c.to_pylist() for c in b.columns), strict=True)), reported[0]


def test_a_task_runs_the_partition_its_marker_names_whatever_its_task_number():
    """An output that coalesces the operator's frame runs several partitions in one task, under
    one task number: each runs as the partition its marker row names."""
    store, cache = MemoryStateStore("op"), PartitionCache()
    spec = spec_for(store, sessions)
    params = BatchParams(1000, None, 1, None)
    out, stats = run_marked(spec, params, [marked([("a", 1), ("b", 2)], 2, at=1)], cache, partition=0)
    assert out == [("a", 1), ("b", 1)] and (stats.rows, stats.partitions) == (2, 1 << 2)
    out, stats = run_marked(spec, params, [marked([], 0)], cache, partition=0)  # partition 0, no rows
    assert out == [] and (stats.rows, stats.partitions) == (0, 1 << 0)
    out, stats = run_marked(spec, params, [marked([("c", 1)], 1, at=1)], cache, partition=0)
    assert out == [("c", 1)] and stats.partitions == 1 << 1
    assert [set(store.list_versions(0, p)) for p in range(3)] == [{1000}, {1000}, {1000}]
    assert {k for k, _ in load_partition(store, STATE, True, 0, 2, 1000).entries.items()} == {"a", "b"}
    assert {k for k, _ in load_partition(store, STATE, True, 0, 0, 1000).entries.items()} == set()


def test_a_task_without_its_marker_or_with_two_is_refused():
    store, cache = MemoryStateStore("op"), PartitionCache()
    spec, params = spec_for(store, sessions), BatchParams(1000, None, 1, None)
    with pytest.raises(ConfigurationError, match="no marker row"):
        run_marked(spec, params, [arrow_batch([("a", 1)])], cache)
    with pytest.raises(ConfigurationError, match=r"marker rows of state partitions \[1, 2\]"):
        run_marked(spec, params, [marked([("a", 1)], 1), marked([], 2)], cache)
    assert store.list_versions(0, 1) == {} and store.list_versions(0, 2) == {}


def test_a_marker_row_is_no_row_for_an_idle_partition_nor_for_the_watermark():
    store, cache = MemoryStateStore("op"), PartitionCache()
    idle = BatchParams(1000, None, 1, None, idle_partitions=(1,))
    assert run_marked(spec_for(store, sessions), idle, [marked([], 1)], cache) == ([], Stats(partitions=1 << 1))
    spec = dataclasses.replace(spec_for(store, running_count, GroupStateTimeout.EVENT_TIME), event_time_column="ts",
                               late_column="ts")
    late, on_time = dt.datetime(1970, 1, 1, 0, 0, 5, tzinfo=dt.UTC), dt.datetime(1970, 1, 1, 0, 1, tzinfo=dt.UTC)
    out, stats = run_marked(spec, BatchParams(2000, None, 1, 10_000), [marked([("a", 1, late), ("b", 1, on_time)], 0,
                                                                              at=1)], cache)
    assert out == [("b", 1)] and (stats.rows, stats.late_rows, stats.max_event_time_ms) == (2, 1, 60_000)


def test_another_worker_catches_up_from_the_store_and_a_new_driver_reloads(store):
    spec = spec_for(store, running_count, GroupStateTimeout.NO_TIMEOUT)
    first, second = Worker(spec), Worker(spec)
    first.run(BatchParams(1000, None, 1, None), [("a", 1)])
    second.run(BatchParams(2000, 1000, 1, None), [("a", 2), ("b", 1)])  # never held the partition
    out, _ = first.run(BatchParams(3000, 2000, 1, None), [("a", 3)])  # held 1000: catches up with the delta at 2000
    assert out == [("a", 3)]
    # A failed batch's delta (4000) is above the committed version: a new driver (another
    # token) builds on 3000, and the re-run rewrites 4000.
    first.run(BatchParams(4000, 3000, 1, None), [("a", 100)])
    out, _ = first.run(BatchParams(4000, None, 2, None), [("b", 1)])
    assert out == [("b", 2)]
    assert load(store, 4000) == {"a": (Count(3, 6), None), "b": (Count(2, 2), None)}


class _Listings:
    """Counts a store's listings of a partition's files (a request each on an object store)."""

    def __init__(self, store, monkeypatch):
        self.count = 0
        listed = store.list_versions

        def counted(generation, partition):
            self.count += 1
            return listed(generation, partition)
        monkeypatch.setattr(store, "list_versions", counted)


def test_a_worker_behind_catches_up_by_the_versions_the_driver_names_without_listing(store, monkeypatch):
    spec = spec_for(store, running_count, GroupStateTimeout.NO_TIMEOUT)
    first, second = Worker(spec), Worker(spec)
    first.run(BatchParams(1000, None, 1, None), [("a", 1)])
    listings = _Listings(store, monkeypatch)
    second.run(BatchParams(2000, 1000, 1, None, recent_versions=(1000,)), [("a", 2)])  # held nothing: lists
    assert listings.count == 1
    second.run(BatchParams(3000, 2000, 1, None, recent_versions=(1000, 2000)), [("a", 3)])  # held 2000
    assert listings.count == 1
    out, _ = first.run(BatchParams(4000, 3000, 1, None, recent_versions=(1000, 2000, 3000)), [("a", 4)])
    assert out == [("a", 4)] and listings.count == 1  # held 1000: read the deltas at 2000 and 3000 by name
    # Versions the driver does not name reaching back to the held one (it started since): listed.
    out, _ = second.run(BatchParams(5000, 4000, 1, None, recent_versions=(4000,)), [("a", 5)])
    assert out == [("a", 5)] and listings.count == 2
    assert load(store, 5000) == {"a": (Count(5, 15), None)}


def test_a_named_version_a_partition_sat_out_sends_its_catch_up_to_the_listing(store, monkeypatch):
    spec = spec_for(store, running_count, GroupStateTimeout.NO_TIMEOUT)
    first, second = Worker(spec), Worker(spec)
    first.run(BatchParams(1000, None, 1, None), [("a", 1)], partition=1)
    first.run(BatchParams(1000, None, 1, None), [("b", 1)], partition=0)
    # Batch 2000 ran partition 0 only; partition 1 sat it out and wrote no delta there.
    second.run(BatchParams(2000, 1000, 1, None, recent_versions=(1000,)), [("b", 2)], partition=0)
    second.run(BatchParams(3000, 2000, 1, None, recent_versions=(1000, 2000), behind={1: 1000}), [("a", 2)],
               partition=1)
    listings = _Listings(store, monkeypatch)
    # Partition 1 ran 3000, so the driver no longer counts it behind; first holds it at 1000.
    out, _ = first.run(BatchParams(4000, 3000, 1, None, recent_versions=(1000, 2000, 3000)), [("a", 3)],
                       partition=1)
    assert out == [("a", 3)] and listings.count == 1


def test_snapshots_follow_ten_deltas_and_loads_start_from_them(store):
    worker = Worker(spec_for(store, running_count, GroupStateTimeout.NO_TIMEOUT))
    prev = None
    for i in range(1, 13):
        worker.run(BatchParams(i * 1000, prev, 1, None), [("a", i)])
        prev = i * 1000
    snapshots = [v for v, kinds in store.list_versions(0, 0).items() if SNAPSHOT in kinds]
    assert snapshots == [10_000]
    assert store.plan_load(0, 0, 12_000)[1] == [(10_000, SNAPSHOT), (11_000, DELTA), (12_000, DELTA)]
    assert load(store, 12_000) == {"a": (Count(12, 78), None)}


def test_a_failing_function_leaves_nothing_and_names_the_key(store):
    def fn(key, rows, state):
        if key == "bad":
            raise ValueError("bug for bad")
        yield from running_count(key, rows, state)

    worker = Worker(spec_for(store, fn, GroupStateTimeout.NO_TIMEOUT))
    worker.run(BatchParams(1000, None, 1, None), [("good", 1)])
    with pytest.raises(StateFunctionError) as failure:
        worker.run(BatchParams(2000, 1000, 1, None), [("good", 1), ("bad", 1)])
    error = StateFunctionError.carried_in(failure.value)
    assert (error.kind, error.key_repr, error.batch_time) == (ErrorKind.RAISED, "'bad'", 2000)
    assert "ValueError: bug for bad" in error.python_traceback and "in fn" in error.python_traceback
    assert len(worker.cache) == 0  # the partition is dropped: no half-applied batch survives
    assert 2000 not in store.list_versions(0, 0)
    out, _ = worker.run(BatchParams(2000, 1000, 1, None), [("good", 1)])
    assert out == [("good", 2)]


@pytest.mark.parametrize("timeout", list(GroupStateTimeout))
def test_event_time_rows_behind_the_watermark_are_dropped_and_counted_under_event_time_timeouts(timeout):
    """As Spark's FlatMapGroupsWithStateExec: late rows are dropped only with event-time timeouts."""
    store = MemoryStateStore("op")
    node = StatefulNode(WatermarkNode(_Root(), Watermark("ts", 1000)), ("key",), running_count, flat=True,
                        state_schema=STATE, output_schema="key string, count long", timeout=timeout, name="op",
                        num_partitions=None, initial_state=None)
    spec = OperatorSpec(store, 0, ("key",), KEYS, STATE, RowSchema.of("key string, count long"), running_count,
                        True, timeout, event_time_column="ts", late_column=node.late_column)
    assert RowSchema.of(StructType([StructField("key", StringType()), StructField("value", LongType()),
                                    StructField("ts", TimestampType())])).arrow == INPUT  # what Spark sends
    times = pa.array([5_000_000, 9_000_000]).cast(INPUT.field("ts").type)  # 5 s and 9 s, in microseconds
    batch = pa.RecordBatch.from_arrays([pa.array(["a", "a"]), pa.array([1, 1]), times], schema=INPUT)
    reported = []
    out = list(run_partition(spec, BatchParams(1000, None, 1, 6_000), [batch], 0, reported.append,
                             cache=PartitionCache()))
    dropped = timeout is GroupStateTimeout.EVENT_TIME
    assert out[0].to_pylist() == [{"key": "a", "count": 1 if dropped else 2}]
    assert (reported[0].late_rows, reported[0].max_event_time_ms) == (int(dropped), 9_000)


def test_a_finished_partition_is_kept_its_output_read_back_and_a_fenced_driver_records_nothing(store, tmp_path):
    """SPEC F2 on every store: a task records its finish after its delta and output are stored;
    running the batch again (a restarted driver, a retried task) calls no function."""
    from batchline.checkpoint.events import JobEventStore
    from batchline.checkpoint.lease import FencedError, Lease
    from batchline.checkpoint.storage import CheckpointStorage
    from batchline.clock import ManualClock

    location = CheckpointStorage(str(tmp_path / "checkpoint"))
    token = Lease(location, ManualClock(0), 15_000).acquire()
    journal = JobEventStore(location, 1000)
    calls = []

    def counted(key, rows, state):
        calls.append(key)
        yield from running_count(key, rows, state)

    spec = dataclasses.replace(spec_for(store, counted, GroupStateTimeout.NO_TIMEOUT), journal=journal)
    first_out, first_stats = Worker(spec).run(BatchParams(1000, None, token, None), [("a", 1), ("b", 2)], 3)
    record = journal.finished(1000, spec.operator, 0, 3)
    assert record is not None and record.output_rows == 2 and record.token == token
    assert calls == ["a", "b"]

    again_out, again_stats = Worker(spec).run(BatchParams(1000, None, token, None), [("a", 1), ("b", 2)], 3)
    assert (again_out, again_stats) == (first_out, first_stats) and calls == ["a", "b"]  # read back, not re-run

    whole_out, _ = Worker(spec).run(BatchParams(1000, None, token, None, keep_finished=False), [("a", 1)], 3)
    assert whole_out == [("a", 1)] and calls == ["a", "b", "a"]  # an input that cannot replay: runs again

    with pytest.raises(FencedError, match="lost its lease"):
        Worker(spec).run(BatchParams(2000, 1000, token - 1, None), [("a", 1)], 3)
    assert journal.finished(2000, spec.operator, 0, 3) is None


@pytest.mark.parametrize("kind", ["memory", "file-local"])
def test_read_problem_says_where_a_version_file_is_and_why_it_cannot_be_read_back(tmp_path, kind):
    store = MemoryStateStore("op") if kind == "memory" else FileStateStore.open(str(tmp_path), "op")
    write(store, 1000, DELTA, ("a", (1, 1), None))
    assert store.read_problem(0, 0, 1000, DELTA) is None
    where, why = store.read_problem(0, 0, 2000, DELTA)
    assert where.endswith("000000000002000.delta.arrow") and why == "it is missing"
    if kind == "file-local":
        path = tmp_path / "state" / "op" / "g0" / "p00000" / "000000000001000.delta.arrow"
        assert store.file_location(0, 0, 1000, DELTA) == str(path)
        path.write_bytes(path.read_bytes()[:10])
        where, why = store.read_problem(0, 0, 1000, DELTA)
        assert where == str(path) and "cut short" in why


def test_batch_params_carry_the_partitions_left_out_of_the_shuffle():
    params = BatchParams(batch_time=3000, prev_version=2000, token=7, watermark_ms=None, left_out=(1, 3))
    assert BatchParams.from_json(params.to_json()) == params
    assert BatchParams.from_json({k: v for k, v in params.to_json().items() if k != "left_out"}).left_out == ()


def test_batch_params_carry_the_operator_s_recent_versions():
    params = BatchParams(batch_time=3000, prev_version=2000, token=7, watermark_ms=None, recent_versions=(1000, 2000))
    assert BatchParams.from_json(params.to_json()) == params
    assert BatchParams.from_json({k: v for k, v in params.to_json().items() if k != "recent_versions"}
                                 ).recent_versions == ()
    with pytest.raises(ConfigurationError, match="'recent_versions'"):
        BatchParams.from_json({**params.to_json(), "recent_versions": 3000})


def test_a_partition_whose_background_snapshots_were_lost_writes_one_before_its_task_ends(monkeypatch):
    """A process killed soon after each start (a driver restarted again and again) loses the
    snapshots written in the background; once twice SNAPSHOT_EVERY deltas pile up, the task
    writes the snapshot itself, so a restart never reads an ever longer chain of deltas."""
    import types

    import batchline.state.execution as execution
    from batchline.state.store import SNAPSHOT

    class LostWithItsProcess:
        def __init__(self, target, **kwargs):
            pass

        def start(self):
            pass

    monkeypatch.setattr(execution, "threading", types.SimpleNamespace(Thread=LostWithItsProcess,
                                                                      Lock=execution.threading.Lock))
    store = MemoryStateStore("op")
    spec = spec_for(store, sessions)
    previous = None
    for batch in range(1, 2 * execution.SNAPSHOT_EVERY + 3):
        time = batch * 1000
        reported = []
        list(run_partition(spec, BatchParams(time, previous, 1, None), [arrow_batch([("a", 1)])], 0,
                           reported.append, cache=PartitionCache()))  # a fresh process each batch
        previous = time
    snapshots = [v for v in range(1000, previous + 1, 1000) if store.has_version(0, 0, v, SNAPSHOT)]
    assert snapshots == [2 * execution.SNAPSHOT_EVERY * 1000], snapshots  # of the version it loaded
