"""`batchline status` from what a location holds, without Spark: excluded executors (SPEC H2),
failed and cancelled batches after the last completed one, a driver that died holding its lease
(and the stale stop of an earlier run it must not show), a refused start, a mistyped path."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess

import pytest

from batchline.batch_time import format_batch_time
from batchline.checkpoint.lease import LEASE_FILE, Lease, LeaseRecord
from batchline.checkpoint.storage import CheckpointStorage, seal, unseal
from batchline.cli.main import main
from batchline.clock import ManualClock
from batchline.errors import ConfigurationError
from batchline.observe.control import (
    STOP_OUTCOME_FILE,
    StopHow,
    StopOutcome,
    read_stop_outcome,
    record_stop_outcome,
)
from batchline.observe.observers import ObserveSettings
from batchline.observe.progress_log import ProgressLog
from batchline.observe.status import last_run_ended
from batchline.scheduler.progress import BatchProgress, ExcludedExecutor, StateOperatorProgress

NOW = 1_800_000_000_000


def record(batch_time: int, status: str = "completed", errors: tuple[str, ...] = ()) -> BatchProgress:
    return BatchProgress(
        batch_time=batch_time, status=status, submission_time_ms=batch_time, processing_start_ms=batch_time + 40,
        processing_end_ms=batch_time + 900, batch_interval_ms=1000, attempts=1, errors=errors,
        state_operators=(StateOperatorProgress("sessions", 10, 0, 5, 5, 0, 0, 2, 1234, None, state_bytes=99_000),),
        excluded_executors=(ExcludedExecutor("7", "worker-2", NOW - 60_000),), backlog=3)


def write_records(storage: CheckpointStorage, *records: BatchProgress) -> None:
    log = ProgressLog(storage, keep=10)
    for r in records:
        log.on_progress(r)


def test_a_running_pipeline_shows_its_excluded_executors_and_the_batches_that_failed(tmp_path, capsys):
    storage = CheckpointStorage(str(tmp_path), warn=False)
    lease = Lease(storage, ManualClock(NOW), ttl_ms=10**12)  # held by this process, far from expiring
    lease.acquire()
    try:
        write_records(storage, record(NOW - 2000), record(NOW - 1000, "failed", ("output 'out': disk full",)))
        assert main(["status", str(tmp_path)]) == 0
        text = capsys.readouterr().out
        assert f"{tmp_path}: running" in text
        assert f"holder: {lease.holder} (pid {os.getpid()}" in text
        assert "excluded executor 7 on worker-2 since" in text
        assert "operator sessions: 1234 keys in state, about 99000 bytes" in text
        assert "run again by a restart" not in text  # the batch ran in one driver
        assert "backlog: 3 batches" in text
        assert "failed: output 'out': disk full" in text
        assert main(["status", str(tmp_path), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["state"] == "running" and status["backlog"] == 3
        assert status["last_batch"]["batch_time"] == NOW - 2000
        assert status["last_batch"]["excluded_executors"] == [
            {"executor_id": "7", "host": "worker-2", "since_ms": NOW - 60_000}]
        assert [r["status"] for r in status["failed_batches"]] == ["failed"]
    finally:
        lease.release()


def test_a_driver_that_died_holding_its_lease_is_shown_as_abandoned(tmp_path, capsys):
    storage = CheckpointStorage(str(tmp_path), warn=False)
    dead = subprocess.Popen(["true"])
    dead.wait()
    storage.replace(LEASE_FILE, seal(LeaseRecord("gone", socket.gethostname(), dead.pid, 4, 10**15).__dict__))
    write_records(storage, record(NOW - 1000))
    assert main(["status", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "abandoned"
    assert main(["status", str(tmp_path)]) == 0
    assert "abandoned: its driver died without releasing the lease" in capsys.readouterr().out


def test_bad_observer_settings_say_what_to_pass():
    with pytest.raises(ConfigurationError, match=r"metrics_port must be a TCP port \(0 for any free one\) or None"):
        ObserveSettings(metrics_port=70_000)
    with pytest.raises(ConfigurationError, match="dashboard_port must be a TCP port"):
        ObserveSettings(dashboard_port="4050")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="progress_records must be at least 1"):
        ObserveSettings(progress_records=0)
    assert ObserveSettings(metrics_port=0, dashboard_port=None).metrics_port == 0


def released_lease(storage: CheckpointStorage, holder: str, acquired_at_ms: int) -> None:
    storage.replace(LEASE_FILE, seal(LeaseRecord(holder, socket.gethostname(), os.getpid(), 2, 0, acquired_at_ms,
                                                 acquired_at_ms + 5000).__dict__))


def test_an_abandoned_location_does_not_show_the_graceful_stop_of_an_earlier_run(tmp_path, capsys):
    storage = CheckpointStorage(str(tmp_path), warn=False)
    record_stop_outcome(storage, StopOutcome("", "earlier", StopHow.GRACEFUL, NOW - 60_000, None))
    dead = subprocess.Popen(["true"])
    dead.wait()
    storage.replace(LEASE_FILE, seal(LeaseRecord("later", socket.gethostname(), dead.pid, 5, 10**15,
                                                 NOW - 30_000).__dict__))
    write_records(storage, record(NOW - 1000))
    assert main(["status", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "abandoned: its driver died without releasing the lease" in text
    assert "last stop" not in text
    assert main(["status", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["last_stop"] is None
    # A new start reads the same: how the last run ended is the abandonment, not the old stop.
    assert last_run_ended(Lease(storage, ManualClock(NOW)).read(), read_stop_outcome(storage)) == \
        "was abandoned: its driver died without releasing the lease"


def test_a_stop_recorded_by_the_last_holder_is_how_the_last_run_ended(tmp_path, capsys):
    storage = CheckpointStorage(str(tmp_path), warn=False)
    released_lease(storage, "last", NOW - 30_000)
    record_stop_outcome(storage, StopOutcome("", "last", StopHow.GRACEFUL, NOW - 2000, NOW - 3000))
    write_records(storage, record(NOW - 3000))
    assert main(["status", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert f"{tmp_path}: stopped" in text and "  last stop: graceful, at " in text
    assert last_run_ended(Lease(storage, ManualClock(NOW)).read(), read_stop_outcome(storage)) == \
        f"stopped gracefully at {format_batch_time(NOW - 2000)}"


def test_a_refused_start_shows_as_failed_naming_why(tmp_path, capsys):
    storage = CheckpointStorage(str(tmp_path), warn=False)
    released_lease(storage, "refused", NOW - 1000)
    record_stop_outcome(storage, StopOutcome("", "refused", StopHow.FAILED, NOW - 900, None, [],
                                             "start refused: operator 'op' keeps its state in 4 partitions"))
    assert main(["status", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert f"{tmp_path}: failed" in text
    assert "  last stop: failed (start refused: operator 'op' keeps its state in 4 partitions), at " in text
    assert main(["status", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "failed"


def test_a_mistyped_location_exits_3_saying_to_check_the_path(tmp_path, capsys):
    missing = tmp_path / "chekpoint"
    assert main(["status", str(missing)]) == 3
    captured = capsys.readouterr()
    assert captured.err.strip() == (f"batchline: nothing at {missing}: no checkpoint, lease or progress; "
                                    "check the path")
    assert not missing.exists()  # status reads; it creates nothing
    assert main(["status", str(missing), "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["state"] == "empty"


def test_a_stop_outcome_is_typed_in_memory_and_text_in_its_file(tmp_path, capsys):
    storage = CheckpointStorage(str(tmp_path), warn=False)
    released_lease(storage, "last", NOW - 30_000)
    outcome = StopOutcome("r1", "last", StopHow.GRACEFUL_TIMED_OUT, NOW - 2000, NOW - 3000, [NOW - 2000])
    record_stop_outcome(storage, outcome)
    written = unseal(storage.read(STOP_OUTCOME_FILE), STOP_OUTCOME_FILE)
    assert written == {"request_id": "r1", "holder": "last", "how": "graceful, timed out",
                       "stopped_at_ms": NOW - 2000, "last_committed": NOW - 3000, "unfinished": [NOW - 2000],
                       "reason": None}
    assert read_stop_outcome(storage) == outcome
    assert main(["status", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["last_stop"]["how"] == "graceful, timed out"
    # A way of stopping a later release added reads as failed, as the messages always told it.
    storage.replace(STOP_OUTCOME_FILE, seal({**written, "how": "paused", "paused_at_ms": NOW}))
    assert read_stop_outcome(storage) == StopOutcome("r1", "last", StopHow.FAILED, NOW - 2000, NOW - 3000,
                                                     [NOW - 2000])


def test_a_batch_rerun_after_a_restart_says_what_it_read_again(tmp_path, capsys):
    storage = CheckpointStorage(str(tmp_path), warn=False)
    rerun = dataclasses.replace(record(NOW - 1000), state_operators=(StateOperatorProgress(
        "sessions", 10, 0, 5, 5, 0, 0, 2, 1234, None, partitions_kept=6, rerun_note="everything its inputs hold"),))
    write_records(storage, rerun)
    assert main(["status", str(tmp_path)]) == 0
    assert "run again by a restart, which read: everything its inputs hold" in capsys.readouterr().out
