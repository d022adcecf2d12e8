"""What ``batchline run PIPELINE.py`` sets for the pipeline it runs: the contexts the script
creates pick these up, so the script itself needs no change to run under the command.

- ``py_files``: a zip of the pipeline's folder, added to every SparkContext a context starts
  on (``addPyFile``), so that a state function imported from a module beside the script is
  found by the executors' Python workers as it is by the driver.
- ``dashboard_port`` / ``metrics_port``: the defaults of contexts that do not set their own;
  ``host`` (the address both bind to) and ``access_token`` likewise.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from pyspark.sql import SparkSession

__all__ = ["LaunchDefaults", "launch_defaults", "set_launch_defaults", "ship_py_files"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchDefaults:
    py_files: tuple[str, ...] = ()
    dashboard_port: int | None = None
    metrics_port: int | None = None
    host: str | None = None
    """None: loopback (127.0.0.1)."""
    access_token: str | None = None


_defaults = LaunchDefaults()
_shipped: dict[str, set[str]] = {}
"""Files added, by Spark application id (a new SparkContext may reuse a stopped one's ``id()``)."""
_lock = threading.Lock()


def launch_defaults() -> LaunchDefaults:
    return _defaults


def set_launch_defaults(defaults: LaunchDefaults) -> None:
    global _defaults
    _defaults = defaults


def ship_py_files(spark: SparkSession) -> None:
    """Add the launch's Python files to ``spark``'s context, once per context and file."""
    context = spark.sparkContext
    for path in _defaults.py_files:
        with _lock:
            shipped = _shipped.setdefault(context.applicationId, set())
            if path in shipped:
                continue
            shipped.add(path)
        context.addPyFile(path)
        logger.debug("Shipped %s to the executors", path)
