"""A local session's Python workers are forked from batchline's daemon, which imported a state
task's modules before it forked them: a new worker starts without importing them again. With
pip's PySpark they import it and Py4J as installed (with their bytecode), not from Spark's zips
of their sources, which the daemon takes off the path: no task reads those zips again."""

import os
import sys
from collections.abc import Iterator

import py4j
import pyarrow as pa
import pyspark
from pyspark.sql.types import BooleanType, StringType, StructField, StructType

from batchline.spark import WORKER_DAEMON, WORKER_DAEMON_CONF
from batchline.worker_daemon import PRELOADED

SEEN = StructType([StructField("parent", StringType()), StructField("loaded", BooleanType()),
                   StructField("pyspark", StringType()), StructField("py4j", StringType()),
                   StructField("zips", StringType())])


def _what_the_worker_inherited(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        pass
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
        parent = cmdline.read().replace(b"\0", b" ").decode()
    loaded = all(name in sys.modules for name in PRELOADED)
    zips = " ".join(entry for entry, importer in sys.path_importer_cache.items()
                    if entry.endswith(".zip") and importer is not None)
    yield pa.RecordBatch.from_pydict({"parent": [parent], "loaded": [loaded], "pyspark": [pyspark.__file__],
                                      "py4j": [py4j.__file__], "zips": [zips]})


def test_workers_come_from_the_daemon_that_preloads_the_state_path(spark):
    assert spark.sparkContext.getConf().get(WORKER_DAEMON_CONF) == WORKER_DAEMON
    rows = spark.range(0, 2, 1, 2).mapInArrow(_what_the_worker_inherited, SEEN).collect()
    assert len(rows) == 2
    for row in rows:
        assert f"-m {WORKER_DAEMON}" in row["parent"], row["parent"]
        assert row["loaded"]
        assert row["pyspark"] == pyspark.__file__  # the driver's: the installed package, not the zip
        assert row["py4j"] == py4j.__file__
        assert row["zips"] == ""
