"""A SparkSession set up the way batchline expects, and a clear word when Java is missing."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from batchline.errors import ConfigurationError, JavaNotFoundError
from batchline.exclusion import ExcludeOnFailure, check_exclusion_conf, same_value, translate_legacy_conf

__all__ = ["local_spark_session", "session_conf", "check_java", "REQUIRED_JAVA"]

logger = logging.getLogger(__name__)

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


STATUS_RETENTION = {
    "spark.ui.retainedJobs": "200",
    "spark.ui.retainedStages": "200",
    "spark.ui.retainedTasks": "10000",
    "spark.sql.ui.retainedExecutions": "200",
}
"""How much of finished jobs' status the driver's JVM keeps (whether or not the UI is on).
Spark's defaults (1,000 jobs, stages and SQL executions, 100,000 tasks) suit a batch
application; a pipeline runs a few jobs every batch, so with them the JVM keeps growing for
hours before the oldest are dropped (SPEC E6: memory stays flat)."""


def session_conf(
    *, shuffle_partitions: int = 4, ui: bool = False, conf: Mapping[str, object] | None = None,
    exclude_on_failure: ExcludeOnFailure | None = None,
) -> dict[str, str]:
    """Every setting ``local_spark_session`` gives Spark, checked.

    In order: batchline's defaults (few shuffle partitions, UTC, no progress bars), then
    ``conf`` (your Spark settings, which win; old ``spark.blacklist.*`` names are translated
    with a WARN), then ``exclude_on_failure``'s settings, which must agree with any of the same
    keys in ``conf``. Exclusion settings are checked the way Spark checks them at start.
    """
    settings = {
        "spark.ui.enabled": str(ui).lower(),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        **STATUS_RETENTION,
    }
    user = translate_legacy_conf(conf or {})
    settings.update(user)
    if exclude_on_failure is not None:
        for key, value in exclude_on_failure.spark_conf().items():
            if key in user and not same_value(key, user[key], value):
                raise ConfigurationError(
                    f"{key} is {user[key]!r} in conf but {value!r} in exclude_on_failure; set it in one place"
                )
            settings[key] = value
    check_exclusion_conf(settings)
    return settings


def local_spark_session(
    master: str = "local[*]", app_name: str = "batchline", shuffle_partitions: int = 4, ui: bool = False, *,
    conf: Mapping[str, object] | None = None, exclude_on_failure: ExcludeOnFailure | None = None,
) -> SparkSession:
    """A session whose Python workers run this interpreter, with few shuffle partitions.

    ``conf``: more Spark settings; ``exclude_on_failure``: Spark's exclusion of failing
    executors and nodes (see ``session_conf``). Settings of Spark itself (not ``spark.sql.*``)
    take effect only when this starts Spark: if a session is already running, the ones it
    does not have are named in a WARN.
    """
    settings = session_conf(shuffle_partitions=shuffle_partitions, ui=ui, conf=conf,
                            exclude_on_failure=exclude_on_failure)
    if SparkSession.getActiveSession() is None:
        check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # A host name that resolves to a loopback address makes Spark warn and guess an interface;
        # a local master needs none but loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    running = spark.sparkContext.getConf()
    not_applied = sorted(key for key, value in settings.items()
                         if not key.startswith("spark.sql.") and not _applied(running.get(key), value, key))
    if not_applied:
        logger.warning("Spark was already running, so these settings did not take effect: %s. Stop the running "
                       "session first (spark.stop()), or give them where it is created",
                       ", ".join(f"{key}={settings[key]}" for key in not_applied))
    return spark


def _applied(running: str | None, wanted: str, key: str) -> bool:
    """Whether the running Spark has ``key`` as asked: Spark adds options of its own to the
    JVM's (``--add-opens``), so those count when they hold the ones asked for."""
    if running == wanted:
        return True
    return key.endswith("JavaOptions") and running is not None and set(wanted.split()) <= set(running.split())


def forget_accumulator(accumulator: Any) -> None:
    """Drop a released batch's accumulator from PySpark's registry of the driver's accumulators,
    which keeps every one for ever (to apply task updates to it; an update for one no longer
    there is ignored): one a batch would grow with the pipeline's age (SPEC E6)."""
    from pyspark import accumulators

    accumulators._accumulatorRegistry.pop(accumulator.aid, None)  # noqa: SLF001 (no public way to drop one)
