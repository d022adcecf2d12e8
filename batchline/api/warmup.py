"""Warming Spark up while a starting driver reads its checkpoint (issue 17).

A driver's first batch pays for cold work: Python workers forked and importing pyarrow and
batchline's per-key path, the JVM loading the classes of its first Arrow job. None of it needs
the checkpoint, so it runs in the background as soon as the context starts, while the lease,
the checkpoint and the job event store are read: one small job with a task per core, under a
job group of its own. It is done once per SparkContext; a failure is logged and changes
nothing else. A pipeline stopped while it runs cancels it (``StartupWarmUp.stop``) and waits for
it before it returns, so a script that stops its Spark session next finds no job of ours
running: a cancelled warm-up is logged at DEBUG, as nothing went wrong.

An idle pipeline pays the same cold work again (issue 19): its batches run no Spark job, and
Spark stops Python workers that sat idle for a minute (``PythonWorkerFactory``'s fixed
``IDLE_WORKER_TIMEOUT``), so the batch that fires a timer after a long wait forked and
imported anew, and took over a second instead of tens of milliseconds. ``KeepWorkersWarm``
runs the same small job when no batch used Python workers for ``DEFAULT_KEEP_WARM_MS``: a
few tens of milliseconds of CPU every 40 s. A context started with
``keep_workers_warm=False`` runs none (then dynamic allocation can release idle executors).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from batchline.scheduler.listener import StreamingListener
from batchline.scheduler.progress import BatchProgress
from batchline.spark import WORKER_DAEMON, WORKER_DAEMON_CONF

__all__ = ["DEFAULT_KEEP_WARM_MS", "KeepWorkersWarm", "StartupWarmUp", "warm_up"]

logger = logging.getLogger(__name__)

JOB_GROUP = "batchline-warm-up"
DEFAULT_KEEP_WARM_MS = 40_000
"""Spark stops idle Python workers after 60 s, checked every 10 s: 40 s (plus up to one 5 s
check) keeps them with room to spare."""
_ROWS = StructType([StructField("rows", LongType())])
_warmed: set[int] = set()
_lock = threading.Lock()


def _warm_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """In each Python worker: import what a stateful task imports, so the first batch's tasks
    find it loaded (workers are reused between tasks)."""
    import pyarrow.compute  # noqa: F401
    import pyarrow.ipc  # noqa: F401

    import batchline.state.execution  # noqa: F401

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


@dataclass
class StartupWarmUp:
    """The start-up warm-up of one SparkContext, running in a thread of its own."""

    context_id: int
    cancel: Callable[[], None]
    """Cancel the warm-up's Spark job (its job group)."""
    stopping: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Cancel the warm-up if it still runs and wait up to ``timeout_s`` for it to end. The
        SparkContext counts as not warmed, so a later start on it warms it again."""
        thread = self.thread
        if thread is None or not thread.is_alive():
            return
        self.stopping.set()
        deadline = time.monotonic() + timeout_s
        # Cancelled again while it runs: the thread may submit its job just after a cancel.
        while thread.is_alive() and time.monotonic() < deadline:
            try:
                self.cancel()
            except Exception as error:  # the SparkContext may be stopping too
                logger.debug("Cancelling the warm-up job failed: %s", error)
                break
            thread.join(min(0.2, max(0.0, deadline - time.monotonic())))
        thread.join(max(0.0, deadline - time.monotonic()))
        with _lock:
            _warmed.discard(self.context_id)


def warm_up(spark: SparkSession) -> StartupWarmUp | None:
    """Start warming ``spark`` up in a daemon thread, once per SparkContext; returns what stops
    it (None when this context was warmed already)."""
    context = spark.sparkContext
    with _lock:
        if id(context) in _warmed:
            return None
        _warmed.add(id(context))

    warming = StartupWarmUp(id(context), lambda: context.cancelJobGroup(JOB_GROUP))
    warming.thread = threading.Thread(target=_run_warm_job, args=(spark, "the first batch starts cold",
                                                                  warming.stopping, _forks_warm(context)),
                                      name="batchline-warm-up", daemon=True)
    warming.thread.start()
    return warming


def _forks_warm(context: SparkContext) -> bool:
    """Whether the Python workers fork from batchline's daemon on one local executor: then the
    task that starts the daemon warms every worker, and the start-up warm-up leaves the other
    cores to the first batch's jobs that need no Python worker."""
    return context.getConf().get(WORKER_DAEMON_CONF) == WORKER_DAEMON and (context.master or "").startswith("local")


