"""Checkpoint cost and restart time.

1. Checkpoint write time, and what it does to scheduling delay, with a large metadata set:
   a file source that remembers 200,000 processed files (about 9 MB of checkpoint), a
   checkpoint after every 250 ms batch, against the same pipeline without checkpoints.
   Checkpoints are written by their own thread, so batches should not wait for them.
2. Restart time: process start to the first batch with new rows completed (a re-run of the
   batch the kill cut short does not count), for batchline and for Spark Structured Streaming
   restarting on the same input and history (30 earlier batches), each run as a fresh driver
   process, alternating, median of the repeats. batchline's driver JVM starts from its
   class-data archive (``batchline.class_archive``), Structured Streaming's as Spark ships; a
   third variant, batchline without the archive, says what the engine alone does.
   ``benchmarks.cluster`` runs the same on a standalone cluster with the checkpoint on an S3
   endpoint.

    python -m benchmarks.checkpoint_restart [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from batchline import StreamingContext, StreamingListener
from batchline.class_archive import ARCHIVE_SWITCH
from batchline.scheduler.listener import BatchInfo
from batchline.spark import local_spark_session
from benchmarks.machine import write_result

SEEN_FILES = 200_000
BATCHES = 40


class _Delays(StreamingListener):
    def __init__(self) -> None:
        self.delays: list[int] = []
        self.done = threading.Event()

    def on_batch_completed(self, info: BatchInfo) -> None:
        self.delays.append(info.scheduling_delay_ms or 0)
        if len(self.delays) >= BATCHES:
            self.done.set()


def scheduling_delays(spark, checkpoint: str | None, interval: str | None = None) -> tuple[list[int], list[float], int]:
    with tempfile.TemporaryDirectory() as empty_dir:
        ssc = StreamingContext(spark, "250ms", checkpoint=checkpoint, checkpoint_interval=interval)
        files = ssc.file_stream(empty_dir, "text")
        events = ssc.generator_stream(rate=400)
        events.union(files.select("value").transform(lambda df: df.selectExpr("0 as id", "value as data",
                                                                            "false as is_last", "now() as ts")))
        events.foreach_batch(lambda df, t: df.count())
        listener = _Delays()
        ssc.add_listener(listener)
        ssc.start()
        # A long history of seen files, as a source has after months; before the first batch.
        ssc.runtime_of(files).restore({"seen": [f"/landing/2026/11/21/events-{i:07d}.json"
                                                for i in range(SEEN_FILES)]})
        listener.done.wait(120)
        writes = list(ssc.checkpoint_manager.writer.write_durations_ms) if checkpoint else []
        ssc.stop()  # first: a running pipeline deletes old checkpoints between a listing and a stat
        size = max((p.stat().st_size for p in Path(checkpoint, "checkpoints").iterdir()), default=0) \
            if checkpoint else 0
    return listener.delays[5:], writes, size  # skip the warm-up batches


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def checkpoint_cost() -> dict:
    spark = local_spark_session("local[2]", "bench-checkpoint", shuffle_partitions=2)
    scheduling_delays(spark, None)  # warm-up
    off, _, _ = scheduling_delays(spark, None)
    with tempfile.TemporaryDirectory() as location:
        every_10, _, _ = scheduling_delays(spark, location, "2500ms")
    with tempfile.TemporaryDirectory() as location:
        every_batch, writes, size = scheduling_delays(spark, location, "250ms")
    spark.stop()
    return {
        "batch_interval_ms": 250,
        "seen_files_in_metadata": SEEN_FILES,
        "checkpoint_bytes": size,
        "checkpoint_write_ms_median": round(statistics.median(writes), 1),
        "checkpoint_write_ms_p95": round(_percentile(writes, 0.95), 1),
        "checkpoints_written_when_due_every_batch": len(writes),
        "scheduling_delay_ms": {
            "no_checkpoints": {"median": statistics.median(off), "p95": _percentile(off, 0.95)},
            "checkpoint_every_10_batches": {"median": statistics.median(every_10),
                                            "p95": _percentile(every_10, 0.95)},
            "checkpoint_every_batch": {"median": statistics.median(every_batch),
                                       "p95": _percentile(every_batch, 0.95)},
        },
    }


ROWS_PER_FILE = 50
HISTORY_FILES = 30


def _write_files(folder: Path, start: int, count: int) -> None:
    for f in range(start, start + count):
        rows = [{"id": f"f{f}-r{r}", "n": r} for r in range(ROWS_PER_FILE)]
        (folder / f"events-{f:05d}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _driver(engine: str, root: Path, where: Sequence[str], archive: bool) -> subprocess.Popen[str]:
    env = {**os.environ} if archive else {**os.environ, ARCHIVE_SWITCH: "off"}
    with open(root / "driver.log", "ab") as log:  # the driver's stderr, for the error if it fails
        return subprocess.Popen(
            [sys.executable, "-m", "benchmarks.restart_driver", engine, str(root / "in"), *where],
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=Path(__file__).parent.parent, env=env,
        )


def _build_history(engine: str, root: Path, where: Sequence[str], archive: bool) -> None:
    """A first run that processes HISTORY_FILES files arriving one by one, then dies (SIGKILL)."""
    history = root / "history"
    history.mkdir()
    _write_files(history, 0, HISTORY_FILES)
    process = _driver(engine, root, where, archive)
    assert process.stdout is not None
    rows = 0
    for line in process.stdout:
        if line.startswith("session"):
            threading.Thread(target=_feed, args=(sorted(history.iterdir()), root / "in"), daemon=True).start()
        elif line.startswith("batch "):
            rows += int(line.split()[1])
            if rows >= HISTORY_FILES * ROWS_PER_FILE:
                break
    process.kill()
    process.wait()
    if rows < HISTORY_FILES * ROWS_PER_FILE:
        raise RuntimeError(f"the {engine} driver exited while building the history:\n{_tail(root)}")


def _feed(files: list[Path], incoming: Path) -> None:
    for path in files:
        shutil.move(str(path), incoming / path.name)
        time.sleep(0.6)


def _tail(root: Path, lines: int = 30) -> str:
    return "\n".join((root / "driver.log").read_text(errors="replace").splitlines()[-lines:])


@dataclass(frozen=True)
class Restart:
    """One restart, in seconds from the driver's process start."""

    session_s: float
    """Its SparkSession is up (``session``)."""
    first_batch_s: float
    """The first batch with new rows is written."""
    rows_before: int
    """Rows of batches before that one: a re-run of the batch the kill cut short."""


