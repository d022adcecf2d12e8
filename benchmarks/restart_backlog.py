"""Time to the first commit after a restart with a backlog of due batches (issue 12).

A checkpointed file-source pipeline (100 ms batches, a checkpoint every batch, text files
read at most ``--files-per-batch`` a batch and counted) runs in a driver process until it has
committed a few batches; the driver is killed with SIGKILL and stays down until ``--backlog``
batches are due; then a new driver process restarts from the checkpoint. It finds those
batches missed, plus those due while it starts up.

Measured from the restarted process's start (the moment it is spawned):

- ``first_commit_s``: its first batch committed (the listener's batch-completed event);
- ``first_checkpoint_after_commit_s``: the first checkpoint written after that commit, the
  progress the next restart starts from; and how many batches were generated before it;
- ``caught_up_s``: every due batch completed; ``catch_up_ms_per_batch`` is the time from the
  first commit to then, per due batch (the due count depends on how long the start took).

``started_s`` is when ``StreamingContext.start()`` returned (JVM, Spark session, lease,
checkpoint, batch log, restart plan): the cold start. ``first_commit_s - started_s`` is the
first batch; the goal is that it does not grow with the backlog.

``throttled`` is the default (``max_batches_ahead``: at most concurrent_jobs + 1 batches
generated and not yet committed); ``unthrottled`` generates every due batch at once
(``max_batches_ahead=10**9``), as Spark Streaming does and batchline did before. Both run in
the same invocation, alternating, on fresh input and checkpoint directories; medians over
``--rounds``.

    python -m benchmarks.restart_backlog [--backlog 150] [--rounds 3] [--files 2000] [--files-per-batch 5]
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
INTERVAL_S = 0.1
HISTORY_BATCHES = 10
"""Batches the first driver commits before it is killed."""
LINES_PER_FILE = 20
UNTHROTTLED = 10**9
VARIANTS = ("throttled", "unthrottled")


# ------------------------------------------------------------------ the driver process
def driver(variant: str, incoming: str, checkpoint: str, files_per_batch: int) -> None:
    """One driver: prints ``session``, ``started``, ``due N``, ``submitted T``, ``completed T``
    and ``checkpoint T`` (written) as they happen, until killed."""
    from batchline import StreamingContext, StreamingListener
    from batchline.scheduler.listener import BatchInfo
    from batchline.spark import local_spark_session

    def say(line: str) -> None:
        print(line, flush=True)

    class Events(StreamingListener):
        def on_batch_submitted(self, info: BatchInfo) -> None:
            say(f"submitted {info.batch_time}")

        def on_batch_completed(self, info: BatchInfo) -> None:
            if info.failure is None:
                say(f"completed {info.batch_time}")

    class Lines(logging.Handler):
        """The restart's count of batches to run, and each checkpoint written."""

        def emit(self, record: logging.LogRecord) -> None:
            message = str(record.msg)
            if message.startswith("Batches to reschedule"):
                say(f"due {record.args[0]}")
            elif message.startswith("Checkpoint for time"):
                say(f"checkpoint {record.args[0]}")

    for name in ("batchline.recovery.restart", "batchline.checkpoint.writer"):
        logging.getLogger(name).addHandler(Lines(logging.INFO))
        logging.getLogger(name).setLevel(logging.INFO)
    spark = local_spark_session("local[2]", f"restart-backlog-{variant}", shuffle_partitions=2)
    say("session")
    ssc = StreamingContext(spark, f"{int(INTERVAL_S * 1000)}ms", checkpoint=checkpoint,
                           checkpoint_interval=f"{int(INTERVAL_S * 1000)}ms",
                           max_batches_ahead=None if variant == "throttled" else UNTHROTTLED)
    lines = ssc.text_file_stream(incoming, settle=0, max_files_per_batch=files_per_batch)
    lines.foreach_batch(lambda df, t: df.count())
    ssc.add_listener(Events())
    ssc.start()
    say("started")
    ssc.await_termination()


