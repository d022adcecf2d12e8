"""Stateful processing: batchline's flat_map_groups_with_state against Spark Structured
Streaming's applyInPandasWithState and Bytewax 0.21, on the same input, in one run.

1. Sustained sessionization throughput: the same parquet files of generated user events
   (200k events from 100k users each), one file per batch, read by batchline's file source
   and by Structured Streaming's (maxFilesPerTrigger=1), sessionized by equivalent functions
   with one-minute processing-time timeouts; and the limit, a bare PySpark job that reads
   the same file, shuffles it by user and hands it to Python as Arrow, without state.
   The second peer, Bytewax 0.21 (``pip install -e ".[bench]"``), runs the same logic on one
   worker in a process of its own, once without recovery and once with SQLite recovery
   snapshotting every 2 s (benchmarks/bytewax_sessions.py: how its wall-clock timers stand in
   for the manual clock). batchline keeps durable state, so it is compared with the latter.
   batchline and the bare job run in rounds (``--rounds``, at least 2) after an untimed pass
   of the bare job, the bare job first in odd rounds and second in even ones: the JVM keeps
   compiling the read, the shuffle and the Arrow transfer for dozens of batches, so a side
   always measured first, on a colder JVM, would look slower than it is (a bare job measured
   once, before batchline, ran 0.58 s a batch where the same job later ran 0.36-0.42 s). The
   first batch of each round is left out on both sides.
2. Batch time when 10k keys change while the state holds 10k, 100k and 1M keys.
3. Memory per key held in state (the worker-resident cache) and bytes per key on disk.

    python -m benchmarks.sessionization [--files 5] [--rounds 2] [--peer-files 3] [--scale 10000,100000,1000000]
        [--no-bytewax]
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.metadata
import importlib.util
import multiprocessing
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout as SparkTimeout
from pyspark.sql.types import LongType, StringType, StructField, StructType

from batchline import StreamingContext
from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import ManualClock
from batchline.examples.sessionization import ClosedSession, UserSession, update_session
from batchline.scheduler.listener import BatchInfo, StreamingListener
from batchline.sources.generator import USER_EVENT_SCHEMA
from batchline.spark import local_spark_session
from batchline.state import GroupStateTimeout
from batchline.state.entries import KEY_PREFIX, STATE_PREFIX, give_memory_back
from batchline.state.execution import load_partition
from batchline.state.schema import RowSchema
from batchline.state.store import StateFiles
from benchmarks.machine import write_result

EVENTS_PER_BATCH = 200_000
USERS = 100_000
PARTITIONS = 4
INTERVAL_MS = 60_000  # nominal: batches are driven by a manual clock as fast as they complete


def write_event_files(spark: SparkSession, directory: Path, files: int) -> list[Path]:
    """``files`` parquet files of generated events, each one batch's input."""
    paths = []
    base_ms = 1_800_000_000_000
    for f in range(files):
        index = F.col("id") + F.lit(f * EVENTS_PER_BATCH)
        df = spark.range(EVENTS_PER_BATCH).select(
            F.pmod(F.xxhash64(F.lit(7), index), F.lit(USERS)).cast("int").alias("id"),
            F.concat(F.lit("event-"), index.cast("string")).alias("data"),
            (F.pmod(F.xxhash64(F.lit(8), index), F.lit(1000)) < F.lit(50)).alias("is_last"),
            (F.lit(base_ms) + index).cast("long").alias("ms"),
        ).select("id", "data", "is_last", F.timestamp_millis("ms").alias("ts"))
        target = directory / f"part-{f:03d}"
        df.coalesce(1).write.parquet(str(target))
        produced = next(target.glob("*.parquet"))
        final = directory / f"events-{f:03d}.parquet"
        produced.rename(final)
        shutil.rmtree(target)
        paths.append(final)
    return paths


# ------------------------------------------------------------------ the limit
def bare_shuffle(spark: SparkSession, paths: list[Path]) -> list[float]:
    def count(batches: Any) -> Any:
        n = 0
        for batch in batches:
            n += batch.num_rows
        yield pa.RecordBatch.from_pydict({"n": [n]})

    times = []
    for path in paths:
        started = time.perf_counter()
        spark.read.parquet(str(path)).repartition(PARTITIONS, "id").mapInArrow(count, "n long").collect()
        times.append(time.perf_counter() - started)
    return times


