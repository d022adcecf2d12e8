"""The nodes every pipeline is made of: transformations, windows and watermarks, each with
the runtime that computes it."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from pyspark import Accumulator
from pyspark.sql import DataFrame

from batchline.batch_time import BatchTime
from batchline.errors import ConfigurationError
from batchline.spark import forget_accumulator
from batchline.streams.base import RuntimeEnv, StreamNode, StreamRuntime, Watermark
from batchline.streams.event_time import NewestParam, measure_newest

__all__ = ["TransformNode", "WindowNode", "WatermarkNode", "WatermarkRuntime", "union_all"]


def union_all(*dfs: DataFrame) -> DataFrame:
    result = dfs[0]
    for df in dfs[1:]:
        result = result.unionByName(df)
    return result


class TransformNode(StreamNode):
    """``fn(df, ...)`` or ``fn(df, ..., batch_time)`` over the parents' DataFrames of a batch."""

    def __init__(self, parents: Sequence[StreamNode], fn: Callable[..., DataFrame], keeps_empty: bool = False) -> None:
        super().__init__(parents)
        self.keeps_empty = keeps_empty
        """Whether batches without rows in give none out (a select, a filter, a union, a grouped
        aggregation): such a batch then needs no job. A function may make rows from nothing (a
        global count, a union with a static DataFrame), so by default it is called every batch."""
        for other in self.parents[1:]:
            if other.slide_ms != self.parents[0].slide_ms:
                raise ConfigurationError(
                    f"cannot combine streams sliding every {self.parents[0].slide_ms} ms and {other.slide_ms} ms; "
                    "window them to the same slide first"
                )
        self.fn = fn
        self.wants_batch_time = _accepts_batch_time(fn, len(self.parents))

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> StreamRuntime:
        return _TransformRuntime(self, env, parents)


class _TransformRuntime(StreamRuntime):
    node: TransformNode

    def has_rows(self, batch_time: int) -> bool:
        return super().has_rows(batch_time) if self.node.keeps_empty else True

    def compute(self, batch_time: int) -> DataFrame:
        args: list[Any] = [self.parent_frame(batch_time, i) for i in range(len(self.parents))]
        if self.node.wants_batch_time:
            args.append(BatchTime(batch_time))
        result = self.node.fn(*args)
        if not isinstance(result, DataFrame):
            raise TypeError(
                f"the function given to transform() must return a DataFrame; it returned "
                f"{type(result).__name__} for batch {BatchTime(batch_time)}"
            )
        return result


def _accepts_batch_time(fn: Callable[..., Any], n_frames: int) -> bool:
    """True when ``fn`` takes one more positional argument than there are DataFrames."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) == n_frames + 1


class WatermarkNode(StreamNode):
    """The parent's rows unchanged, with event time tracked in a column (SPEC D3)."""

    def __init__(self, parent: StreamNode, watermark: Watermark) -> None:
        super().__init__([parent])
        self._watermark = watermark

    def watermark(self) -> Watermark:
        return self._watermark

    def watermark_nodes(self) -> tuple[StreamNode, ...]:
        return (self,)

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> StreamRuntime:
        return WatermarkRuntime(self, env, parents)


class WatermarkRuntime(StreamRuntime):
    """The parent's rows; once ``measure`` is called, with the newest event time of each
    batch's rows measured as they pass."""

    node: WatermarkNode

    def __init__(self, node: WatermarkNode, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> None:
        super().__init__(node, env, parents)
        self._measured = False
        self._newest: dict[int, Accumulator[int | None]] = {}
        """Per batch time, the newest event time its tasks saw so far."""

    def measure(self) -> None:
        """Measure each batch's newest event time here: an operator downstream reads the rows
        of several ``with_watermark``s mixed (a union), and must know each one's."""
        self._measured = True

    def compute(self, batch_time: int) -> DataFrame:
        df = self.parent_frame(batch_time)
        if not self._measured:
            return df
        newest: Accumulator[int | None] = self.env.spark.sparkContext.accumulator(None, NewestParam())
        with self._lock:
            self._newest[batch_time] = newest
        return measure_newest(df, self.node.watermark().column, newest)

    def newest_through(self, batch_time: int) -> int | None:
        """The newest event time the tasks that read this stream's batches up to ``batch_time``
        saw so far (None: none yet)."""
        with self._lock:
            measured = [a for t, a in self._newest.items() if t <= batch_time]
        return max((v for a in measured if (v := a.value) is not None), default=None)

    def release(self, batch_time: int, df: DataFrame) -> None:
        with self._lock:
            newest = self._newest.pop(batch_time, None)
        if newest is not None:
            forget_accumulator(newest)


class WindowNode(StreamNode):
    """Every ``slide_ms``, the rows of the parent's last ``window_ms``."""

    shuffles_input = True

    def __init__(self, parent: StreamNode, window_ms: int, slide_ms: int | None) -> None:
        super().__init__([parent])
        self.window_ms = window_ms
        self._slide_ms = parent.slide_ms if slide_ms is None else slide_ms
        for what, value in (("window length", self.window_ms), ("slide interval", self._slide_ms)):
            if value % parent.slide_ms:
                raise ConfigurationError(
                    f"the {what} ({value} ms) must be a multiple of the parent stream's slide "
                    f"({parent.slide_ms} ms)"
                )

    @property
    def slide_ms(self) -> int:
        return self._slide_ms

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> StreamRuntime:
        return _WindowRuntime(self, env, parents)


class _WindowRuntime(StreamRuntime):
    node: WindowNode

    def parent_remember_ms(self) -> int:
        return self.remember_ms + self.node.window_ms

    def finished_after(self) -> int | None:
        """A window still holds the parent's last rows until they slide out of it."""
        parent = super().finished_after()
        return None if parent is None else parent + self.node.window_ms - self.parents[0].node.slide_ms

    def _window_times(self, batch_time: int) -> range:
        step = self.parents[0].node.slide_ms
        return range(batch_time - self.node.window_ms + step, batch_time + 1, step)

    def has_rows(self, batch_time: int) -> bool:
        parent = self.parents[0]
        return any(parent.has_rows(t) for t in self._window_times(batch_time) if parent.is_time_valid(t))

    def compute(self, batch_time: int) -> DataFrame:
        parent = self.parents[0]
        frames = [df for t in self._window_times(batch_time) if (df := parent.get_or_compute(t)) is not None]
        return union_all(*frames)
