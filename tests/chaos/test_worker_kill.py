"""A Python worker killed with SIGKILL in the middle of a stateful batch on ``local[2]`` loses
nothing (issue 12, point 4). A local master never retries a task (task.maxFailures is 1), so
the Spark job fails and batchline's batch retry (SPEC H3) runs the batch again; the new task
rebuilds the partition's state from the checkpoint location, and the output and the state
equal an uninterrupted run's.

The doomed task dies in the third key of its partition, after it updated the state of two
other keys and yielded their output rows; either it SIGKILLs its own process (``itself``), or
it writes its pid and waits, and the test checks that the pid is a PySpark worker and
SIGKILLs it from outside (``the test``).

Either way the kill waits until Spark has recorded the other partition's task as finished:
a task's accumulator updates reach the driver when Spark takes its success, so the value
the other task adds to ``finished_keys`` says so. That fixes which of the two results Spark
takes first, and so the course of the batch: the retry runs the killed partition only.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.json as pa_json
import pytest
from pyspark import TaskContext

from batchline import StreamingContext
from batchline.scheduler.retry import RetryPolicy
from batchline.spark import WORKER_DAEMON
from batchline.state import read_state
from batchline.testing import END, BatchRecorder, list_stream
from tests.helpers import LogWatcher, wait_for

SCHEDULER = "batchline.scheduler.job_scheduler"
BATCH_RUN = "batchline.scheduler.batch_run"
"""Where a batch says it retries, runs again or was cancelled."""
OPERATOR = "numbering"
KEYS, PER_BATCH, BATCHES = 12, 48, 4
KILL_BATCH = 2
"""The third batch: the state it builds on went through two batches already."""
KILL_AT_CALL = 3
"""The doomed task dies in its third key, after updating two others."""
WAIT_S = 60


def batches() -> list[list[tuple[str, int]]]:
    """Rows ``(key, value)``; values count up over the whole input, so each batch has its own."""
    return [[(f"k{v % KEYS:02d}", v) for v in range(b * PER_BATCH, (b + 1) * PER_BATCH)] for b in range(BATCHES)]


def expected() -> tuple[collections.Counter, dict[str, int]]:
    """Each row numbered within its key in value order: any correct run writes exactly these
    rows, and ends with these counts."""
    counts: dict[str, int] = collections.Counter()
    rows = []
    for key, value in (row for batch in batches() for row in batch):
        counts[key] += 1
        rows.append((key, value, counts[key]))
    return collections.Counter(rows), dict(counts)


def poll(condition: Callable[[], object], what: str, timeout: float = WAIT_S,
         stop: threading.Event | None = None) -> object:
    """``condition()``'s first true value, polled every 20 ms; TimeoutError after ``timeout``."""
    return wait_for(condition, what, timeout, 0.02, stop=stop.is_set if stop is not None else None)


class Injection:
    """The kill, arranged through files in ``directory``; travels to the Python workers with the
    state function. ``mode``: ``itself`` or ``the test`` (see the module)."""

    def __init__(self, directory: Path, mode: str) -> None:
        self.mode = mode
        self.marker = directory / "killed"
        """Created exclusively by the doomed task: one kill across processes and attempts."""
        self.waiting = directory / "waiting"
        """The doomed worker's pid, written once it waits for the test."""
        self.go = directory / "go"
        self.calls = directory / "calls.log"
        """``<task> <pid> <partition> <key>`` for each call of the function in the kill batch."""

    def after_call(self, key: str) -> None:
        """Called after each key of the kill batch, its state updated and its rows yielded."""
        context = TaskContext.get()
        task, partition = context.taskAttemptId(), context.partitionId()
        with open(self.calls, "a") as log:  # one short append: whole, even if the process dies next
            log.write(f"{task} {os.getpid()} {partition} {key}\n")
        if self.calls_of(task) != KILL_AT_CALL or not self._claim(task):
            return
        temporary = self.waiting.with_suffix(".tmp")
        temporary.write_text(str(os.getpid()))
        os.replace(temporary, self.waiting)
        if self.mode == "itself":
            poll(self.go.exists, "go from the test")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(WAIT_S)  # the test kills this process
        raise RuntimeError("the test did not kill this Python worker")

    def calls_of(self, task: int) -> int:
        return sum(1 for line in self.calls.read_text().splitlines() if int(line.split()[0]) == task)

    def _claim(self, task: int) -> bool:
        try:
            marker = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(marker, f"{task} {os.getpid()}".encode())
        os.close(marker)
        return True

    def doomed(self) -> tuple[int, int]:
        """The killed task and its process."""
        task, pid = self.marker.read_text().split()
        return int(task), int(pid)

    def call_log(self) -> list[tuple[int, int, int, str]]:
        rows = [line.split() for line in self.calls.read_text().splitlines()]
        return [(int(task), int(pid), int(partition), key) for task, pid, partition, key in rows]


def make_numbering(injection: Injection, finished_keys):
    """Numbers each key's rows, in value order, across batches; its state is the key's count."""

    def number(key, rows, state):
        (count,) = state.get() if state.exists else (0,)
        rows = sorted(rows, key=lambda r: r.value)
        for row in rows:
            count += 1
            yield (key, row.value, count)
        state.update((count,))
        if rows[0].value // PER_BATCH == KILL_BATCH:
            finished_keys.add(1)  # reaches the driver when Spark records this task as finished
            injection.after_call(key)

    return number


