"""A Python worker killed with SIGKILL in the middle of a stateful batch on ``local[2]`` loses
nothing (issue 12, SPEC H4). A local master never retries a task, so the Spark job fails and
batchline's batch retry runs the batch again; the new task rebuilds the partition's state from
the checkpoint location, and the output and state equal an uninterrupted run's."""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from pathlib import Path

import pyarrow.json as pa_json
import pytest

from batchline import StreamingContext
from batchline.scheduler.retry import RetryPolicy
from batchline.state import read_state
from batchline.testing import END, BatchRecorder, list_stream
from tests.helpers import LogWatcher

KEYS, PER_BATCH, BATCHES = 12, 48, 4
KILL_BATCH, KILL_AFTER_CALLS = 2, 3


def batches() -> list[list[tuple[str, int]]]:
    """Rows ``(key, value)``; values count up over the whole input, so each batch has its own."""
    return [[(f"k{v % KEYS:02d}", v) for v in range(b * PER_BATCH, (b + 1) * PER_BATCH)] for b in range(BATCHES)]


def expected() -> tuple[collections.Counter, dict[str, int]]:
    """Each row numbered within its key in value order: any correct run writes exactly these."""
    counts: dict[str, int] = collections.Counter()
    rows = []
    for key, value in (row for batch in batches() for row in batch):
        counts[key] += 1
        rows.append((key, value, counts[key]))
    return collections.Counter(rows), dict(counts)


def make_numbering(marker: Path, pid_file: Path | None):
    """Numbers each key's rows; in batch KILL_BATCH, after it has numbered and updated other
    keys of its partition, the task's Python worker is killed once: by itself, or (with
    ``pid_file``) by the test, while the worker waits."""
    calls_in_kill_batch = collections.Counter()

    def number(key, rows, state):
        (count,) = state.get() if state.exists else (0,)
        rows = sorted(rows, key=lambda r: r.value)
        for row in rows:
            count += 1
            yield (key, row.value, count)
        state.update((count,))
        if rows[0].value // PER_BATCH == KILL_BATCH:
            calls_in_kill_batch[os.getpid()] += 1
            if calls_in_kill_batch[os.getpid()] == KILL_AFTER_CALLS:
                kill_once(marker, pid_file)

    return number


def kill_once(marker: Path, pid_file: Path | None) -> None:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    if pid_file is None:
        os.kill(os.getpid(), signal.SIGKILL)
    pid_file.write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the test kills this process
        time.sleep(0.05)


def kill_from_outside(pid_file: Path, done: threading.Event, killed: list[int]) -> None:
    while not done.is_set():
        if pid_file.exists() and pid_file.read_text():
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert b"pyspark" in cmdline or b"python" in cmdline, cmdline
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.05)


def output_rows(out: Path) -> collections.Counter:
    """Every visible JSON part file, each read by pyarrow."""
    rows: collections.Counter = collections.Counter()
    for path in out.glob("batch_time=*/part-*"):
        table = pa_json.read_json(path)
        rows.update(zip(table["key"].to_pylist(), table["value"].to_pylist(), table["seq"].to_pylist(), strict=True))
    return rows


@pytest.mark.parametrize("killer", ["itself", "the test"])
def test_a_python_worker_killed_mid_batch_loses_and_duplicates_nothing(spark, tmp_path, killer):
    marker, pid_file = tmp_path / "killed", tmp_path / "worker.pid" if killer == "the test" else None
    checkpoint, out = str(tmp_path / "checkpoint"), tmp_path / "out"
    ssc = StreamingContext(spark, "200ms", checkpoint=checkpoint,
                           retry=RetryPolicy(max_attempts=3, initial_backoff="100ms"))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    rows = list_stream(ssc, [*batches(), END], "key string, value long", bounded=True)
    rows.group_by_key("key").flat_map_groups_with_state(
        make_numbering(marker, pid_file), state_schema="count long", output_schema="key string, value long, seq long",
        name="numbering", num_partitions=2).write_files(str(out), "json")
    done, killed = threading.Event(), []
    if pid_file is not None:
        threading.Thread(target=kill_from_outside, args=(pid_file, done, killed), daemon=True).start()
    try:
        with LogWatcher() as log:
            assert ssc.run_until_finished(timeout=120)
    finally:
        done.set()
    assert marker.exists(), "no worker was killed"
    if pid_file is not None:
        assert killed == [int(pid_file.read_text())]

    # The batch failed once and ran again; every other batch ran once.
    attempts = sorted(info.attempts for info in recorder.completed if info.num_records)
    assert attempts == [1] * (BATCHES - 1) + [2], attempts
    retries = [m for m in log.messages(level=30) if "(attempt 1 of 3)" in m]
    assert len(retries) == 1 and "retrying in 100 ms" in retries[0], log.messages(level=30)

    rows_expected, counts = expected()
    got = output_rows(out)
    assert {row: n for row, n in got.items() if n > 1} == {}, "rows written twice"
    assert got == rows_expected
    state = {r["key"]: r["count"] for r in read_state(spark, checkpoint, "numbering").collect()}
    assert state == counts
