"""A driver killed in the middle of a stateful batch: the restart re-runs only the state
partitions that had not recorded their finish (SPEC F1–F3), and the output, the state and the
batch's statistics are an uninterrupted run's."""

import collections
import dataclasses
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from batchline import BatchFailedError
from batchline.batch_time import format_batch_time
from batchline.state import read_state
from batchline.testing import BatchHarness
from tests.helpers import DRIVERS, poll_until

DRIVER = DRIVERS / "partition_recovery_driver.py"
EVENTS, USERS, PARTITIONS = 40_000, 4_000, 8
BLOCKED = (6, 7)


class Driver:
    """tests/drivers/partition_recovery_driver.py in a process of its own; stdout lines are kept."""

    def __init__(self, work: Path, name: str, checkpoint: Path, out: Path, calls: Path, master: str,
                 block: tuple[int, ...] = ()):
        env = dict(os.environ)
        env.pop("BLOCK_PARTITIONS", None)
        if block:
            env["BLOCK_PARTITIONS"] = ",".join(str(p) for p in block)
        self.name = name
        self.stderr_path = work / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 - closed in wait_exit/kill
        self.process = subprocess.Popen(
            [sys.executable, str(DRIVER), str(checkpoint), str(out), str(calls), "--master", master],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env,
        )
        self.lines: list[str] = []
        self.started_at = time.monotonic()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def completed(self) -> dict[int, tuple[int, int]]:
        """Batch time -> (keys_called, input_rows) of every completed batch."""
        done = {}
        for line in list(self.lines):
            if line.startswith("completed "):
                assert len(line.split()) == 4, f"a malformed line from the driver: {line!r}"
                _, batch_time, keys, rows = line.split()
                done[int(batch_time)] = (int(keys), int(rows))
        return done

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"driver {self.name} did not exit within {timeout} s\n{self.context()}")
        finally:
            self._reader.join(10)
            self._stderr.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self._reader.join(10)
        self._stderr.close()

    def context(self) -> str:
        stderr = self.stderr_path.read_text(errors="replace").splitlines()
        return (f"--- driver {self.name}, {time.monotonic() - self.started_at:.1f} s after its start\n"
                "--- stdout (last 40 lines)\n" + "\n".join(self.lines[-40:])
                + "\n--- stderr (last 40 lines)\n" + "\n".join(stderr[-40:]))


@dataclasses.dataclass
class Reference:
    batch_time: int
    stats: tuple[int, int]
    output: list[dict]
    state: list[dict]
    partition_of: dict[int, int]


def read_output(out: Path) -> tuple[list[dict], set[int]]:
    """What a plain pyarrow reader sees: the rows (sorted by user, without the batch_time
    directory column) and the batch times."""
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    rows = table.to_pylist()
    batch_times = {int(row.pop("batch_time")) for row in rows}
    return sorted(rows, key=lambda r: r["user"]), batch_times


def read_state_rows(spark, checkpoint: Path) -> list[dict]:
    rows = [row.asDict() for row in read_state(spark, str(checkpoint), "sessions").collect()]
    return sorted(rows, key=lambda r: r["user"])


def read_calls(calls: Path) -> list[tuple[int, int]]:
    found = []
    for path in calls.glob("calls-*.txt"):
        found += [tuple(int(x) for x in line.split()) for line in path.read_text().splitlines() if line.strip()]
    return found


def finished_records(checkpoint: Path) -> dict[int, list[str]]:
    """Batch time -> names of the ``sessions`` operator's partition finish records."""
    found: dict[int, list[str]] = {}
    events = checkpoint / "events"
    if events.is_dir():
        for batch_dir in events.iterdir():
            if batch_dir.name.isdigit():
                names = sorted(p.name for p in batch_dir.glob("finished-sessions-g*-p*.json"))
                if names:
                    found[int(batch_dir.name)] = names
    return found