# ------------------------------------------------------------------ batchline
class _Completions(StreamingListener):
    def __init__(self) -> None:
        self.done = threading.Condition()
        self.infos: list[BatchInfo] = []

    def on_batch_completed(self, info: BatchInfo) -> None:
        with self.done:
            self.infos.append(info)
            self.done.notify_all()

    def wait(self, count: int, timeout: float = 600) -> None:
        with self.done:
            if not self.done.wait_for(lambda: len(self.infos) >= count, timeout):
                raise TimeoutError(f"{count} batches did not complete")
        failed = [i.failure for i in self.infos if i.failure]
        if failed:
            raise RuntimeError(failed[0])


def run_batchline(spark: SparkSession, input_dir: Path, files: int,
                  checkpoint: Path) -> tuple[list[float], dict[str, int]]:
    """Wall seconds per batch, from the timer firing to the batch's completion, and the
    sessions closed (all, and by a timeout)."""
    clock = ManualClock(1_000 * INTERVAL_MS)
    ssc = StreamingContext(spark, f"{INTERVAL_MS}ms", clock=clock, checkpoint=str(checkpoint))
    events = ssc.file_stream(str(input_dir), "parquet", USER_EVENT_SCHEMA, settle=0, max_files_per_batch=1)
    sessions = events.group_by_key("id").flat_map_groups_with_state(
        update_session, state_schema=UserSession, output_schema=ClosedSession,
        timeout=GroupStateTimeout.PROCESSING_TIME,
        name="sessions", num_partitions=PARTITIONS)
    sessions.foreach_batch(lambda df, t: df.count(), name="count")
    completions = _Completions()
    ssc.add_listener(completions)
    ssc.start()
    times = []
    try:
        for n in range(1, files + 1):
            started = time.perf_counter()
            clock.advance(INTERVAL_MS)
            completions.wait(n)
            times.append(time.perf_counter() - started)
            print(f"  batchline batch {n}: {times[-1]:.2f} s", flush=True)
    finally:
        ssc.stop(graceful=False)
    progress = [info.state_operators["sessions"] for info in completions.infos[:files]]
    return times, {"closed": sum(p.output_rows for p in progress), "timeout": sum(p.timed_out for p in progress)}


# ------------------------------------------------------------------ the peer
# PySpark 4.3's applyInPandasWithState cannot read an array in its state schema (its worker
# fails with KeyError: 'elementType'), so the peer keeps the session's events joined in one string.
SSS_STATE = StructType([StructField("started", LongType()), StructField("last_seen", LongType()),
                        StructField("events", StringType())])
_SEP = "\x1f"
SSS_OUTPUT = StructType([StructField("user", LongType()), StructField("started", LongType()),
                         StructField("ended", LongType()), StructField("events", LongType()),
                         StructField("closed_by", StringType())])


def sss_update_session(key: Any, frames: Any, state: Any) -> Any:
    """update_session's logic as applyInPandasWithState needs it: pandas in, pandas out."""
    user = int(key[0])
    if state.hasTimedOut:
        started, last_seen, events = state.get
        state.remove()
        yield pd.DataFrame([(user, started, last_seen, len(events.split(_SEP)), "timeout")],
                           columns=SSS_OUTPUT.fieldNames())
        return
    session = state.getOption
    session = (session[0], session[1], session[2].split(_SEP)) if session is not None else None
    closed = []
    for pdf in frames:
        pdf = pdf.sort_values("ts")
        for ts, is_last, data in zip(pdf["ts"].astype("int64") // 1_000_000, pdf["is_last"], pdf["data"],
                                     strict=True):
            if session is None:
                session = (ts, ts, [])
            session[2].append(data)
            session = (session[0], max(session[1], ts), session[2])
            if is_last:
                closed.append((user, session[0], session[1], len(session[2]), "last event"))
                session = None
    if session is None:
        state.remove()
    else:
        state.update((session[0], session[1], _SEP.join(session[2])))
        state.setTimeoutDuration(60_000)
    if closed:
        yield pd.DataFrame(closed, columns=SSS_OUTPUT.fieldNames())


