"""Small batches: can a 1 s interval keep up? batchline against a bare PySpark job of the
same shape, in one process on one SparkSession, rounds alternating.

Each batch is one JSON-lines file of about 7k generated user events (issue 17's case):
- batchline: ``file_stream(json)`` → the seed's sessionization (``flat_map_groups_with_state``,
  processing-time timeouts, 4 state partitions, checkpoint on local disk) → closed sessions
  written with ``write_files(parquet)``. Driven by a manual clock as fast as batches complete;
  a sample is the wall time from the timer firing to the batch's completion event, so job
  generation, the event loop and the checkpoint's batch log are in it.
- bare: ``spark.read.json(file, schema)`` → ``repartition(4, id)`` → ``mapInArrow`` grouping
  each partition's rows by user in Python and yielding closed sessions → ``write.parquet``.

    python -m benchmarks.small_batches [--rounds 3] [--batches 15] [--events 7000]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from batchline import StreamingContext
from batchline.clock import ManualClock
from batchline.examples.sessionization import ClosedSession, UserSession, update_session
from batchline.scheduler.listener import BatchInfo
from batchline.sources.generator import USER_EVENT_SCHEMA
from batchline.spark import local_spark_session
from batchline.state import GroupStateTimeout
from benchmarks.completions import Completions
from benchmarks.machine import write_result

INTERVAL_MS = 1000
PARTITIONS = 4
USERS = 2000


def write_files(directory: Path, files: int, events: int, first: int) -> list[Path]:
    """``files`` JSON-lines files of ``events`` user events each, named in batch order."""
    rng = random.Random(first)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    base_ms = 1_800_000_000_000 + first * events * 10
    for f in range(first, first + files):
        lines = []
        for i in range(events):
            ms = base_ms + (f * events + i) * 10
            lines.append(json.dumps({
                "id": rng.randrange(USERS), "data": f"event-{f}-{i}", "is_last": rng.random() < 0.05,
                "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"}))
        path = directory / f"events-{f:05d}.json"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


# ------------------------------------------------------------------ bare PySpark
def _sessions(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The per-key work without state: rows grouped by user, a closed session per last event."""
    out: dict[str, list[Any]] = {"user": [], "events": []}
    groups: dict[int, list[tuple[Any, ...]]] = {}
    for batch in batches:
        columns = [c.to_pylist() for c in batch.columns]
        for row in zip(*columns, strict=True):
            groups.setdefault(row[0], []).append(row)
    for user, rows in groups.items():
        count = 0
        for row in sorted(rows, key=lambda r: r[3]):
            count += 1
            if row[2]:
                out["user"].append(user)
                out["events"].append(count)
                count = 0
    yield pa.RecordBatch.from_pydict(out, schema=pa.schema([("user", pa.int32()), ("events", pa.int64())]))


def bare_batches(spark: SparkSession, paths: list[Path], out: Path) -> list[float]:
    samples = []
    for path in paths:
        began = time.perf_counter()
        (spark.read.schema(USER_EVENT_SCHEMA).json(str(path)).repartition(PARTITIONS, "id")
         .mapInArrow(_sessions, "user int, events long").write.mode("overwrite").parquet(str(out / path.stem)))
        samples.append(time.perf_counter() - began)
    return samples


# ------------------------------------------------------------------ batchline
def steady_batches(spark: SparkSession, build: Callable[[StreamingContext], Any], checkpoint: Path, batches: int
                   ) -> tuple[list[float], list[BatchInfo]]:
    """The pipeline ``build(ssc)`` sets up, driven by a manual clock as fast as its batches
    complete: each batch's seconds from the timer firing to its completion, and its info."""
    clock = ManualClock(1_000 * INTERVAL_MS)
    ssc = StreamingContext(spark, f"{INTERVAL_MS}ms", clock=clock, checkpoint=str(checkpoint))
    build(ssc)
    completions = Completions()
    ssc.add_listener(completions)
    ssc.start()
    try:
        samples = [completions.next_batch(clock, INTERVAL_MS) for _ in range(batches)]
    finally:
        ssc.stop(graceful=False)
    return samples, completions.infos


