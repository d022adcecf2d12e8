"""Damage to the small sealed files of a checkpoint location, and a location that fills up
(issue 34, SPEC E3), without Spark: what is corruption and what a crash's torn write, the
lease's fencing token after its file was lost, operator metadata that is gone, kept input
files that changed, and writes that run out of space."""

from __future__ import annotations

import errno
import pickle

import pyarrow as pa
import pytest

from batchline.checkpoint.lease import Lease
from batchline.checkpoint.storage import (
    CheckpointStorage,
    CorruptFileError,
    StorageFullError,
    TornFileError,
    seal,
    unseal,
)
from batchline.clock import ManualClock
from batchline.errors import CarriedError, carried_error_in
from batchline.scheduler.retry import RetryPolicy
from batchline.sources.frames import DamagedInputFileError, verified_rows
from batchline.state.store import DELTA, FileHeader, FileStateStore, StateMetadata, StateStoreError
from tests.metered_fs import metered_location

RECORD = {"time": 23_000, "allocations": {"events": {"start": 120, "end": 130}}, "token": 2}


# -------------------------------------------------------------------- sealed files
def test_a_flipped_byte_in_the_header_line_is_corruption_not_a_torn_write():
    data = bytearray(seal(RECORD))
    newline = data.index(b"\n")
    data[newline] ^= 0xFF  # the header's end is gone, yet the whole body follows
    with pytest.raises(CorruptFileError) as failure:
        unseal(bytes(data), "started.json")
    assert not isinstance(failure.value, TornFileError)


def test_a_file_cut_inside_its_header_is_torn_and_an_empty_one_says_so():
    data = seal(RECORD)
    with pytest.raises(TornFileError, match="ends inside its header"):
        unseal(data[:30], "started.json")
    with pytest.raises(TornFileError, match="is empty"):
        unseal(b"", "started.json")


def test_a_damaged_file_is_not_retried():
    assert not RetryPolicy(max_attempts=5).should_retry(CorruptFileError("x does not match its checksum"), 1)


