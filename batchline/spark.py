"""A SparkSession set up the way batchline expects, and a clear word when Java is missing."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from py4j.protocol import Py4JNetworkError  # type: ignore[import-untyped]
from pyspark import SparkConf, SparkContext
from pyspark.find_spark_home import _find_spark_home
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from batchline.class_archive import (
    DRIVER_JAVA_OPTIONS,
    EXECUTOR_JAVA_OPTIONS,
    ExecutorArchiveDump,
    archive_options,
    executor_archive,
)
from batchline.errors import ConfigurationError, JavaNotFoundError, error_text
from batchline.exclusion import ExcludeOnFailure, check_exclusion_conf, same_value, translate_legacy_conf

__all__ = ["local_spark_session", "session_conf", "check_java", "REQUIRED_JAVA", "spark_gone", "SparkWatch",
           "WORKER_DAEMON", "WORKER_DAEMON_CONF"]

logger = logging.getLogger(__name__)

REQUIRED_JAVA = 17  # Spark 4 runs on Java 17 or 21
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def check_java() -> str:
    """The ``java`` Spark will launch (``$JAVA_HOME/bin/java``, else the one on ``PATH``), checked
    to be new enough; raises :class:`JavaNotFoundError` saying what was found and what to do."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    where = f"JAVA_HOME={java_home}" if java_home else "PATH"
    install = (f"Install Java {REQUIRED_JAVA} (Debian/Ubuntu: apt-get install openjdk-{REQUIRED_JAVA}-jdk-headless) "
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

WORKER_DAEMON_CONF, WORKER_DAEMON = "spark.python.daemon.module", "batchline.worker_daemon"
"""Spark's Python daemon that imports a state task's modules once, before it forks workers
(``batchline/worker_daemon.py``)."""


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
    does not have are named in a WARN. A JVM this starts maps Spark's classes from a
    class-data archive, which the first start writes when it exits; executors on this machine
    map one of their own, which one of them writes while a session runs
    (``batchline.class_archive``).
    """
    settings = session_conf(shuffle_partitions=shuffle_partitions, ui=ui, conf=conf,
                            exclude_on_failure=exclude_on_failure)
    if master.startswith("local"):
        # Workers run this interpreter, which imports batchline: their daemon can preload it.
        settings.setdefault(WORKER_DAEMON_CONF, WORKER_DAEMON)
    java = check_java() if SparkSession.getActiveSession() is None else None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # A host name that resolves to a loopback address makes Spark warn and guess an interface;
        # a local master needs none but loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    _start_jvm_in_its_own_group(master, app_name, settings, java)
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


def _start_jvm_in_its_own_group(master: str, app_name: str, settings: Mapping[str, str],
                                java: str | None) -> None:
    """Start Spark's JVM as PySpark would, but in a process group (session) of its own, and
    from the class-data archive of Spark's classes (``batchline.class_archive``) when ``java``
    (the one Spark launches) is known.

    Executors on this machine start from an archive of their own; while there is none, one
    of them writes it once the session has run a while (``ExecutorArchiveDump``).

    PySpark starts the JVM in the driver's process group, ignoring only SIGINT. A SIGTERM to
    the whole group (GNU ``timeout``, ``kill -TERM -PGID``, a supervisor stopping the group)
    then reaches the JVM too: its shutdown hook stops the SparkContext at once, under the
    graceful stop the same signal asked batchline for, and nothing more can run or commit.
    In a group of its own the JVM (and the executors and Python workers it starts) hears only
    what is sent to it; the driver's graceful stop finishes and Spark stops when the driver
    stops it or exits (the JVM ends when the driver's end of its stdin closes, as before).
    Only when this process has no JVM yet, is not handed one (``PYSPARK_GATEWAY_PORT``) and
    is not to use Spark Connect (PySpark then starts no JVM of the driver's)."""
    if os.name != "posix" or "PYSPARK_GATEWAY_PORT" in os.environ or getattr(SparkContext, "_gateway", None):
        return
    api_mode = str(settings.get("spark.api.mode", os.environ.get("SPARK_API_MODE", ""))).lower()
    if api_mode == "connect" or "spark.remote" in settings or {"SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"} & set(
            os.environ):
        return
    launch = dict(settings)
    executors = None
    if java is not None:
        spark_home = _find_spark_home()
        executors = executor_archive(master, java, spark_home, settings)
        # Only the JVMs started here get them: the running conf then holds the settings asked
        # for and more, which ``_applied`` takes as applied.
        for key, archive in ((DRIVER_JAVA_OPTIONS, archive_options(java, spark_home, settings)),
                             (EXECUTOR_JAVA_OPTIONS, executors.options if executors is not None else None)):
            if archive is not None:
                launch[key] = " ".join(filter(None, [settings.get(key), archive]))
    conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(launch.items()))
    gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True})
    # The SparkContext takes the JVM started here; the builder below finds it and adds the session.
    context = SparkContext(conf=conf, gateway=gateway)
    if java is not None and executors is not None and executors.dump_to is not None:
        ExecutorArchiveDump(java, executors.dump_to, context.applicationId).start()


