"""Driving a StreamingContext on a manual clock as fast as its batches complete: the samples
of the benchmarks that time batches from the timer firing to the batch's completion."""

from __future__ import annotations

import threading
import time

from batchline.clock import ManualClock
from batchline.scheduler.listener import BatchInfo, StreamingListener

__all__ = ["Completions"]


class Completions(StreamingListener):
    """Each completed batch's information and when it completed (``perf_counter``)."""

    def __init__(self) -> None:
        self.done = threading.Condition()
        self.infos: list[BatchInfo] = []
        self.finished_at: list[float] = []

    def on_batch_completed(self, info: BatchInfo) -> None:
        with self.done:
            self.infos.append(info)
            self.finished_at.append(time.perf_counter())
            self.done.notify_all()

    def next_batch(self, clock: ManualClock, step_ms: int, timeout: float = 120) -> float:
        """Move the clock on by ``step_ms`` (the timer fires) and wait for the next batch to
        complete; the seconds from the move to its completion. A failed batch raises."""
        with self.done:
            n = len(self.infos) + 1
            began = time.perf_counter()
            clock.advance(step_ms)
            if not self.done.wait_for(lambda: len(self.infos) >= n, timeout):
                raise TimeoutError(f"batch {n} did not complete within {timeout} s")
        info = self.infos[n - 1]
        if info.failure:
            raise RuntimeError(info.failure)
        return self.finished_at[n - 1] - began
