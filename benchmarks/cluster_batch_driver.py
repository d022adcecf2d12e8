"""The small-batch case of ``benchmarks.cluster``, in a driver process of its own (the S3
endpoint runs in the benchmark's process, as in the tests, so it does not share this
driver's interpreter):

    python -m benchmarks.cluster_batch_driver MASTER CHECKPOINT_URL OUT_URL STORAGE_OPTIONS_JSON
        [--rounds 2] [--batches 30]

Each round runs, on one SparkSession on the standalone master, after a warm-up round of both:
- bare: ``--batches`` PySpark jobs of the cluster tests' batch shape and nothing else: 400
  generator events from ``range`` on 2 partitions, ``repartition(3, id)``, a ``mapInArrow``
  that numbers each user's events in index order and writes its partition as one JSON-lines
  file to the S3 endpoint (one PUT), collected. A sample is the job's wall time.
- engine: the cluster tests' pipeline (``harness.numbering.numbering_pipeline``: state in
  3 partitions, checkpoint and output on the S3 endpoint, 500 ms interval, real clock) over
  ``--batches`` batches of 400 events. A sample is a batch's progress record.

Prints one JSON line ``{"bare_ms": [[...] per round], "engine": [[record, ...] per round]}``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from batchline import StreamingListener
from batchline.scheduler.progress import BatchProgress
from batchline.sources.generator import index_range
from batchline.spark import local_spark_session
from harness.cluster import DRIVER_CONF
from harness.numbering import SEED, USERS, make_numbering, numbering_pipeline

EVENTS = 400
RATE = 4000
"""The tests' generator rate: events ``i`` is at ``i / RATE`` seconds (its ``ts``)."""


def events(spark: SparkSession, start: int, end: int) -> DataFrame:
    """The generator's rows for indexes ``start`` to ``end``, made the way it makes them."""
    index = F.col("id")
    return index_range(spark, start, end, 2).select(
        F.pmod(F.xxhash64(F.lit(SEED), index), F.lit(USERS)).cast("int").alias("id"),
        F.concat(F.lit("event-"), index.cast("string")).alias("data"),
        (F.pmod(F.xxhash64(F.lit(SEED + 1), index), F.lit(1_000_000)) < F.lit(50_000)).alias("is_last"),
        F.timestamp_millis((index * F.lit(1000.0 / RATE)).cast("long")).alias("ts"),
    )


def number_and_write(out: str, options: dict[str, Any]) -> Callable[[Iterator[pa.RecordBatch]],
                                                                      Iterator[pa.RecordBatch]]:
    """The task of the bare job: the state function's numbering without state, and the write
    without staging, commit record or publishing."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import fsspec
        from pyspark import TaskContext

        groups: dict[int, list[str]] = {}
        for batch in batches:
            for user, data in zip(batch.column("id").to_pylist(), batch.column("data").to_pylist(), strict=True):
                groups.setdefault(user, []).append(data)
        lines = [json.dumps({"event": data, "user": user, "seq": seq})
                 for user, rows in groups.items()
                 for seq, data in enumerate(sorted(rows, key=lambda d: int(d.split("-")[1])), 1)]
        if lines:
            fs, root = fsspec.core.url_to_fs(out, **options)
            context = TaskContext.get()
            fs.pipe_file(f"{root}/part-{context.partitionId() if context else 0:05d}.json",
                         ("\n".join(lines) + "\n").encode())
        yield pa.RecordBatch.from_pydict({"rows": [len(lines)]}, schema=pa.schema([("rows", pa.int64())]))

    return run


def bare_batch(spark: SparkSession, start: int, out: str, options: dict[str, Any]) -> float:
    began = time.perf_counter()
    written = (events(spark, start, start + EVENTS).repartition(3, "id")
               .mapInArrow(number_and_write(out, options), "rows long").collect())
    elapsed = time.perf_counter() - began
    assert sum(r["rows"] for r in written) == EVENTS, written
    return elapsed


class _Records(StreamingListener):
    def __init__(self) -> None:
        self.records: list[BatchProgress] = []

    def on_progress(self, progress: BatchProgress) -> None:
        self.records.append(progress)


def summary(record: BatchProgress) -> dict[str, Any]:
    durations = record.durations
    return {
        "batch_time": record.batch_time,
        "status": record.status,
        "records": sum(i.records for i in record.inputs),
        "generation_ms": durations.generation_ms,
        "processing_ms": record.processing_ms,
        "commit_ms": durations.commit_ms,
        "completed_ms": (record.processing_end_ms or 0) + durations.commit_ms,
        # By kind: the output job's name holds its path, which differs between rounds.
        "jobs_ms": {kind: sum(job.duration_ms for job in durations.jobs if job.kind == kind)
                    for kind in {job.kind for job in durations.jobs}},
        "checkpoint_ms": durations.checkpoint_ms,
        "backlog": record.backlog,
    }


def engine_batches(spark: SparkSession, checkpoint: str, out: str, options: dict[str, Any],
                   batches: int) -> list[dict[str, Any]]:
    ssc = numbering_pipeline(spark, checkpoint, out, options, EVENTS * batches, make_numbering(None, None, None))
    listener = _Records()
    ssc.add_listener(listener)
    if not ssc.run_until_finished(timeout=600):
        ssc.stop(graceful=False)
        raise RuntimeError("the engine's pipeline did not finish in 600 s")
    return [summary(r) for r in listener.records]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("master")
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("storage_options", type=json.loads)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()
    spark = local_spark_session(args.master, "bench-cluster-batches", shuffle_partitions=2, conf=DRIVER_CONF)
    options = args.storage_options
    bare: list[list[float]] = []
    engine: list[list[dict[str, Any]]] = []
    # Round 0 warms the executors up and is not kept: both sides keep getting faster for some
    # 50 jobs (the JVMs' JIT). Then the side that goes first alternates, against what drift is left.
    for r in range(args.rounds + 1):
        for side in ("bare", "engine") if r % 2 else ("engine", "bare"):
            if side == "bare":
                bare.append([bare_batch(spark, EVENTS * i, f"{args.out}/bare-{r}/batch={i}", options) * 1000
                             for i in range(args.batches)])
            else:
                engine.append(engine_batches(spark, f"{args.checkpoint}/engine-{r}", f"{args.out}/engine-{r}",
                                             options, args.batches))
    spark.stop()
    print(json.dumps({"bare_ms": bare[1:], "engine": engine[1:]}), flush=True)


if __name__ == "__main__":
    main()
