"""One streaming driver for the restart benchmarks: JSON files in, JSON files out, checkpointed.

    python -m benchmarks.restart_driver {batchline|sss} IN OUT CHECKPOINT
        [--master URL] [--storage-options JSON]

``sss`` is Spark Structured Streaming (file source, foreachBatch, a 500 ms processing-time
trigger), ``batchline`` the same pipeline on batchline. Both print ``batch <rows> <new rows>``
when a batch with rows is done; new rows are those of the files written after the crash
(``f1NNN-`` ids, see ``benchmarks.checkpoint_restart``), so a re-run of the batch the crash cut
short does not count as the first batch of the restart.

Without options: ``local[2]``, everything on local disk, each batch written with Spark's JSON
writer by ``sss`` and with batchline's ``FileSink`` by ``batchline``. ``--master``: a
standalone master (``benchmarks.cluster``). ``--storage-options``: OUT is an fsspec URL that
both engines write through ``FileSink`` (pip's PySpark has no Hadoop S3 connector, so Spark's
writer cannot reach it), and batchline's CHECKPOINT may be one too; Structured Streaming's
checkpoint goes through Hadoop's file systems, so it stays a local path.
"""

from __future__ import annotations

import argparse
import json

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from batchline import StreamingContext
from batchline.sinks.files import FileSink
from batchline.spark import local_spark_session

SCHEMA = StructType([StructField("id", StringType(), False), StructField("n", IntegerType(), False)])
NEW_ID = r"^f1\d{3}-"
"""Ids of the files written after the crash (numbered from 1000)."""


def counted(df: DataFrame) -> tuple[int, int]:
    """The batch's rows and how many came from the new files, in one job (as the count alone was)."""
    row = df.agg(F.count(F.lit(1)), F.sum(F.col("id").rlike(NEW_ID).cast("int"))).first()
    assert row is not None  # an aggregate without grouping has one row
    return row[0], row[1] or 0


def report(rows: int, new: int) -> None:
    """Said once the batch is written."""
    if rows:
        print(f"batch {rows} {new}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=("batchline", "sss"))
    parser.add_argument("incoming")
    parser.add_argument("out")
    parser.add_argument("checkpoint")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--storage-options", type=json.loads)
    args = parser.parse_args()
    conf = None
    if not args.master.startswith("local"):
        from harness.cluster import DRIVER_CONF

        conf = DRIVER_CONF
    spark = local_spark_session(args.master, f"restart-{args.engine}", shuffle_partitions=2, conf=conf)
    print("session", flush=True)
    options = args.storage_options
    if args.engine == "sss":
        sink = FileSink(args.out, "json", storage_options=options) if options is not None else None

        def write_sss(df: DataFrame, batch_id: int) -> None:
            rows, new = counted(df)
            if sink is not None:
                sink.write(df, batch_id)
            else:
                df.write.mode("append").json(args.out)
            report(rows, new)

        query = (spark.readStream.schema(SCHEMA).json(args.incoming).writeStream
                 .foreachBatch(write_sss).option("checkpointLocation", args.checkpoint)
                 .trigger(processingTime="500 milliseconds").start())
        query.awaitTermination()
    else:
        sink = FileSink(args.out, "json", storage_options=options)
        ssc = StreamingContext(spark, "500ms", checkpoint=args.checkpoint, checkpoint_interval="5s",
                               checkpoint_storage_options=options)
        events = ssc.file_stream(args.incoming, "json", SCHEMA, settle=0)

        def write(df: DataFrame, batch_time: int) -> None:
            rows, new = counted(df)
            sink.write(df, batch_time)
            report(rows, new)

        events.foreach_batch(write)
        ssc.start()
        ssc.await_termination()


if __name__ == "__main__":
    main()
