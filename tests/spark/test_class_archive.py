"""A driver's JVM writes the class-data archive of Spark's classes when it exits, and the next
driver's JVM loads Spark's classes from it: with a real JVM, in driver processes of their own
(the test session's JVM is already running)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from batchline.class_archive import CACHE_DIR, is_whole
from tests.helpers import wait_for

DRIVER = textwrap.dedent("""
    import sys
    from batchline.spark import local_spark_session
    conf = {"spark.driver.extraJavaOptions": sys.argv[1]} if len(sys.argv) > 1 else None
    spark = local_spark_session("local[1]", "class-archive", shuffle_partitions=1, conf=conf)
    spark.stop()
""")


def drive(cache: Path, *args: str) -> None:
    env = {**os.environ, CACHE_DIR: str(cache), "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, "-c", DRIVER, *args], env=env, capture_output=True, text=True,
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
    spark_context = [line for line in loaded.read_text().splitlines() if " org.apache.spark.SparkContext " in line]
    assert spark_context and "shared objects file (top)" in spark_context[0], spark_context

