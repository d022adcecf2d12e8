"""A driver's JVM writes the class-data archive of Spark's classes when it exits, and the next
driver's JVM loads Spark's classes from it; an executor on the driver's machine writes one of
the executors' own while it runs, and the next executors load from it: with real JVMs, in
driver processes of their own (the test session's JVM is already running), on a
``local-cluster`` master."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from batchline.class_archive import CACHE_DIR, is_whole
from tests.helpers import wait_for

DRIVER = textwrap.dedent("""
    import sys, time
    from batchline import class_archive
    from batchline.spark import local_spark_session
    conf = {"spark.executor.memory": "512m"}
    for key, options in zip(("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"), sys.argv[1:]):
        conf[key] = options
    class_archive.DUMP_AFTER_S = 3.0
    spark = local_spark_session("local-cluster[1,1,1024]", "class-archive", shuffle_partitions=1, conf=conf)
    assert spark.range(0, 100, 1, 1).selectExpr("sum(id)").first()[0] == 4950  # a task on the executor
    # A Python task too: an executor that ran one could not write its archive as it exited.
    assert spark.range(0, 100, 1, 1).mapInArrow(lambda batches: batches, "id long").count() == 100
    jvm = class_archive.archive_dir()
    deadline = time.monotonic() + 120
    while not list(jvm.glob("executor-*.jsa")) and not any(map(class_archive.is_whole, jvm.glob("executor-*.part"))):
        assert time.monotonic() < deadline, "no executor wrote the executors' archive in 120 s"
        time.sleep(0.5)
    spark.stop()
""")


def drive(cache: Path, *options: str) -> None:
    env = {**os.environ, CACHE_DIR: str(cache), "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, "-c", DRIVER, *options], env=env, capture_output=True, text=True,
                          timeout=240, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cds" not in done.stdout.lower(), f"the JVM spoke of its archive on the driver's stdout: {done.stdout}"


def test_the_first_driver_and_executor_write_archives_and_the_next_ones_load_spark_from_them(tmp_path):
    cache = tmp_path / "cache"
    drive(cache)  # returns once an executor wrote a whole part: told to once the session ran 3 s
    jvm = cache / "jvm"
    # The driver's JVM writes its part as it exits, which may be after the driver's process
    # ended; its header, first word included, comes last.
    wait_for(lambda: any(is_whole(p) for p in jvm.glob("spark-*.part")),
             "the archive written by the exiting JVM", 120, 0.5)
    assert len([p for p in jvm.glob("executor-*.part") if is_whole(p)]) == 1

    driver_log, executor_log = tmp_path / "driver-classes.log", tmp_path / "executor-classes.log"
    drive(cache, f"-Xlog:class+load=info:file={driver_log}", f"-Xlog:class+load=info:file={executor_log}")
    assert len(list(jvm.glob("spark-*.jsa"))) == 1 and len(list(jvm.glob("executor-*.jsa"))) == 1
    assert list(jvm.glob("*.part")) == []
    for log, main in ((driver_log, "org.apache.spark.SparkContext"),
                      (executor_log, "org.apache.spark.executor.CoarseGrainedExecutorBackend")):
        loaded = [line for line in log.read_text().splitlines() if f" {main} " in line]
        assert loaded and "shared objects file (top)" in loaded[0], loaded
