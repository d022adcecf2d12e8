"""The streams a user builds (SPEC C1): handles over the pipeline's description.

A ``Stream`` names one node of the description and builds new ones: transformations,
windows, watermarks, stateful operators and outputs. Nothing runs and nothing is stored
until the context starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from pyspark.sql import Column, DataFrame

from batchline.batch_time import BatchTime
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError
from batchline.sinks.console import ConsoleSink
from batchline.sinks.files import DEFAULT_KEEP_COMMITS, FileSink
from batchline.sinks.kafka import COMMIT_TOPIC, KafkaSink
from batchline.sinks.postgres import PROGRESS_TABLE, PostgresSink, WriteMode
from batchline.sinks.sink import ForeachBatchSink, Sink
from batchline.sources.queue import QueueSource
from batchline.sources.source_input import SourceInput
from batchline.state.aggregates import check_aggregates
from batchline.state.aggregation import AggregationNode, OutputMode, SessionWindow, TimeWindow
from batchline.state.deduplication import DeduplicationNode
from batchline.state.group_state import AtEnd, GroupStateTimeout
from batchline.state.join import JoinNode, JoinType, Within
from batchline.state.late_rows import LateRowsNode
from batchline.state.stateful import StatefulNode
from batchline.streams import OutputOperation, StreamGraph, StreamNode, TransformNode, WatermarkNode, WindowNode
from batchline.streams.base import Watermark
from batchline.streams.nodes import union_all

__all__ = ["Stream", "KeyedStream", "InputStream", "FileStream", "QueueStream"]


class Stream:
    """A sequence of DataFrames, one per batch (or per slide, for windows)."""

    def __init__(self, node: StreamNode, graph: StreamGraph) -> None:
        self.node = node
        self.graph = graph
        """The pipeline's description this stream belongs to."""

    def _derive(self, node: StreamNode) -> Stream:
        return Stream(node, self.graph)

    @property
    def slide_ms(self) -> int:
        """How often this stream produces a DataFrame."""
        return self.node.slide_ms

    # ---------------------------------------------------------------- transformations
    def transform(self, fn: Callable[..., DataFrame], *, keeps_empty: bool = False) -> Stream:
        """Apply ``fn(df)`` or ``fn(df, batch_time)`` to every batch's DataFrame. With
        ``keeps_empty=True`` (``fn`` gives no row for a batch without rows, as a select, a
        filter or a grouped aggregation) a batch known to hold no row skips ``fn`` and the jobs
        after it (SPEC E6); by default ``fn`` is called every batch, since it may make rows
        from nothing (a global count, a union with a static DataFrame)."""
        return self._derive(TransformNode([self.node], fn, keeps_empty))

    def select(self, *cols: str | Column) -> Stream:
        return self.transform(lambda df: df.select(*cols), keeps_empty=True)

    def filter(self, condition: str | Column) -> Stream:
        return self.transform(lambda df: df.filter(condition), keeps_empty=True)

    where = filter

    def with_column(self, name: str, col: Column) -> Stream:
        return self.transform(lambda df: df.withColumn(name, col), keeps_empty=True)

    def union(self, *others: Stream) -> Stream:
        """Rows of this stream and the others, matched by column name, batch by batch."""
        return self._derive(TransformNode([self.node, *(o.node for o in others)], union_all, keeps_empty=True))

    def window(self, window_length: object, slide_interval: object | None = None) -> Stream:
        """Every ``slide_interval``, the rows of the last ``window_length`` (both multiples of
        this stream's slide; the slide defaults to it)."""
        slide_ms = None if slide_interval is None else parse_duration_ms(slide_interval, "slide interval")
        return self._derive(WindowNode(self.node, parse_duration_ms(window_length, "window length"), slide_ms))

    def with_watermark(self, event_time_column: str, delay: object, *, idle_timeout: object | None = None) -> Stream:
        """Track event time in ``event_time_column`` (a timestamp): the watermark is the newest
        event time seen minus ``delay`` ("0 seconds" allowed, as in Spark). Stateful operators
        downstream time out event-time timeouts against it and, when they use event-time
        timeouts, drop the rows older than it and count them as late (SPEC D3).

        ``idle_timeout``: once no row came for that long (processing time), event time is
        taken to go on with the clock, so the watermark moves on and the last windows of a
        quiet stream close (Flink's source idleness). Without it, as in Spark, the watermark
        waits for the next row."""
        upstream = self.node.watermark()
        if upstream is not None:
            # As Spark ("Redefining watermark is disallowed"): two delays on one path would make
            # the rows late by one and the windows closed by the other.
            raise ConfigurationError(
                f"with_watermark({event_time_column!r}, ...): this stream already has a watermark on "
                f"{upstream.column!r} from a with_watermark (or a windowed aggregation) upstream; keep one "
                "with_watermark per path: drop the upstream one, or set this one where the event time is defined")
        idle_ms = None if idle_timeout is None else parse_duration_ms(idle_timeout, "idle timeout")
        watermark = Watermark(event_time_column, parse_duration_ms(delay, "watermark delay", allow_zero=True), idle_ms)
        return self._derive(WatermarkNode(self.node, watermark))

    def group_by_key(self, *cols: str | Column | TimeWindow | SessionWindow) -> KeyedStream:
        """Group by key columns and, for ``aggregate``, at most one event-time window
        (``batchline.window(column, length, slide)`` or ``batchline.session_window(column, gap)``)."""
        if not cols:
            raise ConfigurationError("group_by_key needs at least one key column or a window")
        return KeyedStream(self, cols)

    def drop_duplicates(self, *columns: str, name: str = "drop_duplicates",
                        num_partitions: int | None = None) -> Stream:
        """Each key's first row (of ``columns``) passes; later ones are dropped, as Spark's
        ``dropDuplicates``. After ``with_watermark``: rows at or before the watermark are late
        (dropped and counted), and a key goes from the state once the watermark passes its
        event time, which must then be one of ``columns`` (otherwise keys are kept for ever,
        as in Spark, and a warning says so). Of a key's rows in one batch, the one with the
        earliest event time passes."""
        return self._deduplicate(columns, None, False, name, num_partitions)

    def drop_duplicates_within_watermark(self, *columns: str, within: object | None = None,
                                         name: str = "drop_duplicates", num_partitions: int | None = None) -> Stream:
        """As Spark's ``dropDuplicatesWithinWatermark``: a key's first row passes, and rows
        with the same ``columns`` are dropped until the watermark passes the first row's event
        time plus ``within`` (default: the watermark's delay); then the key may pass again."""
        return self._deduplicate(columns, within, True, name, num_partitions)

    def _deduplicate(self, columns: tuple[str, ...], within: object | None, within_watermark: bool, name: str,
                     num_partitions: int | None) -> Stream:
        if not all(isinstance(c, str) for c in columns):
            raise ConfigurationError("deduplication takes column names; add computed columns with with_column first")
        node = DeduplicationNode(self.node, columns, within=within, within_watermark=within_watermark, name=name,
                                 num_partitions=num_partitions)
        self.graph.claim(node)
        return Stream(node, self.graph)

    def join(self, other: Stream, on: str | Sequence[str | tuple[str, str]], *, how: JoinType | str = "inner",
             within: Within | Sequence[object] | None = None, name: str = "join",
             num_partitions: int | None = None) -> Stream:
        """Join this stream (left) with ``other`` (right) on equal ``on`` columns (names alike on
        both sides, or ``(left, right)`` pairs), as Spark's stream-stream join: each pair of rows
        that meets the condition comes out once, in the batch where the second of the two
        arrives.

        ``how``: ``"inner"``, ``"left"``, ``"right"``, ``"full"`` (outer: a row that never met one
        comes out with nulls for the other side, once the watermark says none can come) or
        ``"left_semi"`` (each left row that meets a right row, once, with the left's columns).

        ``within=(left_time, right_time, lower, upper)``: only pairs whose right time lies in
        ``[left_time + lower, left_time + upper]`` (durations, negative ones allowed, e.g.
        ``("shown_at", "clicked_at", "0 seconds", "1 hour")``). With ``with_watermark`` on both
        streams, on those columns, rows behind the watermark are late (dropped, counted, and on
        ``late_rows``) and each side's buffered rows go once no row to come can meet them.
        Without it an inner join keeps every row for ever (a warning says so); outer and semi
        joins need it.

        Output columns: keys named alike once, then the left's columns, then the right's; a
        column name both sides have otherwise must be renamed first."""
        node = JoinNode(self.node, other.node, on, how=how, within=within, name=name, num_partitions=num_partitions)
        self.graph.claim(node)
        return Stream(node, self.graph)

    def aggregate(self, *aggregates: object, output_mode: OutputMode | str = OutputMode.UPDATE,
                  name: str = "aggregate", expire_after: object | None = None) -> Stream:
        """A running aggregation over the whole stream, without keys: see ``KeyedStream.aggregate``."""
        return KeyedStream(self, ()).aggregate(*aggregates, output_mode=output_mode, name=name,
                                               num_partitions=1, expire_after=expire_after)

    def count(self) -> Stream:
        """One row per batch: the number of rows in it, as column ``count``."""
        return self.transform(lambda df: df.groupBy().count())

    # ---------------------------------------------------------------- outputs
    def write(self, sink: Sink, name: str | None = None) -> OutputOperation:
        """Hand every batch to ``sink`` (a :class:`batchline.Sink`: your own, or a built-in one);
        ``name`` is the output's stable name (default: the sink's class name). Unless the sink
        says ``needs_checkpoint = False``, the context needs a checkpoint location: ``start()``
        refuses the pipeline without one."""
        return self.graph.add_output(self.node, sink, name or type(sink).__name__)

    def foreach_batch(self, fn: Callable[[DataFrame, BatchTime], Any], name: str | None = None) -> OutputOperation:
        """Call ``fn(df, batch_time)`` for every batch; ``batch_time`` is the batch's id (epoch ms),
        the same every time the batch runs, across restarts, only with a checkpoint location
        (without one a new run starts over with new batch times). A function that writes outside
        the process should key what it writes by ``batch_time`` and run with ``checkpoint=``."""
        return self.graph.add_output(self.node, ForeachBatchSink(fn), name or "foreach_batch")

    def console(self, num_rows: int = 20, truncate: bool = True, name: str | None = None) -> OutputOperation:
        """Print the first rows of every batch under a header with the batch time."""
        return self.graph.add_output(self.node, ConsoleSink(num_rows, truncate), name or "console")

    def write_files(self, path: str, format: str = "parquet", name: str | None = None,
                    storage_options: dict[str, Any] | None = None, keep_commits: int = DEFAULT_KEEP_COMMITS,
                    **options: str) -> OutputOperation:
        """Write every non-empty batch as one directory ``batch_time=<ms>`` under ``path`` (a
        local path or fsspec URL, with ``storage_options``), exactly once across restarts.
        The newest ``keep_commits`` commit records stay files; older ones are compacted into
        one snapshot in the background, so they do not pile up over a pipeline's life. Needs
        a checkpoint location (``StreamingContext(..., checkpoint=...)``): without one a rerun
        would write everything again, so ``start()`` refuses."""
        sink = FileSink(path, format, options, storage_options=storage_options, keep_commits=keep_commits)
        return self.graph.add_output(self.node, sink, name or f"files:{path}")

    def write_postgres(self, dsn: str, table: str, *, mode: WriteMode | str = WriteMode.APPEND, key: Sequence[str] = (),
                       name: str | None = None, progress_table: str = PROGRESS_TABLE) -> OutputOperation:
        """Write every batch into PostgreSQL ``table`` exactly once: rows are loaded with COPY
        from the tasks into a staging table, then moved into ``table`` in one transaction with
        a row of ``progress_table`` (pipeline, output, batch time, fencing token), so a batch
        that runs again writes nothing twice and a driver that lost its lease writes nothing.
        ``mode=WriteMode.UPSERT`` (or ``"upsert"``) inserts or updates by ``key`` (a primary key or unique index). The
        stream's columns must be columns of ``table``, checked before anything is written.
        Needs a checkpoint location, as ``write_files`` does."""
        sink = PostgresSink(dsn, table, mode, key, progress_table)
        return self.graph.add_output(self.node, sink, name or f"postgres:{table}")

    def write_kafka(self, bootstrap_servers: str, topic: str, *, key: str | Column | None = None,
                    value: str | Column | None = None, headers: str | Sequence[str] | None = None,
                    config: Mapping[str, Any] | None = None, name: str | None = None,
                    commit_topic: str = COMMIT_TOPIC, timeout: object = "60s") -> OutputOperation:
        """Write every batch into Kafka ``topic`` exactly once: all of a batch's records in one
        Kafka transaction with a commit marker on ``commit_topic`` (compacted, created when
        missing), so a read_committed consumer sees each row once, and a batch all at once or
        not at all. ``value``: a column (binary as it is, text as UTF-8, structs as JSON),
        default the whole row as a JSON object; ``key``: a column, default none; ``headers``:
        columns sent as headers of their names. The transactional id comes from the pipeline
        and the output's name, so a newer driver fences an older one. ``config``: librdkafka
        producer settings. ``timeout``: how long a commit waits for the brokers before the batch
        fails (and is retried). Needs a checkpoint location and an existing topic."""
        sink = KafkaSink(bootstrap_servers, topic, key=key, value=value, headers=headers, config=config,
                         commit_topic=commit_topic, timeout_s=parse_duration_ms(timeout, "timeout") / 1000)
        return self.graph.add_output(self.node, sink, name or f"kafka:{topic}")

    @property
    def late_rows(self) -> Stream:
        """The rows this stateful operator dropped as late (behind its watermark), each batch's
        own: the row's columns (with ``window_start`` and ``window_end`` of the window it missed,
        for a windowed aggregation: a row late for two sliding windows comes twice), then
        ``operator`` and ``watermark``. Write it anywhere, as any stream."""
        if not isinstance(self.node, StatefulNode):
            raise ConfigurationError("late_rows is the stream of a stateful operator's late rows: take it from what "
                                     "aggregate, drop_duplicates or flat_map_groups_with_state return")
        if not self.node.drops_late_rows:
            raise ConfigurationError(f"operator {self.node.name!r} drops no row as late (it has no watermark, or keeps "
                                     "every row: a running aggregation, a state function without event-time "
                                     "timeouts), so it has no late rows")
        return self._derive(LateRowsNode(self.node, self.node.rows_node))

    def __repr__(self) -> str:
        return f"Stream({self.node!r})"