def expected_totals() -> dict[int, tuple[int, int]]:
    totals: dict[int, tuple[int, int]] = {}
    for i in range(EVENTS):
        count, total = totals.get((i * 7919) % USERS, (0, 0))
        totals[(i * 7919) % USERS] = (count + 1, total + i)
    return totals


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory) -> Reference:
    """An uninterrupted run of the driver on a fresh checkpoint."""
    work = tmp_path_factory.mktemp("reference")
    checkpoint, out, calls = work / "checkpoint", work / "out", work / "calls"
    driver = Driver(work, "reference", checkpoint, out, calls, "local[2]")
    assert driver.wait_exit(180) == 0, driver.context()
    big = {t: stats for t, stats in driver.completed().items() if stats[1] > 0}
    assert len(big) == 1, f"expected one batch with input, got {big}\n{driver.context()}"
    [(batch_time, stats)] = big.items()
    assert stats == (USERS, EVENTS)
    output, batch_times = read_output(out)
    assert batch_times == {batch_time}
    assert {r["user"]: (r["count"], r["total"]) for r in output} == expected_totals()
    state = read_state_rows(spark, checkpoint)
    assert {r["user"]: (r["count"], r["total"]) for r in state} == expected_totals()
    calls_made = read_calls(calls)
    assert sorted(u for _, u in calls_made) == list(range(USERS))  # one call per user
    partition_of = dict((u, p) for p, u in calls_made)
    assert set(partition_of.values()) == set(range(PARTITIONS))
    return Reference(batch_time, stats, output, state, partition_of)


def wait_for_finished(driver: Driver, checkpoint: Path, count: int, timeout: float) -> int:
    """Poll the job event store until one batch has ``count`` finish records; its batch time."""
    def finished_batch() -> int | None:
        for batch_time, names in finished_records(checkpoint).items():
            assert len(names) <= count, f"more partitions finished than the unblocked ones: {names}"
            if len(names) == count:
                return batch_time
        return None

    found = poll_until(finished_batch, timeout, 0.2, stop=lambda: driver.process.poll() is not None)
    if found is not None:
        return found
    if driver.process.poll() is not None:
        pytest.fail(f"the driver exited ({driver.process.returncode}) before {count} partitions finished\n"
                    f"{driver.context()}")
    pytest.fail(f"{count} partitions did not record their finish within {timeout} s: "
                f"{finished_records(checkpoint)}\n{driver.context()}")


def crash_mid_batch_and_restart(spark, tmp_path: Path, reference: Reference, master: str) -> None:
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    first_calls, restart_calls = tmp_path / "calls-first", tmp_path / "calls-restart"

    # 1. Partitions 6 and 7 block; the other six finish and record it; then kill -9.
    first = Driver(tmp_path, "first", checkpoint, out, first_calls, master, block=BLOCKED)
    try:
        batch_time = wait_for_finished(first, checkpoint, PARTITIONS - len(BLOCKED), timeout=120)
        time.sleep(1.0)
        assert len(finished_records(checkpoint)[batch_time]) == PARTITIONS - len(BLOCKED)
    finally:
        first.kill()
    assert batch_time not in first.completed(), "the batch completed although two partitions were blocked"
    assert sorted({p for p, _ in read_calls(first_calls)}) == [p for p in range(PARTITIONS) if p not in BLOCKED]
    assert not out.exists() or read_output(out)[0] == [], "the killed batch published output"

    # 2. The restart, unblocked, with a fresh calls directory.
    restarted = Driver(tmp_path, "restarted", checkpoint, out, restart_calls, master)
    assert restarted.wait_exit(180) == 0, restarted.context()
    context = restarted.context()

    expected = (f"INFO batchline.state.stateful: Batch {format_batch_time(batch_time)}: keeping 6 of 8 finished "
                "partitions of operator 'sessions'; re-running 2")
    phrase = "keeping 6 of 8 finished partitions of operator 'sessions'; re-running 2"
    matching = [line for line in restarted.lines if phrase in line]
    assert matching, f"no restart line saying {phrase!r}\n{context}"

    calls = read_calls(restart_calls)
    per_key = collections.Counter(user for _, user in calls)
    called_in = sorted({p for p, _ in calls})
    assert called_in == list(BLOCKED), f"the restart called the state function in partitions {called_in}"
    assert sorted(per_key) == sorted(u for u, p in reference.partition_of.items() if p in BLOCKED)
    assert set(per_key.values()) == {1}, "a key was called twice"

    output, batch_times = read_output(out)
    assert batch_times == {batch_time}
    assert len(output) == USERS, f"{len(output)} output rows, expected {USERS}"
    assert output == reference.output
    assert read_state_rows(spark, checkpoint) == reference.state
    assert restarted.completed().get(batch_time) == reference.stats, context
    # Last, so that the behaviour above is checked even when only the logger differs.
    assert expected in matching, f"the restart line is {matching}, expected {expected!r} (logger and text)"


