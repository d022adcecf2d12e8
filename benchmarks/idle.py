"""What an idle pipeline costs (issue 19, SPEC E6): batchline against Structured Streaming,
the same keys waiting on the same processing-time timeouts, no input, on one machine.

Each engine runs in a process of its own (local[2], 1 s batches, checkpoint on local disk):
one JSON-lines file gives ``--keys`` users one event each, every user's session then waits on
a processing-time timeout of ``--timeout`` seconds, and nothing more arrives.

- batchline: ``file_stream(json)`` → ``flat_map_groups_with_state`` (4 state partitions) →
  ``foreach_batch`` that notes when closed sessions arrive.
- Structured Streaming: the file source → ``applyInPandasWithState`` with
  ``ProcessingTimeTimeout`` → ``foreachBatch``, trigger every second (it runs a no-data batch
  every trigger while state with timeouts exists).

Measured, after the first batch and ``--warmup`` seconds: the CPU of the engine's whole
process tree (driver, JVM, Python workers) over ``--idle`` seconds, in % of one core; then how
long after its deadline, by the wall clock, each engine emitted the timed-out sessions, and
in which batch (its time after the deadline: batchline fires processing-time timers in the batch at
the deadline, Structured Streaming in the first batch whose trigger timestamp is strictly after it).

    python -m benchmarks.idle [--keys 900] [--idle 60] [--warmup 10] [--timeout 90]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.machine import descendants, write_result

INTERVAL_MS = 1000
PARTITIONS = 4


# ------------------------------------------------------------------ the measuring parent
def tree_cpu_ticks(root: int) -> dict[int, int]:
    """CPU clock ticks used so far by ``root`` and by each process below it, by pid."""
    parent_of: dict[int, int] = {}
    used: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        parent_of[int(entry)] = int(fields[1])
        used[int(entry)] = int(fields[11]) + int(fields[12])  # utime, stime
    tree = {root} | descendants(root, parent_of)
    return {pid: used[pid] for pid in tree if pid in used}


def idle_cpu_seconds(root: int, seconds: float) -> float:
    """CPU seconds the tree used over ``seconds``, sampled every second per process, so that a
    process that ends meanwhile (Spark stops Python workers idle for a minute) counts what it
    used until its last sample, and one that starts counts from zero."""
    first = tree_cpu_ticks(root)
    last = dict(first)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        last.update(tree_cpu_ticks(root))
    used = sum(ticks - first.get(pid, 0) for pid, ticks in last.items())
    return used / os.sysconf("SC_CLK_TCK")


def measure(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``engine`` in a child process; its idle CPU and its timeouts' lateness."""
    command = [sys.executable, "-m", "benchmarks.idle", "--child", engine, "--keys", str(args.keys),
               "--timeout", str(args.timeout)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    result: dict[str, Any] = {"engine": engine}
    try:
        for line in child.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            print(f"  {engine}: {event}", flush=True)
            if event["event"] == "ready":
                time.sleep(args.warmup)
                started = time.monotonic()
                used = idle_cpu_seconds(child.pid, args.idle)
                elapsed = time.monotonic() - started
                result["idle_cpu_percent_of_one_core"] = round(100 * used / elapsed, 2)
                result["idle_seconds"] = round(elapsed, 1)
                print(f"  {engine}: {result['idle_cpu_percent_of_one_core']}% of one core over {elapsed:.0f} s",
                      flush=True)
            elif event["event"] == "closed":
                result["timed_out_sessions"] = event["sessions"]
                result["timeout_lateness_s"] = round(event["lateness_s"], 2)
                result["fired_in_batch_after_deadline_s"] = round(event["batch_after_deadline_s"], 2)
                break
    finally:
        child.terminate()
        child.wait(60)
    return result


# ------------------------------------------------------------------ the engines (child processes)
def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def write_input(directory: Path, keys: int) -> None:
    directory.mkdir(parents=True)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = [json.dumps({"id": k, "data": f"event-{k}", "is_last": False, "ts": now}) for k in range(keys)]
    (directory / "events-0.json").write_text("\n".join(lines) + "\n")


def count_until_timeout(timeout: str, key: Any, rows: Any, state: Any) -> Iterator[dict[str, Any]]:
    """A session that only counts its events and closes ``timeout`` after the last one."""
    if state.has_timed_out:
        count = state.get()[0]
        state.remove()
        yield {"id": key, "events": count}
        return
    state.update(((state.get()[0] if state.exists else 0) + sum(1 for _ in rows),))
    state.set_timeout_duration(timeout)


def run_batchline(keys: int, timeout_s: int, work: Path) -> None:
    from batchline import StreamingContext
    from batchline.sources.generator import USER_EVENT_SCHEMA
    from batchline.spark import local_spark_session
    from batchline.state import GroupStateTimeout

    write_input(work / "in", keys)
    spark = local_spark_session(app_name="idle-batchline")
    ssc = StreamingContext(spark, f"{INTERVAL_MS}ms", checkpoint=str(work / "checkpoint"))
    opened: dict[str, int] = {}

    def closed(df: Any, batch_time: Any) -> None:
        sessions = df.count()
        if sessions:
            deadline_ms = opened["batch_time"] + timeout_s * 1000
            say(event="closed", sessions=sessions, lateness_s=time.time() - deadline_ms / 1000,
                batch_after_deadline_s=(int(batch_time) - deadline_ms) / 1000)

    def first_batch(df: Any, batch_time: Any) -> None:
        if "batch_time" not in opened and df.count():
            opened["batch_time"] = int(batch_time)
            say(event="ready", batch_time=int(batch_time))

    events = ssc.file_stream(str(work / "in"), "json", USER_EVENT_SCHEMA, settle=0)
    events.foreach_batch(first_batch, name="opened")
    events.group_by_key("id").flat_map_groups_with_state(
        functools.partial(count_until_timeout, f"{timeout_s} seconds"), state_schema="events long",
        output_schema="id long, events long", timeout=GroupStateTimeout.PROCESSING_TIME, name="sessions",
        num_partitions=PARTITIONS).foreach_batch(closed, name="closed")
    ssc.start()
    ssc.await_termination()


def run_structured_streaming(keys: int, timeout_s: int, work: Path) -> None:
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout as SparkTimeout
    from pyspark.sql.types import LongType, StructField, StructType

    from batchline.sources.generator import USER_EVENT_SCHEMA
    from batchline.spark import local_spark_session

    write_input(work / "in", keys)
    spark = local_spark_session(app_name="idle-structured-streaming")
    spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
    state_schema = StructType([StructField("events", LongType())])
    output_schema = StructType([StructField("id", LongType()), StructField("events", LongType())])

    def update(key: Any, frames: Any, state: Any) -> Any:
        if state.hasTimedOut:
            (count,) = state.get
            state.remove()
            yield pd.DataFrame([(int(key[0]), count)], columns=["id", "events"])
            return
        count = (state.get[0] if state.exists else 0) + sum(len(f) for f in frames)
        state.update((count,))
        state.setTimeoutDuration(timeout_s * 1000)

    opened: dict[str, float] = {}

    fired: dict[str, Any] = {}

    def closed(df: Any, batch_id: int) -> None:
        sessions = df.count()
        if sessions and not fired:
            fired.update(batch_id=batch_id, sessions=sessions, at=time.time())

    stream = spark.readStream.schema(USER_EVENT_SCHEMA).json(str(work / "in"))
    query = (stream.groupBy("id")
             .applyInPandasWithState(update, output_schema, state_schema, "append", SparkTimeout.ProcessingTimeTimeout)
             .writeStream.foreachBatch(closed).option("checkpointLocation", str(work / "checkpoint"))
             .trigger(processingTime="1 second").start())
    while "at" not in opened:
        for progress in query.recentProgress:
            if progress["numInputRows"] > 0:
                opened["at"] = _epoch_s(progress["timestamp"])  # the batch timestamp deadlines start from
                say(event="ready", batch_id=progress["batchId"])
                break
        time.sleep(0.2)
    # The batch's progress (its timestamp) is recorded only after foreachBatch returned.
    while True:
        progress = [p for p in query.recentProgress if fired and p["batchId"] == fired["batch_id"]]
        if progress:
            deadline = opened["at"] + timeout_s  # as Spark sets it: the opening batch's timestamp plus the duration
            say(event="closed", sessions=fired["sessions"], lateness_s=fired["at"] - deadline,
                batch_after_deadline_s=_epoch_s(progress[0]["timestamp"]) - deadline)
            break
        time.sleep(0.2)
    query.awaitTermination()


def _epoch_s(timestamp: str) -> float:
    """A progress record's ISO timestamp (``2026-11-24T10:00:00.123Z``) in epoch seconds."""
    import datetime as dt

    return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=900)
    parser.add_argument("--idle", type=float, default=60, help="seconds of idling measured")
    parser.add_argument("--warmup", type=float, default=10, help="seconds after the first batch, not measured")
    parser.add_argument("--timeout", type=int, default=90, help="the sessions' processing-time timeout, seconds")
    parser.add_argument("--engines", default="batchline,structured_streaming")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        work = Path(tempfile.mkdtemp(prefix=f"batchline-idle-{args.child}-"))
        (run_batchline if args.child == "batchline" else run_structured_streaming)(args.keys, args.timeout, work)
        return
    if args.timeout < args.warmup + args.idle + 5:
        parser.error("--timeout must exceed --warmup plus --idle: the keys must still wait while CPU is measured")
    results = [measure(engine, args) for engine in args.engines.split(",")]
    figures: dict[str, Any] = {"keys": args.keys, "interval_ms": INTERVAL_MS, "timeout_s": args.timeout,
                               "warmup_s": args.warmup, "engines": results}
    path = write_result("idle", figures)
    print(json.dumps(figures, indent=2))
    print(f"Written to {path}")


if __name__ == "__main__":
    main()
