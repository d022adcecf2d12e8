"""Memory over a long run (issue 19, SPEC E6): does the resident memory of the driver, its
JVM and the Python workers stay flat while batches go by?

The seed's sessionization on a manual clock, driven as fast as batches complete: the
generator's user events (``--rate`` per second over ``--users`` users) → the sessionization
operator (processing-time timeouts of one minute, 4 state partitions) → ``write_files``
(Parquet), checkpoints every 10 batches. The state is steady once sessions close as fast as
they open (after about 60 batches), so any growth after that is a leak. The resident set of
each process (``VmRSS``) is sampled every ``--every`` batches; the figure is the growth from
batch ``--baseline`` to the last batch, in %, per process kind.

The JVM's resident set follows the heap its collector commits (G1 grows it in steps, up to
``spark.driver.memory``, when collections take much of the time), which says little about a
leak. So the JVM is also measured by what a leak would show: its live heap after a full
collection (``jcmd GC.class_histogram``, at the baseline batch and at the last), and with
``--fixed-heap`` (the setting BENCHMARKS.md recommends for a long-running driver) its heap is
committed and touched at start (``-Xms`` = ``spark.driver.memory``, ``-XX:+AlwaysPreTouch``), so
its resident set no longer moves with the collector's choices.

    python -m benchmarks.soak [--batches 20000] [--baseline 1000] [--every 250] [--fixed-heap] [--output PATH]

``tests/soak/test_soak.py`` runs it (``pytest -m soak``) and holds it to the issue's bound.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from batchline import StreamingContext
from batchline.clock import ManualClock
from batchline.examples.sessionization import build_sessionization
from batchline.scheduler.listener import BatchInfo, StreamingListener
from batchline.spark import local_spark_session
from benchmarks.machine import descendants, write_result

INTERVAL_MS = 1000


class Completed(StreamingListener):
    """Counts completed batches and keeps nothing else: a listener that kept every batch's
    information would itself grow with the run (``benchmarks.completions`` does)."""

    def __init__(self) -> None:
        self.done = threading.Condition()
        self.count = 0
        self.failure: str | None = None

    def on_batch_completed(self, info: BatchInfo) -> None:
        with self.done:
            self.count += 1
            self.failure = self.failure or info.failure
            self.done.notify_all()

    def next_batch(self, clock: ManualClock, step_ms: int, timeout: float = 120) -> None:
        with self.done:
            wanted = self.count + 1
            clock.advance(step_ms)
            if not self.done.wait_for(lambda: self.count >= wanted, timeout):
                raise TimeoutError(f"batch {wanted} did not complete within {timeout} s")
            if self.failure:
                raise RuntimeError(self.failure)


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _processes() -> dict[str, list[int]]:
    """This driver, its JVM and the JVM's Python workers, by kind."""
    me = os.getpid()
    parent_of, command = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            parent_of[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
            command[int(entry)] = cmdline
    jvms = [p for p, parent in parent_of.items() if parent == me and "java" in command[p]]
    below = {p for jvm in jvms for p in descendants(jvm, parent_of)}
    workers = sorted(p for p in below if "python" in command[p])
    return {"driver": [me], "jvm": jvms, "python_workers": workers}


def sample() -> dict[str, int]:
    """Resident KiB per process kind (summed over the kind's processes)."""
    return {kind: sum(_rss_kib(p) or 0 for p in pids) for kind, pids in _processes().items()}


def live_heap_kib(jvm: int) -> int | None:
    """The JVM's live heap: what a full collection leaves (the class histogram runs one)."""
    try:
        histogram = subprocess.run(["jcmd", str(jvm), "GC.class_histogram"], capture_output=True, text=True,
                                   timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    total = re.search(r"^Total\s+\d+\s+(\d+)", histogram, re.M)
    return int(total.group(1)) // 1024 if total else None


FIXED_HEAP = "-Xms1g -XX:+AlwaysPreTouch"
"""The driver JVM's options for a long run: the whole heap (``spark.driver.memory``, 1g by
default) committed and touched at start."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--baseline", type=int, default=1_000, help="the batch memory is compared with")
    parser.add_argument("--every", type=int, default=250, help="batches between two samples")
    parser.add_argument("--rate", type=float, default=200, help="generated events per second of batch time")
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--fixed-heap", action="store_true", help=f"start the JVM with {FIXED_HEAP}")
    parser.add_argument("--output", type=Path, help="write the figures there instead of benchmarks/results/soak.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="batchline-soak-"))
    spark = local_spark_session(app_name="soak", conf={"spark.driver.extraJavaOptions": FIXED_HEAP}
                                if args.fixed_heap else None)
    clock = ManualClock(1_000 * INTERVAL_MS)
    ssc = StreamingContext(spark, f"{INTERVAL_MS}ms", clock=clock, checkpoint=str(work / "checkpoint"),
                           checkpoint_interval=f"{10 * INTERVAL_MS}ms")
    build_sessionization(ssc, rate=args.rate, users=args.users, num_partitions=4).write_files(
        str(work / "out"), "parquet", name="sessions_out")
    completions = Completed()
    ssc.add_listener(completions)
    ssc.start()
    samples: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        for n in range(1, args.batches + 1):
            completions.next_batch(clock, INTERVAL_MS)
            if n % args.every == 0 or n in (1, args.baseline, args.batches):
                samples.append({"batch": n, "seconds": round(time.perf_counter() - started, 1), **sample()})
                if n in (args.baseline, args.batches):
                    samples[-1]["jvm_live_heap"] = sum(live_heap_kib(p) or 0 for p in _processes()["jvm"])
                print(json.dumps(samples[-1]), flush=True)
    finally:
        ssc.stop(graceful=False)
    base = next(s for s in samples if s["batch"] == args.baseline)
    last = samples[-1]
    growth = {kind: round(100 * (last[kind] - base[kind]) / base[kind], 1) if base.get(kind) else None
              for kind in ("driver", "jvm", "python_workers", "jvm_live_heap")}
    figures = {"batches": args.batches, "baseline_batch": args.baseline, "rate": args.rate, "users": args.users,
               "jvm_options": FIXED_HEAP if args.fixed_heap else None,
               "growth_percent_since_baseline": growth, "samples_kib": samples}
    path = write_result("soak", figures, args.output)
    print(json.dumps({"growth_percent_since_baseline": growth}, indent=2))
    print(f"Written to {path}")


if __name__ == "__main__":
    main()