def conduct(injection: Injection, finished_keys, stop: threading.Event, killed: list[int],
            errors: list[BaseException]) -> None:
    """The test's side of ``itself`` and ``the test``: once the doomed worker waits and Spark has
    recorded the other partition's task as finished, say go, or kill the worker."""
    try:
        pid = int(poll(lambda: injection.waiting.exists() and injection.waiting.read_text(),
                       "worker waiting to be killed", stop=stop))
        poll(lambda: finished_keys.value > 0, "finished task of the other partition", stop=stop)
        if injection.mode == "itself":
            injection.go.touch()
            return
        assert pid != os.getpid(), "the pid is the test's own process"
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        # Local sessions fork their workers from batchline's daemon, clusters from PySpark's.
        assert {b"pyspark.daemon", WORKER_DAEMON.encode()} & set(cmdline), \
            f"process {pid} is not a PySpark worker: {cmdline}"
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    except BaseException as error:
        errors.append(error)


def output_rows(out: Path) -> collections.Counter:
    """Every visible JSON part file's rows, each file read by pyarrow."""
    rows: collections.Counter = collections.Counter()
    for path in out.glob("batch_time=*/part-*"):
        table = pa_json.read_json(path)
        rows.update(zip(table["key"].to_pylist(), table["value"].to_pylist(), table["seq"].to_pylist(), strict=True))
    return rows


@pytest.mark.parametrize("mode", ["itself", "the test"], ids=["killed-by-itself", "killed-from-outside"])
def test_a_python_worker_killed_mid_batch_loses_and_duplicates_nothing(spark, tmp_path, mode):
    checkpoint, out = str(tmp_path / "checkpoint"), tmp_path / "out"
    injection = Injection(tmp_path, mode)
    finished_keys = spark.sparkContext.accumulator(0)
    ssc = StreamingContext(spark, "200ms", checkpoint=checkpoint,
                           retry=RetryPolicy(max_attempts=3, initial_backoff="100ms"))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    rows = list_stream(ssc, [*batches(), END], "key string, value long", bounded=True)
    rows.group_by_key("key").flat_map_groups_with_state(
        make_numbering(injection, finished_keys), state_schema="count long",
        output_schema="key string, value long, seq long", name=OPERATOR, num_partitions=2,
    ).write_files(str(out), "json", name="out")
    stop, killed, errors = threading.Event(), [], []
    conductor = threading.Thread(target=conduct, args=(injection, finished_keys, stop, killed, errors), daemon=True)
    conductor.start()
    try:
        with LogWatcher() as log:
            finished = ssc.run_until_finished(timeout=120)
    finally:
        stop.set()
        ssc.stop()
        if conductor.is_alive():
            conductor.join(10)
    assert finished, "the pipeline did not finish within 120 s"
    assert errors == []
    assert injection.marker.exists(), "no worker was killed"

    # The doomed task numbered and updated two keys of its partition, died in the third, and a
    # task in another process ran the partition again from the state before the batch.
    doomed, dead_pid = injection.doomed()
    if mode == "the test":
        assert killed == [dead_pid]
    tasks = collections.defaultdict(list)
    for task, pid, partition, key in injection.call_log():
        tasks[task].append((pid, partition, key))
    assert len(tasks[doomed]) == KILL_AT_CALL, tasks
    partition = tasks[doomed][0][1]
    again = [task for task in tasks if task != doomed and tasks[task][0][1] == partition]
    assert len(again) == 1, tasks
    assert dead_pid not in {pid for pid, _, _ in tasks[again[0]]}
    assert {key for _, _, key in tasks[doomed]} < {key for _, _, key in tasks[again[0]]}

    # The batch failed once and ran again; every other batch ran once; the pipeline went on.
    with_input = sorted((info for info in recorder.completed if info.num_records), key=lambda i: i.batch_time)
    assert [info.attempts for info in with_input] == [2 if b == KILL_BATCH else 1 for b in range(BATCHES)]
    assert all(info.failure is None for info in recorder.completed) and recorder.errors == []
    progress = with_input[KILL_BATCH].state_operators[OPERATOR]
    assert (progress.input_rows, progress.keys_called, progress.output_rows, progress.state_keys) == (
        PER_BATCH, KEYS, PER_BATCH, KEYS)
    warnings = [r.getMessage() for r in log.records
                if r.name in (SCHEDULER, BATCH_RUN) and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"failed in operator '{OPERATOR}' (attempt 1 of 3)" in warnings[0], warnings
    assert warnings[0].endswith("; retrying in 100 ms"), warnings
    assert any(m.startswith("Running batch") and m.endswith("again (attempt 2 of 3)") for m in log.messages(BATCH_RUN))

    rows_expected, counts = expected()
    got = output_rows(out)
    assert {row: n for row, n in got.items() if n > 1} == {}, "rows written twice"
    assert sorted(set(rows_expected) - set(got)) == [], "rows lost"
    assert got == rows_expected
    state = {r["key"]: r["count"] for r in read_state(spark, checkpoint, OPERATOR).collect()}
    assert state == counts
