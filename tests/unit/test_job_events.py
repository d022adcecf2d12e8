"""The job event store (SPEC F1): one log of what happened, records found by name, a torn
record of a batch no later commit follows dropped with a WARN, other damage an error naming
the record."""

import logging

import pytest

from batchline.checkpoint.events import CommitMarker, JobEventStore, OperatorInitialized, PartitionFinished
from batchline.checkpoint.lease import FencedError
from batchline.checkpoint.model import OperatorProgress
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, seal


def store(location, interval_ms=1000):
    return JobEventStore(CheckpointStorage(str(location)), interval_ms)


def finished(partition, rows=3):
    return PartitionFinished("sessions", partition, 0, 2000, rows, {"keys_called": rows, "partitions": 1 << partition},
                             token=1)


def test_a_batch_is_logged_its_partitions_finish_and_it_completes(tmp_path):
    events = store(tmp_path)
    events.batch_started(2000, {"gen": {"start": 0, "end": 10}}, token=1)
    events.operator_initialized(2000, OperatorInitialized("sessions", 8, 0))
    events.operator_initialized(2000, OperatorInitialized("sessions", 8, 0))  # a re-run writes it again: kept
    events.partition_finished(2000, finished(3))
    events.partition_finished(2000, finished(3, rows=99))  # a retried task's record: the first one stays
    events.batch_completed(2000, token=1, operators={"sessions": OperatorProgress(last_rows_at=1000)})

    assert events.started(2000) == {"gen": {"start": 0, "end": 10}}
    assert events.operator(2000, "sessions", 0) == OperatorInitialized("sessions", 8, 0)
    assert events.finished(2000, "sessions", 0, 3) == finished(3)
    assert events.finished(2000, "sessions", 0, 4) is None
    assert events.finished(2000, "sessions", 1, 3) is None  # another generation (a rescale) keeps nothing
    assert events.is_completed(2000) and not events.is_completed(3000)
    assert events.completed(2000) == CommitMarker(2000, 1, {"sessions": OperatorProgress(last_rows_at=1000)})


def test_a_second_driver_cannot_log_or_complete_a_batch_again(tmp_path):
    first, stale = store(tmp_path), store(tmp_path)
    first.batch_started(2000, {"a": {}}, token=2)
    with pytest.raises(FencedError, match="already written by another driver"):
        stale.batch_started(2000, {"b": {}}, token=1)
    first.batch_completed(2000, token=2)
    with pytest.raises(FencedError, match="already written by another driver"):
        stale.batch_completed(2000, token=1)


def test_a_torn_record_at_the_tail_is_dropped_with_a_warning(tmp_path, caplog):
    events = store(tmp_path)
    events.batch_started(1000, {"a": {}}, token=1)
    events.batch_started(2000, {"a": {}}, token=1)
    (tmp_path / "events" / "000000000002000" / "started.json").write_bytes(b"BATCHLINE1 deadbeef 99\n{\"ti")
    with caplog.at_level(logging.WARNING, logger="batchline.checkpoint.events"):
        assert events.started(2000) is None  # never ran: it is generated anew
        assert not (tmp_path / "events" / "000000000002000" / "started.json").exists()
        events.batch_started(2000, {"a": {}}, token=1)
        events.partition_finished(2000, finished(0))
        (tmp_path / "events" / "000000000002000" / "finished-sessions-g0-p00000.json").write_bytes(b"BATCHLINE1 0f")
        assert events.finished(2000, "sessions", 0, 0) is None  # runs again
    assert sum("Dropping torn record of batch 2000" in r.getMessage() for r in caplog.records) == 2


def test_a_record_cut_short_after_later_records_of_its_batch_were_written_is_an_error(tmp_path):
    """A crash tears only the record being written; one followed by records of its batch was
    whole once, so what it recorded happened: it is not dropped."""
    events = store(tmp_path)
    events.batch_started(2000, {"a": {}}, token=1)
    events.partition_finished(2000, finished(0))
    started = tmp_path / "events" / "000000000002000" / "started.json"
    started.write_bytes(started.read_bytes()[:40])
    with pytest.raises(CorruptFileError, match="finished-sessions-g0-p00000.json was written after it") as failure:
        events.started(2000)
    assert str(started) in str(failure.value) and "Restore the file" in str(failure.value)
    assert started.exists()


