"""A tour of a batch's code paths, run by a driver's JVM that writes the class-data archive.

The archive (``batchline.class_archive``) holds the classes its JVM had loaded when it exited,
and the first driver on a machine writes it for every later start of the same Java and Spark.
A first run that stopped before its first batch, or read JSON only, leaves out Parquet's
reader, the parsers and the shuffle's classes: every later driver's first batch then loads
over a thousand classes from Spark's jars on its task threads, on cores that are busy starting
everything else (a cold first read of a Parquet file took 0.8 s longer than with them
archived, measured on a 2-core machine). Janino's classes, which compile Spark's generated
code, come from a signed jar, and no archive can hold those.

So the start-up warm-up of a JVM that writes the archive also runs the paths of a batch once,
on a few rows in a temporary folder: the file source's Parquet, JSON and CSV frames with their
dead-letter columns, a metric observed, a union, a shuffle by key into an Arrow task, and an
aggregation. Only on a local master, whose executors run in the driver's JVM: on a cluster the
archive is the driver's only, and reading happens elsewhere. It runs once per machine, Java and
Spark, in the background, under the warm-up's job group (a stop cancels it).
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, IntegerType, StringType, StructField, StructType, TimestampType

from batchline.class_archive import DRIVER_JAVA_OPTIONS, writes_archive
from batchline.sources.parsing import csv_parser, json_parser, parquet_parser

__all__ = ["tour_for_the_archive"]

logger = logging.getLogger(__name__)

_SCHEMA = StructType([StructField("id", IntegerType()), StructField("data", StringType()),
                      StructField("is_last", BooleanType()), StructField("ts", TimestampType())])
_ROWS = 64


def tour_for_the_archive(spark: SparkSession, stopping: threading.Event) -> bool:
    """Run the tour if this JVM writes the class-data archive and runs its executors; whether it
    ran. A failure is logged and changes nothing: the archive only holds fewer classes."""
    context = spark.sparkContext
    if not (context.master or "").startswith("local[") or not writes_archive(
            context.getConf().get(DRIVER_JAVA_OPTIONS, "")):
        return False
    try:
        with tempfile.TemporaryDirectory(prefix="batchline-class-tour-") as folder:
            for frame in _frames(spark, Path(folder)):
                if stopping.is_set():
                    return False
                frame.collect()
    except Exception as error:  # only fewer classes in the archive
        if not stopping.is_set():
            logger.info("The tour of a batch's code paths for the class-data archive failed (%s); later drivers "
                        "load those classes from Spark's jars in their first batch", str(error).strip()[:200])
        return False
    logger.debug("Toured a batch's code paths for the class-data archive this JVM writes at exit")
    return True


def _frames(spark: SparkSession, folder: Path) -> Iterator[DataFrame]:
    """The queries of the tour, over a few rows written to ``folder``."""
    table = pa.table({
        "id": pa.array([i % 7 for i in range(_ROWS)], pa.int32()),
        "data": [f"event-{i}" for i in range(_ROWS)],
        "is_last": [i % 5 == 0 for i in range(_ROWS)],
        "ts": pa.array([1_800_000_000_000_000 + i for i in range(_ROWS)], pa.timestamp("us", tz="UTC")),
    })
    pq.write_table(table, folder / "rows.parquet")
    rows = table.to_pylist()
    (folder / "rows.json").write_text("".join(
        f'{{"id": {r["id"]}, "data": "{r["data"]}", "is_last": {str(r["is_last"]).lower()}, '
        f'"ts": "{r["ts"].isoformat()}"}}\n' for r in rows) + "not json\n")
    (folder / "rows.csv").write_text("".join(
        f'{r["id"]},{r["data"]},{str(r["is_last"]).lower()},{r["ts"].isoformat()}\n' for r in rows))

    parquet = spark.read.schema(_SCHEMA).parquet(str(folder / "rows.parquet")).select(*parquet_parser(_SCHEMA).columns)
    json = json_parser(_SCHEMA).parse(spark.read.text(str(folder / "rows.json")))
    csv = csv_parser(_SCHEMA).parse(spark.read.text(str(folder / "rows.csv")))
    read = parquet.unionByName(json).unionByName(csv).observe(
        "batchline-class-tour", F.count(F.lit(1)).alias("rows"))
    yield read.repartition(2, "id").mapInArrow(_count, "rows long")
    yield read.groupBy("id").agg(F.count(F.lit(1)).alias("n"), F.max("ts").alias("last")).orderBy("id")


def _count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pydict({"rows": [sum(batch.num_rows for batch in batches)]})