def engine_batches(spark: SparkSession, input_dir: Path, out: Path, checkpoint: Path, batches: int
                   ) -> tuple[list[float], list[BatchInfo]]:
    def build(ssc: StreamingContext) -> None:
        events = ssc.file_stream(str(input_dir), "json", USER_EVENT_SCHEMA, settle=0, max_files_per_batch=1)
        events.group_by_key("id").flat_map_groups_with_state(
            update_session, state_schema=UserSession, output_schema=ClosedSession,
            timeout=GroupStateTimeout.PROCESSING_TIME, name="sessions", num_partitions=PARTITIONS,
        ).write_files(str(out), "parquet", name="sessions_out")
    return steady_batches(spark, build, checkpoint, batches)


# ------------------------------------------------------------------ rounds
def alternate_rounds(rounds: int, warmup: int, bare_round: Callable[[int], list[float]],
                     engine_round: Callable[[int], tuple[list[float], list[BatchInfo]]]
                     ) -> tuple[list[float], list[float], list[BatchInfo]]:
    """``rounds`` rounds, each the bare job's batches then the engine's (``bare_round(r)``,
    ``engine_round(r)``); the samples of both without each round's first ``warmup`` batches,
    and the engine's batch infos."""
    engine: list[float] = []
    bare: list[float] = []
    infos: list[BatchInfo] = []
    for r in range(rounds):
        bare_samples = bare_round(r)[warmup:]
        samples, round_infos = engine_round(r)
        bare += bare_samples
        engine += samples[warmup:]
        infos += round_infos
        print(f"round {r + 1}: engine median {statistics.median(samples[warmup:]) * 1000:.0f} ms, "
              f"bare median {statistics.median(bare_samples) * 1000:.0f} ms", flush=True)
    return engine, bare, infos


def ratio_figures(engine: list[float], bare: list[float]) -> dict[str, Any]:
    """Medians and p90s of both sides' batch times (ms) and the ratio of the medians."""
    engine_ms, bare_ms = statistics.median(engine) * 1000, statistics.median(bare) * 1000
    return {
        "batches_measured": len(engine),
        "engine_median_ms": round(engine_ms, 1),
        "engine_p90_ms": round(statistics.quantiles(engine, n=10)[-1] * 1000, 1),
        "bare_pyspark_median_ms": round(bare_ms, 1),
        "bare_pyspark_p90_ms": round(statistics.quantiles(bare, n=10)[-1] * 1000, 1),
        "ratio": round(engine_ms / bare_ms, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--events", type=int, default=7000)
    parser.add_argument("--warmup", type=int, default=3, help="batches of each round not counted (JIT, workers)")
    args = parser.parse_args()
    spark = local_spark_session("local[2]", "batchline-bench-small-batches", shuffle_partitions=PARTITIONS)
    work = Path(tempfile.mkdtemp(prefix="batchline-small-"))

    def bare_round(r: int) -> list[float]:
        paths = write_files(work / f"bare-{r}", args.batches, args.events, (r + 1) * 1000)
        return bare_batches(spark, paths, work / f"bare-out-{r}")

    def engine_round(r: int) -> tuple[list[float], list[BatchInfo]]:
        write_files(work / f"engine-{r}", args.batches, args.events, (r + 1) * 1000)
        return engine_batches(spark, work / f"engine-{r}", work / f"engine-out-{r}", work / f"checkpoint-{r}",
                              args.batches)

    try:
        bare_batches(spark, write_files(work / "warm", 3, args.events, 0), work / "warm-out")
        engine, bare, infos = alternate_rounds(args.rounds, args.warmup, bare_round, engine_round)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    records = [info.num_records for info in infos]
    assert all(n == args.events for n in records), f"a batch did not count {args.events} records: {records}"
    figures = {
        "events_per_batch": args.events,
        "state_partitions": PARTITIONS,
        **ratio_figures(engine, bare),
        "goal_ratio": 1.2,
    }
    figures["keeps_up_with_1s"] = figures["engine_median_ms"] < INTERVAL_MS
    print(json.dumps(figures, indent=2))
    print(f"wrote {write_result('small_batches', figures)}")


if __name__ == "__main__":
    main()
