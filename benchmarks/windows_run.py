"""One side of ``benchmarks/windows.py``, in a process of its own: an event-time windowed
aggregation (or, case ``d``, a deduplication) over Parquet files, from process start to exit.

    python -m benchmarks.windows_run batchline|peer INPUT_DIR OUTPUT_DIR CHECKPOINT_DIR FILES_PER_BATCH CASE

- ``batchline``: ``file_stream(..., "parquet", bounded=True, max_files_per_batch=k)``,
  ``with_watermark``, the case's ``group_by_key(window(...) or session_window(...),
  "key").aggregate(...)`` in append mode (case ``d``: ``drop_duplicates_within_watermark("key")``),
  ``write_files`` (parquet), and ``run_until_finished()``.
- ``peer``: Spark Structured Streaming, ``readStream.parquet`` with ``maxFilesPerTrigger=k``,
  ``withWatermark``, the case's ``groupBy(window(...) or session_window(...), "key").agg(...)``
  (Spark's native stateful aggregation; case ``d``: ``dropDuplicatesWithinWatermark(["key"])``)
  in append mode, the parquet file sink, ``trigger(availableNow=True)``.

A case is an entry of ``CASES``: how each side computes its rows from the watermarked input.
With ``BENCH_WINDOWS_PROFILE`` set to a directory, the batchline side profiles itself into it
(``benchmarks/windows_profile.py``) and the peer writes its Spark event log there. Both sides
print bounded_run's ``mark``/``log``/``batch`` lines, which ``bounded.py``'s figures read.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

STARTED = time.time()  # only after the interpreter's own start-up; the parent times the process

from benchmarks import windows_profile  # noqa: E402
from benchmarks.bounded_run import finish_peer, instrument_batchline, mark  # noqa: E402

SCHEMA = "key long, value long, ts timestamp"
WATERMARK_DELAY = "10 seconds"
PARTITIONS = 4
OPERATOR = "windows"


# ------------------------------------------------------------------ the cases
def batchline_windows(length: str, slide: str | None) -> Callable[[Any], Any]:
    """Count, sum and max of ``value`` per key and window, emitted once per window (append)."""
    def build(events: Any) -> Any:
        from batchline import aggregates as agg
        from batchline import window

        return events.group_by_key(window("ts", length, slide), "key").aggregate(
            agg.count(), agg.sum("value"), agg.max("value"), output_mode="append", name=OPERATOR,
            num_partitions=PARTITIONS)
    return build


def peer_windows(length: str, slide: str | None) -> Callable[[Any], Any]:
    """The same with Structured Streaming's own operator; rows out as batchline's."""
    def build(events: Any) -> Any:
        from pyspark.sql import functions as F

        window = F.window("ts", length, slide) if slide else F.window("ts", length)
        return (events.groupBy(window.alias("window"), "key")
                .agg(F.count(F.lit(1)).alias("count"), F.sum("value").alias("sum_value"),
                     F.max("value").alias("max_value"))
                .select("key", F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                        "count", "sum_value", "max_value"))
    return build


def batchline_sessions(gap: str) -> Callable[[Any], Any]:
    """Count, sum and max of ``value`` per key and session window, each session emitted once
    it closed (append)."""
    def build(events: Any) -> Any:
        from batchline import aggregates as agg
        from batchline import session_window

        return events.group_by_key(session_window("ts", gap), "key").aggregate(
            agg.count(), agg.sum("value"), agg.max("value"), output_mode="append", name=OPERATOR,
            num_partitions=PARTITIONS)
    return build


def peer_sessions(gap: str) -> Callable[[Any], Any]:
    """The same with Structured Streaming's ``session_window``; rows out as batchline's."""
    def build(events: Any) -> Any:
        from pyspark.sql import functions as F

        return (events.groupBy(F.session_window("ts", gap).alias("window"), "key")
                .agg(F.count(F.lit(1)).alias("count"), F.sum("value").alias("sum_value"),
                     F.max("value").alias("max_value"))
                .select("key", F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                        "count", "sum_value", "max_value"))
    return build


def batchline_dedup(events: Any) -> Any:
    """The rows whose ``key`` was not seen within the watermark's delay (the rows kept)."""
    return events.drop_duplicates_within_watermark("key", name=OPERATOR, num_partitions=PARTITIONS)


def peer_dedup(events: Any) -> Any:
    """The same with Structured Streaming's ``dropDuplicatesWithinWatermark``."""
    return events.dropDuplicatesWithinWatermark(["key"])


class Case(NamedTuple):
    batchline: Callable[[Any], Any]
    """A batchline ``Stream`` of the input (watermarked) to the stream of rows out."""
    peer: Callable[[Any], Any]
    """A streaming ``DataFrame`` of the input (watermarked) to the rows out."""
    watermark_delay: str = WATERMARK_DELAY


CASES: dict[str, Case] = {
    "a": Case(batchline_windows("1 minute", None), peer_windows("1 minute", None)),
    "b": Case(batchline_windows("5 minutes", "1 minute"), peer_windows("5 minutes", "1 minute")),
    "c": Case(batchline_sessions("30 seconds"), peer_sessions("30 seconds")),
    "d": Case(batchline_dedup, peer_dedup, "10 minutes"),
}


# ------------------------------------------------------------------ the sides
def run_batchline(case: Case, input_dir: str, output_dir: str, checkpoint: str, files_per_batch: int) -> None:
    from batchline import StreamingContext
    from batchline.spark import local_spark_session

    mark("imported")
    conf = {}
    if os.environ.get(windows_profile.ENV):
        conf = windows_profile.install(Path(os.environ[windows_profile.ENV]))
    spark = local_spark_session("local[2]", "bench-windows", shuffle_partitions=PARTITIONS, conf=conf)
    mark("spark")
    ssc = StreamingContext(spark, "1s", checkpoint=checkpoint)
    instrument_batchline(ssc, OPERATOR)
    events = ssc.file_stream(input_dir, "parquet", SCHEMA, bounded=True, max_files_per_batch=files_per_batch,
                             name="events")
    out = case.batchline(events.with_watermark("ts", case.watermark_delay))
    out.write_files(output_dir, format="parquet", name="out")
    ssc.run_until_finished()
    mark("finished")
    spark.stop()
    mark("spark_stopped")


def run_peer(case: Case, input_dir: str, output_dir: str, checkpoint: str, files_per_batch: int) -> None:
    from batchline.spark import local_spark_session

    mark("imported")
    conf = {}
    if os.environ.get(windows_profile.ENV):  # the event log only: no Python task to profile
        conf = windows_profile.event_log_conf(Path(os.environ[windows_profile.ENV]))
    spark = local_spark_session("local[2]", "bench-windows-peer", shuffle_partitions=PARTITIONS, conf=conf)
    mark("spark")
    events = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", files_per_batch).parquet(input_dir)
              .withWatermark("ts", case.watermark_delay))
    query = (case.peer(events).writeStream.outputMode("append").format("parquet").option("path", output_dir)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    finish_peer(spark, query)


if __name__ == "__main__":
    side, input_dir, output_dir, checkpoint, files_per_batch, case = sys.argv[1:7]
    mark("python", STARTED)
    {"batchline": run_batchline, "peer": run_peer}[side](CASES[case], input_dir, output_dir, checkpoint,
                                                          int(files_per_batch))
