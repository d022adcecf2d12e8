"""A SparkSession set up the way batchline expects."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

__all__ = ["local_spark_session"]


def local_spark_session(
    master: str = "local[*]", app_name: str = "batchline", shuffle_partitions: int = 4, ui: bool = False
) -> SparkSession:
    """A session whose Python workers run this interpreter, with few shuffle partitions."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", str(ui).lower())
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
