"""Helpers for testing pipelines: a manual clock, a batch recorder, a collecting sink, a
replayable list source with end and abort markers, a harness that runs a pipeline one batch
at a time, and a tester for a state function without Spark."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from batchline.api.context import StreamingContext
from batchline.api.stream import Stream
from batchline.batch_time import BatchTime
from batchline.clock import ManualClock
from batchline.scheduler.listener import BatchInfo, StreamingListener
from batchline.sources.lists import END, Abort, AbortedForTest, ListSource
from batchline.spark import local_spark_session
from batchline.state.schema import as_struct
from batchline.state.tester import StateFunctionTester

__all__ = [
    "END",
    "Abort",
    "AbortedForTest",
    "BatchHarness",
    "BatchRecorder",
    "CollectSink",
    "ManualClock",
    "StateFunctionTester",
    "list_stream",
    "local_spark_session",
    "wait_for",
]


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


def list_stream(ssc: StreamingContext, items: list[Any], schema: StructType | str | type, name: str = "list",
                bounded: bool = False) -> Stream:
    """A replayable input over ``items``: each a list of rows for one batch, ``END`` or ``Abort()``;
    ``bounded``: the input ends at ``END`` or at the end of the list, so the pipeline can finish."""
    return ssc.input(ListSource(items, schema, bounded), name=name)


class BatchHarness:
    """Runs a pipeline one batch at a time on a manual clock: rows in, the output's rows back.

    ``build(input_stream)`` returns the stream whose batches ``batch()`` returns; its input
    takes the rows given to each ``batch()`` call (dicts or tuples of ``schema``)::

        harness = BatchHarness(spark, lambda s: s.group_by_key("key").flat_map_groups_with_state(...),
                               "key string, value long", checkpoint=str(tmp_path)).start()
        assert harness.batch([("a", 1)]) == [{"key": "a", "count": 1}]
        harness.stop()

    A list of schemas makes as many inputs: ``build(first, second)`` gets them all, and
    ``batch(first_rows, second_rows)`` gives each its rows (a join's two streams).
    """

    def __init__(self, spark: SparkSession, build: Callable[..., Stream],
                 schema: StructType | str | type | list[StructType | str | type], *,
                 checkpoint: str | None = None, batch_interval_ms: int = 1000, start_ms: int = 100_000,
                 **context_options: Any) -> None:
        self.spark = spark
        schemas = schema if isinstance(schema, list) else [schema]
        self.schemas = [as_struct(s, "the schema of BatchHarness") for s in schemas]
        self.schema = self.schemas[0]
        self.clock = ManualClock(start_ms)
        self.interval_ms = batch_interval_ms
        self.ssc = StreamingContext(spark, batch_interval_ms / 1000, clock=self.clock, checkpoint=checkpoint,
                                    **context_options)
        self.recorder = BatchRecorder()
        self.ssc.add_listener(self.recorder)
        self.inputs = [self.ssc.queue_stream([], schema=s) for s in self.schemas]
        self.input = self.inputs[0]
        self.output = build(*self.inputs)
        self.sink = CollectSink()
        self.output.foreach_batch(self.sink, name="collect")
        self.batch_time = start_ms

    def start(self) -> BatchHarness:
        self.ssc.start()
        return self

    def batch(self, rows: list[Any] | tuple[Any, ...] = (), *more: list[Any] | tuple[Any, ...],
              timeout: float = 120) -> list[dict[str, Any]]:
        """Queue ``rows`` (and the further inputs' ``more``) for the next batch, run it, and
        return its output rows (sorted)."""
        for stream, schema, given in zip(self.inputs, self.schemas, (rows, *more), strict=False):
            if given:
                stream.push(self.spark.createDataFrame(list(given), schema))
        self.clock.advance(self.interval_ms)
        self.batch_time += self.interval_ms
        info = self.recorder.wait_for_batch(self.batch_time, timeout)
        if info.failure is not None:
            raise AssertionError(f"batch {BatchTime(self.batch_time)} failed: {info.failure}")
        return self.sink.batches.get(self.batch_time, [])

    def info(self) -> BatchInfo:
        """The newest completed batch's statistics."""
        return self.recorder.completed[-1]

    def stop(self) -> None:
        self.ssc.stop(graceful=False)
