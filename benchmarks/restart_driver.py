"""One streaming driver for the restart benchmark: JSON files in, JSON files out, checkpointed.

    python -m benchmarks.restart_driver {batchline|sss} IN OUT CHECKPOINT

Both engines write each batch with Spark's JSON writer and print ``batch <rows>`` when a
batch with rows is done; ``sss`` is Spark Structured Streaming (file source, foreachBatch,
a 500 ms processing-time trigger), ``batchline`` the same pipeline on batchline.
"""

from __future__ import annotations

import sys

from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from batchline import StreamingContext
from batchline.sinks.files import FileSink
from batchline.spark import local_spark_session

SCHEMA = StructType([StructField("id", StringType(), False), StructField("n", IntegerType(), False)])


def main() -> None:
    engine, incoming, out, checkpoint = sys.argv[1:5]
    spark = local_spark_session("local[2]", f"restart-{engine}", shuffle_partitions=2)
    print("session", flush=True)
    if engine == "sss":
        def write(df, batch_id):
            rows = df.count()
            df.write.mode("append").json(out)
            if rows:
                print(f"batch {rows}", flush=True)

        query = (spark.readStream.schema(SCHEMA).json(incoming).writeStream
                 .foreachBatch(write).option("checkpointLocation", checkpoint)
                 .trigger(processingTime="500 milliseconds").start())
        query.awaitTermination()
    else:
        sink = FileSink(out, "json")
        ssc = StreamingContext(spark, "500ms", checkpoint=checkpoint, checkpoint_interval="5s")
        events = ssc.file_stream(incoming, "json", SCHEMA, settle=0)

        def write(df, batch_time):
            rows = df.count()
            sink.write(df, batch_time)
            if rows:
                print(f"batch {rows}", flush=True)

        events.foreach_batch(write)
        ssc.start()
        ssc.await_termination()


if __name__ == "__main__":
    main()
