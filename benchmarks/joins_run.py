"""One side of ``benchmarks/joins.py``, in a process of its own: a stream-stream join of
impressions and clicks over Parquet files, from process start to exit.

    python -m benchmarks.joins_run batchline|peer INPUT_DIR OUTPUT_DIR CHECKPOINT_DIR FILES_PER_BATCH CASE

``INPUT_DIR`` holds ``impressions/`` and ``clicks/``; ``CASE`` is ``inner`` or ``left``.

- ``batchline``: two ``file_stream(..., "parquet", bounded=True, max_files_per_batch=k)``,
  ``with_watermark`` on ``shown_at`` and ``clicked_at``, ``impressions.join(clicks,
  "impression_id", how=CASE, within=("shown_at", "clicked_at", "0 seconds", "10 minutes"))``,
  ``write_files`` (parquet), and ``run_until_finished()``.
- ``peer``: Spark Structured Streaming, two ``readStream.parquet`` with ``maxFilesPerTrigger=k``,
  ``withWatermark`` on both, Spark's stream-stream join on ``i_id = c_id AND clicked_at >=
  shown_at AND clicked_at <= shown_at + interval 10 minutes`` (``inner`` / ``leftOuter``), the
  parquet file sink, ``trigger(availableNow=True)``.

Both write ``impression_id, ad_id, shown_at, clicked_at`` (``clicked_at`` null for a left
outer row without a click). Besides ``bounded_run``'s ``mark``/``log``/``batch`` lines, the
batchline side prints ``state <batch_time> <records> <state_keys> <state_bytes> <watermark_ms>``
per completed batch and the peer ``peerstate <batch_id> <numRowsTotal> <memoryUsedBytes>`` per
progress. ``python -m benchmarks.joins_run state CHECKPOINT_DIR VERSION`` prints the Arrow
bytes of the batchline side's state at a version (``read_state``). With
``BENCH_WINDOWS_PROFILE`` set to a directory, the batchline side profiles itself into it
(``benchmarks/windows_profile.py``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

STARTED = time.time()  # only after the interpreter's own start-up; the parent times the process

from benchmarks import windows_profile  # noqa: E402
from benchmarks.bounded_run import emit, emit_peer_progress, instrument_batchline, mark  # noqa: E402

IMPRESSIONS_SCHEMA = "impression_id long, ad_id long, shown_at timestamp"
CLICKS_SCHEMA = "impression_id long, clicked_at timestamp"
WATERMARK_DELAY = "1 minute"
WITHIN = ("shown_at", "clicked_at", "0 seconds", "10 minutes")
PARTITIONS = 4
OPERATOR = "joined"
CASES = {"inner": ("inner", "inner"), "left": ("left", "leftOuter")}
"""Case: (batchline's ``how``, Structured Streaming's join type)."""
COLUMNS = ("impression_id", "ad_id", "shown_at", "clicked_at")


def instrument_state(ssc: Any) -> None:
    """``state ...`` lines: the operator's keys, estimated bytes and watermark after each batch."""
    from batchline import StreamingListener

    class State(StreamingListener):
        def on_batch_completed(self, info: Any) -> None:
            progress = info.state_operators.get(OPERATOR)
            if info.failure is None and progress is not None:
                emit(f"state {info.batch_time} {info.num_records} {progress.state_keys} {progress.state_bytes} "
                     f"{progress.watermark_ms if progress.watermark_ms is not None else ''}".rstrip())

    ssc.add_listener(State())


