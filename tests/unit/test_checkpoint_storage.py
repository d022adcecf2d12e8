"""Checkpoint files, manifest, fallback and the lease, on local disk and a manual clock."""

import logging
import os
import threading

import pytest

from batchline.checkpoint.lease import CheckpointLockedError, FencedError, Lease, LeaseRecord
from batchline.checkpoint.model import Checkpoint
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, seal, unseal
from batchline.checkpoint.writer import CHECKPOINTS, MANIFEST, CheckpointWriter, load_latest_checkpoint
from batchline.clock import ManualClock
from tests.helpers import poll_until


def checkpoint_at(time, pending=()):
    return Checkpoint(time=time, zero_time=0, batch_interval_ms=1000, checkpoint_interval_ms=1000,
                      pending_times=tuple(pending), inputs={"files": {"seen": [f"f{time}"]}},
                      outputs=("sink",), written_at_ms=time)


def test_sealed_files_detect_tearing_and_tampering():
    data = seal({"a": 1})
    assert unseal(data, "x") == {"a": 1}
    with pytest.raises(CorruptFileError, match="torn"):
        unseal(data[: len(data) // 2], "x")
    with pytest.raises(CorruptFileError, match="checksum"):
        unseal(data.replace(b'"a":1', b'"a":2'), "x")


def write_checkpoints(storage, times, keep=3):
    writer = CheckpointWriter(storage, ManualClock(), keep=keep, check_lease=lambda: None)
    for t in times:
        writer.write_now(checkpoint_at(t, pending=(t - 1000,)))
    writer.stop()
    return writer


def test_a_backlog_of_queued_checkpoints_is_written_as_its_newest(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    gate = threading.Event()
    writer = CheckpointWriter(storage, ManualClock(), keep=10, check_lease=lambda: gate.wait(10))
    written = []
    for t in range(1000, 6000, 1000):  # the first write waits at the gate while the rest queue up
        writer.write(checkpoint_at(t), on_written=lambda c: written.append(c.time))
    gate.set()
    writer.stop()
    assert sorted(written) == [1000, 2000, 3000, 4000, 5000]  # every caller hears back
    assert load_latest_checkpoint(storage)[0].time == 5000
    assert len(os.listdir(tmp_path / CHECKPOINTS)) < 5


def test_writer_keeps_the_last_k_checkpoints_and_lists_them_in_the_manifest(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    writer = write_checkpoints(storage, [2000, 4000, 6000, 8000, 10000])
    files = sorted(os.listdir(tmp_path / CHECKPOINTS))
    assert len(files) == 3 and [f.split("-")[1] for f in files] == ["000000000006000", "000000000008000",
                                                                     "000000000010000"]
    assert writer.retained == sorted(files, reverse=True)
    assert writer.oldest_needed_time() == 5000  # the oldest kept checkpoint's pending batch
    checkpoint, retained = load_latest_checkpoint(storage)
    assert checkpoint == checkpoint_at(10000, pending=(9000,))
    assert [e["name"] for e in retained] == writer.retained


def test_a_torn_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    storage = CheckpointStorage(str(tmp_path))
    writer = write_checkpoints(storage, [2000, 4000, 6000])
    newest = tmp_path / CHECKPOINTS / writer.retained[0]
    newest.write_bytes(newest.read_bytes()[:40])  # torn mid-write
    with caplog.at_level(logging.WARNING, logger="batchline.checkpoint.writer"):
        checkpoint, retained = load_latest_checkpoint(storage)
    assert checkpoint.time == 4000
    assert [e["name"] for e in retained] == writer.retained[1:]
    assert any("is torn or corrupt" in r.getMessage() and "falling back to" in r.getMessage()
               for r in caplog.records)


def test_an_unreadable_manifest_falls_back_to_the_checkpoint_files(tmp_path, caplog):
    storage = CheckpointStorage(str(tmp_path))
    write_checkpoints(storage, [2000, 4000])
    (tmp_path / MANIFEST).write_text("{garbage")
    with caplog.at_level(logging.WARNING):
        checkpoint, _ = load_latest_checkpoint(storage)
    assert checkpoint.time == 4000
    assert any("manifest is unreadable" in r.getMessage() for r in caplog.records)


def test_nothing_valid_means_no_checkpoint(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    assert load_latest_checkpoint(storage) == (None, [])
    writer = write_checkpoints(storage, [2000])
    (tmp_path / CHECKPOINTS / writer.retained[0]).write_text("")
    assert load_latest_checkpoint(storage) == (None, [])


def test_a_second_driver_is_refused_with_the_holders_name(tmp_path):
    clock = ManualClock(1_000_000)
    first = Lease(CheckpointStorage(str(tmp_path)), clock, ttl_ms=10_000)
    first.acquire()
    second = Lease(CheckpointStorage(str(tmp_path)), clock, ttl_ms=10_000)
    with pytest.raises(CheckpointLockedError, match=f"held by driver {first.holder}"):
        second.acquire()
    first.release()
    assert second.acquire() == 2  # a released lease is free at once; the token grows
    second.release()


def test_a_stale_driver_cannot_commit_after_another_took_over(tmp_path):
    clock = ManualClock(1_000_000)
    storage = CheckpointStorage(str(tmp_path))
    stale = Lease(storage, clock, ttl_ms=10_000)
    stale.acquire()
    stale._stop.set()  # the driver is paused: it renews no more
    clock.advance(10_001)  # its lease expires
    successor = Lease(storage, clock, ttl_ms=10_000)
    assert successor.acquire() == 2
    successor.check()
    with pytest.raises(FencedError, match="lost its lease"):
        stale.check()
    # Its checkpoint writer refuses to write as well.
    writer = CheckpointWriter(storage, clock, keep=3, check_lease=stale.check)
    with pytest.raises(FencedError):
        writer.write_now(checkpoint_at(2000))
    assert not (tmp_path / CHECKPOINTS).exists()
    successor.release()


def test_the_lease_of_a_dead_process_on_this_host_is_taken_over(tmp_path):
    import socket
    import subprocess

    storage = CheckpointStorage(str(tmp_path))
    process = subprocess.Popen(["true"])
    process.wait()
    dead = LeaseRecord("old-driver", socket.gethostname(), process.pid, 7, expires_at_ms=10**15)
    storage.replace("_lease.json", seal(dead.__dict__))
    lease = Lease(storage, ManualClock(0))
    assert lease.acquire() == 8
    lease.release()


def test_renewal_keeps_a_live_lease_beyond_its_ttl(tmp_path):
    clock = ManualClock(0)
    storage = CheckpointStorage(str(tmp_path))
    lease = Lease(storage, clock, ttl_ms=3000)
    lease.acquire()
    for _ in range(10):  # 10 s of clock time: more than three TTLs
        clock.advance(1000)
        # the renewal thread reacts to the clock
        poll_until(lambda: lease.read().expires_at_ms >= clock.now_ms() + 3000, 5)
        assert lease.read().expires_at_ms == clock.now_ms() + 3000
    with pytest.raises(CheckpointLockedError):
        Lease(storage, clock, ttl_ms=3000).acquire()
    lease.release()


def test_a_second_checkpoint_for_the_same_time_replaces_the_first(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    writer = CheckpointWriter(storage, ManualClock(), keep=2, check_lease=lambda: None)
    writer.write_now(checkpoint_at(2000, pending=(2000,)))
    writer.write_now(checkpoint_at(4000, pending=(4000,)))
    writer.write_now(checkpoint_at(4000))  # the same time again, once its batch completed
    writer.stop()
    assert [e["time"] for e in storage.read_sealed(MANIFEST)["checkpoints"]] == [4000, 2000]
    assert len(os.listdir(tmp_path / CHECKPOINTS)) == 2
    assert load_latest_checkpoint(storage)[0].pending_times == ()


def test_a_batch_logged_or_committed_by_another_driver_cannot_be_overwritten(tmp_path):
    from batchline.checkpoint.events import JobEventStore

    successor, stale = JobEventStore(CheckpointStorage(str(tmp_path))), JobEventStore(CheckpointStorage(str(tmp_path)))
    successor.batch_started(5000, {"files": {"files": ["a"]}}, token=2)
    successor.batch_completed(5000, token=2)
    with pytest.raises(FencedError, match="already written by another driver"):
        stale.batch_started(5000, {"files": {"files": ["b"]}}, token=1)
    with pytest.raises(FencedError, match="already written by another driver"):
        stale.batch_completed(5000, token=1)
    assert successor.started(5000) == {"files": {"files": ["a"]}}
