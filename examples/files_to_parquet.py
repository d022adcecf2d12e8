"""Turn JSON-lines files dropped into a directory into Parquet batches, keeping bad lines.

    batchline run examples/files_to_parquet.py -- IN_DIR OUT_DIR [SECONDS]

Every JSON file that appears in IN_DIR (lines like ``{"user": 1, "action": "click", "ts":
"2026-01-01T00:00:00Z"}``) is read once; its good rows land in OUT_DIR/events and a ten-second
sliding count of actions per user in OUT_DIR/activity (Parquet, one ``batch_time=`` directory
per batch); lines that do not parse go to OUT_DIR/dead_letters (JSON lines) with the reason.
It runs for SECONDS, or until Ctrl-C, which stops it gracefully. The checkpoint is kept in
OUT_DIR/checkpoint: run it again and it goes on after the files it read, writing none twice.
"""

import sys

from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType, TimestampType

from batchline import StreamingContext
from batchline.spark import local_spark_session

args = [a for a in sys.argv[1:] if a != "--"]
in_dir, out_dir = args[0], args[1]
seconds = float(args[2]) if len(args) > 2 else None

schema = StructType([
    StructField("user", IntegerType(), False),
    StructField("action", StringType(), True),
    StructField("ts", TimestampType(), True),
])

spark = local_spark_session()
ssc = StreamingContext(spark, batch_interval="1s", checkpoint=f"{out_dir}/checkpoint")
events = ssc.file_stream(in_dir, format="json", schema=schema)
events.write_files(f"{out_dir}/events", format="parquet")
events.dead_letters.write_files(f"{out_dir}/dead_letters", format="json")
activity = events.window("10s", "2s").group_by_key("user").agg(F.count("*").alias("actions_last_10s"))
activity.write_files(f"{out_dir}/activity", format="parquet")
ssc.start()
if not ssc.await_termination(seconds):  # SECONDS passed; Ctrl-C stops it gracefully before that
    ssc.stop(graceful=True)
