"""A driver's JVM writes the class-data archive of Spark's classes when it exits, and the next
driver's JVM loads Spark's classes from it: with a real JVM, in driver processes of their own
(the test session's JVM is already running). The writing JVM's tour of a batch's code paths
puts the classes of a first batch (Parquet's reader, JSON and CSV parsing, the shuffle's
writer) in the archive too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from batchline.class_archive import CACHE_DIR, is_whole
from tests.helpers import wait_for

DRIVER = textwrap.dedent("""
    import sys, threading
    from batchline.api.class_tour import tour_for_the_archive
    from batchline.spark import local_spark_session
    conf = {"spark.driver.extraJavaOptions": sys.argv[1]} if len(sys.argv) > 1 else None
    spark = local_spark_session("local[1]", "class-archive", shuffle_partitions=1, conf=conf)
    if conf is None:
        assert tour_for_the_archive(spark, threading.Event()), "no tour in a JVM that writes the archive"
    else:
        assert not tour_for_the_archive(spark, threading.Event()), "a tour in a JVM that writes no archive"
        for name in FIRST_BATCH_CLASSES:
            spark.sparkContext._jvm.java.lang.Class.forName(name)
    spark.stop()
""")
FIRST_BATCH_CLASSES = ("org.apache.parquet.hadoop.ParquetFileReader",
                       "org.apache.spark.sql.catalyst.json.JacksonParser",
                       "org.apache.spark.sql.catalyst.csv.UnivocityParser",
                       "org.apache.spark.shuffle.sort.BypassMergeSortShuffleWriter")
"""Classes the first batch of a pipeline reading Parquet loads, which a JVM that only starts
Spark does not."""


def drive(cache: Path, *args: str) -> None:
    env = {**os.environ, CACHE_DIR: str(cache), "PYSPARK_PYTHON": sys.executable}
    driver = f"FIRST_BATCH_CLASSES = {FIRST_BATCH_CLASSES!r}\n{DRIVER}"
    done = subprocess.run([sys.executable, "-c", driver, *args], env=env, capture_output=True, text=True,
                          timeout=180, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cds" not in done.stdout.lower(), f"the JVM spoke of its archive on the driver's stdout: {done.stdout}"


def test_the_first_driver_s_jvm_writes_the_archive_and_the_next_loads_spark_from_it(tmp_path):
    cache = tmp_path / "cache"
    drive(cache)
    jvm = cache / "jvm"
    # The JVM writes it as it exits, which may be after the driver's process ended; its header,
    # first word included, comes last.
    wait_for(lambda: any(is_whole(p) for p in jvm.glob("*.part")),
             "the archive written by the exiting JVM", 120, 0.5)

    loaded = tmp_path / "classes.log"
    drive(cache, f"-Xlog:class+load=info:file={loaded}")
    archives = list(jvm.glob("*.jsa"))
    assert len(archives) == 1 and list(jvm.glob("*.part")) == []
    lines = loaded.read_text().splitlines()
    for name in ("org.apache.spark.SparkContext", *FIRST_BATCH_CLASSES):
        found = [line for line in lines if f" {name} " in line]
        assert found and "shared objects file (top)" in found[0], found

