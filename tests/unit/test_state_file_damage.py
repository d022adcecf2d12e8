"""A state file whose bytes are not those batchline wrote is never read as state: a flipped
byte anywhere fails its checksum, a cut or emptied file is named as such, and the error names
the file and is not retried. Files written before checksums are read as they are."""

import io

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from batchline.scheduler.retry import RetryPolicy
from batchline.state.execution import load_partition
from batchline.state.store import (
    DamagedStateFileError,
    FileHeader,
    FileKind,
    decode_version_file,
    encode_version_file,
)

HEADER = FileHeader(version=1_700_000_000_000, partition=3, kind=FileKind.DELTA)
TABLE = pa.table({"key": list(range(100)), "count": [i * 7 for i in range(100)]})
WHERE = "file:///ckpt/state/counts/g0/p00003/001700000000000.delta.arrow"


def test_a_file_reads_back_as_written():
    found = decode_version_file(encode_version_file(HEADER, TABLE), FileKind.DELTA, WHERE)
    assert found.header == HEADER and found.table.select(["key", "count"]).equals(TABLE)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_a_flipped_byte_anywhere_fails_the_checksum(where):
    data = bytearray(encode_version_file(HEADER, TABLE))
    index = {"start": 8, "middle": len(data) // 2, "end": len(data) - 20}[where]
    data[index] ^= 0x01
    with pytest.raises(DamagedStateFileError) as failure:
        decode_version_file(bytes(data), FileKind.DELTA, WHERE)
    assert WHERE in str(failure.value) and "checksum does not match" in str(failure.value)
    assert "Restore the file" in str(failure.value)


@pytest.mark.parametrize(("size", "problem"), [(0, "empty"), (10, "cut short"), (-30, "cut short")])
def test_a_cut_or_emptied_file_is_named_as_such(size, problem):
    data = encode_version_file(HEADER, TABLE)
    with pytest.raises(DamagedStateFileError, match=problem):
        decode_version_file(data[:size], FileKind.DELTA, WHERE)


def test_a_damaged_file_is_not_retried_and_reaches_the_driver_with_its_name():
    error = DamagedStateFileError(WHERE, "its checksum does not match", carry=True)
    assert not RetryPolicy(max_attempts=5).should_retry(error, 1)
    # in a task the error travels as text inside Spark's own error
    carried = DamagedStateFileError.carried_in(RuntimeError(f"PythonException: {error}"))
    assert carried is not None and carried.path == WHERE and not carried.carry


def test_a_file_written_before_checksums_is_read():
    table = TABLE.replace_schema_metadata(HEADER.to_metadata())
    sink = io.BytesIO()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    found = decode_version_file(sink.getvalue(), FileKind.DELTA, WHERE)
    assert found.header == HEADER and found.table.num_rows == 100


# -------------------------------------------------------------------- a damaged snapshot
def _store_with_a_damaged_snapshot(tmp_path, purge_deltas_before_it=False):
    from batchline.state.store import DELTA, SNAPSHOT, FileStateStore
    from tests.unit.test_state_store import table

    store = FileStateStore.open(str(tmp_path), "op")
    for version in range(1, 6):
        store.write_version(0, FileHeader(version, 0, DELTA), table(("a", (version, version), None)))
    store.write_version(0, FileHeader(2, 0, SNAPSHOT), table(("a", (2, 2), None)))
    store.write_version(0, FileHeader(4, 0, SNAPSHOT), table(("a", (4, 4), None)))
    snapshot = tmp_path / "state" / "op" / "g0" / "p00000" / f"{4:015d}.snapshot.arrow"
    assert snapshot.exists(), sorted(p.name for p in (tmp_path / "state" / "op" / "g0" / "p00000").iterdir())
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    if purge_deltas_before_it:
        for version in (1, 2, 3):
            store.delete_version(0, 0, version, DELTA)
        store.delete_version(0, 0, 2, SNAPSHOT)
    return store, snapshot


def test_a_damaged_snapshot_is_read_around_from_the_older_files_exactly(tmp_path, caplog):
    from tests.unit.test_state_store import STATE, Count

    store, snapshot = _store_with_a_damaged_snapshot(tmp_path)
    data = load_partition(store, STATE, True, 0, 0, 5)
    assert {k: Count(*v) for k, (v, _) in data.entries.items()} == {"a": Count(5, 5)}
    assert data.version == 5
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("snapshot of version 4 is damaged" in m and str(snapshot.name) in m for m in warned)


def test_a_damaged_snapshot_without_the_files_before_it_stops_naming_it(tmp_path):
    from tests.unit.test_state_store import STATE

    store, snapshot = _store_with_a_damaged_snapshot(tmp_path, purge_deltas_before_it=True)
    with pytest.raises(DamagedStateFileError, match="checksum does not match") as failure:
        load_partition(store, STATE, True, 0, 0, 5)
    assert snapshot.name in str(failure.value)


def _deltas_then_snapshot(tmp_path, first):
    """Deltas 1 to 5 (the first one's header saying ``first``) and one snapshot, at 4, damaged."""
    from batchline.state.store import DELTA, SNAPSHOT, FileStateStore
    from tests.unit.test_state_store import table

    store = FileStateStore.open(str(tmp_path), "op")
    for version in range(1, 6):
        header = FileHeader(version, 0, DELTA, first=first if version == 1 else False)
        store.write_version(0, header, table(("a", (version, version), None)))
    store.write_version(0, FileHeader(4, 0, SNAPSHOT), table(("a", (4, 4), None)))
    snapshot = tmp_path / "state" / "op" / "g0" / "p00000" / f"{4:015d}.snapshot.arrow"
    snapshot.write_bytes(snapshot.read_bytes()[:100])
    return store, snapshot


def test_a_damaged_only_snapshot_is_read_around_from_the_partitions_first_delta_on(tmp_path):
    from tests.unit.test_state_store import STATE, Count

    store, _ = _deltas_then_snapshot(tmp_path, first=True)
    data = load_partition(store, STATE, True, 0, 0, 5)
    assert {k: Count(*v) for k, (v, _) in data.entries.items()} == {"a": Count(5, 5)}


@pytest.mark.parametrize("first", [False, None], ids=["after purged versions", "written before deltas said"])
def test_a_damaged_only_snapshot_over_deltas_not_known_to_start_the_partition_stops_naming_it(tmp_path, first):
    from tests.unit.test_state_store import STATE

    store, snapshot = _deltas_then_snapshot(tmp_path, first=first)
    with pytest.raises(DamagedStateFileError, match="cut short") as failure:
        load_partition(store, STATE, True, 0, 0, 5)
    assert snapshot.name in str(failure.value)


def test_deltas_whose_snapshot_is_gone_are_never_read_as_the_whole_state(tmp_path):
    """A purge keeps the snapshot the oldest retained versions need and deletes what is under
    it; with that snapshot deleted too, the deltas left start in the middle of the state."""
    from batchline.state.store import DELTA, SNAPSHOT, FileStateStore, StateVersionError
    from tests.unit.test_state_store import STATE, table

    store = FileStateStore.open(str(tmp_path), "op")
    for version in range(1, 6):
        header = FileHeader(version, 0, DELTA, first=version == 1)
        store.write_version(0, header, table(("a", (version, version), None)))
    store.write_version(0, FileHeader(3, 0, SNAPSHOT), table(("a", (3, 3), None)))
    for version in (1, 2):
        store.delete_version(0, 0, version, DELTA)
    store.delete_version(0, 0, 3, SNAPSHOT)
    with pytest.raises(StateVersionError, match="builds on a snapshot that is no longer there"):
        load_partition(store, STATE, True, 0, 0, 5)


# -------------------------------------------------------------------- a damaged kept output
@pytest.mark.parametrize("damage", ["flipped", "deleted"])
def test_a_finished_partition_whose_kept_output_is_damaged_runs_again_exactly_and_says_so(tmp_path, damage):
    import dataclasses

    from batchline.checkpoint.events import JobEventStore
    from batchline.checkpoint.lease import Lease
    from batchline.checkpoint.storage import CheckpointStorage
    from batchline.clock import ManualClock
    from batchline.state.contract import BatchParams
    from batchline.state.group_state import GroupStateTimeout
    from batchline.state.store import FileStateStore
    from tests.unit.test_state_store import Worker, running_count, spec_for

    location = CheckpointStorage(str(tmp_path / "checkpoint"))
    token = Lease(location, ManualClock(0), 15_000).acquire()
    calls = []

    def counted(key, rows, state):
        calls.append(key)
        yield from running_count(key, rows, state)

    store = FileStateStore(location, "op")
    spec = dataclasses.replace(spec_for(store, counted, GroupStateTimeout.NO_TIMEOUT),
                               journal=JobEventStore(location, 1000))
    params = BatchParams(1000, None, token, None)
    first_out, _ = Worker(spec).run(params, [("a", 1), ("b", 2)], 3)
    kept = tmp_path / "checkpoint" / "state" / "op" / "g0" / "p00003" / f"{1000:015d}.output.arrow"
    if damage == "flipped":
        data = bytearray(kept.read_bytes())
        data[len(data) // 2] ^= 0xFF
        kept.write_bytes(bytes(data))
    else:
        kept.unlink()
    again_out, stats = Worker(spec).run(params, [("a", 1), ("b", 2)], 3)
    assert again_out == first_out and calls == ["a", "b", "a", "b"]  # run again from the state before it
    assert any("cannot be read back" in w and "running it again" in w for w in stats.warnings)