# -------------------------------------------------------------------- the lease
def test_a_lost_or_damaged_lease_keeps_the_fencing_token_growing(tmp_path, caplog):
    clock = ManualClock(1_700_000_000_000)
    storage = CheckpointStorage(str(tmp_path))
    first = Lease(storage, clock, ttl_ms=10_000)
    assert first.acquire() == 1
    first.release()
    storage.write_new("checkpoints/checkpoint-1.json", seal({}))  # the location was used
    (tmp_path / "_lease.json").write_bytes(b"BATCHLINE1 garbage")
    second = Lease(storage, clock, ttl_ms=10_000)
    token = second.acquire()
    assert token >= clock.now_ms() > 1  # larger than any token a driver before it held
    assert any("_lease.json is unreadable" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    second.release()
    (tmp_path / "_lease.json").unlink()
    clock.advance(1000)
    third = Lease(storage, clock, ttl_ms=10_000)
    assert third.acquire() > token
    assert any("missing at a location that was used before" in r.getMessage() for r in caplog.records)
    third.release()


# -------------------------------------------------------------------- operator metadata
def _metadata() -> StateMetadata:
    from pyspark.sql.types import LongType, StructField, StructType

    return StateMetadata("counts", 2, 0, StructType([StructField("id", LongType())]),
                         StructType([StructField("count", LongType())]), "NoTimeout")


def test_operator_metadata_that_is_lost_after_batches_wrote_state_stops_naming_it(tmp_path):
    store = FileStateStore.open(str(tmp_path), "counts")
    assert store.read_metadata() is None  # no state yet: a fresh operator
    store.write_metadata(_metadata())
    table = pa.table({"key.id": [1], "state.count": [3], "__timeout_ms": pa.array([None], pa.int64()),
                      "__removed": [False]})
    store.write_version(0, FileHeader(1000, 1, DELTA), table)
    metadata = tmp_path / "state" / "counts" / "_metadata.json"
    metadata.unlink()
    with pytest.raises(StateStoreError, match="is missing, but batches wrote its state") as failure:
        store.read_metadata()
    assert str(metadata) in str(failure.value) and "Restore the file" in str(failure.value)
    store.write_metadata(_metadata())
    metadata.write_bytes(metadata.read_bytes()[:-10])
    with pytest.raises(StateStoreError, match="is damaged: .* is torn") as failure:
        store.read_metadata()
    assert "Restore the file" in str(failure.value)


# -------------------------------------------------------------------- kept input files
def test_a_kept_input_file_that_changed_is_refused_naming_it():
    import hashlib
    import io

    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"n": list(range(1000))}), buffer)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    assert verified_rows(data, digest, "inputs/x/part-00000.parquet").num_rows == 1000
    assert verified_rows(data, None, "inputs/x/part-00000.parquet").num_rows == 1000  # an older manifest
    changed = bytearray(data)
    changed[len(changed) // 2] ^= 0x01
    with pytest.raises(DamagedInputFileError, match="part-00000.parquet is damaged: its checksum does not match"):
        verified_rows(bytes(changed), digest, "inputs/x/part-00000.parquet")
    with pytest.raises(DamagedInputFileError, match="is empty"):
        verified_rows(b"", digest, "inputs/x/part-00000.parquet")
    assert not RetryPolicy(max_attempts=5).should_retry(DamagedInputFileError("p", "q"), 1)
    # raised in a task, it reaches the driver by its text inside Spark's error
    carried = carried_error_in(RuntimeError(f"PythonException: {DamagedInputFileError('p', 'its checksum')}"))
    assert isinstance(carried, DamagedInputFileError) and carried.path == "p"


# -------------------------------------------------------------------- out of space
def test_a_write_that_runs_out_of_space_names_the_location_and_leaves_no_part_of_the_file(tmp_path):
    url, options = metered_location(str(tmp_path / "small"), 4096)
    storage = CheckpointStorage(url, options)
    storage.write_new("events/000000000001000/started.json", seal(RECORD))
    storage.replace("_progress.json", seal({"progress": []}))
    big = seal({"progress": ["x" * 5000]})
    with pytest.raises(StorageFullError) as failure:
        storage.write_new("events/000000000002000/started.json", big)
    error = failure.value
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert f"no space left at {url}" in str(error) and "Free space there" in str(error)
    assert not (tmp_path / "small" / "events" / "000000000002000" / "started.json").exists()
    with pytest.raises(StorageFullError):
        storage.replace("_progress.json", big)
    assert unseal(storage.read("_progress.json"), "p") == {"progress": []}  # the old one, whole
    assert not [p for p in (tmp_path / "small").rglob(".tmp-*")]


def test_the_out_of_space_error_travels_from_a_task_and_is_retried():
    error = StorageFullError("file:///ckpt", "file:///ckpt/state/counts/g0/p00000/1.delta.arrow", carry=True)
    assert isinstance(error, CarriedError) and isinstance(error, OSError)
    assert RetryPolicy(max_attempts=3).should_retry(error, 1)  # space may come back
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, StorageFullError) and copy.location == "file:///ckpt"
    found = carried_error_in(RuntimeError(f"An exception was thrown from the Python worker: {error}"))
    assert isinstance(found, StorageFullError) and found.path.endswith("1.delta.arrow")
    assert "<<batchline-error" not in str(found)


def test_a_stop_on_a_full_location_goes_on_and_the_lease_lapses_by_itself(tmp_path, caplog):
    url, options = metered_location(str(tmp_path / "small"), 4096)
    storage = CheckpointStorage(url, options)
    clock = ManualClock(1_000_000)
    lease = Lease(storage, clock, ttl_ms=10_000)
    lease.acquire()
    (tmp_path / "small" / "filler").write_bytes(b"\0" * 4000)
    lease.release()  # cannot write the released lease: warns and goes on
    assert lease.token is None
    assert any("Could not release the checkpoint lease" in r.getMessage() for r in caplog.records)
    (tmp_path / "small" / "filler").unlink()
    clock.advance(10_001)
    assert Lease(storage, clock, ttl_ms=10_000).acquire() == 2
