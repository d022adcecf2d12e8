"""Helpers for testing pipelines: a manual clock, a batch recorder and a collecting sink."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

from batchline.batch_time import BatchTime
from batchline.clock import ManualClock
from batchline.scheduler.listener import BatchInfo, StreamingListener
from batchline.spark import local_spark_session

__all__ = ["ManualClock", "BatchRecorder", "CollectSink", "local_spark_session", "wait_for"]


def wait_for(predicate: Callable[[], bool], condition: threading.Condition, timeout: float, what: str) -> None:
    with condition:
        if not condition.wait_for(predicate, timeout):
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


class BatchRecorder(StreamingListener):
    """Records every listener event in order, and lets a test wait for batches to complete."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.completed: list[BatchInfo] = []
        self.submitted: list[BatchInfo] = []
        self.errors: list[BaseException] = []
        self._changed = threading.Condition()

    def _record(self, kind: str, info: BatchInfo) -> None:
        with self._changed:
            self.events.append((kind, info.batch_time))
            self._changed.notify_all()

    def on_batch_submitted(self, info: BatchInfo) -> None:
        self.submitted.append(info)
        self._record("submitted", info)

    def on_batch_started(self, info: BatchInfo) -> None:
        self._record("started", info)

    def on_batch_completed(self, info: BatchInfo) -> None:
        with self._changed:
            self.completed.append(info)
        self._record("completed", info)

    def on_error(self, error: BaseException) -> None:
        with self._changed:
            self.errors.append(error)
            self._changed.notify_all()

    def wait_for_completed(self, count: int, timeout: float = 60) -> list[BatchInfo]:
        wait_for(lambda: len(self.completed) >= count, self._changed, timeout, f"{count} completed batches")
        return list(self.completed)

    def wait_for_batch(self, batch_time: int, timeout: float = 60) -> BatchInfo:
        wait_for(lambda: any(i.batch_time == batch_time for i in self.completed), self._changed, timeout,
                 f"batch {batch_time} to complete")
        return next(i for i in self.completed if i.batch_time == batch_time)

    def wait_for_event(self, kind: str, batch_time: int, timeout: float = 60) -> None:
        wait_for(lambda: (kind, batch_time) in self.events, self._changed, timeout, f"{kind} {batch_time}")


class CollectSink:
    """A foreach_batch function that keeps each batch's rows (as dicts) by batch time."""

    def __init__(self, sort: bool = True) -> None:
        self.batches: dict[int, list[dict[str, Any]]] = {}
        self._sort = sort
        self._changed = threading.Condition()

    def __call__(self, df: DataFrame, batch_time: BatchTime) -> None:
        rows = [row.asDict(recursive=True) for row in df.collect()]
        if self._sort:
            rows.sort(key=lambda r: tuple(str(v) for v in r.values()))
        with self._changed:
            self.batches[int(batch_time)] = rows
            self._changed.notify_all()

    def all_rows(self) -> list[dict[str, Any]]:
        with self._changed:
            return [row for t in sorted(self.batches) for row in self.batches[t]]

    def wait_for_rows(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 60) -> None:
        wait_for(lambda: predicate(self.all_rows()), self._changed, timeout, "expected rows")
