"""``batchline status`` and ``batchline stop`` as an operator uses them: a pipeline runs in this
process on real time, the command line runs as a process of its own and reaches it only through
the checkpoint location (a local folder, or S3)."""

import collections
import functools
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import pyarrow.dataset as ds

from batchline import ContextState, StreamingContext
from batchline.checkpoint.lease import Lease
from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import ManualClock
from batchline.observe.control import StopWatcher, request_stop
from batchline.testing import BatchRecorder, CollectSink
from tests.helpers import LineServer

CLI_TIMEOUT_S = 120


def cli(*args, storage_options=None, timeout=CLI_TIMEOUT_S):
    """``batchline ARGS`` as a process of its own, as an operator runs it from another terminal."""
    extra = ["--storage-options", json.dumps(storage_options)] if storage_options is not None else []
    return subprocess.run([sys.executable, "-m", "batchline.cli.main", *args, *extra],
                          capture_output=True, text=True, timeout=timeout)


def status_json(location, storage_options=None, exit_status=0):
    result = cli("status", location, "--json", storage_options=storage_options)
    assert result.returncode == exit_status, result.stdout + result.stderr
    return json.loads(result.stdout)


def assert_running_status(status, ssc, location):
    """What ``status --json`` says of a pipeline running in this process."""
    assert status["state"] == "running", status
    assert status["location"] == location
    lease = status["lease"]
    assert lease["pid"] == os.getpid()
    assert lease["host"] == socket.gethostname()
    assert lease["holder"] == ssc.checkpoint_manager.lease.holder
    assert lease["token"] == ssc.checkpoint_manager.lease.token
    assert lease["expires_at_ms"] > time.time() * 1000 - 1000  # not released
    assert 0 <= status["lease_age_ms"] < 15_000
    batch = status["last_batch"]
    assert batch is not None, status
    # The very record the pipeline made of that batch, as the other process read it.
    ours = {p.batch_time: p for p in ssc.recent_progress}
    assert batch["batch_time"] in ours, (batch["batch_time"], sorted(ours))
    assert batch == json.loads(json.dumps(ours[batch["batch_time"]].to_json()))
    assert batch["status"] == "completed"
    assert isinstance(batch["records"], int) and batch["records"] >= 0
    for delay in ("scheduling_delay_ms", "processing_ms", "total_delay_ms"):
        assert isinstance(batch[delay], int) and batch[delay] >= 0, (delay, batch)
    assert isinstance(status["backlog"], int) and status["backlog"] >= 0
    assert status["backlog"] == batch["backlog"]
    assert status["last_stop"] is None or status["last_stop"]["stopped_at_ms"] < lease["acquired_at_ms"]


# ----------------------------------------------------------------------- nothing there
def test_status_of_an_empty_location_exits_3_saying_to_check_the_path(tmp_path, s3_endpoint):
    for location, options in ((str(tmp_path / "never-used"), None), (str(tmp_path), None),
                              (f"s3://batchline-test/{uuid.uuid4().hex}/checkpoint", s3_endpoint)):
        status = status_json(location, options, exit_status=3)
        assert status["state"] == "empty", status
        assert status["location"] == location
        assert status["lease"] is None and status["last_batch"] is None and status["last_stop"] is None
        assert status["finished_inputs"] == {} and status["finished"] is False and status["backlog"] == 0
        text = cli("status", location, storage_options=options)
        assert text.returncode == 3, text.stdout + text.stderr
        assert text.stdout == ""
        assert text.stderr.strip() == (f"batchline: nothing at {location}: no checkpoint, lease or progress; "
                                       "check the path")
    assert list(tmp_path.iterdir()) == []  # status changes nothing, and creates nothing


def test_stop_where_nothing_runs_exits_3_and_says_so(tmp_path):
    location = str(tmp_path / "checkpoint")
    result = cli("stop", location, "--timeout", "5")
    assert result.returncode == 3, result.stdout + result.stderr
    assert f"no pipeline is running at {location}" in result.stdout
    assert not (tmp_path / "checkpoint" / "_stop_request.json").exists()