def run_peer(spark: SparkSession, input_dir: Path, files: int, checkpoint: Path) -> list[float]:
    query = (
        spark.readStream.schema(USER_EVENT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(input_dir))
        .groupBy("id")
        .applyInPandasWithState(sss_update_session, SSS_OUTPUT, SSS_STATE, "append", SparkTimeout.ProcessingTimeTimeout)
        .writeStream.format("noop").option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
        .start()
    )
    # Stop after the batches with input: the no-data batches that follow would time out
    # every session, and are not part of the comparison.
    while True:
        durations = [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress
                     if p["numInputRows"] > 0]
        if len(durations) >= files or not query.isActive:
            break
        time.sleep(0.5)
    query.stop()
    # A stopped query's job is cancelled at once, but a Python task in the middle of its
    # function runs on to its end (45 s once, beside the runs after it): those wait for it.
    tracker, deadline = spark.sparkContext.statusTracker(), time.monotonic() + 600
    while any(e.numRunningTasks for e in tracker.getExecutorInfos()):
        if time.monotonic() > deadline:
            raise TimeoutError("the stopped peer's tasks still run after 10 minutes: the runs after it would share "
                               "the cores with them; run the benchmark again")
        time.sleep(0.5)
    print(f"  peer batches: {durations}; its tasks ended {time.strftime('%H:%M:%S')}", flush=True)
    return durations[:files]


# ------------------------------------------------------------------ the second peer
def run_bytewax(paths: list[Path], recovery: bool) -> dict[str, Any]:
    """Bytewax on one worker over ``paths`` (benchmarks.bytewax_sessions.run), in a process of
    its own: only its start-up overlaps the idle Spark driver, and it is not timed."""
    from benchmarks import bytewax_sessions  # the "bench" extra

    # spawn: a forked child would inherit the driver's JVM gateway and its threads.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(bytewax_sessions.run, paths, recovery).result()


# ------------------------------------------------------------------ state scale
COUNT_STATE = "count long"


def running_count(key: Any, rows: Any, state: Any) -> Any:
    count = (state.get()[0] if state.exists else 0) + sum(1 for _ in rows)
    state.update((count,))
    return ()


