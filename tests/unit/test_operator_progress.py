"""A stateful operator's progress is one typed record from the runtime to the checkpoint and
the commit marker and back: nothing the runtime keeps for a restart is dropped on the way
(the idle timeout's ``last_rows_at`` once was, by the checkpoint)."""

from types import SimpleNamespace

from pyspark.sql.types import StructType

from batchline.checkpoint.events import CommitMarker
from batchline.checkpoint.manager import CheckpointManager, CheckpointSettings
from batchline.checkpoint.model import Checkpoint, OperatorProgress
from batchline.checkpoint.storage import CheckpointStorage, seal, unseal
from batchline.checkpoint.writer import CHECKPOINTS, read_checkpoint
from batchline.clock import ManualClock
from batchline.recovery.restart import _last_committed_progress
from batchline.state.contract import PartitionFacts, Stats
from batchline.state.operator import _StatsParam, tasks_reported
from batchline.state.stateful import StatefulRuntime
from batchline.state.store import StateMetadata

INTERVAL = 1000
PROGRESS = OperatorProgress(max_event_time_ms=7_500, finished_partitions=(1,), finished_after=None,
                            partitions={0: [3, 68, 9_000], 1: [0, 0, None]}, partitions_generation=2,
                            input_max_event_time_ms={0: 7_500, 1: 6_000}, last_rows_at=4_000,
                            source_max_event_time_ms={0: 7_500, 1: 2_000})


def checkpoint(operators: dict[str, OperatorProgress], time: int = 5_000,
               pending: tuple[int, ...] = (5_000,)) -> Checkpoint:
    return Checkpoint(time=time, zero_time=0, batch_interval_ms=INTERVAL, checkpoint_interval_ms=2 * INTERVAL,
                      pending_times=pending, inputs={}, outputs=("out",), written_at_ms=time, operators=operators)


def manager(tmp_path) -> CheckpointManager:
    return CheckpointManager(CheckpointSettings(str(tmp_path), 2 * INTERVAL, batch_interval_ms=INTERVAL),
                             ManualClock(10_000))


def runtime(progress: OperatorProgress | None = None) -> StatefulRuntime:
    """A runtime with only what its progress record reads and writes (no Spark, no store)."""
    made = StatefulRuntime.__new__(StatefulRuntime)
    made.metadata = StateMetadata("counts", 2, 2, StructType([]), StructType([]), "NoTimeout")
    made.restore_progress(progress or OperatorProgress())
    return made