def test_a_lost_started_record_of_a_batch_that_ran_is_an_error(tmp_path):
    events = store(tmp_path)
    events.batch_started(2000, {"a": {}}, token=1)
    events.check_logged(2000)
    events.check_logged(3000)  # never logged: nothing to say
    events.partition_finished(2000, finished(0))
    (tmp_path / "events" / "000000000002000" / "started.json").unlink()
    with pytest.raises(CorruptFileError, match="started.json is missing, but the batch's later records are there"):
        events.check_logged(2000)


def test_a_torn_finish_record_while_later_batches_run_is_dropped(tmp_path):
    """Later batches are logged, and their tasks write, while an earlier one still runs: a
    crash can tear its finish record with several batches logged after it."""
    events = store(tmp_path)
    for t in (1000, 2000, 3000):
        events.batch_started(t, {"a": {}}, token=1)
    events.batch_completed(1000, token=1)
    (tmp_path / "events" / "000000000002000" / "finished-sessions-g0-p00003.json").write_bytes(b"BATCHLI")
    assert events.finished(2000, "sessions", 0, 3) is None
    assert not (tmp_path / "events" / "000000000002000" / "finished-sessions-g0-p00003.json").exists()


def test_a_torn_record_of_a_batch_a_later_commit_follows_is_an_error(tmp_path):
    events = store(tmp_path)
    for t in (1000, 2000):
        events.batch_started(t, {"a": {}}, token=1)
        events.partition_finished(t, finished(3))
        events.batch_completed(t, token=1)
    record = tmp_path / "events" / "000000000001000" / "finished-sessions-g0-p00003.json"
    record.write_bytes(record.read_bytes()[:-5])
    with pytest.raises(CorruptFileError, match=r"is torn: .*a later batch was committed after it"):
        events.finished(1000, "sessions", 0, 3)
    assert record.exists()


def test_a_retried_task_replaces_the_finish_record_a_killed_attempt_tore(tmp_path):
    events = store(tmp_path)
    record = tmp_path / "events" / "000000000002000" / "finished-sessions-g0-p00003.json"
    record.parent.mkdir(parents=True)
    record.write_bytes(seal(finished(3).to_json())[:20])
    events.partition_finished(2000, finished(3))
    assert events.finished(2000, "sessions", 0, 3) == finished(3)


def test_a_flipped_byte_is_damage_even_in_the_newest_batch(tmp_path):
    events = store(tmp_path)
    events.batch_started(1000, {"a": {}}, token=1)
    events.partition_finished(1000, finished(3))
    record = tmp_path / "events" / "000000000001000" / "finished-sessions-g0-p00003.json"
    record.write_bytes(record.read_bytes().replace(b'"output_rows":3', b'"output_rows":4'))
    with pytest.raises(CorruptFileError, match=r"does not match its checksum; a crash cuts a write short"):
        events.finished(1000, "sessions", 0, 3)


def test_corruption_before_the_tail_is_an_error_naming_the_record(tmp_path):
    events = store(tmp_path)
    events.batch_started(1000, {"a": {}}, token=1)
    events.batch_completed(1000, token=1)
    events.batch_started(2000, {"a": {}}, token=1)
    marker = tmp_path / "events" / "000000000001000" / "completed.json"
    marker.write_bytes(marker.read_bytes().replace(b'"token":1', b'"token":7'))
    with pytest.raises(CorruptFileError, match=r"000000000001000/completed\.json does not match its checksum.*"
                                               r"not a crash's torn write"):
        events.is_completed(1000)
    assert marker.exists()  # kept for whoever repairs it


def test_old_batches_are_purged_and_forgotten_finishes_are_gone(tmp_path):
    events = store(tmp_path)
    for t in (1000, 2000, 3000):
        events.batch_started(t, {}, token=1)
    events.partition_finished(3000, finished(1))
    events.forget_finished(3000, "sessions", 0, 8)
    assert events.finished(3000, "sessions", 0, 1) is None
    assert events.purge_before(3000) == 2
    assert events.started(1000) is None and events.started(3000) == {}


def test_a_purge_keeps_the_newest_commit_marker(tmp_path):
    """A finished operator's last state version is known committed by the newest marker, even
    once idle batches after it moved the purge threshold past it."""
    events = store(tmp_path)
    for t in (1000, 2000, 3000):
        events.batch_started(t, {}, token=1)
    events.batch_completed(1000, token=1)
    events.batch_completed(2000, token=1)
    assert events.purge_before(4000) == 2
    assert events.is_completed(2000) and not events.is_completed(1000) and events.started(3000) is None