def spark_gone(spark: SparkSession) -> str | None:
    """Why the Spark under ``spark`` is gone (its JVM exited or no longer answers, its
    SparkContext stopped), or None while it runs. Never raises: it is asked on the way to a
    stop, when whatever talks to the JVM may fail."""
    context = spark.sparkContext
    # The JVM PySpark started (None when it was handed a running one): its exit is final.
    process = getattr(getattr(context, "_gateway", None), "proc", None)
    if process is not None and (code := process.poll()) is not None:
        return f"its process {process.pid} exited with code {code}"
    java_context = getattr(context, "_jsc", None)
    if java_context is None:
        return "the SparkContext was stopped"
    try:
        stopped = java_context.sc().isStopped()
    except (Py4JNetworkError, OSError) as error:
        return f"connection to it refused: {error_text(error)}"
    except Exception as error:  # noqa: BLE001 (an answer, so the JVM is there; anything else is not a stop)
        logger.debug("Asking Spark whether its SparkContext is stopped failed: %s", error_text(error))
        return None
    return "the SparkContext was stopped" if stopped is True else None


class SparkWatch:
    """A thread that asks every ``interval_s`` whether Spark is gone (``spark_gone``) and, the
    first time it is, calls ``on_gone`` with why. A pipeline whose inputs are quiet runs no
    Spark job that would fail: without the watch it would go on as if nothing happened."""

    def __init__(self, spark: SparkSession, on_gone: Callable[[str], None], interval_s: float = 1.0) -> None:
        self._spark = spark
        self._on_gone = on_gone
        self._interval_s = interval_s
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="batchline-spark-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed.set()

    def _watch(self) -> None:
        while not self._closed.wait(self._interval_s):
            why = spark_gone(self._spark)
            if why is not None:
                if not self._closed.is_set():  # a stop that stopped Spark itself closed the watch first
                    self._on_gone(why)
                return


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


OBSERVE_ALL_ATTEMPTS = "spark.sql.legacy.observeMetricsAggregateAllAttempts"
"""Spark's legacy setting for ``DataFrame.observe``: true adds the counts of every attempt of
a task, so a map task run again (its stage re-run after a fetch failure, its executor lost)
counts its rows twice. Spark 4.3's default (false) keeps each task's last successful attempt
only (``LastAttemptAggregatingAccumulator``), which batchline's input counts rely on."""


def observe_last_attempts(spark: SparkSession) -> None:
    """Make the session's ``observe()`` metrics count each task's last attempt only: undo
    :data:`OBSERVE_ALL_ATTEMPTS` at WARN if a user set it, since an input's row counts (its
    progress records, its dead letters) would count the rows of a re-run map task twice."""
    if str(spark.conf.get(OBSERVE_ALL_ATTEMPTS, "false")).strip().lower() != "true":
        return
    logger.warning("%s=true makes observe() add every attempt of a task: a stage re-run after a lost executor "
                   "would count its input rows twice. batchline counts inputs with observe(), so it sets it "
                   "to false for this session (Spark's default)", OBSERVE_ALL_ATTEMPTS)
    spark.conf.set(OBSERVE_ALL_ATTEMPTS, "false")
