"""A restart keeps a crashed batch's finished partitions only when everything they need is there
(issue 34, item 5): a finished partition whose stored output or state delta is gone or damaged
runs again whole, its rows shuffled to it, and the output and the state are an uninterrupted
run's: nothing lost, nothing twice.

The crash is staged in one process: the second of three batches fails in one state partition
after the others recorded their finish (their delta, output and finish record are stored), the
batch is not retried, and the pipeline stops. Then one finished partition's files are damaged,
and a new context on the same checkpoint re-runs the batch and runs the third one.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from batchline import BatchFailedError, StreamingContext
from batchline.clock import ManualClock
from batchline.scheduler.listener import BatchInfo
from batchline.scheduler.retry import RetryPolicy
from batchline.state import read_state
from batchline.state.stateful import StatefulRuntime
from batchline.testing import BatchRecorder, list_stream
from tests.helpers import poll_until

START, INTERVAL, PARTITIONS = 100_000, 1000, 4
FAILED_BATCH = START + 2 * INTERVAL
KEYS = [f"k{i}" for i in range(40)]
BATCHES = [[(k, 1) for k in KEYS], [(k, 10) for k in KEYS for _ in range(2)], [(k, 100) for k in KEYS[::3]]]
BAD_KEY = "k13"


def expected_output() -> list[tuple[int, str, int, int]]:
    """(batch time, key, count, total) of every call, as an uninterrupted run writes them."""
    rows, totals = [], {}
    for i, batch in enumerate(BATCHES):
        seen: dict[str, tuple[int, int]] = {}
        for key, n in batch:
            count, total = seen.get(key, totals.get(key, (0, 0)))
            seen[key] = (count + 1, total + n)
        totals.update(seen)
        rows += [(START + (i + 1) * INTERVAL, key, count, total) for key, (count, total) in seen.items()]
    return sorted(rows)


def make_total(checkpoint: str, marker: str):
    """Running count and total per key; in the second batch the call for ``BAD_KEY`` waits until
    every other partition recorded its finish, then raises (once: ``marker`` remembers)."""

    def fn(key, rows, state):
        count, total = state.get() if state.exists else (0, 0)
        for row in rows:
            count, total = count + 1, total + row.n
        if key == BAD_KEY and state.current_processing_time_ms() == FAILED_BATCH and not os.path.exists(marker):
            batch_dir = os.path.join(checkpoint, "events", f"{FAILED_BATCH:015d}")

            def finished() -> int:  # the other partitions that recorded their finish
                names = os.listdir(batch_dir) if os.path.isdir(batch_dir) else []
                return sum(n.startswith("finished-totals-") for n in names)

            poll_until(lambda: finished() >= PARTITIONS - 1, 60, 0.1)
            open(marker, "w").close()
            raise RuntimeError(f"injected failure after {finished()} other partitions finished")
        state.update((count, total))
        yield (key, count, total)

    return fn


def start(spark, checkpoint: Path, out: Path, fn, clock: ManualClock) -> tuple[StreamingContext, BatchRecorder]:
    ssc = StreamingContext(spark, INTERVAL / 1000, clock=clock, checkpoint=str(checkpoint),
                           retry=RetryPolicy(max_attempts=1))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    list_stream(ssc, BATCHES, "key string, n long", name="events").group_by_key("key").flat_map_groups_with_state(
        fn, state_schema="count long, total long", output_schema="key string, count long, total long",
        name="totals", num_partitions=PARTITIONS).write_files(str(out), "parquet", name="out")
    ssc.start()
    return ssc, recorder


def read_output(out: Path) -> list[tuple[int, str, int, int]]:
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    return sorted((int(r["batch_time"]), r["key"], r["count"], r["total"]) for r in table.to_pylist())


def finished_partitions(checkpoint: Path) -> list[int]:
    names = os.listdir(checkpoint / "events" / f"{FAILED_BATCH:015d}")
    return sorted(int(n.split("-p")[-1].split(".")[0]) for n in names if n.startswith("finished-totals-"))


def stored(checkpoint: Path, partition: int, kind: str) -> Path:
    return checkpoint / "state" / "totals" / "g0" / f"p{partition:05d}" / f"{FAILED_BATCH:015d}.{kind}.arrow"


def delete(path: Path) -> None:
    path.unlink()


def flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4] = bytes(b ^ 0xFF for b in data[middle:middle + 4])
    path.write_bytes(bytes(data))


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:10])


def crash_in_second_batch(spark, checkpoint: Path, out: Path, fn) -> list[int]:
    """The first batch commits; the second fails in one partition after the others recorded
    their finish, and the pipeline stops. Returns the partitions that finished."""
    clock = ManualClock(START)
    ssc, recorder = start(spark, checkpoint, out, fn, clock)
    try:
        clock.advance(INTERVAL)
        assert recorder.wait_for_batch(START + INTERVAL, 120).failure is None
        clock.advance(INTERVAL)
        with pytest.raises(BatchFailedError, match="injected failure after 3 other partitions finished"):
            ssc.await_termination(120)
    finally:
        ssc.stop(graceful=False)
    finished = finished_partitions(checkpoint)
    assert len(finished) == PARTITIONS - 1, finished
    assert read_output(out) == [row for row in expected_output() if row[0] == START + INTERVAL]
    return finished


def restart(spark, checkpoint: Path, out: Path, fn) -> tuple[BatchInfo, BatchInfo | None]:
    """A new context on the checkpoint: the failed batch runs again, then (if it succeeded) the third."""
    clock = ManualClock(FAILED_BATCH)
    ssc, recorder = start(spark, checkpoint, out, fn, clock)
    try:
        rerun = recorder.wait_for_batch(FAILED_BATCH, 120)
        if rerun.failure is not None:
            with pytest.raises(BatchFailedError):  # stopped by the failure, its lease given back
                ssc.await_termination(120)
            return rerun, None
        clock.advance(INTERVAL)
        return rerun, recorder.wait_for_batch(FAILED_BATCH + INTERVAL, 120)
    finally:
        ssc.stop(graceful=False)


def assert_exact(spark, checkpoint: Path, out: Path) -> None:
    """The output and the state are an uninterrupted run's: nothing lost, nothing twice."""
    output, expected = read_output(out), expected_output()
    duplicated = [row for row, n in Counter(output).items() if n > 1]
    assert not duplicated, f"rows written twice: {duplicated}"
    missing, unexpected = sorted(set(expected) - set(output)), sorted(set(output) - set(expected))
    assert output == expected, f"missing {missing}, unexpected {unexpected}"
    state = sorted((r["key"], r["count"], r["total"]) for r in read_state(spark, str(checkpoint), "totals").collect())
    assert state == sorted((key, count, total) for _, key, count, total in {row[1]: row for row in expected}.values())