def run_batchline(how: str, input_dir: str, output_dir: str, checkpoint: str, files_per_batch: int) -> None:
    from batchline import StreamingContext
    from batchline.spark import local_spark_session

    mark("imported")
    conf = {}
    if os.environ.get(windows_profile.ENV):
        conf = windows_profile.install(Path(os.environ[windows_profile.ENV]))
    spark = local_spark_session("local[2]", "bench-joins", shuffle_partitions=PARTITIONS, conf=conf)
    mark("spark")
    ssc = StreamingContext(spark, "1s", checkpoint=checkpoint)
    instrument_batchline(ssc, OPERATOR)
    instrument_state(ssc)
    impressions = ssc.file_stream(str(Path(input_dir) / "impressions"), "parquet", IMPRESSIONS_SCHEMA, bounded=True,
                                  max_files_per_batch=files_per_batch, name="impressions")
    clicks = ssc.file_stream(str(Path(input_dir) / "clicks"), "parquet", CLICKS_SCHEMA, bounded=True,
                             max_files_per_batch=files_per_batch, name="clicks")
    joined = impressions.with_watermark("shown_at", WATERMARK_DELAY).join(
        clicks.with_watermark("clicked_at", WATERMARK_DELAY), "impression_id", how=how, within=WITHIN,
        name=OPERATOR, num_partitions=PARTITIONS)
    joined.write_files(output_dir, format="parquet", name="out")
    ssc.run_until_finished()
    mark("finished")
    spark.stop()
    mark("spark_stopped")


def run_peer(how: str, input_dir: str, output_dir: str, checkpoint: str, files_per_batch: int) -> None:
    from pyspark.sql import functions as F

    from batchline.spark import local_spark_session

    mark("imported")
    spark = local_spark_session("local[2]", "bench-joins-peer", shuffle_partitions=PARTITIONS)
    mark("spark")
    impressions = (spark.readStream.schema(IMPRESSIONS_SCHEMA).option("maxFilesPerTrigger", files_per_batch)
                   .parquet(str(Path(input_dir) / "impressions")).withColumnRenamed("impression_id", "i_id")
                   .withWatermark("shown_at", WATERMARK_DELAY))
    clicks = (spark.readStream.schema(CLICKS_SCHEMA).option("maxFilesPerTrigger", files_per_batch)
              .parquet(str(Path(input_dir) / "clicks")).withColumnRenamed("impression_id", "c_id")
              .withWatermark("clicked_at", WATERMARK_DELAY))
    condition = F.expr(f"i_id = c_id AND clicked_at >= shown_at + interval {WITHIN[2]} "
                       f"AND clicked_at <= shown_at + interval {WITHIN[3]}")
    joined = impressions.join(clicks, condition, how).select(
        F.col("i_id").alias("impression_id"), "ad_id", "shown_at", "clicked_at")
    query = (joined.writeStream.outputMode("append").format("parquet").option("path", output_dir)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    mark("query_started")
    query.awaitTermination()
    mark("finished")
    emit_peer_progress(query)
    for p in query.recentProgress:
        operators = p.get("stateOperators") or [{}]
        emit(f"peerstate {p['batchId']} {sum(o.get('numRowsTotal', 0) for o in operators)} "
             f"{sum(o.get('memoryUsedBytes', 0) for o in operators)}")
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    spark.stop()
    mark("spark_stopped")


def read_state_bytes(checkpoint: str, version: int) -> None:
    """``statebytes <version> <keys> <Arrow bytes> <left rows> <right rows>``: the join's state at
    ``version`` read back with ``read_state`` (key, both sides' buffered rows, timeout) as Arrow."""
    import pyarrow.compute as pc

    from batchline.spark import local_spark_session
    from batchline.state import read_state

    spark = local_spark_session("local[2]", "bench-joins-state", shuffle_partitions=PARTITIONS)
    try:
        table = read_state(spark, checkpoint, OPERATOR, version=version).toArrow()
        rows = [int(pc.sum(pc.list_value_length(table[side])).as_py() or 0) for side in ("left", "right")]
        emit(f"statebytes {version} {table.num_rows} {table.nbytes} {rows[0]} {rows[1]}")
    finally:
        spark.stop()


if __name__ == "__main__" and sys.argv[1] == "state":
    read_state_bytes(sys.argv[2], int(sys.argv[3]))
elif __name__ == "__main__":
    side, input_dir, output_dir, checkpoint, files_per_batch, case = sys.argv[1:7]
    mark("python", STARTED)
    how = CASES[case][0 if side == "batchline" else 1]
    {"batchline": run_batchline, "peer": run_peer}[side](how, input_dir, output_dir, checkpoint, int(files_per_batch))