# ----------------------------------------------------------------------- a running pipeline, stopped
def test_status_of_a_running_pipeline_then_stop_from_the_command_line_processes_every_line(spark, tmp_path):
    location = str(tmp_path / "checkpoint")
    server = LineServer()
    ssc = StreamingContext(spark, "500ms", checkpoint=location)
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    sink = CollectSink(sort=False)
    ssc.socket_text_stream("127.0.0.1", server.port, block_interval="100ms").foreach_batch(sink, name="collect")
    ssc.start()
    sent = []
    try:
        first = [f"early-{i}" for i in range(300)]
        server.send(first)
        sent += first
        sink.wait_for_rows(lambda rows: len(rows) == len(first), timeout=60)
        status = status_json(location)
        assert_running_status(status, ssc, location)
        assert any(p.records for p in ssc.recent_progress)

        text = cli("status", location)
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert lines[0] == f"{location}: running"
        holder = ssc.checkpoint_manager.lease.holder
        assert any(line.strip().startswith(f"holder: {holder} (pid {os.getpid()} on ") for line in lines), lines
        assert any(line.strip().startswith("last completed batch: ") and " records" in line for line in lines), lines
        assert any(line.strip().startswith("backlog: ") for line in lines), lines

        last = [f"last-{i}" for i in range(3000)]
        server.send(last)
        sent += last
        stop = cli("stop", location, "--timeout", "60")
    finally:
        server.close()
        if ssc.state is ContextState.ACTIVE and not ssc.await_termination(30):
            ssc.stop(graceful=False)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert f"Asked {holder} " in stop.stdout and "to stop gracefully" in stop.stdout
    assert "Stopped gracefully: every received record was processed" in stop.stdout
    assert ssc.await_termination(10)
    assert ssc.state is ContextState.STOPPED
    received = [row["value"] for row in sink.all_rows()]
    assert len(received) == len(sent)
    assert collections.Counter(received) == collections.Counter(sent)  # each line once, none lost
    assert sum(p.records for p in ssc.recent_progress) == len(sent)

    after = status_json(location)
    assert after["state"] == "stopped", after
    assert after["lease"]["holder"] == holder and after["lease"]["expires_at_ms"] == 0
    assert after["last_stop"]["how"] == "graceful"
    assert after["last_stop"]["holder"] == holder
    assert after["last_stop"]["unfinished"] == []
    assert after["last_stop"]["last_committed"] == max(committed(recorder))
    assert after["last_batch"]["batch_time"] == ssc.last_progress.batch_time
    text = cli("status", location).stdout
    assert text.splitlines()[0] == f"{location}: stopped"
    assert f"last holder: {holder}" in text and "  last stop: graceful, at " in text

    again = cli("stop", location, "--timeout", "5")  # stopped: nobody to ask
    assert again.returncode == 3 and "no pipeline is running" in again.stdout, again.stdout + again.stderr


# ----------------------------------------------------------------------- an immediate stop, then a restart
@dataclass
class Seen:
    count: int


def number_events(slow_while, key, rows, state):
    """Numbers a user's events 1, 2, 3, ... across batches: an event committed twice, or a batch
    whose state counted twice, shows as a repeated or skipped number. While the file
    ``slow_while`` exists, each batch takes about twice the interval (three keys a partition,
    0.3 s each), so that batches are always running and queued when a stop comes, however fast
    the machine."""
    seen = state.get() if state.exists else Seen(0)
    count = seen.count
    out = []
    for row in rows:
        count += 1
        out.append({"id": key, "data": row.data, "n": count})
    if os.path.exists(slow_while):
        time.sleep(0.3)
    state.update(Seen(count))
    return out


def numbering_pipeline(spark, location, out, recorder, slow_while):
    # A graceful stop finishes every batch due by then, however far behind: none is left half done.
    ssc = StreamingContext(spark, "500ms", checkpoint=location, graceful_stop_timeout="90s")
    ssc.add_listener(recorder)
    events = ssc.generator_stream(rate=300, users=6, partitions=1, name="events")
    numbered = events.group_by_key("id").flat_map_groups_with_state(
        functools.partial(number_events, slow_while), state_schema=Seen,
        output_schema="id int, data string, n long", name="numbering", num_partitions=2)
    numbered.write_files(out, "parquet", name="numbered")
    return ssc


def committed(recorder):
    """The batches the run committed (a batch a stop cancelled completes with a failure)."""
    return [info.batch_time for info in recorder.completed if info.failure is None]


def not_committed(recorder):
    """Batches generated (their input logged) and not committed: queued, running or cancelled."""
    done = set(committed(recorder))
    return sorted({info.batch_time for info in recorder.submitted} - done)


