"""Spark's Python daemon with what a state task imports already imported.

Spark starts one daemon per executor (``pyspark.daemon``) and forks a Python worker from it
for each task that finds no idle one. Each fork then imports pyarrow, numpy and batchline's
state path on its own: about a second of CPU per worker. A starting driver's first batch forks
a worker per core on a machine whose cores are busy starting the JVM, and Spark stops workers
that sat idle for a minute, so that cost comes back after every quiet minute.

This daemon imports those modules once, before it forks: a fork shares them, and a worker
starts in milliseconds. ``local_spark_session`` sets it for a local master
(``spark.python.daemon.module``); on a cluster, set it where batchline is installed on the
executors (a daemon that cannot import this module cannot start). The threads these imports
start (numpy's OpenBLAS pool, Arrow's jemalloc background thread) are made safe across a fork
by their libraries' ``pthread_atfork`` handlers, and Arrow's thread pools start on first use.
A module that fails to import is left to the worker, as without this daemon.

Spark puts ``<SPARK_HOME>/python/lib/pyspark.zip`` first on a worker's path. With pip's
PySpark, SPARK_HOME is the installed package itself, and that zip is a copy of its sources
without bytecode: importing from it compiles every PySpark module again at each daemon start
(about a second of CPU, on a driver's start, when the cores are busiest), and each worker's
first task reads the zip's directory again. This daemon takes that copy off the path when the
package it copies is importable as installed, and imports the same files from there.
"""

from __future__ import annotations

import importlib
import os
import sys

__all__ = ["PRELOADED"]

PRELOADED = ("pyarrow", "pyarrow.compute", "pyarrow.ipc", "numpy", "pyspark.worker", "batchline.state.execution")


def _installed_copy_off_the_path(path: list[str]) -> None:
    """Remove from ``path`` a ``<package>/python/lib/pyspark.zip`` whose ``<package>`` is the
    ``pyspark`` package in a folder that is itself on ``path`` (pip's PySpark)."""
    folders = {os.path.realpath(entry) for entry in path if entry}
    for entry in list(path):
        if os.path.basename(entry) != "pyspark.zip":
            continue
        package = os.path.dirname(os.path.dirname(os.path.dirname(entry)))
        if (os.path.basename(package) == "pyspark" and os.path.isfile(os.path.join(package, "__init__.py"))
                and os.path.realpath(os.path.dirname(package)) in folders):
            path.remove(entry)


def _preload() -> None:
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except Exception as error:  # the worker imports it again and reports what is wrong
            print(f"batchline.worker_daemon: not preloading {name}: {error!r}", file=sys.stderr)


if __name__ == "__main__":
    _installed_copy_off_the_path(sys.path)
    _preload()
    from pyspark.daemon import manager

    manager()