@pytest.mark.parametrize(("kind", "damage"), [
    ("output", delete), ("output", flip_bytes), ("output", cut_short), ("delta", delete), ("delta", flip_bytes),
], ids=["output-deleted", "output-flipped", "output-cut", "delta-deleted", "delta-flipped"])
def test_a_finished_partition_whose_files_are_gone_or_damaged_runs_again_whole(spark, tmp_path, caplog, kind, damage):
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    fn = make_total(str(checkpoint), str(tmp_path / "failed-once"))
    finished = crash_in_second_batch(spark, checkpoint, out, fn)

    # One finished partition loses (or has damaged) a file it needs to be kept.
    victim = finished[0]
    path = stored(checkpoint, victim, kind)
    damage(path)

    with caplog.at_level(logging.INFO, logger="batchline"):
        rerun, last = restart(spark, checkpoint, out, fn)
    assert rerun.failure is None, rerun.failure
    assert last is not None and last.failure is None, last.failure
    assert_exact(spark, checkpoint, out)
    progress = rerun.state_operators["totals"]
    assert progress.input_rows == len(BATCHES[1])
    assert progress.partitions_kept == PARTITIONS - 2, "the damaged partition was kept, or a sound one was not"
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name.startswith("batchline")]
    assert any(f"partition {victim} " in m and str(path) in m for m in warnings), f"no WARN naming {path}: {warnings}"


def test_a_kept_partition_whose_output_goes_after_the_restart_decided_loses_no_row(spark, tmp_path, monkeypatch):
    """The output goes after the restart decided to keep the partition and left its rows out of
    the shuffle (deleted by hand, or an object store that lost it): the partition must not run
    its function on no rows. The batch fails naming the file, and the next start runs it again
    whole."""
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    fn = make_total(str(checkpoint), str(tmp_path / "failed-once"))
    victim = crash_in_second_batch(spark, checkpoint, out, fn)[0]
    path = stored(checkpoint, victim, "output")

    decide = StatefulRuntime.recover_batch

    def decide_then_lose_the_output(self, batch_time: int, whole: bool) -> None:
        decide(self, batch_time, whole)
        if path.exists():
            path.unlink()

    with monkeypatch.context() as patched:
        patched.setattr(StatefulRuntime, "recover_batch", decide_then_lose_the_output)
        rerun, _ = restart(spark, checkpoint, out, fn)
    assert rerun.failure is not None, "the batch ran although a kept partition's output was gone"
    assert "KeptOutputLostError" in rerun.failure and str(path) in rerun.failure, rerun.failure
    assert read_output(out) == [row for row in expected_output() if row[0] == START + INTERVAL]

    rerun, last = restart(spark, checkpoint, out, fn)
    assert rerun.failure is None, rerun.failure
    assert last is not None and last.failure is None, last.failure
    assert_exact(spark, checkpoint, out)