def restart_time(engine: str, root: Path, where: Sequence[str] = (), archive: bool | None = None) -> Restart:
    """Process start to the first batch with new rows completed, after a crash with new data
    waiting. ``where``: the driver's OUT, CHECKPOINT and options (default: local[2], both under
    ``root``; ``benchmarks.cluster`` passes a standalone master and the S3 endpoint).
    ``archive``: whether the driver's JVM starts from batchline's class-data archive (default:
    batchline's does; Structured Streaming's starts as Spark ships)."""
    archive = engine == "batchline" if archive is None else archive
    where = list(where) or [str(root / "out"), str(root / "checkpoint")]
    (root / "in").mkdir()
    _build_history(engine, root, where, archive)
    _write_files(root / "in", 1000, 5)
    began = time.perf_counter()
    process = _driver(engine, root, where, archive)
    assert process.stdout is not None
    session, rows_before = 0.0, 0
    try:
        for line in process.stdout:
            if line.startswith("session"):
                session = time.perf_counter() - began
            elif line.startswith("batch "):
                _, rows, new = line.split()
                if int(new) > 0:
                    return Restart(session, time.perf_counter() - began, rows_before)
                rows_before += int(rows)  # a re-run of the batch the kill cut short
        raise RuntimeError(f"the {engine} driver exited without a batch:\n{_tail(root)}")
    finally:
        process.kill()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cost = checkpoint_cost()
    print(json.dumps(cost, indent=2))
    # Untimed: the first driver to exit writes the class-data archive the timed ones start from.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as root:
        restart_time("batchline", Path(root))
    variants = {"batchline": ("batchline", True), "batchline_without_archive": ("batchline", False),
                "sss": ("sss", False)}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (engine, archive) in variants.items():
            with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as root:
                samples[name].append(restart_time(engine, Path(root), archive=archive).first_batch_s)
                print(f"restart {name}: {samples[name][-1]:.2f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    restart = {
        "batchline_s_median": round(medians["batchline"], 2),
        "batchline_without_archive_s_median": round(medians["batchline_without_archive"], 2),
        "spark_structured_streaming_s_median": round(medians["sss"], 2),
        "samples_s": {k: [round(v, 2) for v in vs] for k, vs in samples.items()},
        "history_files": HISTORY_FILES,
        "ratio": round(medians["batchline"] / medians["sss"], 3),
        "ratio_without_archive": round(medians["batchline_without_archive"] / medians["sss"], 3),
    }
    print(json.dumps(restart, indent=2))
    path = write_result("checkpoint_restart", {"checkpoint_cost": cost, "restart": restart})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
