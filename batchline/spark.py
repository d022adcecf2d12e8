"""A SparkSession set up the way batchline expects, and a clear word when Java is missing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from pyspark.sql import SparkSession

from batchline.errors import JavaNotFoundError

__all__ = ["local_spark_session", "check_java", "REQUIRED_JAVA"]

REQUIRED_JAVA = 17  # Spark 4 runs on Java 17 or 21
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def check_java() -> str:
    """The ``java`` Spark will launch (``$JAVA_HOME/bin/java``, else the one on ``PATH``), checked
    to be new enough; raises :class:`JavaNotFoundError` saying what was found and what to do."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    where = f"JAVA_HOME={java_home}" if java_home else "PATH"
    install = (f"Install Java {REQUIRED_JAVA} (Debian/Ubuntu: apt-get install openjdk-{REQUIRED_JAVA}-jre-headless) "
               f"and put it on PATH, or set JAVA_HOME to its home directory.")
    if not java or not os.access(java, os.X_OK):
        raise JavaNotFoundError(f"Spark needs Java {REQUIRED_JAVA} or newer, but no java was found on {where}. "
                                + install)
    try:
        answer = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise JavaNotFoundError(f"Spark needs Java {REQUIRED_JAVA} or newer, but {java} (from {where}) did not "
                                f"run: {error}. {install}") from None
    match = _VERSION.search(answer.stderr + answer.stdout)
    if match is None:
        raise JavaNotFoundError(f"{java} (from {where}) did not report a Java version. {install}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_392" is Java 8
        major = int(match.group(2))
    if major < REQUIRED_JAVA:
        raise JavaNotFoundError(f"Spark needs Java {REQUIRED_JAVA} or newer, but {java} (from {where}) is Java "
                                f"{major}. {install}")
    return java


def local_spark_session(
    master: str = "local[*]", app_name: str = "batchline", shuffle_partitions: int = 4, ui: bool = False
) -> SparkSession:
    """A session whose Python workers run this interpreter, with few shuffle partitions."""
    if SparkSession.getActiveSession() is None:
        check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # A host name that resolves to a loopback address makes Spark warn and guess an interface;
        # a local master needs none but loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
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
