"""Fixed cost per batch: batchline against a bare PySpark job of the same shape.

Both run in one process on one SparkSession. The engine side drives a real StreamingContext
on a manual clock as fast as batches complete (so no interval sleeping is measured): each
sample is the wall time from the timer firing to the batch's completion event, which covers
the event loop, input allocation, job generation, submission, the Spark job and the listener.
The bare side builds the same DataFrame from ``spark.range``, as the generator builds it
(``index_range``: the same generated code batch after batch), and runs the same action.
Rounds alternate between the two to cancel drift.

    python -m benchmarks.batch_overhead [--rounds 5] [--batches 40]
"""

from __future__ import annotations

import argparse
import statistics
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from batchline import StreamingContext
from batchline.clock import ManualClock
from batchline.sources.generator import index_range
from batchline.spark import local_spark_session
from benchmarks.completions import Completions
from benchmarks.machine import write_result

INTERVAL_MS = 1000


def _bare_events(spark: SparkSession, start: int, end: int) -> DataFrame:
    index = F.col("id")
    return index_range(spark, start, end).select(
        F.pmod(F.xxhash64(F.lit(0), index), F.lit(1000)).cast("int").alias("id"),
        F.concat(F.lit("event-"), index.cast("string")).alias("data"),
        (F.pmod(F.xxhash64(F.lit(1), index), F.lit(1_000_000)) < F.lit(50_000)).alias("is_last"),
        F.timestamp_millis(F.lit(0) + index * F.lit(10)).alias("ts"),
    )


def bare_batches(spark: SparkSession, records: int, batches: int, offset: int) -> list[float]:
    samples = []
    for i in range(batches):
        began = time.perf_counter()
        start = offset + i * records
        _bare_events(spark, start, start + records).collect()
        samples.append(time.perf_counter() - began)
    return samples


def engine_batches(spark: SparkSession, records: int, batches: int) -> list[float]:
    clock = ManualClock(10 * INTERVAL_MS + 1)
    ssc = StreamingContext(spark, INTERVAL_MS / 1000, clock=clock)
    events = ssc.generator_stream(rate=records * 1000 / INTERVAL_MS)
    events.foreach_batch(lambda df, batch_time: df.collect())
    completions = Completions()
    ssc.add_listener(completions)
    ssc.start()
    try:
        samples = [completions.next_batch(clock, INTERVAL_MS, 60) for _ in range(batches)]
    finally:
        ssc.stop()
    return samples


def measure(spark: SparkSession, records: int, rounds: int, batches: int) -> dict[str, float]:
    engine, bare = [], []
    engine_batches(spark, records, 10)  # warm-up: JIT, Python workers, code paths
    bare_batches(spark, records, 10, 0)
    for r in range(rounds):
        bare += bare_batches(spark, records, batches, offset=r * batches * records)
        engine += engine_batches(spark, records, batches)
    engine_ms, bare_ms = statistics.median(engine) * 1000, statistics.median(bare) * 1000
    return {
        "records_per_batch": records,
        "batches_measured": len(engine),
        "engine_median_ms": round(engine_ms, 2),
        "bare_pyspark_median_ms": round(bare_ms, 2),
        "engine_p90_ms": round(statistics.quantiles(engine, n=10)[-1] * 1000, 2),
        "bare_pyspark_p90_ms": round(statistics.quantiles(bare, n=10)[-1] * 1000, 2),
        "ratio": round(engine_ms / bare_ms, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()
    spark = local_spark_session("local[2]", "batchline-bench-overhead", shuffle_partitions=2)
    results = [measure(spark, records, args.rounds, args.batches) for records in (0, 100)]
    for row in results:
        print(
            f"{row['records_per_batch']:>4} records/batch: engine {row['engine_median_ms']:.1f} ms, "
            f"bare PySpark {row['bare_pyspark_median_ms']:.1f} ms, ratio {row['ratio']:.2f}x (goal <= 1.2x)"
        )
    path = write_result("batch_overhead", {"goal_ratio": 1.2, "cases": results})
    print(f"wrote {path}")
    spark.stop()


if __name__ == "__main__":
    main()
