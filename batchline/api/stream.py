"""Streams are per-batch DataFrames (SPEC C1): each batch time maps to one lazy DataFrame.

A stream remembers the DataFrames it generated for as long as a downstream window needs
them; ``clear_metadata`` releases the rest after every batch (SPEC A5).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame

from batchline.batch_time import BatchTime, parse_duration_ms
from batchline.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame as InitialState

    from batchline.api.env import PipelineEnv
    from batchline.api.output import OutputOperation
    from batchline.state.group_state import GroupStateTimeout
    from batchline.state.operator import StatefulStream

__all__ = ["Stream", "KeyedStream"]

logger = logging.getLogger(__name__)

_stream_ids = itertools.count()


class Stream(ABC):
    """A sequence of DataFrames, one per batch (or per slide, for windows)."""

    def __init__(self, env: PipelineEnv, parents: Sequence[Stream] = ()) -> None:
        self.env = env
        self.parents: tuple[Stream, ...] = tuple(parents)
        self.stream_id = next(_stream_ids)
        self._generated: dict[int, DataFrame] = {}
        self._lock = threading.RLock()
        self.zero_time: int | None = None
        self.remember_ms = 0

    # ---------------------------------------------------------------- scheduling
    @property
    def slide_ms(self) -> int:
        """How often this stream produces a DataFrame; inputs slide every batch interval."""
        return self.parents[0].slide_ms

    @abstractmethod
    def _compute(self, batch_time: int) -> DataFrame:
        """Build (lazily) this stream's DataFrame for a valid batch time."""

    def _release(self, batch_time: int, df: DataFrame) -> None:
        """Free what a forgotten batch held (cached data, blocks); nothing by default."""
        return None

    def _parent_remember_ms(self) -> int:
        return self.remember_ms

    def is_time_valid(self, batch_time: int) -> bool:
        if self.zero_time is None or batch_time <= self.zero_time:
            return False
        return (batch_time - self.zero_time) % self.slide_ms == 0

    def get_or_compute(self, batch_time: int) -> DataFrame | None:
        """This stream's DataFrame for ``batch_time``; None when the time is not on its slide."""
        with self._lock:
            if batch_time in self._generated:
                return self._generated[batch_time]
            if not self.is_time_valid(batch_time):
                return None
            df = self._compute(batch_time)
            self._generated[batch_time] = df
            return df

    def initialize(self, zero_time: int) -> None:
        if self.zero_time is not None and self.zero_time != zero_time:
            raise ConfigurationError(f"stream {self!r} is already part of a graph started at {self.zero_time}")
        self.zero_time = zero_time
        for parent in self.parents:
            parent.initialize(zero_time)

    def remember(self, duration_ms: int) -> None:
        """Keep generated DataFrames for at least ``duration_ms``; parents keep what we need."""
        if duration_ms > self.remember_ms:
            self.remember_ms = duration_ms
        for parent in self.parents:
            parent.remember(self._parent_remember_ms())

    def clear_metadata(self, batch_time: int) -> None:
        """Forget DataFrames generated at or before ``batch_time - remember``."""
        with self._lock:
            old = [t for t in self._generated if t <= batch_time - self.remember_ms]
            released = [(t, self._generated.pop(t)) for t in old]
        for t, df in released:
            self._release(t, df)
        if old:
            logger.debug("Cleared %d old batches of %r at %d", len(old), self, batch_time)
        for parent in self.parents:
            parent.clear_metadata(batch_time)

    def generated_times(self) -> list[int]:
        with self._lock:
            return sorted(self._generated)

    def ancestors(self) -> set[int]:
        """Ids of this stream and every stream it reads from."""
        seen = {self.stream_id}
        for parent in self.parents:
            seen |= parent.ancestors()
        return seen

    # ---------------------------------------------------------------- transformations
    def transform(self, fn: Callable[..., DataFrame]) -> Stream:
        """Apply ``fn(df)`` or ``fn(df, batch_time)`` to every batch's DataFrame."""
        return TransformedStream(self.env, [self], fn)

    def select(self, *cols: str | Column) -> Stream:
        return self.transform(lambda df: df.select(*cols))

    def filter(self, condition: str | Column) -> Stream:
        return self.transform(lambda df: df.filter(condition))

    where = filter

    def with_column(self, name: str, col: Column) -> Stream:
        return self.transform(lambda df: df.withColumn(name, col))

    def union(self, *others: Stream) -> Stream:
        """Rows of this stream and the others, matched by column name, batch by batch."""
        for other in others:
            if other.slide_ms != self.slide_ms:
                raise ConfigurationError(
                    f"cannot union streams sliding every {self.slide_ms} ms and {other.slide_ms} ms; "
                    "window them to the same slide first"
                )
        return TransformedStream(self.env, [self, *others], _union_all)

    def window(self, window_length: object, slide_interval: object | None = None) -> Stream:
        """Every ``slide_interval``, the rows of the last ``window_length`` (both multiples of
        this stream's slide; the slide defaults to it)."""
        return WindowedStream(self, window_length, slide_interval)

    def with_watermark(self, event_time_column: str, delay: object) -> Stream:
        """Track event time in ``event_time_column`` (a timestamp): stateful operators
        downstream drop rows older than the newest event time seen minus ``delay``, count
        them as late, and time out event-time timeouts against it (SPEC D3)."""
        delay_ms = parse_duration_ms(delay, "watermark delay")
        stream = TransformedStream(self.env, [self], lambda df: df)
        stream.watermark = (event_time_column, delay_ms)  # type: ignore[attr-defined]
        return stream

    def group_by_key(self, *cols: str | Column) -> KeyedStream:
        if not cols:
            raise ConfigurationError("group_by_key needs at least one key column")
        return KeyedStream(self, cols)

    def count(self) -> Stream:
        """One row per batch: the number of rows in it, as column ``count``."""
        return self.transform(lambda df: df.groupBy().count())

    # ---------------------------------------------------------------- outputs
    def foreach_batch(self, fn: Callable[[DataFrame, BatchTime], Any], name: str | None = None) -> OutputOperation:
        """Call ``fn(df, batch_time)`` for every batch; ``batch_time`` is a stable id (epoch ms)."""
        from batchline.api.output import OutputOperation

        return OutputOperation.register(self.env, self, fn, name or "foreach_batch")

    def console(self, num_rows: int = 20, truncate: bool = True, name: str | None = None) -> OutputOperation:
        """Print the first rows of every batch under a header with the batch time."""
        from batchline.sinks.console import ConsoleSink

        return self.foreach_batch(ConsoleSink(num_rows, truncate).write, name or "console")

    def write_files(
        self, path: str, format: str = "parquet", name: str | None = None, **options: str
    ) -> OutputOperation:
        """Write every non-empty batch as one directory ``batch_time=<ms>`` under ``path``,
        moved into place whole, so a reader never sees part of a batch."""
        from batchline.sinks.files import FileSink

        return self.foreach_batch(FileSink(path, format, options).write, name or f"files:{path}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}#{self.stream_id}"


def _union_all(*dfs: DataFrame) -> DataFrame:
    result = dfs[0]
    for df in dfs[1:]:
        result = result.unionByName(df)
    return result


class TransformedStream(Stream):
    def __init__(self, env: PipelineEnv, parents: Sequence[Stream], fn: Callable[..., DataFrame]) -> None:
        super().__init__(env, parents)
        self._fn = fn
        self._wants_time = _accepts_batch_time(fn, len(parents))

    def _compute(self, batch_time: int) -> DataFrame:
        inputs = [parent.get_or_compute(batch_time) for parent in self.parents]
        args: list[Any] = list(inputs)
        if self._wants_time:
            args.append(BatchTime(batch_time))
        result = self._fn(*args)
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


class WindowedStream(Stream):
    def __init__(self, parent: Stream, window_length: object, slide_interval: object | None) -> None:
        super().__init__(parent.env, [parent])
        self.window_ms = parse_duration_ms(window_length, "window length")
        self._slide_ms = (
            parent.slide_ms if slide_interval is None else parse_duration_ms(slide_interval, "slide interval")
        )
        for what, value in (("window length", self.window_ms), ("slide interval", self._slide_ms)):
            if value % parent.slide_ms:
                raise ConfigurationError(
                    f"the {what} ({value} ms) must be a multiple of the parent stream's slide "
                    f"({parent.slide_ms} ms)"
                )

    @property
    def slide_ms(self) -> int:
        return self._slide_ms

    def _parent_remember_ms(self) -> int:
        return self.remember_ms + self.window_ms

    def _compute(self, batch_time: int) -> DataFrame:
        parent = self.parents[0]
        step = parent.slide_ms
        times = range(batch_time - self.window_ms + step, batch_time + 1, step)
        frames = [df for t in times if (df := parent.get_or_compute(t)) is not None]
        return _union_all(*frames)


class KeyedStream:
    """A stream grouped by key columns, batch by batch."""

    def __init__(self, stream: Stream, keys: Sequence[str | Column]) -> None:
        self.stream = stream
        self.keys = tuple(keys)

    def agg(self, *exprs: Column) -> Stream:
        keys = self.keys
        return self.stream.transform(lambda df: df.groupBy(*keys).agg(*exprs))

    def count(self) -> Stream:
        keys = self.keys
        return self.stream.transform(lambda df: df.groupBy(*keys).count())

    def flat_map_groups_with_state(
        self,
        fn: Callable[..., Any],
        *,
        state_schema: Any,
        output_schema: Any,
        timeout: GroupStateTimeout | None = None,
        name: str | None = None,
        num_partitions: int | None = None,
        initial_state: InitialState | None = None,
    ) -> StatefulStream:
        """Call ``fn(key, rows, state)`` once per key with data in a batch, and for keys whose
        timeout passed; it returns (or yields) any number of output rows (SPEC D1, D2).

        ``rows`` iterates the key's rows of the batch as named tuples; ``state`` is a
        GroupState of ``state_schema`` (a dataclass or a Spark schema). Output rows are
        dataclasses, dicts or tuples of ``output_schema``. The state lives at the checkpoint
        location under ``name`` (keep it stable across releases) in ``num_partitions``
        partitions (default 8, fixed once state exists). ``initial_state`` is a DataFrame of
        key columns and state fields to start from; ``fn`` is called for each of its keys in
        the first batch.
        """
        return self._with_state(fn, True, state_schema, output_schema, timeout, name, num_partitions, initial_state)

    def map_groups_with_state(
        self,
        fn: Callable[..., Any],
        *,
        state_schema: Any,
        output_schema: Any,
        timeout: GroupStateTimeout | None = None,
        name: str | None = None,
        num_partitions: int | None = None,
        initial_state: InitialState | None = None,
    ) -> StatefulStream:
        """Like ``flat_map_groups_with_state``, with exactly one output row per call."""
        return self._with_state(fn, False, state_schema, output_schema, timeout, name, num_partitions, initial_state)

    def _with_state(self, fn: Callable[..., Any], flat: bool, state_schema: Any, output_schema: Any,
                    timeout: GroupStateTimeout | None, name: str | None, num_partitions: int | None,
                    initial_state: InitialState | None) -> StatefulStream:
        from batchline.state.group_state import GroupStateTimeout
        from batchline.state.operator import StatefulStream

        return StatefulStream(self, fn, flat=flat, state_schema=state_schema, output_schema=output_schema,
                              timeout=timeout or GroupStateTimeout.NO_TIMEOUT, name=name,
                              num_partitions=num_partitions, initial_state=initial_state)