def test_an_immediate_stop_then_a_restart_commits_nothing_twice(spark, tmp_path):
    location, out, slow = str(tmp_path / "checkpoint"), str(tmp_path / "out"), tmp_path / "slow"
    slow.touch()
    first_recorder = BatchRecorder()
    first = numbering_pipeline(spark, location, out, first_recorder, str(slow))
    first.start()
    try:
        first_recorder.wait_for_completed(2, timeout=90)
        first_recorder.wait_for_event("started", first_recorder.completed[-1].batch_time + 500, timeout=30)
        stop = cli("stop", location, "--immediate", "--timeout", "60")
    finally:
        if first.state is ContextState.ACTIVE and not first.await_termination(30):
            first.stop(graceful=False)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "to stop immediately" in stop.stdout
    assert "Stopped immediately: running batches were cancelled" in stop.stdout
    assert first.await_termination(10) and first.state is ContextState.STOPPED
    first_completed = committed(first_recorder)
    cut_short = not_committed(first_recorder)
    assert cut_short, "the immediate stop left no batch uncommitted"
    assert min(cut_short) > max(first_completed)

    status = status_json(location)
    assert status["state"] == "stopped", status
    assert status["last_stop"]["how"] == "immediate"
    assert status["last_stop"]["last_committed"] == max(first_completed)
    assert status["lease"]["expires_at_ms"] == 0
    # The last completed batch; the batches the stop cut short are listed as cancelled.
    assert status["last_batch"]["batch_time"] == max(first_completed)
    assert status["last_batch"]["status"] == "completed"
    cancelled = [r["batch_time"] for r in status["failed_batches"] if r["status"] == "cancelled"]
    assert cancelled and set(cancelled) <= set(cut_short), (cancelled, cut_short)
    assert "  last stop: immediate, at " in cli("status", location).stdout
    before = {int(t) for t in read_numbered(out).column("batch_time").to_pylist()}
    # write_files publishes a batch inside the batch's own job, so a stop that lands after that job
    # and before the batch's commit leaves its files visible and the batch uncommitted; the rerun
    # finds the output's commit record and writes nothing again (no event twice, checked below).
    assert {t for t in first_completed if has_rows(t, first_recorder)} <= before
    assert before <= set(first_completed) | set(cut_short), (before, first_completed, cut_short)

    slow.unlink()  # the same pipeline, faster: the batches due after the down time are soon done
    second_recorder = BatchRecorder()
    second = numbering_pipeline(spark, location, out, second_recorder, str(slow))
    second.start()
    try:
        second_recorder.wait_for_completed(len(cut_short) + 2, timeout=120)
    finally:
        second.stop(graceful=True)
    assert second.await_termination(10)
    second_completed = committed(second_recorder)
    assert set(cut_short) <= set(second_completed)  # the batches cut short ran again
    assert not_committed(second_recorder) == []
    assert not set(first_completed) & set(second_completed)

    table = read_numbered(out)
    written = {int(t) for t in table.column("batch_time").to_pylist()}
    assert written == {t for t in first_completed + second_completed if has_rows(t, first_recorder,
                                                                                    second_recorder)}
    data = table.column("data").to_pylist()
    counts = collections.Counter(data)
    assert [d for d, c in counts.items() if c > 1] == []  # no event written twice
    numbers = sorted(int(d.split("-")[1]) for d in data)
    assert numbers == list(range(len(numbers)))  # none lost: events 0, 1, 2, ... as generated
    # The second run's records begin with those the first left at the location.
    assert [p.batch_time for p in second.recent_progress[:len(first.recent_progress)]] == [
        p.batch_time for p in first.recent_progress]
    assert len(numbers) == sum(p.records for p in second.recent_progress if p.status == "completed")
    by_user = collections.defaultdict(list)
    for user, n in zip(table.column("id").to_pylist(), table.column("n").to_pylist(), strict=True):
        by_user[user].append(n)
    for user, ns in by_user.items():
        # The state counted each event once: a user's numbers are 1..(its events in the output).
        assert sorted(ns) == list(range(1, len(ns) + 1)), (user, sorted(ns))


def has_rows(batch_time, *recorders):
    """Whether the batch had events (the file output writes nothing for a batch without rows)."""
    return any(info.num_records for recorder in recorders for info in recorder.completed
               if info.batch_time == batch_time and info.failure is None)


