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

Spark puts ``<SPARK_HOME>/python/lib/pyspark.zip`` and the ``py4j-<version>-src.zip`` beside it
first on a worker's path. With pip's PySpark, SPARK_HOME is the installed package itself, and
those zips are copies of installed sources without bytecode: importing from them compiles
every PySpark and Py4J module again at each daemon start (about a second of CPU, on a driver's
start, when the cores are busiest), and every task of every worker reads their directories
again (``importlib.invalidate_caches``, 15 ms for PySpark's). This daemon takes such a copy off
the path, and out of the import system's cache of path entries, when the package it copies is
installed in a folder on the path, and imports the same files from there.

Two imports that each worker made on its own are made here too: pandas, which pyarrow imports
the first time a task turns Python values into Arrow (half a second of CPU), and batchline's
API, which a worker imports when it unpickles a function from a module that imports batchline.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import MutableMapping
from typing import Any

__all__ = ["PRELOADED"]

PRELOADED = ("pyarrow", "pyarrow.compute", "pyarrow.ipc", "numpy", "pandas", "pyspark.worker",
             "batchline.state.execution", "batchline.api.context")


def _installed_copy_off_the_path(path: list[str], importers: MutableMapping[str, Any]) -> None:
    """Remove from ``path`` and from ``importers`` (``sys.path_importer_cache``) the zips in a
    ``<package>/python/lib`` whose ``<package>`` is the ``pyspark`` package in a folder that is
    itself on ``path`` (pip's PySpark): ``pyspark.zip``, and ``py4j-<version>-src.zip`` when
    that version of Py4J is installed in a folder on ``path``."""
    folders = {os.path.realpath(entry) for entry in path if entry}
    for entry in list(path):
        lib, name = os.path.split(entry)
        package = os.path.dirname(os.path.dirname(lib))
        if not (os.path.basename(package) == "pyspark" and os.path.isfile(os.path.join(package, "__init__.py"))
                and os.path.realpath(os.path.dirname(package)) in folders):
            continue
        py4j_version = name.removeprefix("py4j-").removesuffix("-src.zip")
        if name == "pyspark.zip" or (name == f"py4j-{py4j_version}-src.zip" and any(
                os.path.isdir(os.path.join(folder, f"py4j-{py4j_version}.dist-info")) for folder in folders)):
            path.remove(entry)
            importers.pop(entry, None)


def _preload() -> None:
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except Exception as error:  # the worker imports it again and reports what is wrong
            print(f"batchline.worker_daemon: not preloading {name}: {error!r}", file=sys.stderr)


if __name__ == "__main__":
    _installed_copy_off_the_path(sys.path, sys.path_importer_cache)
    _preload()
    from pyspark.daemon import manager

    manager()
