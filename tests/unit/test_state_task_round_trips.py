"""A state task's round trips to the store that need not wait for each other go side by side:
a partition the worker holds is caught up while its finish record is looked up, and the
task's rows go on (to a sink staging its file) while its finish record is written. What must
stay in order stays: the record after the delta and output, the task's end after the record."""

from __future__ import annotations

import dataclasses
import threading

import pyarrow as pa
import pytest

from batchline.checkpoint.events import JobEventStore
from batchline.checkpoint.lease import Lease
from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import ManualClock
from batchline.state import GroupStateTimeout
from batchline.state.contract import BatchParams
from batchline.state.execution import PartitionCache, PartitionEnd, run_partition
from batchline.state.stateful import _then
from batchline.state.store import DELTA, OUTPUT, FileKind, MemoryStateStore, read_ahead
from batchline.streams.handover import ArrowHandover
from tests.helpers import running_count
from tests.unit.test_state_store import Worker, arrow_batch, spec_for

PARTITION = 3
WAIT_S = 10


class _Reads(MemoryStateStore):
    """A memory store that says which version files were read, and when a delta's read began."""

    def __init__(self) -> None:
        super().__init__("op")
        self.read: list[tuple[int, FileKind]] = []
        self.delta_read = threading.Event()

    def read_version(self, generation, partition, version, kind):
        self.read.append((version, kind))
        if kind == DELTA:
            self.delta_read.set()
        return super().read_version(generation, partition, version, kind)


class _Journal(JobEventStore):
    """A job event store whose lookups can be made to wait for something else to happen."""

    def __init__(self, storage: CheckpointStorage) -> None:
        super().__init__(storage, 1000)
        self.lookup_waits_for: threading.Event | None = None
        self.lookup_saw_it: bool | None = None
        self.record_waits_for: threading.Event | None = None
        self.record_saw_it: bool | None = None

    def finished(self, batch_time, operator, generation, partition):
        if self.lookup_waits_for is not None:
            self.lookup_saw_it = self.lookup_waits_for.wait(WAIT_S)
        return super().finished(batch_time, operator, generation, partition)

    def partition_finished(self, batch_time, record):
        if self.record_waits_for is not None:
            self.record_saw_it = self.record_waits_for.wait(WAIT_S)
        super().partition_finished(batch_time, record)


@pytest.fixture
def operator(tmp_path):
    location = CheckpointStorage(str(tmp_path / "checkpoint"))
    token = Lease(location, ManualClock(0), 15_000).acquire()
    store, journal = _Reads(), _Journal(location)
    calls: list[str] = []

    def counted(key, rows, state):
        calls.append(key)
        yield from running_count(key, rows, state)

    spec = dataclasses.replace(spec_for(store, counted, GroupStateTimeout.NO_TIMEOUT), journal=journal)
    return spec, store, journal, token, calls


def test_a_partition_the_worker_holds_catches_up_while_its_finish_record_is_looked_up(operator):
    spec, store, journal, token, calls = operator
    here, elsewhere = Worker(spec), Worker(spec)
    here.run(BatchParams(1000, None, token, None), [("a", 1)], PARTITION)
    elsewhere.run(BatchParams(2000, 1000, token, None), [("a", 1)], PARTITION)  # ``here`` is now behind

    store.delta_read.clear()
    journal.lookup_waits_for = store.delta_read  # the lookup answers only once the catch-up reads
    out, _ = here.run(BatchParams(3000, 2000, token, None, recent_versions=(1000, 2000)), [("a", 1)], PARTITION)
    assert journal.lookup_saw_it is True, "the lookup waited for a catch-up that came only after it"
    assert out == [("a", 3)] and calls == ["a", "a", "a"]
    assert (2000, DELTA) in store.read


def test_a_held_partition_that_finished_the_batch_before_is_kept_though_its_state_cannot_catch_up(operator):
    spec, store, journal, token, calls = operator
    here, elsewhere = Worker(spec), Worker(spec)
    here.run(BatchParams(1000, None, token, None), [("a", 1)], PARTITION)
    elsewhere.run(BatchParams(2000, 1000, token, None), [("a", 1)], PARTITION)
    first_out, _ = elsewhere.run(BatchParams(3000, 2000, token, None), [("a", 1)], PARTITION)
    store.delete_version(0, PARTITION, 2000, DELTA)  # what ``here`` would need to catch up with

    out, stats = here.run(BatchParams(3000, 2000, token, None), [("a", 1)], PARTITION)
    assert out == first_out == [("a", 3)] and calls == ["a", "a", "a"]  # kept: read back, not run
    assert stats.keys_called == 1  # what the run that finished it recorded