def _run_warm_job(spark: SparkSession, if_failed: str, stopping: threading.Event | None = None,
                  one_task: bool = False) -> None:
    """One task per core (or ``one_task``) that imports what a stateful task imports; a
    failure is only logged, and a cancel by ``stopping`` not even as a failure."""
    if stopping is not None and stopping.is_set():
        return
    context = spark.sparkContext
    began = time.perf_counter()
    try:
        context.setJobGroup(JOB_GROUP, "batchline: warming Python workers and the JVM up", True)
        slots = 1 if one_task else max(1, context.defaultParallelism)
        spark.range(0, slots, 1, slots).mapInArrow(_warm_task, _ROWS).collect()
        logger.debug("Warmed Spark up in %.0f ms (%d Python workers)", (time.perf_counter() - began) * 1000, slots)
    except Exception as error:  # only a head start: the batches do the same work anyway
        if stopping is not None and stopping.is_set():
            logger.debug("Warming Spark up was cancelled: the pipeline stopped (%s)", _first_line(error))
        else:
            logger.info("Warming Spark up failed (%s); %s", _first_line(error), if_failed)


def _first_line(error: BaseException) -> str:
    """An error's first line: a Spark job's error carries the JVM's stack trace after it."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class KeepWorkersWarm(StreamingListener):
    """Runs the warm-up job when no batch used Python workers (read a row, or called a key's
    state function) and no warm-up ran for ``idle_ms``, so that the next batch with work, often
    one firing a timer, finds its workers running.

    Batches tell it what they did (``on_progress``); a thread of its own (``start``) checks
    every ``check_ms``, so that the warm-up comes in time whatever the batch interval. The
    warm-up runs on a thread of its own, one at a time. ``now_ms`` is a monotonic clock:
    Spark times its idle workers by one.
    """

    def __init__(self, warm: Callable[[], None], now_ms: Callable[[], int], idle_ms: int = DEFAULT_KEEP_WARM_MS,
                 cancel: Callable[[], None] = lambda: None) -> None:
        self._warm = warm
        self._now_ms = now_ms
        self._idle_ms = idle_ms
        self._cancel = cancel
        self._lock = threading.Lock()
        self._last_ms = now_ms()
        """When a batch last used Python workers, or the last warm-up started."""
        self._running: threading.Thread | None = None
        self._stopped = threading.Event()
        self._checker: threading.Thread | None = None

    @classmethod
    def for_session(cls, spark: SparkSession) -> KeepWorkersWarm:
        keeper = cls(lambda: None, lambda: time.monotonic_ns() // 1_000_000,
                     cancel=lambda: spark.sparkContext.cancelJobGroup(JOB_GROUP))
        # A warm-up that stop cancels is logged as cancelled, not as failed.
        keeper._warm = lambda: _run_warm_job(spark, "the next batch with work may start cold", keeper._stopped)
        return keeper

    def on_progress(self, progress: BatchProgress) -> None:
        if progress.records or any(operator.keys_called for operator in progress.state_operators):
            with self._lock:
                self._last_ms = self._now_ms()

    def check(self) -> None:
        """Start the warm-up if the workers sat idle for ``idle_ms`` and none is running."""
        with self._lock:
            now = self._now_ms()
            if (self._stopped.is_set() or now - self._last_ms < self._idle_ms
                    or (self._running is not None and self._running.is_alive())):
                return
            self._last_ms = now
            self._running = threading.Thread(target=self._warm, name="batchline-keep-warm", daemon=True)
            self._running.start()

    def start(self, check_ms: int = 5_000) -> None:
        def loop() -> None:
            while not self._stopped.wait(check_ms / 1000):
                self.check()

        self._checker = threading.Thread(target=loop, name="batchline-keep-warm-checker", daemon=True)
        self._checker.start()

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a warm-up that is running to end."""
        with self._lock:
            running = self._running
        if running is not None:
            running.join(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """No more warm-ups; one that is running is cancelled, and waited for up to ``timeout_s``."""
        self._stopped.set()
        if self._checker is not None:
            self._checker.join(timeout_s)
        with self._lock:
            running = self._running is not None and self._running.is_alive()
        if running:
            try:
                self._cancel()
            except Exception as error:  # the SparkContext may be stopping too
                logger.debug("Cancelling the warm-up job failed: %s", error)
            self.join(timeout_s)

    def __repr__(self) -> str:
        return f"KeepWorkersWarm(after {self._idle_ms} ms without work for Python workers)"