# ------------------------------------------------------------------ one trial
class Driver:
    """A driver process and its lines, each with the seconds since the process was spawned."""

    def __init__(self, variant: str, root: Path, files_per_batch: int, name: str) -> None:
        self.stderr = root / f"{name}.stderr"
        self._lines: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self.began = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.restart_backlog", "driver", variant, str(root / "in"),
             str(root / "checkpoint"), str(files_per_batch)],
            stdout=subprocess.PIPE, stderr=self.stderr.open("w"), text=True, cwd=ROOT,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put((time.monotonic() - self.began, line.strip()))
        self._lines.put(None)

    def events(self, timeout_s: float):
        """``(seconds, kind, value)`` as they come, until the process ends or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if item is None:
                tail = self.stderr.read_text()[-3000:]
                raise RuntimeError(f"the driver exited ({self.process.wait()}); its stderr ends:\n{tail}")
            at, line = item
            kind, _, value = line.partition(" ")
            yield at, kind, int(value) if value.lstrip("-").isdigit() else None
        raise TimeoutError(f"no end within {timeout_s:.0f} s; see {self.stderr}")

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: no stop, no final checkpoint
        self.process.wait()


def write_input(folder: Path, files: int) -> None:
    folder.mkdir(parents=True)
    for f in range(files):
        (folder / f"part-{f:06d}.txt").write_text("".join(f"file {f} line {n}\n" for n in range(LINES_PER_FILE)))


def trial(variant: str, root: Path, backlog: int, files: int, files_per_batch: int, timeout_s: float) -> dict[str, Any]:
    write_input(root / "in", files)
    first = Driver(variant, root, files_per_batch, "first")
    completed = 0
    for _, kind, _ in first.events(timeout_s):
        completed += kind == "completed"
        if completed >= HISTORY_BATCHES:
            break
    first.kill()
    time.sleep(backlog * INTERVAL_S)  # down until ``backlog`` batches are due (start-up adds more)

    second = Driver(variant, root, files_per_batch, "second")
    figures: dict[str, Any] = {}
    submitted = done = 0
    due = first_commit = None
    try:
        for at, kind, value in second.events(timeout_s):
            if kind in ("session", "started"):
                figures[f"{kind}_s"] = round(at, 2)
            elif kind == "due":
                due = figures["due_batches"] = value
            elif kind == "submitted":
                submitted += 1
            elif kind == "completed":
                done += 1
                if first_commit is None:
                    first_commit = value
                    figures["first_commit_s"] = round(at, 2)
            elif kind == "checkpoint" and first_commit is not None and value is not None and value >= first_commit \
                    and "first_checkpoint_after_commit_s" not in figures:
                figures["first_checkpoint_after_commit_s"] = round(at, 2)
                figures["generated_before_that_checkpoint"] = submitted
            if due is not None and done >= due and "first_checkpoint_after_commit_s" in figures:
                figures["caught_up_s"] = round(at, 2)
                figures["catch_up_ms_per_batch"] = round((at - figures["first_commit_s"]) * 1000 / due, 1)
                figures["first_commit_after_start_s"] = round(figures["first_commit_s"] - figures["started_s"], 2)
                break
    finally:
        second.kill()
    return figures


# ------------------------------------------------------------------ the run
def summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("started_s", "first_commit_s", "first_commit_after_start_s", "first_checkpoint_after_commit_s",
            "generated_before_that_checkpoint", "due_batches", "caught_up_s", "catch_up_ms_per_batch")
    return {f"{key}_median": statistics.median(s[key] for s in samples) for key in keys}


def main() -> None:
    if sys.argv[1:2] == ["driver"]:
        driver(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog", type=int, default=150, help="batches due from down time alone")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=2000, help="text files in the input directory")
    parser.add_argument("--files-per-batch", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600, help="seconds a driver may take for its part")
    parser.add_argument("--no-wait-idle", action="store_true", help="measure without waiting for an idle machine")
    parser.add_argument("--no-write", action="store_true", help="print the figures, write no results file")
    args = parser.parse_args()
    from benchmarks.bounded import wait_until_idle
    from benchmarks.machine import write_result

    samples: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    idle: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for variant in VARIANTS:
            idle.append({"skipped": True} if args.no_wait_idle else wait_until_idle())
            with tempfile.TemporaryDirectory(prefix="bench-restart-backlog-", ignore_cleanup_errors=True) as root:
                figures = trial(variant, Path(root), args.backlog, args.files, args.files_per_batch, args.timeout)
            samples[variant].append(figures)
            print(f"round {round_ + 1} {variant}: {json.dumps(figures)}", flush=True)
    result = {
        "batch_interval_ms": int(INTERVAL_S * 1000), "checkpoint_interval_ms": int(INTERVAL_S * 1000),
        "backlog": args.backlog, "history_batches": HISTORY_BATCHES, "files": args.files,
        "files_per_batch": args.files_per_batch, "lines_per_file": LINES_PER_FILE, "master": "local[2]",
        "rounds": args.rounds, "idle": idle,
        **{variant: {**summary(samples[variant]), "samples": samples[variant]} for variant in VARIANTS},
    }
    throttled, unthrottled = result["throttled"], result["unthrottled"]
    for key in ("first_commit_s", "first_checkpoint_after_commit_s", "catch_up_ms_per_batch"):
        result[f"{key}_ratio_unthrottled_to_throttled"] = round(
            unthrottled[f"{key}_median"] / throttled[f"{key}_median"], 2)
    print(json.dumps({k: v for k, v in result.items() if k != "idle"}, indent=2))
    if not args.no_write:
        print(f"wrote {write_result('restart_backlog', result)}")


if __name__ == "__main__":
    main()
