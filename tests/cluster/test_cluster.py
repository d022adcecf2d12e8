"""Executor faults on a real Spark standalone cluster (issue 12, SPEC H1, H2, H4): a faulty
executor is excluded, an executor JVM killed mid-batch loses nothing, and a driver killed at
random resumes from its checkpoint on the S3 endpoint. The drivers are processes of their own
(tests/drivers/cluster_driver.py): one SparkContext per process, and this one already has its own."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import s3fs
from pyspark.sql import functions as F

from batchline.state import read_state
from harness.numbering import SEED, USERS, numbered_output, write_event_files
from tests.helpers import DRIVERS, poll_until

DRIVER = DRIVERS / "cluster_driver.py"
TOTAL = 2400


class ClusterDriver:
    def __init__(self, cluster, locations, log: Path, *flags: str) -> None:
        checkpoint, out, options = locations
        self.log = log
        with open(log, "ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(DRIVER), cluster.url, checkpoint, out, json.dumps(options),
                 "--total", str(TOTAL), *flags],
                stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
            )
        self.completed: list[tuple[int, int, int, str]] = []
        self.progress: list[tuple[int, str, int]] = []
        self.stages_rerun: int | None = None
        self.started = threading.Event()
        self.finished = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith("started"):
                self.started.set()
            elif line.startswith("finished"):
                self.finished = True
            elif line.startswith("completed "):
                _, batch, records, attempts, excluded = line.split()
                self.completed.append((int(batch), int(records), int(attempts), excluded))
            elif line.startswith("progress "):
                _, batch, status, records = line.split()
                self.progress.append((int(batch), status, int(records)))
            elif line.startswith("stages rerun "):
                self.stages_rerun = int(line.split()[2])

    def wait(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout)
            self._reader.join(10)  # every line it printed is read
            return code
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the driver did not end in {timeout:.0f} s; its log ends:\n{self.tail()}") from None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def locations(s3_endpoint):
    run = uuid.uuid4().hex[:8]
    return f"s3://batchline-test/cluster-{run}/checkpoint", f"s3://batchline-sink/cluster-{run}/out", s3_endpoint


@pytest.fixture(scope="module")
def expected(spark):
    """Every event numbered within its user, in index order, as any correct run writes it."""
    users = spark.range(TOTAL).select(
        "id", F.pmod(F.xxhash64(F.lit(SEED), F.col("id")), F.lit(USERS)).cast("int").alias("user")).collect()
    counts: dict[int, int] = collections.Counter()
    rows = []
    for index, user in sorted((r.id, r.user) for r in users):
        counts[user] += 1
        rows.append((f"event-{index}", user, counts[user]))
    return collections.Counter(rows), dict(counts)


def output_rows(locations) -> collections.Counter:
    _, out, options = locations
    return numbered_output(out, options)


def assert_equal_to_an_uninterrupted_run(spark, locations, expected) -> None:
    rows, counts = expected
    got = output_rows(locations)
    repeated = sorted(row for row, n in got.items() if n > 1)
    assert not repeated, f"rows written twice: {repeated[:5]}"
    assert set(got) == set(rows), (f"missing {sorted(set(rows) - set(got))[:5]}, "
                                   f"unexpected {sorted(set(got) - set(rows))[:5]}")
    checkpoint, _, options = locations
    try:
        state = read_state(spark, checkpoint, "numbering", storage_options=options).collect()
    except Exception as error:
        fs = s3fs.S3FileSystem(**options)
        fs.invalidate_cache()
        files = sorted(p.rsplit("/checkpoint/", 1)[1] for p in fs.find(checkpoint.removeprefix("s3://"))
                       if "/state/" in p or p.endswith("completed.json"))
        raise AssertionError(f"the state is unreadable ({error}); files:\n" + "\n".join(files)) from error
    state = {r["id"]: r["count"] for r in state}
    assert state == counts


def test_a_faulty_executor_is_excluded_and_the_output_equals_a_fault_free_run(
        spark, standalone_cluster, locations, expected, tmp_path):
    """Every task of the state function fails on worker 2's executor; Spark retries them on
    worker 1's and excludes worker 2's, which batchline reports per batch and in its log."""
    driver = ClusterDriver(standalone_cluster, locations, tmp_path / "driver.log", "--faulty-worker", "2")
    assert driver.wait(300) == 0 and driver.finished, driver.tail()
    log = driver.log.read_text()
    excluded = {e for *_, e in driver.completed if e != "-"}
    assert len(excluded) == 1, f"expected one excluded executor in the batch information, got {excluded}"
    (executor_id,) = excluded
    faulty_dirs = {p.name for p in (standalone_cluster.directory / "worker-2").glob("app-*/*")}
    assert executor_id in faulty_dirs, f"executor {executor_id} is not worker 2's ({faulty_dirs})"
    assert any("injected fault" in p.read_text(errors="replace")
               for p in (standalone_cluster.directory / "worker-2").glob(f"app-*/{executor_id}/stderr"))
    assert f"Spark excluded executor {executor_id} on 127.0.0.1" in log
    assert driver.completed[-1][3] == executor_id, "the executor stays excluded to the end (timeout 1h)"
    # Spark's task retries on the healthy executor were enough: no batch had to run again.
    assert {attempts for _, _, attempts, _ in driver.completed} == {1}
    assert_equal_to_an_uninterrupted_run(spark, locations, expected)


def test_an_executor_jvm_killed_mid_batch_loses_and_duplicates_nothing(
        spark, standalone_cluster, locations, expected, tmp_path):
    """The state function holds in the middle of a partition; the test SIGKILLs its executor.
    Spark runs the task again on the other executor, which rebuilds the partition's state from
    the checkpoint on S3, and the worker starts a new executor in place of the dead one."""
    hold = tmp_path / "hold"
    driver = ClusterDriver(standalone_cluster, locations, tmp_path / "driver.log",
                           "--hold-file", str(hold), "--hold-at", str(TOTAL // 3))
    held = poll_until(lambda: hold.exists() and hold.read_text(), 180, 0.05,
                      stop=lambda: driver.process.poll() is not None)
    assert held, f"no task held event {TOTAL // 3}:\n{driver.tail()}"
    pid = int(held)
    executors = standalone_cluster.executor_pids()
    assert pid in executors.values(), f"{pid} is not an executor JVM of the cluster ({executors})"
    worker = next(w for w, p in executors.items() if p == pid)
    os.kill(pid, signal.SIGKILL)
    replaced = poll_until(lambda: standalone_cluster.executor_pids().get(worker) not in (None, pid), 180, 0.2,
                          stop=lambda: driver.process.poll() is not None)
    assert driver.wait(300) == 0 and driver.finished, driver.tail()
    assert replaced is not None, f"worker {worker} started no new executor while the driver ran"
    assert_equal_to_an_uninterrupted_run(spark, locations, expected)


def test_random_kill_9s_of_the_driver_on_the_cluster_with_the_checkpoint_on_s3(
        spark, standalone_cluster, locations, expected, tmp_path):
    rng = random.Random(12)
    kills = 0
    for attempt in range(5):
        driver = ClusterDriver(standalone_cluster, locations, tmp_path / "driver.log")
        if attempt == 0:
            time.sleep(rng.uniform(2.0, 6.0))  # during start-up
        else:
            assert driver.started.wait(120), driver.tail()
            time.sleep(rng.uniform(0.5, 8.0))  # in batches, commits, checkpoints, the final one
        if driver.process.poll() is not None:
            break  # it finished before the kill
        driver.kill()
        kills += 1
    assert kills >= 4, f"only {kills} kills landed before the pipeline finished"
    driver = ClusterDriver(standalone_cluster, locations, tmp_path / "driver.log")
    assert driver.wait(300) == 0 and driver.finished, driver.tail()
    assert_equal_to_an_uninterrupted_run(spark, locations, expected)


EVENT_FILES = 6
"""The file input's events in six files, two a batch: 800 events a batch in two map tasks."""


