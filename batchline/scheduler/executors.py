"""Which executors Spark has excluded for failures, for batch information and the log (SPEC H2).

Spark's exclude-on-failure keeps its decisions in the driver's scheduler; the driver's status
store (the data behind the web UI and its REST API, kept with or without the UI) says which
executors are excluded. The monitor reads it through the JVM at the end of each batch, so it
needs no UI and no listener of its own in the JVM.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import SparkSession

from batchline.clock import Clock
from batchline.scheduler.listener import ExcludedExecutor
from batchline.spark import spark_gone

__all__ = ["ExecutorMonitor", "ExecutorStatus", "executor_statuses"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExecutorStatus:
    executor_id: str
    host: str
    excluded: bool


def executor_statuses(spark: SparkSession) -> list[ExecutorStatus]:
    """The live executors of ``spark``'s application, the driver excepted."""
    # The status store has no Python API; its Scala one is reached through the JVM gateway.
    jvm_context = spark.sparkContext._jsc.sc()  # type: ignore[union-attr]  # noqa: SLF001
    summaries = jvm_context.statusStore().executorList(True)
    statuses = []
    for i in range(summaries.size()):
        summary = summaries.apply(i)
        if summary.id() != "driver":
            host = summary.hostPort().rsplit(":", 1)[0]
            statuses.append(ExecutorStatus(summary.id(), host, bool(summary.isExcluded())))
    return statuses


def _statuses_unless_gone(spark: SparkSession) -> list[ExecutorStatus] | None:
    """``executor_statuses``, or None when Spark went away (its executors with it): the
    pipeline stops for that and says so once; the batch's record goes without them."""
    try:
        return executor_statuses(spark)
    except Exception:
        if spark_gone(spark) is not None:
            return None
        raise


class ExecutorMonitor:
    """Reports the excluded executors, WARNs when one is excluded and when one comes back.

    Spark does not keep when it excluded an executor, so ``since_ms`` is when the monitor first
    saw it excluded: the end of the batch in which it was.
    """

    def __init__(self, statuses: Callable[[], list[ExecutorStatus] | None], clock: Clock) -> None:
        self._statuses = statuses
        self._clock = clock
        self._lock = threading.Lock()
        self._excluded: dict[str, ExcludedExecutor] = {}

    @classmethod
    def of(cls, spark: SparkSession, clock: Clock) -> ExecutorMonitor:
        return cls(lambda: _statuses_unless_gone(spark), clock)

    def excluded(self) -> list[ExcludedExecutor]:
        now = self._clock.now_ms()
        statuses = self._statuses()
        with self._lock:
            if statuses is None:  # Spark is gone: what was known stays, nothing is said of it
                return sorted(self._excluded.values(), key=lambda e: e.since_ms)
            live = {status.executor_id for status in statuses}
            for status in statuses:
                if status.excluded and status.executor_id not in self._excluded:
                    self._excluded[status.executor_id] = ExcludedExecutor(status.executor_id, status.host, now)
                    logger.warning(
                        "Spark excluded executor %s on %s after repeated task failures: no tasks run there until "
                        "spark.excludeOnFailure.timeout passes (or, with killExcludedExecutors, it is replaced). "
                        "Look at that executor's log for why its tasks fail", status.executor_id, status.host)
                elif not status.excluded and status.executor_id in self._excluded:
                    del self._excluded[status.executor_id]
                    logger.warning("Executor %s on %s is no longer excluded: Spark schedules tasks on it again",
                                   status.executor_id, status.host)
            for executor_id in [e for e in self._excluded if e not in live]:
                gone = self._excluded.pop(executor_id)
                logger.warning("Excluded executor %s on %s is gone (killed or lost); the cluster manager may start "
                               "a new one in its place", executor_id, gone.host)
            return sorted(self._excluded.values(), key=lambda e: e.since_ms)