def scale_run(spark: SparkSession, keys: int, changed: int, batches: int, checkpoint: Path) -> list[float]:
    """Batch processing times with ``changed`` distinct keys per batch over a state of ``keys``."""
    initial = spark.range(keys).select(F.col("id").alias("key"), F.lit(1).cast("long").alias("count"))
    clock = ManualClock(1_000 * INTERVAL_MS)
    ssc = StreamingContext(spark, f"{INTERVAL_MS}ms", clock=clock, checkpoint=str(checkpoint))
    schema = StructType([StructField("key", LongType())])
    queue = ssc.queue_stream([], schema=schema)
    out = queue.group_by_key("key").flat_map_groups_with_state(
        running_count, state_schema=COUNT_STATE, output_schema="key long", name="counts",
        num_partitions=PARTITIONS, initial_state=initial)
    out.foreach_batch(lambda df, t: df.count(), name="count")
    completions = _Completions()
    ssc.add_listener(completions)
    ssc.start()
    stride = keys // changed
    times = []
    try:
        for n in range(1, batches + 1):
            # A different set of 10k existing keys every batch.
            queue.push(spark.range(changed).select(((F.col("id") * stride + n) % keys).alias("key")))
            started = time.perf_counter()
            clock.advance(INTERVAL_MS)
            completions.wait(n)
            times.append(time.perf_counter() - started)
    finally:
        ssc.stop(graceful=False)
    return times


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def memory_per_key(checkpoint: Path, operator: str, state_schema: Any) -> dict[str, float]:
    """Load an operator's state as a worker holds it: RSS growth per key, against the bytes
    the key and state fields take in Arrow (the goal: within 1.5x), and disk bytes per key.

    The first partition is loaded first and kept, unmeasured: a process's first load pays once
    for what no key needs again (modules imported on first use, Arrow's compute kernels, the
    allocator's arenas), about 100 B per key of a 93k-key session state. The other partitions
    are measured; the first one, still held, keeps the memory the warm-up used out of their way."""
    files = StateFiles(CheckpointStorage(str(checkpoint)), operator)
    metadata = files.read_metadata()
    assert metadata is not None and metadata.num_partitions > 1
    schema = RowSchema.of(state_schema)
    load = functools.partial(load_partition, files, schema, True, metadata.generation, version=None, below=2**62)
    warm = load(0)
    gc.collect()
    give_memory_back()  # as loading does at its end: the baseline without freed memory held
    before = _rss_bytes()
    held = [load(p) for p in range(1, metadata.num_partitions)]
    gc.collect()
    grown = _rss_bytes() - before
    keys = sum(len(d.entries) for d in held)
    fields = 0
    for data in held:
        if len(data.entries):
            table = data.entries.table()
            fields += sum(table.column(n).nbytes for n in table.column_names
                          if n.startswith((KEY_PREFIX, STATE_PREFIX)))
    disk = sum(f.stat().st_size for f in (checkpoint / "state" / operator).rglob("*.snapshot.arrow"))
    all_keys = keys + len(warm.entries)
    return {"keys": keys, "memory_bytes_per_key": round(grown / keys, 1),
            "arrow_field_bytes_per_key": round(fields / keys, 1), "memory_vs_arrow": round(grown / fields, 2),
            "held_bytes_per_key": round(sum(d.entries.nbytes for d in held) / keys, 1),
            "snapshot_bytes_per_key": round(disk / all_keys, 1) if disk else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=5, help="batches for batchline and the bare job, per round")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of the bare job and batchline, each first in every other round")
    parser.add_argument("--peer-files", type=int, default=3, help="batches for applyInPandasWithState")
    parser.add_argument("--scale", default="10000,100000,1000000")
    parser.add_argument("--changed", type=int, default=10_000)
    parser.add_argument("--scale-batches", type=int, default=8)
    parser.add_argument("--bytewax", action=argparse.BooleanOptionalAction, default=None,
                        help="run the Bytewax peer (default: when bytewax is installed)")
    args = parser.parse_args()
    have_bytewax = importlib.util.find_spec("bytewax") is not None
    if args.bytewax and not have_bytewax:
        parser.error('--bytewax needs Bytewax 0.21: pip install -e ".[bench]"')
    use_bytewax = have_bytewax if args.bytewax is None else args.bytewax
    if args.files < 2 or args.rounds < 2:
        parser.error("--files and --rounds need at least 2: a round's first batch is not counted, and each side "
                     "goes first in one round")

    spark = local_spark_session("local[2]", "bench-sessionization", shuffle_partitions=PARTITIONS)
    work = Path(tempfile.mkdtemp(prefix="bench-sessions-"))
    try:
        input_dir = work / "events"
        input_dir.mkdir()
        paths = write_event_files(spark, input_dir, max(args.files, args.peer_files))

        print("untimed warm-up", bare_shuffle(spark, paths[: args.files]), flush=True)
        bare_rounds, our_rounds = [], []
        for r in range(args.rounds):
            if r % 2 == 1:
                ours, ours_closed = run_batchline(spark, input_dir, args.files, work / f"batchline-{r}")
            bare_rounds.append(bare_shuffle(spark, paths[: args.files]))
            print(f"round {r + 1}: bare", bare_rounds[-1], flush=True)
            if r % 2 == 0:
                ours, ours_closed = run_batchline(spark, input_dir, args.files, work / f"batchline-{r}")
            our_rounds.append(ours)
        peer_dir = work / "peer-in"
        peer_dir.mkdir()
        for path in paths[: args.peer_files]:
            shutil.copy(path, peer_dir / path.name)
        peer = run_peer(spark, peer_dir, args.peer_files, work / "peer-checkpoint")
        print("peer", peer, flush=True)
        bytewax_runs: dict[str, dict[str, Any]] = {}
        if use_bytewax:
            for name, recovery in (("bytewax", False), ("bytewax_recovery", True)):
                bytewax_runs[name] = run_bytewax(paths[: args.files], recovery)
                print(name, bytewax_runs[name], flush=True)

        steady = lambda xs: statistics.median(xs[1:]) if len(xs) > 1 else xs[0]  # noqa: E731 - first batch warms up
        pooled = lambda rounds: statistics.median([x for xs in rounds for x in xs[1:]])  # noqa: E731 - the same, per round
        throughput = {
            "events_per_batch": EVENTS_PER_BATCH, "users": USERS, "partitions": PARTITIONS,
            "rounds": args.rounds, "order": "the bare job first in odd rounds, batchline first in even ones",
            "untimed_warm_up": "one pass of the bare job",
            "batchline_batch_seconds": [[round(x, 2) for x in xs] for xs in our_rounds],
            "peer_batch_seconds": [round(x, 2) for x in peer],
            "bare_batch_seconds": [[round(x, 2) for x in xs] for xs in bare_rounds],
            "batchline_events_per_s": round(EVENTS_PER_BATCH / pooled(our_rounds)),
            "peer_events_per_s": round(EVENTS_PER_BATCH / steady(peer)),
            "bare_events_per_s": round(EVENTS_PER_BATCH / pooled(bare_rounds)),
        }
        throughput["vs_peer"] = round(throughput["batchline_events_per_s"] / throughput["peer_events_per_s"], 1)
        throughput["vs_bare"] = round(throughput["batchline_events_per_s"] / throughput["bare_events_per_s"], 2)
        notes: dict[str, Any] = {}
        for name, result in bytewax_runs.items():
            throughput[f"{name}_batch_seconds"] = [round(x, 2) for x in result["batch_seconds"]]
            throughput[f"{name}_events_per_s"] = round(EVENTS_PER_BATCH / steady(result["batch_seconds"]))
            throughput[f"vs_{name}"] = round(throughput["batchline_events_per_s"]
                                             / throughput[f"{name}_events_per_s"], 2)
            closed = result["closed_sessions"]
            notes[name] = {k: v for k, v in result.items() if k != "batch_seconds"} | {
                "events_per_s_whole_run": round(EVENTS_PER_BATCH * len(result["batch_seconds"])
                                                / sum(result["batch_seconds"])),
                "same_sessions_as_batchline": (sum(closed.values()), closed["timeout"])
                == (ours_closed["closed"], ours_closed["timeout"])}
        if bytewax_runs:
            throughput["bytewax"] = {
                "version": importlib.metadata.version("bytewax"), "workers": 1,
                "operator": "stateful_batch, timeouts by notify_at",
                "runs": {"bytewax": "no recovery (epochs of 10 s, the default)",
                         "bytewax_recovery": "SQLite recovery, one partition, snapshots every 2 s (epoch_interval)"},
                "compare_batchline_with": "bytewax_recovery",
                "why": "batchline commits its state to the checkpoint every batch; of Bytewax's runs only "
                       "the recovery one keeps state durably",
                "timeouts": "processing time counted in files on both sides (batchline: a manual clock, one minute "
                            "per file; Bytewax: wall-clock notify_at aimed at the start of the file after the due one, "
                            "erring late since a timer that fires early costs Bytewax extra calls and a late one does "
                            "not, see "
                            "benchmarks/bytewax_sessions.py): the same sessions close the same way, Bytewax's "
                            "timeouts later; on_notify_calls against the timeouts (batchline: one call each) show "
                            "what the timers cost Bytewax",
                "batchline_closed_sessions": ours_closed,
                **notes,
            }
        print("throughput", throughput, flush=True)
        session_memory = memory_per_key(work / f"batchline-{args.rounds - 1}", "sessions", UserSession)
        print("session state memory", session_memory, flush=True)

        scale: dict[str, Any] = {"changed_keys_per_batch": args.changed, "warm_up_batches": 3}
        count_memory = None
        for keys in [int(k) for k in args.scale.split(",")]:
            times = scale_run(spark, keys, args.changed, args.scale_batches, work / f"scale-{keys}")
            scale[str(keys)] = {"batch_seconds": [round(t, 3) for t in times],
                                "median_after_warm_up": round(statistics.median(times[3:]), 3)}
            print("scale", keys, scale[str(keys)], flush=True)
            count_memory = memory_per_key(work / f"scale-{keys}", "counts", COUNT_STATE)
        sizes = [k for k in scale if k.isdigit()]
        scale["largest_vs_smallest"] = round(scale[sizes[-1]]["median_after_warm_up"]
                                             / scale[sizes[0]]["median_after_warm_up"], 2)
        print("scale ratio", scale["largest_vs_smallest"], flush=True)
        print("count state memory", count_memory, flush=True)

        path = write_result("sessionization", {
            "throughput": throughput, "state_scale": scale,
            "memory": {"sessions": session_memory, "running_count": count_memory},
        })
        print(f"wrote {path}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