def read_numbered(out):
    return ds.dataset(out, format="parquet", partitioning="hive").to_table()


# ----------------------------------------------------------------------- a finished pipeline
def test_status_of_a_finished_pipeline_names_the_finished_input(spark, tmp_path):
    location = str(tmp_path / "checkpoint")
    ssc = StreamingContext(spark, "500ms", checkpoint=location)
    sink = CollectSink()

    def slow_first(df, batch_time):
        if not sink.batches:
            time.sleep(1.5)  # the next batches are generated meanwhile, the last one taking the input's end
        sink(df, batch_time)

    ssc.generator_stream(1_000_000, total=120, max_records_per_batch=50, name="backfill").foreach_batch(slow_first)
    assert ssc.run_until_finished(timeout=60)
    assert len(sink.all_rows()) == 120
    status = status_json(location)
    assert status["state"] == "finished", status
    assert status["finished"] is True
    assert list(status["finished_inputs"]) == ["backfill"]
    # 50 + 50 + 20 events: the input ended with its third batch, the final checkpoint is of that or a later one.
    ended = sorted(p.batch_time for p in ssc.recent_progress if p.records)[2]
    assert status["finished_inputs"]["backfill"] == ended <= status["checkpoint_time"]
    assert status["lease"]["expires_at_ms"] == 0
    # The records say when the input ended: not in the batches before its last records, though it
    # had already ended (batches are generated ahead) when their records were made.
    assert [(p.inputs[0].records, p.inputs[0].finished) for p in ssc.recent_progress if p.inputs] == [
        (50, False), (50, False), (20, True)]
    assert status["last_batch"]["batch_time"] == ssc.last_progress.batch_time
    text = cli("status", location).stdout
    assert text.splitlines()[0] == f"{location}: finished"
    assert "  input backfill finished after batch " in text
    assert "  the pipeline finished: every input ended and every output committed" in text
    assert cli("stop", location, "--timeout", "5").returncode == 3


# ----------------------------------------------------------------------- on S3
def test_status_and_stop_through_a_checkpoint_on_s3(spark, s3_endpoint):
    location = f"s3://batchline-test/{uuid.uuid4().hex}/checkpoint"
    ssc = StreamingContext(spark, "500ms", checkpoint=location, checkpoint_storage_options=s3_endpoint)
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    sink = CollectSink()
    ssc.generator_stream(200, users=5, name="events").foreach_batch(sink)
    ssc.start()
    try:
        recorder.wait_for_completed(2, timeout=60)
        assert_running_status(status_json(location, s3_endpoint), ssc, location)
        stop = cli("stop", location, "--timeout", "60", storage_options=s3_endpoint)
    finally:
        if ssc.state is ContextState.ACTIVE and not ssc.await_termination(30):
            ssc.stop(graceful=False)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "Stopped gracefully" in stop.stdout
    assert ssc.await_termination(10) and ssc.state is ContextState.STOPPED
    status = status_json(location, s3_endpoint)
    assert status["state"] == "stopped", status
    assert status["last_stop"]["how"] == "graceful"
    assert status["last_stop"]["last_committed"] == max(committed(recorder))
    assert status["last_batch"]["batch_time"] == ssc.last_progress.batch_time
    assert status["lease"]["pid"] == os.getpid() and status["lease"]["expires_at_ms"] == 0
    assert len(sink.all_rows()) == sum(p.records for p in ssc.recent_progress)


# ----------------------------------------------------------------------- the driver's side, without Spark
def test_a_stop_request_for_an_older_lease_token_is_ignored(tmp_path):
    storage = CheckpointStorage(str(tmp_path), warn=False)
    clock = ManualClock(1_000_000)
    old = Lease(storage, clock)
    assert old.acquire() == 1
    stale, _ = request_stop(storage, clock, immediate=False)  # meant for the driver with token 1
    assert stale.token == 1
    old.release()
    new = Lease(storage, clock)
    assert new.acquire() == 2
    handed = []
    watcher = StopWatcher(storage, clock, lambda: new.token, 500, handed.append)
    try:
        assert watcher.poll_once() is None
        assert handed == []

        fresh, holder = request_stop(storage, clock, immediate=True)
        assert holder.token == 2 and fresh.token == 2
        assert watcher.poll_once() == fresh
        assert handed == [fresh] and fresh.immediate
        assert watcher.poll_once() is None  # handed on once
        assert handed == [fresh]
    finally:
        new.release()