class InputStream(Stream):
    """An input's rows; the records it could not read go to ``dead_letters``."""

    node: SourceInput

    @property
    def dead_letters(self) -> Stream:
        """The bad records: ``raw_record``, ``reason``, ``source``, ``batch_time``."""
        return self._derive(self.node.dead_letters)


class FileStream(InputStream):
    """New files of a directory or prefix; bad lines go to ``dead_letters``."""


class QueueStream(Stream):
    """One queued DataFrame per batch; ``push`` queues more while the pipeline runs."""

    node: SourceInput

    def push(self, df: DataFrame) -> None:
        cast(QueueSource, self.node.source).push(df)


class KeyedStream:
    """A stream grouped by key columns, batch by batch."""

    def __init__(self, stream: Stream, keys: Sequence[str | Column | TimeWindow | SessionWindow]) -> None:
        self.stream = stream
        self.keys = tuple(keys)

    def agg(self, *exprs: Column) -> Stream:
        """Spark's aggregate expressions over each batch on its own; for totals across batches
        (running or windowed), use ``aggregate``."""
        keys = self._batch_keys("agg")
        return self.stream.transform(lambda df: df.groupBy(*keys).agg(*exprs), keeps_empty=True)

    def count(self) -> Stream:
        """Rows per key in each batch on its own; for counts across batches, use
        ``aggregate(aggregates.count())``."""
        keys = self._batch_keys("count")
        return self.stream.transform(lambda df: df.groupBy(*keys).count(), keeps_empty=True)

    def _batch_keys(self, what: str) -> tuple[str | Column, ...]:
        if any(isinstance(k, (TimeWindow, SessionWindow)) for k in self.keys):
            raise ConfigurationError(
                f"{what}() aggregates each batch on its own and an event-time window spans batches; use "
                ".aggregate(aggregates.count(), ...) to aggregate windows across batches")
        return cast(tuple[str | Column, ...], self.keys)

    def aggregate(self, *aggregates: object, output_mode: OutputMode | str = OutputMode.UPDATE,
                  name: str | None = None, num_partitions: int | None = None,
                  expire_after: object | None = None) -> Stream:
        """Aggregate across batches, per key and, when grouped by a ``window`` or a
        ``session_window``, per event-time window: Spark's streaming ``groupBy(...).agg(...)``.
        The aggregates are batchline's (``from batchline import aggregates``: ``count``,
        ``sum``, ``min``, ``max``, ``avg``, ``first``, ``last``, ``collect_list``,
        ``collect_set``); Spark computes each batch's partials, the state keeps their merge.

        Rows out: the key columns, ``window_start`` and ``window_end`` when windowed, one
        column per aggregate (``count``, ``sum_amount``, ... or its ``alias``).

        ``output_mode``: ``"update"`` (default) emits, every batch, the groups whose
        aggregates changed; ``"append"`` emits each window once, final, in the batch where the
        watermark passes its end (needs a window and ``with_watermark``). A partial whose
        window has already ended at the watermark is late: dropped and counted.

        ``expire_after`` (without a window): forget a key that long after its newest event
        time, against the watermark, or without a watermark that long after its last update.
        ``name`` keeps the state at the checkpoint location (keep it stable)."""
        windows = [k for k in self.keys if isinstance(k, (TimeWindow, SessionWindow))]
        if len(windows) > 1:
            raise ConfigurationError("group by one window at most")
        if not all(isinstance(k, (str, TimeWindow, SessionWindow)) for k in self.keys):
            raise ConfigurationError(
                "an aggregation groups by column names; add computed keys with with_column first")
        keys = tuple(str(k) for k in self.keys if isinstance(k, str))
        checked = check_aggregates(aggregates, "aggregate()")
        node = AggregationNode(self.stream.node, keys, windows[0] if windows else None, checked,
                               output_mode=output_mode, name=name or "aggregate", num_partitions=num_partitions,
                               expire_after=expire_after)
        graph = self.stream.graph
        graph.claim(node)
        return Stream(node, graph)

    def flat_map_groups_with_state(
        self,
        fn: Callable[..., Any],
        *,
        state_schema: Any,
        output_schema: Any,
        timeout: GroupStateTimeout | None = None,
        name: str | None = None,
        num_partitions: int | None = None,
        initial_state: DataFrame | None = None,
        at_end: AtEnd | str = AtEnd.KEEP,
    ) -> Stream:
        """Call ``fn(key, rows, state)`` once per key with data in a batch, and for keys whose
        timeout passed; it returns (or yields) any number of output rows (SPEC D1, D2).

        ``rows`` iterates the key's rows of the batch as named tuples; ``state`` is a
        GroupState of ``state_schema`` (a dataclass or a Spark schema). Output rows are
        dataclasses, dicts or tuples of ``output_schema``. The state lives at the checkpoint
        location under ``name`` (keep it stable across releases) in ``num_partitions``
        partitions (default 8, fixed once state exists). ``initial_state`` is a DataFrame of
        key columns and state fields to start from; ``fn`` is called for each of its keys in
        the first batch.

        When every input has ended (bounded inputs), event-time timeouts all fire (the
        watermark reaches the end of time) before the pipeline finishes; keys with
        processing-time timeouts are kept for a later run (``at_end=AtEnd.KEEP``, or ``"keep"``)
        or all time out (``at_end=AtEnd.TIME_OUT``, or ``"time_out"``).
        """
        return self._with_state(fn, True, state_schema, output_schema, timeout, name, num_partitions, initial_state,
                                at_end)

    def map_groups_with_state(
        self,
        fn: Callable[..., Any],
        *,
        state_schema: Any,
        output_schema: Any,
        timeout: GroupStateTimeout | None = None,
        name: str | None = None,
        num_partitions: int | None = None,
        initial_state: DataFrame | None = None,
        at_end: AtEnd | str = AtEnd.KEEP,
    ) -> Stream:
        """Like ``flat_map_groups_with_state``, with exactly one output row per call."""
        return self._with_state(fn, False, state_schema, output_schema, timeout, name, num_partitions, initial_state,
                                at_end)

    def _with_state(self, fn: Callable[..., Any], flat: bool, state_schema: Any, output_schema: Any,
                    timeout: GroupStateTimeout | None, name: str | None, num_partitions: int | None,
                    initial_state: DataFrame | None, at_end: AtEnd | str) -> Stream:
        if not all(isinstance(k, str) for k in self.keys):
            raise ConfigurationError(
                "a stateful operator groups by column names (an event-time window is for aggregate()); add "
                "computed keys with with_column first"
            )
        node = StatefulNode(
            self.stream.node, tuple(str(k) for k in self.keys), fn, flat=flat, state_schema=state_schema,
            output_schema=output_schema, timeout=timeout or GroupStateTimeout.NO_TIMEOUT,
            name=name or ("flat_map_groups_with_state" if flat else "map_groups_with_state"),
            num_partitions=num_partitions, initial_state=initial_state, at_end=at_end,
        )
        graph = self.stream.graph
        graph.claim(node)
        return Stream(node, graph)