def test_a_restart_after_a_kill_mid_batch_reruns_only_the_unfinished_partitions(spark, tmp_path, reference):
    crash_mid_batch_and_restart(spark, tmp_path, reference, "local[2]")


def test_the_same_on_a_cluster_master_with_separate_executors(spark, tmp_path, reference):
    crash_mid_batch_and_restart(spark, tmp_path, reference, "local-cluster[2,1,1024]")


# ------------------------------------------------------------------ an input that cannot replay
QUEUE_SCHEMA = "user long, n long"
QUEUE_PARTITIONS = 4


def make_failing_total(checkpoint: str, marker: str, bad_user: int):
    """Running count and total; in the second batch, the call for ``bad_user`` waits until the
    other partitions recorded their finish, then raises (once: ``marker`` remembers)."""

    def fn(user, rows, state):
        count, total = state.get() if state.exists else (0, 0)
        for row in rows:
            count, total = count + 1, total + row.n
        if user == bad_user and state.exists and not os.path.exists(marker):
            batch_dir = os.path.join(checkpoint, "events", f"{state.current_processing_time_ms():015d}")

            def finished() -> int:  # the other partitions that recorded their finish
                names = os.listdir(batch_dir) if os.path.isdir(batch_dir) else []
                return sum(n.startswith("finished-sessions-") for n in names)

            all_finished = poll_until(lambda: finished() >= QUEUE_PARTITIONS - 1, 60, 0.1)
            open(marker, "w").close()
            if all_finished:
                raise RuntimeError(f"injected failure after {finished()} other partitions finished")
            raise RuntimeError(f"gave up: only {finished()} other partitions finished")
        state.update((count, total))
        yield (user, count, total)

    return fn


def test_a_batch_that_read_a_queue_reruns_whole_with_a_warning(spark, tmp_path, caplog):
    checkpoint = tmp_path / "checkpoint"
    fn = make_failing_total(str(checkpoint), str(tmp_path / "failed-once"), bad_user=13)

    def build(stream):
        return stream.group_by_key("user").flat_map_groups_with_state(
            fn, state_schema="count long, total long", output_schema="user long, count long, total long",
            name="sessions", num_partitions=QUEUE_PARTITIONS)

    users = range(40)
    first = BatchHarness(spark, build, QUEUE_SCHEMA, checkpoint=str(checkpoint)).start()
    try:
        committed = sorted(first.batch([(u, 1) for u in users]), key=lambda r: r["user"])
        assert committed == [{"user": u, "count": 1, "total": 1} for u in users]
        first.input.push(spark.createDataFrame([(u, 10) for u in users], first.schema))
        first.clock.advance(first.interval_ms)
        with pytest.raises(BatchFailedError, match=r"injected failure after 3 other partitions finished"):
            first.ssc.await_termination(120)
    finally:
        first.stop()
    failed_batch = first.batch_time + first.interval_ms

    with caplog.at_level(logging.INFO, logger="batchline"):
        second = BatchHarness(spark, build, QUEUE_SCHEMA, checkpoint=str(checkpoint), start_ms=failed_batch).start()
        try:
            second.batch_time = failed_batch
            info = second.recorder.wait_for_batch(failed_batch, 120)
            rerun_output = second.sink.batches.get(failed_batch, [])
        finally:
            second.stop()
    assert info.failure is None, info.failure
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    warnings = [m for level, m in messages if level == logging.WARNING and "'queue'" in m]
    assert any(re.search(r"whole batch re-?runs", m) for m in warnings), \
        f"no WARNING naming the queue input and saying the whole batch re-runs: {warnings or messages}"
    kept = [m for _, m in messages if "finished partitions of operator" in m]
    assert not kept, f"a partition was kept: {kept}"
    # The queue's frame is gone with the driver: the re-run has no input, and nothing of the
    # partitions that had finished before the failure is in its statistics, output or state.
    progress = info.state_operators["sessions"]
    assert (progress.input_rows, progress.keys_called, progress.output_rows) == (0, 0, 0)
    assert rerun_output == []
    state = {r["user"]: (r["count"], r["total"]) for r in read_state_rows(spark, checkpoint)}
    assert state == {u: (1, 1) for u in users}
