"""Warming Spark up while a starting driver reads its checkpoint (issue 17).

A driver's first batch pays for cold work: Python workers forked and importing pyarrow and
batchline's per-key path, the JVM loading the classes of its first Arrow job. None of it needs
the checkpoint, so it runs in the background as soon as the context starts, while the lease,
the checkpoint and the job event store are read: one small job with a task per core, under a
job group of its own. It is done once per SparkContext; a failure is logged and changes
nothing else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

__all__ = ["warm_up"]

logger = logging.getLogger(__name__)

JOB_GROUP = "batchline-warm-up"
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


def warm_up(spark: SparkSession) -> threading.Thread | None:
    """Start warming ``spark`` up in a daemon thread, once per SparkContext; returns the thread
    (None when this context was warmed already)."""
    context = spark.sparkContext
    with _lock:
        if id(context) in _warmed:
            return None
        _warmed.add(id(context))

    def run() -> None:
        began = time.perf_counter()
        try:
            context.setJobGroup(JOB_GROUP, "batchline: warming Python workers and the JVM up", True)
            slots = max(1, context.defaultParallelism)
            spark.range(0, slots, 1, slots).mapInArrow(_warm_task, "rows long").collect()
            logger.info("Warmed Spark up in %.0f ms (%d Python workers)", (time.perf_counter() - began) * 1000, slots)
        except Exception as error:  # only a head start: the batches do the same work anyway
            logger.info("Warming Spark up failed (%s); the first batch starts cold", error)

    thread = threading.Thread(target=run, name="batchline-warm-up", daemon=True)
    thread.start()
    return thread