def test_a_worker_lost_mid_shuffle_counts_each_input_row_once(
        spark, standalone_cluster, locations, expected, tmp_path):
    """A batch's input rows are read and counted (``observe``) in the map stage of the
    shuffle before the state function. The state function holds in the first batch and the
    test SIGKILLs its executor, whose map output (no external shuffle service) goes with it:
    the reduce tasks fail to fetch it, Spark runs the map stage again for the lost map tasks,
    and they read and count their file a second time. Spark 4.3's ``observe()`` keeps only
    the last attempt of each task of an RDD (``LastAttemptAggregatingAccumulator``; its
    legacy setting ``spark.sql.legacy.observeMetricsAggregateAllAttempts=true`` adds every
    attempt's counts, and a map task that runs again counts its rows twice, as it did before
    4.3). Spark's default (false) is exact; the driver sets the legacy setting in its session,
    as a user may, and batchline must switch it back for its counts to stay exact (without
    that, the first batch counts 1,200 rows for its 800). Each executor runs one of the batch's
    two file map tasks (two free one-core executors, two tasks first in line), so the lost one
    takes a file's map output. Each batch's record count (its progress record and its batch
    information) must be its 800 events, and the output that of a fault-free run."""
    rows, _ = expected
    events = sorted(((event, user) for event, user, _ in rows), key=lambda e: int(e[0].split("-")[1]))
    write_event_files(tmp_path / "events", events, EVENT_FILES)
    hold = tmp_path / "hold"
    driver = ClusterDriver(standalone_cluster, locations, tmp_path / "driver.log",
                           "--input-dir", str(tmp_path / "events"), "--hold-file", str(hold), "--hold-at", "100",
                           "--conf", "spark.sql.legacy.observeMetricsAggregateAllAttempts=true",
                           # Workers on one machine read each other's shuffle files from the disk
                           # (Spark's host-local read), which a killed executor leaves behind; a worker
                           # lost on a machine of its own takes its map output with it: fetches fail.
                           "--conf", "spark.shuffle.readHostLocalDisk=false")
    held = poll_until(lambda: hold.exists() and hold.read_text(), 180, 0.05,
                      stop=lambda: driver.process.poll() is not None)
    assert held, f"no task held event 100:\n{driver.tail()}"
    pid = int(held)
    assert pid in standalone_cluster.executor_pids().values(), "the held task runs in no executor of the cluster"
    os.kill(pid, signal.SIGKILL)
    assert driver.wait(300) == 0 and driver.finished, driver.tail()
    assert "FetchFailed" in driver.log.read_text(), f"no fetch failed after the executor was lost:\n{driver.tail()}"
    assert driver.stages_rerun, f"no Spark stage ran a second attempt after the fetch failure:\n{driver.tail()}"
    per_file = TOTAL // EVENT_FILES
    batches = [(batch, records) for batch, status, records in driver.progress if status == "completed" and records]
    assert [records for _, records in batches] == [2 * per_file] * (EVENT_FILES // 2), \
        f"records per batch in the progress records: {batches}"
    completed = [(batch, records, attempts) for batch, records, attempts, _ in driver.completed if records]
    assert [(records, attempts) for _, records, attempts in completed] == [(2 * per_file, 1)] * (EVENT_FILES // 2), \
        f"records and attempts per batch in the batch information: {completed}"
    assert_equal_to_an_uninterrupted_run(spark, locations, expected)
