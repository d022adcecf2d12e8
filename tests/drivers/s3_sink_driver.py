"""A driver for the file sink's crash tests: writes one batch with FileSink and exits.

    BATCHLINE_TEST_KILL_AT=<point> python tests/drivers/s3_sink_driver.py URL STORAGE_OPTIONS_JSON BATCH_TIME FORMAT

With ``BATCHLINE_TEST_KILL_AT`` set (``before-record``, ``after-record:<n>``), the sink's
commit SIGKILLs this process at that point; ``written`` is printed when the batch is done.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from batchline.sinks.files import FileSink  # noqa: E402
from batchline.spark import local_spark_session  # noqa: E402

ROWS, PARTITIONS = 32, 5


def batch_frame(spark: SparkSession) -> DataFrame:
    """The same batch every time: ids 0..31 in 5 partitions of 8 ids, the last one empty
    (ids 32..39 are filtered out), with a timestamp, a list and a nested struct."""
    return (spark.range(0, 40, 1, PARTITIONS).where(F.col("id") < ROWS)
            .select(F.col("id"),
                    F.concat(F.lit("row-"), F.col("id").cast("string")).alias("name"),
                    F.timestamp_seconds(F.col("id") + 1_780_000_000).alias("ts"),
                    F.array(F.col("id"), F.col("id") * 2).alias("pair"),
                    F.struct(F.col("id").alias("a"), F.struct((F.col("id") % 3).alias("c")).alias("b"))
                    .alias("nested")))


def main() -> None:
    url, options, batch_time, format = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    spark = local_spark_session("local[2]", "s3-sink-driver", shuffle_partitions=2)
    FileSink(url, format, storage_options=options).write(batch_frame(spark), batch_time)
    print("written", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