def test_a_partition_the_worker_does_not_hold_reads_no_state_when_it_finished_the_batch_before(operator):
    spec, store, journal, token, calls = operator
    Worker(spec).run(BatchParams(1000, None, token, None), [("a", 1)], PARTITION)
    Worker(spec).run(BatchParams(2000, 1000, token, None), [("a", 1)], PARTITION)
    store.read.clear()

    out, _ = Worker(spec).run(BatchParams(2000, 1000, token, None), [("a", 1)], PARTITION)  # a restart's re-run
    assert out == [("a", 2)] and calls == ["a", "a"]
    assert store.read == [(2000, OUTPUT)], "a kept partition loaded state it does not need"


def test_a_partition_held_ahead_of_the_batch_is_left_as_it_is_when_the_batch_is_kept(operator):
    spec, store, journal, token, calls = operator
    here = Worker(spec)
    here.run(BatchParams(1000, None, token, None), [("a", 1)], PARTITION)
    here.run(BatchParams(2000, 1000, token, None), [("a", 1)], PARTITION)  # held at 2000 now
    store.read.clear()

    out, _ = here.run(BatchParams(2000, 1000, token, None), [("a", 1)], PARTITION)  # a new stage attempt
    assert out == [("a", 2)] and calls == ["a", "a"]
    assert store.read == [(2000, OUTPUT)], "a kept partition loaded state it does not need"
    out, _ = here.run(BatchParams(3000, 2000, token, None), [("a", 1)], PARTITION)
    assert out == [("a", 3)] and store.read == [(2000, OUTPUT)]  # its copy at 2000 stayed, good as it was


def _run(spec, params, cache, endings, report):
    return run_partition(spec, params, [arrow_batch([("a", 1), ("b", 2)])], PARTITION, report,
                         cache=cache, background_snapshots=False, endings=endings)


def test_rows_come_out_while_the_finish_record_is_written_and_the_partition_ends_after_it(operator):
    spec, store, journal, token, calls = operator
    cache, endings, reported = PartitionCache(), [], []
    staged = threading.Event()  # what a sink does with the rows: it may not wait for the record
    journal.record_waits_for = staged
    recorded_when_reported = []

    def report(stats):
        recorded_when_reported.append(journal.finished(1000, spec.operator, 0, PARTITION) is not None)
        reported.append(stats)

    rows = [row for batch in _run(spec, BatchParams(1000, None, token, None), cache, endings, report)
            for row in batch.to_pylist()]
    staged.set()
    assert sorted(r["key"] for r in rows) == ["a", "b"]
    [end] = endings
    assert isinstance(end, PartitionEnd)
    assert reported == [] and len(cache) == 0, "the partition counted as done before its finish record"

    end.complete()
    assert journal.record_saw_it is True, "the finish record was written before the rows came out"
    record = journal.finished(1000, spec.operator, 0, PARTITION)
    assert record is not None and record.output_rows == 2
    assert len(reported) == 1 and reported[0].keys_called == 2 and len(cache) == 1
    assert recorded_when_reported == [True], "the partition reported its batch before its finish record was written"


def test_a_finish_record_that_cannot_be_written_fails_the_partition_which_reports_and_caches_nothing(operator):
    spec, store, journal, token, calls = operator
    cache, endings, reported = PartitionCache(), [], []

    def full(batch_time, record):
        raise OSError(28, "No space left on device")

    journal.partition_finished = full
    assert [r for b in _run(spec, BatchParams(1000, None, token, None), cache, endings, reported.append)
            for r in b.to_pylist()]
    with pytest.raises(OSError, match="No space left"):
        endings[0].complete()
    assert reported == [] and len(cache) == 0


def test_settling_a_partition_waits_for_its_finish_record_and_reports_and_caches_nothing(operator):
    spec, store, journal, token, calls = operator
    cache, endings, reported = PartitionCache(), [], []
    release = threading.Event()
    journal.record_waits_for = release

    for _ in _run(spec, BatchParams(1000, None, token, None), cache, endings, reported.append):
        pass
    [end] = endings
    settling = threading.Thread(target=end.settle)
    settling.start()
    settling.join(0.2)
    assert settling.is_alive(), "settle returned while the finish record was still being written"
    release.set()
    settling.join(WAIT_S)
    assert not settling.is_alive()
    assert journal.finished(1000, spec.operator, 0, PARTITION) is not None  # landed before the task ended
    assert reported == [] and len(cache) == 0  # a failed task reports nothing and caches nothing