def test_every_field_round_trips_through_a_checkpoint_file(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    storage.write_new(f"{CHECKPOINTS}/checkpoint-x.json", seal(checkpoint({"counts": PROGRESS}).to_json()))
    assert read_checkpoint(storage, "checkpoint-x.json").operators == {"counts": PROGRESS}
    assert OperatorProgress.from_json(PROGRESS.to_json()) == PROGRESS


def test_a_record_written_before_last_rows_at_was_kept_reads_as_no_rows_yet_and_is_written_the_same():
    older = {"max_event_time_ms": None, "partitions": {"0": [3, 68, None]}, "partitions_generation": 0}
    progress = OperatorProgress.from_json(older)
    assert progress.last_rows_at is None
    assert progress.to_json() == older
    # The commit markers of the runtime's untyped record carried the key, as null.
    assert OperatorProgress.from_json({**older, "last_rows_at": None}) == progress


def test_the_runtime_takes_back_what_it_recorded():
    assert runtime(PROGRESS).progress() == PROGRESS
    assert runtime().progress() == OperatorProgress()


def test_a_restart_from_a_checkpoint_without_a_later_commit_marker_keeps_the_idle_timeout_state(tmp_path):
    before = runtime(PROGRESS)
    before.last_rows_at = 5_000  # the batch at 5 s brought rows
    storage = CheckpointStorage(str(tmp_path))
    storage.write_new(f"{CHECKPOINTS}/checkpoint-x.json",
                      seal(checkpoint({"counts": before.progress()}, pending=()).to_json()))
    read = read_checkpoint(storage, "checkpoint-x.json")
    after = runtime()
    after.restore_progress(_last_committed_progress(manager(tmp_path), read, 5_000, INTERVAL)["counts"])
    assert after.last_rows_at == 5_000
    assert after.progress() == before.progress()


def test_a_restart_takes_the_newest_commit_marker_as_typed_progress(tmp_path):
    checkpoints = manager(tmp_path)
    newer = OperatorProgress(max_event_time_ms=9_000, last_rows_at=6_000,
                             partitions={0: PartitionFacts(1, 10, None).to_json()}, partitions_generation=2)
    checkpoints.events.batch_completed(6_000, token=3, operators={"counts": newer})
    written = unseal(CheckpointStorage(str(tmp_path)).read("events/000000000006000/completed.json"), "marker")
    assert written == {"time": 6_000, "token": 3, "operators": {"counts": {
        "max_event_time_ms": 9_000, "last_rows_at": 6_000, "partitions": {"0": [1, 10, None]},
        "partitions_generation": 2}}}
    assert checkpoints.events.completed(6_000) == CommitMarker(6_000, 3, {"counts": newer})
    found = _last_committed_progress(checkpoints, checkpoint({"counts": PROGRESS}), 7_000, INTERVAL)
    assert found == {"counts": newer}
    assert runtime(found["counts"]).last_rows_at == 6_000


def test_a_partition_that_reports_again_counts_once():
    """A batch that runs again in the same driver runs its finished partitions again (no cache
    keeps their rows when the output reads them in one pass); each reports what its finish
    record kept, and the batch's totals count it once."""
    param = _StatsParam()
    first_attempt = param.addInPlace(param.zero({}), {1: Stats(rows=24, keys_called=6, partitions=1)})
    retried = param.addInPlace(first_attempt, {1: Stats(rows=24, keys_called=6, partitions=1)})
    retried = param.addInPlace(retried, {2: Stats(rows=24, keys_called=6, partitions=2)})

    class Reports:
        value = retried

    total = tasks_reported(Reports())  # type: ignore[arg-type]
    assert (total.rows, total.keys_called, total.partitions) == (48, 12, 3)


class _FinishRecords:
    """The job event store's finish records of one batch, as ``recover_batch`` reads them."""

    def __init__(self, finished: set[int]) -> None:
        self.finished_partitions, self.forgotten = finished, False

    def finished(self, batch_time: int, operator: str, generation: int, partition: int) -> object | None:
        return object() if partition in self.finished_partitions else None

    def forget_finished(self, batch_time: int, operator: str, generation: int, partitions: int) -> None:
        self.forgotten = True


def recovering(finished: set[int], partitions: int = 8, drained: frozenset[int] = frozenset(),
               metadata: bool = True) -> StatefulRuntime:
    """A runtime with what a restart's ``recover_batch`` reads: its finish records and metadata."""
    made = runtime()
    made.metadata = StateMetadata("counts", partitions, 2, StructType([]), StructType([]), "NoTimeout") \
        if metadata else None
    made.name, made._batches, made._drained = "counts", {}, set(drained)
    made._checkpoint = SimpleNamespace(events=_FinishRecords(finished))
    made._keepable = lambda batch_time, generation, partition: True  # their files read back whole
    return made


def test_a_batch_a_restart_runs_again_says_what_of_its_inputs_it_read_again_and_why():
    kept = recovering({0, 1, 2, 3, 4, 5}, drained=frozenset({7}))
    kept.recover_batch(5_000, ())
    note = kept.batch(5_000).rerun_note
    assert kept.batch(5_000).kept == frozenset(range(6))
    assert note is not None and note.startswith("everything its inputs still hold, for 1 partition(s) (6); 6 kept")
    assert "left out of the state shuffle" in note and "no source can give some partitions' rows alone" in note

    many = recovering({0}, partitions=40)
    many.recover_batch(5_000, ())
    assert "for 39 partition(s) (1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 29 more); 1 kept" in many.batch(5_000).rerun_note

    none = recovering(set())
    none.recover_batch(5_000, ())
    assert none.batch(5_000).rerun_note == ("everything its inputs still hold, for every partition: none had "
                                            "finished the batch durably before the restart")
    fresh = recovering(set(), metadata=False)
    fresh.recover_batch(5_000, ())
    assert fresh.batch(5_000).rerun_note == none.batch(5_000).rerun_note

    whole = recovering({0, 1, 2})
    whole.recover_batch(5_000, ["queue"])
    assert whole.batch(5_000).rerun_whole and whole._checkpoint.events.forgotten
    assert whole.batch(5_000).kept == frozenset()
    assert whole.batch(5_000).rerun_note == ("input(s) queue cannot give the batch its rows again: it ran without "
                                             "them, every partition again, on what its other inputs still hold")


def test_the_restarts_note_outlives_a_retry_of_the_batch():
    whole = recovering({0}, partitions=2)
    whole.recover_batch(5_000, ["queue"])
    batch = whole.batch(5_000)
    batch.took_on(Stats(), frozenset({0, 1}), None)  # the first attempt ran; a retry takes it on again
    assert not batch.rerun_whole
    assert batch.rerun_note is not None and batch.rerun_note.startswith("input(s) queue")
