"""Keeping the Python workers, and the state partitions resident in them, alive while a
pipeline idles (SPEC D4, E6).

Spark stops its idle Python workers after one minute without a task (``PythonWorkerFactory``'s
``IDLE_WORKER_TIMEOUT_NS``, fixed, not a setting). The state partitions resident in them go
with them, so the first batch after a longer quiet spell (a timer falling due, a sparse
input) loads every partition it runs from the checkpoint location again. While an operator
holds state and has run no job for ``KEEPALIVE_AFTER_MS``, it runs one tiny Python task per
executor slot instead, outside any batch (job group ``batchline-keepalive-<operator>``): a few
tens of milliseconds of CPU a minute, against reloading the whole state.
"""

from __future__ import annotations

import logging
import threading

from pyspark import SparkContext

from batchline.clock import Clock

__all__ = ["KEEPALIVE_AFTER_MS", "WorkerKeepAlive"]

logger = logging.getLogger(__name__)

KEEPALIVE_AFTER_MS = 40_000
"""Quiet time after which the workers are touched: well inside Spark's minute, which its
monitor checks every 10 s."""


def _touch(value: int) -> int:
    return value


class WorkerKeepAlive:
    """Touches the Python workers once the operator's tasks have been quiet for a while."""

    def __init__(self, spark_context: SparkContext, clock: Clock, operator: str) -> None:
        self._sc = spark_context
        self._clock = clock
        self.job_group = f"batchline-keepalive-{operator}"
        self._last_ms = clock.now_ms()
        self._thread: threading.Thread | None = None

    def note_tasks_ran(self) -> None:
        """The operator's tasks just ran: its workers are fresh."""
        self._last_ms = self._clock.now_ms()

    def idle(self) -> None:
        """A batch went by without the operator's tasks: touch the workers if they have been
        quiet for ``KEEPALIVE_AFTER_MS``. Never waits: the job runs on a thread of its own."""
        now = self._clock.now_ms()
        if now - self._last_ms < KEEPALIVE_AFTER_MS or (self._thread is not None and self._thread.is_alive()):
            return
        self._last_ms = now
        self._thread = threading.Thread(target=self._run, name=self.job_group, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._sc.setJobGroup(self.job_group, "keeps the Python workers and their state alive while idle",
                                 interruptOnCancel=True)
            slots = max(1, self._sc.defaultParallelism)
            self._sc.parallelize(range(slots), slots).map(_touch).count()
        except Exception as error:  # noqa: BLE001 (a stopping context, a lost executor: the next batch reloads)
            logger.debug("Keeping the Python workers alive failed (%s); a later batch loads state again if they "
                         "stopped", error)