class _End:
    def __init__(self, log):
        self.log = log

    def complete(self):
        self.log.append("complete")

    def settle(self):
        self.log.append("settle")


class _Task:
    """A state task as ``_then`` drives it: rows out, its partition's end left to the caller."""

    def __init__(self, log):
        self.log = log

    def run(self, batches, endings):
        endings.append(_End(self.log))
        yield from batches


@pytest.mark.parametrize("fails", [False, True])
def test_the_sink_s_part_of_a_state_task_runs_before_the_partition_ends_which_a_failure_settles(fails):
    log: list[str] = []
    schema = pa.schema([("key", pa.string())])

    def sink(batches):
        rows = sum(b.num_rows for b in batches)
        log.append(f"staged {rows}")
        if fails:
            raise OSError("the sink's file could not be written")
        yield pa.RecordBatch.from_pylist([{"key": "message"}], schema=schema)

    task = _then(_Task(log), ArrowHandover(schema, 10_000), sink)
    batches = [pa.RecordBatch.from_pylist([{"key": "a"}, {"key": "b"}], schema=schema)]
    if fails:
        with pytest.raises(OSError, match="could not be written"):
            list(task(iter(batches)))
        assert log == ["staged 2", "settle"]
    else:
        assert [b.num_rows for b in task(iter(batches))] == [1]
        assert log == ["staged 2", "complete"]


class _SideBySide(MemoryStateStore):
    """A memory store read as an object store is: several version files side by side. A delta's
    read answers only once ``together`` reads are in flight at once (or fails after a while)."""

    reads_at_once = 4

    def __init__(self, together: int) -> None:
        super().__init__("op")
        self.together = threading.Barrier(together, timeout=WAIT_S)
        self.waiting = False

    def read_version(self, generation, partition, version, kind):
        if self.waiting and kind == DELTA:
            self.together.wait()
        return super().read_version(generation, partition, version, kind)


def test_a_partition_several_versions_behind_reads_the_deltas_it_missed_side_by_side(tmp_path):
    location = CheckpointStorage(str(tmp_path / "checkpoint"))
    token = Lease(location, ManualClock(0), 15_000).acquire()
    store = _SideBySide(together=3)
    spec = dataclasses.replace(spec_for(store, running_count, GroupStateTimeout.NO_TIMEOUT),
                               journal=JobEventStore(location, 1000))
    here, elsewhere = Worker(spec), Worker(spec)
    here.run(BatchParams(1000, None, token, None), [("a", 1)], PARTITION)
    for batch in (2000, 3000, 4000):  # ``here`` misses three versions
        elsewhere.run(BatchParams(batch, batch - 1000, token, None), [("a", 1)], PARTITION)

    store.waiting = True  # the three deltas answer only when all three are asked for at once
    out, _ = here.run(BatchParams(5000, 4000, token, None, recent_versions=(1000, 2000, 3000, 4000)),
                      [("a", 1)], PARTITION)
    assert out == [("a", 5)]


def test_reads_side_by_side_come_in_order_and_an_error_is_raised_in_its_place():
    started: list[int] = []
    others_started = threading.Barrier(3, timeout=WAIT_S)

    def read(n):
        def run():
            started.append(n)
            if n < 3:
                others_started.wait()  # the first three answer only once all three were asked for
            if n == 2:
                raise FileNotFoundError(f"version {n}")
            return n
        return run

    reads = read_ahead([read(n) for n in range(6)], at_once=3)
    assert next(reads) == 0 and next(reads) == 1
    with pytest.raises(FileNotFoundError, match="version 2"):
        next(reads)
    assert 5 not in started, "reads went on after the one that failed"
    assert list(read_ahead([read(3), read(4)], at_once=1)) == [3, 4]  # one at a time: in the caller's thread


def test_a_partition_loaded_afresh_reads_its_files_side_by_side():
    store = _SideBySide(together=4)
    spec = spec_for(store, running_count, GroupStateTimeout.NO_TIMEOUT)
    worker = Worker(spec)
    for batch in (1000, 2000, 3000, 4000):
        worker.run(BatchParams(batch, batch - 1000 if batch > 1000 else None, 1, None), [("a", 1)], PARTITION)

    store.waiting = True  # a restarted driver's worker: four deltas to read, all asked for at once
    out, _ = Worker(spec).run(BatchParams(5000, 4000, 2, None), [("a", 1)], PARTITION)
    assert out == [("a", 5)]
