"""The stateful operator on the driver: ``flat_map_groups_with_state`` (SPEC D1–D5, D8).

``StatefulNode`` is the operator as the user describes it (function, schemas, timeout,
name, partitions); ``StatefulRuntime`` is what it becomes when the pipeline starts: its
stored metadata, the version the next batch builds on, what the driver knows of each
partition. Its part of each batch (the partitions that ran, were kept or skipped, the
statistics and facts they reported) is one ``OperatorBatch`` per batch
(``batchline.state.operator_batch``), taken on when the batch commits.

Each batch the operator shuffles its input into ``num_partitions`` state partitions as
``repartition(n, keys)`` places rows (a shuffle by number, which adaptive execution never
coalesces), with one marker row per partition that tells its task which partition it runs
(``batchline.state.placement``), and runs the state function in ``mapInArrow``; the
partitions that reported are checked every batch. Its job caches the output, so outputs
that read it never run the function twice, and collects the batch's statistics. An
operator read by one output only, directly, runs no job of its own: its job publishes the
batch's parameters, the output's job runs the tasks, and a completion job after it takes on
their statistics, running any partition the output did not evaluate
(``batchline.state.in_output_job``). What is static
reaches the tasks as an ``OperatorSpec`` in the task closure; what depends on the previous
batch (the version to build on, the watermark) as ``BatchParams`` in a Spark local property
of the job, because the batch's DataFrame is built before the previous batch has finished
(``batchline.state.contract``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from batchline.batch_time import END_OF_TIME_MS, format_batch_time
from batchline.checkpoint.events import OperatorInitialized
from batchline.checkpoint.model import OperatorProgress
from batchline.choices import choose
from batchline.errors import ConfigurationError, ContextStateError
from batchline.scheduler.job import Job, JobKind
from batchline.scheduler.progress import StateOperatorProgress
from batchline.spark import forget_accumulator
from batchline.state import operator
from batchline.state.contract import LATE_AT, RECENT_VERSIONS, BatchParams, OperatorSpec, PartitionFacts, Stats
from batchline.state.execution import PartitionEnd, StateTask, beside_store
from batchline.state.frames import write_state_frame
from batchline.state.group_state import AtEnd, GroupStateTimeout, last_due
from batchline.state.in_output_job import InOutputJob
from batchline.state.operator import (
    operator_progress,
    operator_task,
    publish_batch_params,
    purge_old_versions,
    run_batch_job,
    tasks_reported,
)
from batchline.state.operator_batch import OperatorBatch, Started
from batchline.state.placement import StateShuffle, placement
from batchline.state.schema import RowSchema
from batchline.state.store import DELTA, OUTPUT, STATE_DIR, FileStateStore, StateMetadata, StateStore
from batchline.streams import RuntimeEnv, StreamNode, StreamRuntime
from batchline.streams.base import ArrowFunction, Watermark, lowest_watermark
from batchline.streams.handover import ArrowHandover
from batchline.streams.nodes import WatermarkRuntime

__all__ = ["StatefulNode", "StatefulRuntime"]

logger = logging.getLogger(__name__)

class StatefulNode(StreamNode):
    """``flat_map_groups_with_state`` / ``map_groups_with_state`` as described by the user."""

    ordered_batches = True
    shuffles_input = True
    materializes = True

    def __init__(
        self,
        parent: StreamNode,
        key_names: tuple[str, ...],
        fn: Callable[..., Any],
        *,
        flat: bool,
        state_schema: Any,
        output_schema: Any,
        timeout: GroupStateTimeout,
        name: str,
        num_partitions: int | None,
        initial_state: DataFrame | None,
        at_end: AtEnd | str = AtEnd.KEEP,
    ) -> None:
        super().__init__([parent])
        self.at_end = choose(AtEnd, at_end, "at_end")
        if not isinstance(timeout, GroupStateTimeout):
            raise ConfigurationError(f"timeout must be a GroupStateTimeout; got {timeout!r}")
        if num_partitions is not None and num_partitions < 1:
            raise ConfigurationError(f"num_partitions must be at least 1; got {num_partitions}")
        self.key_names = key_names
        self.fn = fn
        self.flat = flat
        self.state_schema = RowSchema.of(state_schema)
        self.output_schema = RowSchema.of(output_schema)
        self.timeout = timeout
        self.name = name
        self.requested_partitions = num_partitions
        self.initial_state = initial_state
        self.event_time: Watermark | None = parent.watermark()
        self.watermark_source: Watermark | None = self.event_time
        """The ``with_watermark`` upstream (its very object): operators that share one share its
        event time, as Spark's one watermark per query."""
        found = parent.watermark_nodes()
        self.union_watermarks: tuple[StreamNode, ...] = found if found is not None and len(found) > 1 else ()
        """The ``with_watermark``s upstream when the rows come through more than one (a union of
        streams with their own): each one's newest event time is measured where it is defined,
        and the operator's watermark is the lowest of theirs (``lowest_watermark``). Empty
        otherwise: the watermark is ``event_time``'s, from the newest event time of the rows."""
        if timeout is GroupStateTimeout.EVENT_TIME and self.event_time is None:
            raise ConfigurationError(
                "event-time timeouts need a watermark: call stream.with_watermark(column, delay) before grouping"
            )

    def checkpoint_claim(self) -> tuple[str, str]:
        return (STATE_DIR, self.name)

    def watermark_nodes(self) -> tuple[StreamNode, ...] | None:
        """Downstream of an operator, event time is the operator's own (a window's end, a
        join's rows): no ``with_watermark`` upstream measures it."""
        return None if self.watermark() is not None else ()

    @property
    def late_column(self) -> str | None:
        """As in Spark, a state function's rows are dropped as late only under event-time timeouts."""
        if self.timeout is GroupStateTimeout.EVENT_TIME and self.event_time is not None:
            return self.event_time.column
        return None

    rows_column: str | None = None
    """See ``OperatorSpec.rows_column``: a state function's input rows count one each."""
    input_column: str | None = None
    """See ``OperatorSpec.input_column``: set by an operator that reads several inputs."""
    input_watermarks: tuple[Watermark | None, ...] = ()
    """For an operator that reads several inputs (a join), each input's watermark: the
    operator's is the lowest among the inputs whose event time has been seen (Spark's global
    watermark); ``event_time`` then names the column that holds each row's own event time."""

    @property
    def rows_node(self) -> StreamNode:
        """The stream whose rows the operator takes in, as they came (before any partials)."""
        return self.parents[0]

    @property
    def drops_late_rows(self) -> bool:
        """Whether rows behind the watermark are dropped (and so have a stream, ``late_rows``)."""
        return self.late_column is not None and self.event_time is not None

    def late_rows(self, rows: DataFrame) -> DataFrame:
        """``rows`` (of ``rows_node``) as the late stream shows them, with the column
        ``LATE_AT``: the epoch ms at or before which the watermark makes each row late. Only
        for an operator that ``drops_late_rows``."""
        assert self.event_time is not None
        return rows.withColumn(LATE_AT, F.unix_millis(F.col(self.event_time.column).cast("timestamp")))

    resolved = True
    """Whether the state and output schemas are known (a built-in operator learns them from
    its input's schema, in ``resolve``)."""

    def resolve(self, input_schema: StructType) -> None:
        """Called with the input's schema before the first batch is built; a built-in operator
        whose state and output follow from its input's columns derives them here."""

    def check_stored_state(self, stored: StructType) -> None:
        """The state schema reads the stored state (SPEC D5): fields added since need defaults."""
        self.state_schema.check_compatible(stored, f"operator {self.name!r}")

    @property
    def times_out_at_end(self) -> bool:
        """Whether every key with a timeout times out once the inputs have ended: event time
        reaches its end (the watermark passes every deadline); processing-time deadlines fire
        only with ``AtEnd.TIME_OUT`` (by default the state is kept for a later run)."""
        return self.timeout is GroupStateTimeout.EVENT_TIME or (
            self.timeout is GroupStateTimeout.PROCESSING_TIME and self.at_end is AtEnd.TIME_OUT)

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> StreamRuntime:
        return StatefulRuntime(self, env, parents)


class StatefulRuntime(StreamRuntime):
    """The operator's run: its stored metadata, the version to build on, its part of each batch."""

    node: StatefulNode

    def __init__(self, node: StatefulNode, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> None:
        super().__init__(node, env, parents)
        self.name = node.name
        # StreamGraph.validate refuses a stateful operator without a checkpoint location.
        assert env.checkpoint is not None, f"stateful operator {node.name!r} runs without a checkpoint location"
        self._checkpoint = env.checkpoint
        self._files: StateStore = FileStateStore(env.checkpoint.storage, node.name)
        self.metadata: StateMetadata | None = None
        self.prev_version: int | None = None
        self._recent_versions: deque[int] = deque(maxlen=RECENT_VERSIONS)
        """The versions this driver committed, newest last (``BatchParams.recent_versions``)."""
        self.max_event_time_ms: int | None = None
        self.input_max_event_time_ms: dict[int, int] = {}
        """Per input, for an operator that reads several (``StatefulNode.input_watermarks``)."""
        self._sources: tuple[WatermarkRuntime, ...] = ()
        if node.union_watermarks and not node.input_watermarks:
            self._sources = _runtimes_of(node.union_watermarks, parents)
            for source in self._sources:
                source.measure()
        self.source_max_event_time_ms: dict[int, int] | None = {} if self._sources else None
        """Per ``StatefulNode.union_watermarks`` (by index), the newest event time seen there;
        None for other operators, or as restored from a checkpoint written before it was kept."""
        self.last_rows_at: int | None = None
        """The time of the newest batch that brought the operator rows (for the idle timeout)."""
        self._batches: dict[int, OperatorBatch] = {}
        """The operator's part of each batch it is concerned with: the one thing kept per batch."""
        self._facts: dict[int, PartitionFacts] | None = None
        """What each partition holds after the last committed batch (its earliest timer above
        all); None when unknown (a restart from an older checkpoint, an initial state not yet
        called): the next batch then runs every partition."""
        self._facts_generation: int | None = None
        """The state generation the restored facts were recorded under."""
        self._behind: dict[int, int | None] = {}
        """Per partition whose newest version is older than ``prev_version`` (it sat batches out): that version."""
        self._commits = 0
        self._drained: set[int] = set()
        """Partitions finished for good: the inputs ended and they hold no timeout that may fire."""
        self._finished_after: int | None = None
        self._shuffle: StateShuffle | None = None
        """How rows go to the state partitions: built once the partition count is known."""
        self._in_output_job = InOutputJob(self) if node.node_id in env.read_by_one_output else None
        """Only one output reads the operator, directly: the batch runs inside that output's job
        (one Spark job fewer, and no pass over the persisted output), completed by a finish job."""
        self._handover: ArrowHandover | None = None
        """How the batch's rows reach its output's function in the state tasks (``map_in_arrow``)."""
        self._cache_rows = node.node_id not in env.read_in_one_pass
        """Whether a batch's rows out are cached: unless its only output reads them in one pass.
        A second pass runs the tasks again, which read back their partitions' recorded output:
        the cache saves time, not correctness."""

    # ---------------------------------------------------------------- batches
    def batch(self, batch_time: int) -> OperatorBatch | None:
        """The operator's part of the batch, if the batch concerns it (still)."""
        return self._batches.get(batch_time)

    def _part_of(self, batch_time: int) -> OperatorBatch:
        """The operator's part of the batch, made when the batch first concerns it."""
        return self._batches.setdefault(batch_time, OperatorBatch(batch_time))

    # ---------------------------------------------------------------- lifecycle
    def open(self) -> None:
        """Check the stored state against this operator, or set it up (with its initial state)."""
        node, url = self.node, self._checkpoint.storage.url
        self.metadata = self._files.read_metadata()
        if self.metadata is None:
            if node.initial_state is not None:
                self._write_initial_state(node.initial_state)  # its keys are called in the first batch
            else:
                self._facts = {}  # no state at all: no timer anywhere
            return
        stored = self.metadata
        if node.requested_partitions is not None and node.requested_partitions != stored.num_partitions:
            raise ConfigurationError(
                f"operator {self.name!r} keeps its state in {stored.num_partitions} partitions at "
                f"{url}, but num_partitions={node.requested_partitions} was given; the count is "
                f"fixed in the checkpoint. Run `batchline state rescale {url} --operator "
                f"{self.name} --partitions {node.requested_partitions}` while the pipeline is stopped, or drop "
                "the argument"
            )
        if stored.timeout != node.timeout.name:
            logger.info("Operator %s changes its timeout kind from %s to %s", self.name, stored.timeout,
                        node.timeout.name)
        self._check_stored_schema()
        if node.initial_state is not None:
            logger.info("Operator %s resumes its stored state; the initial state is not applied again", self.name)

    def _check_stored_schema(self) -> None:
        """The state schema can read the stored state (once known: see ``StatefulNode.resolve``)."""
        if self.metadata is not None and self.node.resolved:
            self.node.check_stored_state(self.metadata.state_schema)

    @property
    def num_partitions(self) -> int:
        if self.metadata is not None:
            return self.metadata.num_partitions
        return self.node.requested_partitions or operator.DEFAULT_STATE_PARTITIONS

    def _check_stored_keys(self, key_schema: StructType) -> None:
        """The key columns are the stored state's (nullability may differ), or it raises."""
        if self.metadata is not None and self.metadata.key_schema.simpleString() != key_schema.simpleString():
            raise ConfigurationError(
                f"operator {self.name!r}: the key columns are now {key_schema.simpleString()}, but the stored "
                f"state is keyed by {self.metadata.key_schema.simpleString()}; keys cannot change type"
            )

    def _ensure_metadata(self, key_schema: StructType) -> StateMetadata:
        node = self.node
        if self.metadata is None:
            self.metadata = StateMetadata(self.name, self.num_partitions, 0, key_schema, node.state_schema.struct,
                                          node.timeout.name, node.state_schema.stored_defaults())
            self._files.write_metadata(self.metadata)
            return self.metadata
        self._check_stored_keys(key_schema)
        if (self.metadata.state_schema.simpleString() != node.state_schema.struct.simpleString()
                or self.metadata.state_defaults != node.state_schema.stored_defaults()):
            self.metadata = dataclasses.replace(self.metadata, state_schema=node.state_schema.struct,
                                                timeout=node.timeout.name,
                                                state_defaults=node.state_schema.stored_defaults())
            self._files.write_metadata(self.metadata)
        return self.metadata

    def _write_initial_state(self, df: DataFrame) -> None:
        node = self.node
        if self.zero_time is None:
            raise ContextStateError(f"operator {self.name!r} is opened before the pipeline started")
        missing = [c for c in (*node.key_names, *node.state_schema.names) if c not in df.columns]
        if missing:
            raise ConfigurationError(
                f"the initial state of operator {self.name!r} lacks column(s) {missing}; it needs the key "
                f"columns {list(node.key_names)} and the state fields {node.state_schema.names}"
            )
        key_schema = StructType([df.schema[k] for k in node.key_names])
        metadata = StateMetadata(self.name, self.num_partitions, 0, key_schema, node.state_schema.struct,
                                 node.timeout.name, node.state_schema.stored_defaults())
        count = write_state_frame(df, self._files, metadata, node.state_schema, self.zero_time, initial=True)
        self._files.write_metadata(metadata)  # last: until then, a restart writes the initial state again
        self.metadata = metadata
        logger.info("Operator %s starts from an initial state of %d keys", self.name, count)

    def restore_progress(self, progress: OperatorProgress) -> None:
        self.max_event_time_ms = progress.max_event_time_ms
        self.input_max_event_time_ms = dict(progress.input_max_event_time_ms)
        sources = progress.source_max_event_time_ms
        self.source_max_event_time_ms = None if sources is None else dict(sources)
        self.last_rows_at = progress.last_rows_at
        self._drained = set(progress.finished_partitions)
        self._finished_after = progress.finished_after
        facts = progress.partitions
        self._facts = None if facts is None else {p: PartitionFacts.from_json(f) for p, f in facts.items()}
        self._facts_generation = progress.partitions_generation

    def progress(self) -> OperatorProgress:
        facts: dict[int, Any] | None = None
        generation: int | None = None
        if self._facts is not None and self.metadata is not None:
            # The timers a restarted driver must know, so that it skips idle batches from the
            # first; under the generation they hold for (a rescale or write_state makes a new one).
            facts = {p: f.to_json() for p, f in sorted(self._facts.items())}
            generation = self.metadata.generation
        return OperatorProgress(
            max_event_time_ms=self.max_event_time_ms,
            finished_partitions=tuple(sorted(self._drained)),
            finished_after=self._finished_after if self._drained else None,
            partitions=facts,
            partitions_generation=generation,
            input_max_event_time_ms=dict(self.input_max_event_time_ms),
            last_rows_at=self.last_rows_at,
            source_max_event_time_ms=None if self.source_max_event_time_ms is None
            else dict(self.source_max_event_time_ms),
        )

    # ---------------------------------------------------------------- finishing (SPEC G2)
    def partitions(self) -> int:
        return self.num_partitions

    def finished_partitions(self) -> frozenset[int]:
        return frozenset(self._drained)

    def finished_after(self) -> int | None:
        return self._finished_after

    def _drain(self, batch_time: int, stats: Stats) -> None:
        """After a batch that ran with every input ended: partitions holding no timeout that
        may still fire are finished; once all are, so is the operator."""
        keeps_timers = self.node.times_out_at_end
        done = {p for p in range(self.num_partitions) if not (keeps_timers and stats.timers >> p & 1)}
        newly = sorted(done - self._drained)
        self._drained |= done
        if newly:
            logger.info("Operator %s: partitions %s finished in batch %s (inputs ended, no timeout left); %d of %d "
                        "still run", self.name, newly, format_batch_time(batch_time),
                        self.num_partitions - len(self._drained), self.num_partitions)
        if len(self._drained) == self.num_partitions and self._finished_after is None:
            self._finished_after = batch_time
            logger.info("Operator %s finished in batch %s: its inputs ended and every partition drained", self.name,
                        format_batch_time(batch_time))

    def after_jobs(self, batch_time: int) -> None:
        """The batch's jobs succeeded: what its partitions reported becomes the driver's view,
        before the commit records it (a failed attempt's reports never count)."""
        batch = self.batch(batch_time)
        if batch is None:
            return
        pending, facts = batch.take_facts()
        if pending:
            self._facts = facts
            self._facts_generation = self.metadata.generation if self.metadata is not None else None

    def on_batch_committed(self, batch_time: int) -> None:
        batch = self.batch(batch_time)
        ran = batch.committed() if batch is not None else None
        if ran is None:
            return
        for p in range(self.num_partitions):
            if p in ran:
                self._behind.pop(p, None)
            elif p not in self._behind:
                self._behind[p] = self.prev_version  # sat the batch out: still at its version
        self.prev_version = batch_time
        self._recent_versions.append(batch_time)
        self._commits += 1
        if self._commits % operator.PURGE_EVERY == 0:
            threading.Thread(target=self._purge, name=f"batchline-state-purge-{self.name}", daemon=True).start()

    def _purge(self) -> None:
        """Delete state files older than the retained versions, off the batch's path."""
        if self.metadata is not None:
            purge_old_versions(self._files, self.metadata, self.prev_version)

    # ---------------------------------------------------------------- batches
    def compute(self, batch_time: int) -> DataFrame:
        node = self.node
        if not node.resolved:
            schema = self.parent_frame(batch_time).schema
            node.resolve(schema)
            # The keys first: a built-in operator's state follows from its input's columns, so a
            # column moved into the key changes its state too, but what changed is the key.
            if all(k in schema.fieldNames() for k in node.key_names):
                self._check_stored_keys(StructType([schema[k] for k in node.key_names]))
            self._check_stored_schema()
        if self.finished_before(batch_time) or not self.has_rows(batch_time):
            return self.env.empty_frame(node.output_schema.struct)
        df = self.parent_frame(batch_time)
        columns = df.schema  # one round trip to the JVM for the batch's columns
        missing = [k for k in node.key_names if k not in columns.fieldNames()]
        if missing:
            raise ConfigurationError(
                f"operator {self.name!r}: key column(s) {missing} are not in {columns.fieldNames()}")
        metadata = self._ensure_metadata(StructType([columns[k] for k in node.key_names]))
        spec = OperatorSpec(
            store=self._files, generation=metadata.generation, key_names=node.key_names,
            key_schema=metadata.key_schema, state=node.state_schema, output=node.output_schema, fn=node.fn,
            flat=node.flat, timeout=node.timeout, event_time_column=node.event_time.column if node.event_time else None,
            journal=self._checkpoint.events, late_column=node.late_column, rows_column=node.rows_column,
            input_column=node.input_column,
        )
        task, stats = operator_task(self.env.spark.sparkContext, spec, batch_time)
        batch = self._part_of(batch_time)
        batch.stats = stats
        n = metadata.num_partitions
        kept = batch.kept
        if kept:
            # A re-run batch shuffles only the rows of the partitions it re-runs.
            df = df.where(~placement(node.key_names, n).isin(*sorted(kept)))
        if self._shuffle is None or self._shuffle.num_partitions != n:
            self._shuffle = StateShuffle(self.env.spark, node.key_names, n)
        shuffled = self._shuffle(df, columns)  # a filter keeps the columns
        rows = shuffled.mapInArrow(task, node.output_schema.struct)
        if self._cache_rows:
            return rows.persist(StorageLevel.MEMORY_AND_DISK)
        batch.tasks = (shuffled, task)
        return rows

    def map_in_arrow(self, batch_time: int, df: DataFrame, fn: ArrowFunction, schema: Any) -> DataFrame:
        """``fn`` in the state tasks, on the rows they return, when ``df`` is the batch's rows
        and its only output reads them in one pass: one Python worker a task, where
        ``df.mapInArrow`` would hand the rows to the JVM and back to a second one."""
        batch = self.batch(batch_time)
        handed = self.generated(batch_time)
        if batch is None or batch.tasks is None or df is not handed:
            return df.mapInArrow(fn, schema)
        shuffled, task = batch.tasks
        if self._handover is None:
            self._handover = ArrowHandover.of(self.env.spark, self.node.output_schema.struct)
        return shuffled.mapInArrow(_then(task, self._handover, fn), schema)

    def release(self, batch_time: int, df: DataFrame) -> None:
        if df.is_cached:
            df.unpersist()
        batch = self.batch(batch_time)
        if batch is not None:
            batch.tasks = None
            if batch.stats is not None:
                forget_accumulator(batch.stats)
                batch.stats = None

    def clear_metadata(self, batch_time: int) -> None:
        super().clear_metadata(batch_time)
        # A batch's part goes with its DataFrame; a skipped batch stays known as one for as long
        # as a window downstream may read it.
        for t in [t for t in self._batches if t <= batch_time - self.remember_ms]:
            del self._batches[t]

    def has_rows(self, batch_time: int) -> bool:
        """False for a batch this operator skipped: no row came and no timer was due."""
        batch = self.batch(batch_time)
        return batch is None or not batch.skipped

    def _newest_per_source(self) -> dict[int, int]:
        """``source_max_event_time_ms``, for an operator with several ``with_watermark``s upstream."""
        if self.source_max_event_time_ms is None:
            # Restored from a checkpoint that kept only the newest event time of all the rows,
            # whose watermark took the first source's delay: each source is taken to have seen
            # what gives that same watermark, so that it neither falls back (and lets rows in to
            # windows already closed and emitted) nor jumps.
            newest, event_time = self.max_event_time_ms, self.node.event_time
            delays = [source.node.watermark().delay_ms for source in self._sources]
            self.source_max_event_time_ms = {} if newest is None or event_time is None else {
                i: newest - event_time.delay_ms + delay for i, delay in enumerate(delays)}
        return self.source_max_event_time_ms

    def watermark_ms(self, batch_time: int) -> int | None:
        event_time = self.node.event_time
        if self._sources:
            watermarks = [source.node.watermark() for source in self._sources]
            return lowest_watermark(watermarks, self._newest_per_source(), batch_time, self.last_rows_at)
        if self.node.input_watermarks:
            seen = [w.at(self.input_max_event_time_ms[i], batch_time, self.last_rows_at)
                    for i, w in enumerate(self.node.input_watermarks)
                    if w is not None and i in self.input_max_event_time_ms]
            return min(seen) if seen else None
        newest = self.newest_event_time_ms(batch_time)
        if event_time is None or newest is None:
            return None
        return event_time.at(newest, batch_time, self.last_rows_at)

    def newest_event_time_ms(self, before: int) -> int | None:
        """The newest event time in the batches before ``before`` of the rows of this
        operator's ``with_watermark``: those that reached it, and those an operator upstream
        under the same ``with_watermark`` saw (a deduplication's dropped rows move the watermark
        of an aggregation after it, as Spark's one watermark does)."""
        batch = self.batch(before)
        newest = batch.newest_before if batch is not None and batch.counted_event_times else self.max_event_time_ms
        for upstream in self._sharing_watermark():
            theirs = upstream.newest_event_time_ms(before)
            if theirs is not None and (newest is None or theirs > newest):
                newest = theirs
        return newest

    def _sharing_watermark(self) -> list[StatefulRuntime]:
        """The nearest stateful operators upstream under the same ``with_watermark``."""
        source = self.node.watermark_source
        found: list[StatefulRuntime] = []
        if source is None:
            return found
        pending = list(self.parents)
        while pending:
            runtime = pending.pop()
            if isinstance(runtime, StatefulRuntime):
                if runtime.node.watermark_source is source and not runtime.node.input_watermarks:
                    found.append(runtime)
                continue
            pending.extend(runtime.parents)
        return found

    def prepare_job(self, batch_time: int) -> Job | None:
        if self.node.node_id not in self.env.consumed or not self.is_time_valid(batch_time):
            return None
        watermark = self.watermark_ms(batch_time)
        if not self._awaiting_commit() and self._partitions_to_run(
                batch_time, self.parents[0].finished_before(batch_time), watermark) == frozenset():
            # Every earlier batch is committed, so the driver's view of the timers is current:
            # nothing is due and no row comes. The batch builds no DataFrame and runs no job.
            self._skip(batch_time, watermark)
            return None
        df = self.get_or_compute(batch_time)
        if df is None:
            return None
        self._part_of(batch_time).awaiting_commit = True
        return Job(batch_time, self.name, lambda: self._run(batch_time, df), JobKind.STATE)

    def _awaiting_commit(self) -> bool:
        """Whether a batch whose job was generated has not committed yet."""
        return any(batch.awaiting_commit for batch in tuple(self._batches.values()))

    def _skip(self, batch_time: int, watermark_ms: int | None) -> None:
        batch = self._part_of(batch_time)
        batch.skipped = True
        batch.progress = operator_progress(self.name, self._known_totals(), watermark_ms, 0, len(self._drained))
        logger.debug("Operator %s skips batch %s: no row and no timer due", self.name, format_batch_time(batch_time))

    def _run(self, batch_time: int, df: DataFrame) -> None:
        started = self._start(batch_time, df)
        if started is None:
            return
        if self._in_output_job is not None:
            # The output's job evaluates the DataFrame under the parameters just published to
            # this thread; the operator's finish job completes the batch after it.
            self._in_output_job.started(self._part_of(batch_time), started)
            return
        self.complete(batch_time, df, started)

    def finish_job(self, batch_time: int) -> Job | None:
        return None if self._in_output_job is None else self._in_output_job.finish_job(batch_time)

    def explain_failure(self, batch_time: int, error: BaseException) -> BaseException | None:
        return None if self._in_output_job is None else self._in_output_job.explain_failure(batch_time, error)

    def _start(self, batch_time: int, df: DataFrame) -> Started | None:
        """Decide what the batch runs and publish its parameters to this thread's jobs; None
        when it runs nothing (skipped, or the operator has finished)."""
        batch = self._part_of(batch_time)
        batch.started = None  # an earlier attempt's decision does not hold
        # Inputs ended before this batch: it brings no rows, only the timeouts that fire at the end.
        ending = self.parents[0].finished_before(batch_time)
        fire = ending and self.node.times_out_at_end
        watermark = END_OF_TIME_MS if fire and self.node.event_time is not None else self.watermark_ms(batch_time)
        params = BatchParams(batch_time=batch_time, prev_version=self.prev_version,
                             token=self._checkpoint.lease.token or 0, watermark_ms=watermark,
                             keep_finished=not batch.rerun_whole, end_of_input=fire,
                             finished_partitions=tuple(sorted(self._drained)), behind=dict(self._behind),
                             left_out=tuple(sorted(batch.kept)), recent_versions=tuple(self._recent_versions))
        if self.finished_before(batch_time):
            # Drained in an earlier batch, which ended after this one's job was built: publish
            # parameters under which every task does nothing, for outputs that still read it.
            publish_batch_params(self.env.spark.sparkContext, self.name, dataclasses.replace(params, skip=True))
            return None
        due = self._partitions_to_run(batch_time, ending, watermark)
        if due is not None and not due:
            self._skip(batch_time, watermark)
            # Frames downstream were built on this batch's DataFrame when it was generated (a
            # union with another input): under these parameters its tasks give nothing. Windows
            # built later read the empty frame that replaces it.
            publish_batch_params(self.env.spark.sparkContext, self.name, dataclasses.replace(params, skip=True))
            with self._lock:
                self._generated[batch_time] = self.env.empty_frame(self.node.output_schema.struct)
            if df.is_cached:
                df.unpersist()
            return None
        running = frozenset(range(self.num_partitions)) if due is None else due
        if due is not None:
            params = dataclasses.replace(params, idle_partitions=tuple(
                p for p in range(self.num_partitions) if p not in due and p not in self._drained))
            logger.debug("Operator %s runs only partitions %s in batch %s: their timers are due", self.name,
                         sorted(due), format_batch_time(batch_time))
        recorded = None
        if self.metadata is not None:
            events, record = self._checkpoint.events, OperatorInitialized(
                self.name, self.metadata.num_partitions, self.metadata.generation)
            if events.storage.creates_whole:
                # Beside the job, which needs nothing of it: on S3, a round trip off its path.
                recorded = beside_store(lambda: events.operator_initialized(batch_time, record))
            else:
                # Before the job: its tasks' finish records would follow a record a crash tore,
                # which a restart takes for a damaged disk (``JobEventStore``'s torn records).
                events.operator_initialized(batch_time, record)
        publish_batch_params(self.env.spark.sparkContext, self.name, params)
        return Started(params, running, ending, watermark, recorded)

    def complete(self, batch_time: int, df: DataFrame, started: Started) -> None:
        """Run what no job ran yet, then take on what the tasks reported."""
        batch = self._part_of(batch_time)
        stats = self.reported(batch_time, started.params) if self._in_output_job is not None else None
        if stats is None or not self.all_reported(stats):
            # The operator's own job; or, after its output's job, the partitions that job did not
            # evaluate (it had committed the batch before a crash and wrote nothing, or read only
            # some rows): the DataFrame is persisted, so what it evaluated does not run again.
            run_batch_job(self.env.spark.sparkContext, self.name, started.params, df)
            stats = self.reported(batch_time, started.params)
        if started.recorded is not None:
            started.recorded.result()
        running, ending, watermark = started.running, started.ending, started.watermark_ms
        for note in dict.fromkeys(stats.warnings):  # a partition evaluated by two jobs says it twice
            logger.warning("Operator %s, batch %d: %s", self.name, batch_time, note)
        if not batch.counted_event_times:
            batch.counted_event_times, batch.newest_before = True, self.max_event_time_ms
        if stats.max_event_time_ms is not None:
            self.max_event_time_ms = max(self.max_event_time_ms or stats.max_event_time_ms, stats.max_event_time_ms)
        for i, newest in stats.input_max_event_time_ms.items():
            self.input_max_event_time_ms[i] = max(self.input_max_event_time_ms.get(i, newest), newest)
        if self._sources:
            known = self._newest_per_source()
            for i, source in enumerate(self._sources):
                seen = source.newest_through(batch_time)
                if seen is not None:
                    known[i] = max(known.get(i, seen), seen)
        if stats.rows:
            self.last_rows_at = max(self.last_rows_at or batch_time, batch_time)
        facts = self._facts_after(running, stats)
        batch.took_on(stats, running - self._drained, facts)
        if ending:
            self._drain(batch_time, stats)
        totals = stats if facts is None else dataclasses.replace(
            stats, state_keys=sum(f.keys for f in facts.values()),
            state_bytes=sum(f.state_bytes for f in facts.values()))
        batch.progress = operator_progress(self.name, totals, watermark, len(batch.kept), len(self._drained),
                                           batch.rerun_note)
        if stats.late_rows:
            logger.info("Operator %s dropped %d late rows in batch %d (watermark %s)", self.name, stats.late_rows,
                        batch_time, watermark)

    def reported(self, batch_time: int, params: BatchParams) -> Stats:
        """What the batch's tasks reported, completed from the partitions' finish records: a
        task that finished its partition inside the output's job and then failed in the
        output's own part (a write that failed) reports nothing, and a retry of the batch may read
        the partition's cached rows without running it again. Partitions that sat the batch
        out, or had drained, did nothing to report."""
        accumulator = self._part_of(batch_time).stats
        if accumulator is None:
            raise ContextStateError(f"operator {self.name!r} ran batch {batch_time} before building its DataFrame; "
                                    "this is a bug in batchline, please report it")
        stats = tasks_reported(accumulator)
        generation = self.metadata.generation if self.metadata is not None else 0
        for p in range(self.num_partitions):
            if stats.partitions >> p & 1:
                continue
            if p in params.idle_partitions or p in params.finished_partitions:
                stats = stats.merge(Stats(partitions=1 << p))
            elif (record := self._checkpoint.events.finished(batch_time, self.name, generation, p)) is not None:
                stats = stats.merge(Stats.from_json(record.stats))
        return stats

    def all_reported(self, stats: Stats) -> bool:
        return stats.partitions == (1 << self.num_partitions) - 1

    def _partitions_to_run(self, batch_time: int, ending: bool, watermark_ms: int | None) -> frozenset[int] | None:
        """Which partitions the batch must run: None for all (rows came, or the driver does
        not know every partition's timers, or the batch is special: the inputs' end, a re-run
        after a crash); else those whose earliest timer is due, as ``_call_function`` fires
        them (``last_due``). Empty: skip the batch."""
        batch = self.batch(batch_time)
        if (self._facts is None or ending or self.parents[0].has_rows(batch_time)
                or (batch is not None and (batch.kept or batch.rerun_whole))):
            return None
        if self.metadata is not None and self._facts_generation not in (None, self.metadata.generation):
            return None  # the state was rescaled or rewritten offline since: its timers are not known
        last = last_due(self.node.timeout, batch_time, watermark_ms, False)
        if last is None:
            return frozenset()
        return frozenset(p for p, f in self._facts.items()
                         if f.next_timer_ms is not None and f.next_timer_ms <= last and p not in self._drained)

    def _facts_after(self, ran: frozenset[int], stats: Stats) -> dict[int, PartitionFacts] | None:
        """The driver's view once the batch is committed: the partitions that ran as they
        reported; the others as they were (a drained partition reports nothing and fires nothing)."""
        if any(p not in stats.partitions_after for p in ran - self._drained):
            return None  # a kept partition's finish record without its facts (see checkpoint.migrations): learn again
        facts = {p: f for p, f in (self._facts or {}).items() if p not in ran}
        facts.update(stats.partitions_after)
        return facts

    def _known_totals(self) -> Stats:
        """A skipped batch's statistics: nothing done, the state as the last batch left it."""
        facts = (self._facts or {}).values()
        return Stats(state_keys=sum(f.keys for f in facts), state_bytes=sum(f.state_bytes for f in facts))

    def recover_batch(self, batch_time: int, unreplayable: Sequence[str]) -> None:
        """Say which partitions keep the work they recorded as finished before the crash; when
        an input cannot replay (``unreplayable``) none does, and their records are deleted."""
        batch = self._part_of(batch_time)
        batch.rerun_note = operator.rerun_note(frozenset(), (), unreplayable)
        if self.metadata is None:
            return
        events, generation, partitions = self._checkpoint.events, self.metadata.generation, self.metadata.num_partitions
        if unreplayable:
            events.forget_finished(batch_time, self.name, generation, partitions)
            batch.rerun_whole = True
            return
        kept = [p for p in range(partitions) if events.finished(batch_time, self.name, generation, p) is not None
                and self._keepable(batch_time, generation, p)]
        if kept:
            batch.kept = frozenset(kept)
            batch.rerun_note = operator.rerun_note(batch.kept, [
                p for p in range(partitions) if p not in batch.kept and p not in self._drained], ())
            logger.info("Batch %s: keeping %d of %d finished partitions of operator %r; re-running %d",
                        format_batch_time(batch_time), len(kept), partitions, self.name, partitions - len(kept))
            logger.info("Batch %s: the rows of the kept partitions %s of operator %r are left out of its shuffle",
                        format_batch_time(batch_time), kept, self.name)

    def _keepable(self, batch_time: int, generation: int, partition: int) -> bool:
        """Whether a partition that recorded its finish of the batch can keep it: its rows will be
        left out of the shuffle, so its delta and its output must both read back whole (checksum
        and all), or the rows would be lost. One that cannot runs again whole: its finish record
        is deleted, so no task of the re-run takes what it left for finished, and the re-run
        writes its delta and output over the ones there (a version is written whole or rewritten,
        and loading the version before it never reads them: nothing is applied twice)."""
        for kind in (DELTA, OUTPUT):
            problem = self._files.read_problem(generation, partition, batch_time, kind)
            if problem is not None:
                where, why = problem
                logger.warning("Batch %s: partition %d of operator %r recorded its finish before the restart, but "
                               "its %s %s cannot be read back: %s. It runs again whole, its rows shuffled to it",
                               format_batch_time(batch_time), partition, self.name, kind.value, where, why)
                self._checkpoint.events.forget_partition_finished(batch_time, self.name, generation, partition)
                return False
        return True

    def operator_progress(self, batch_time: int) -> StateOperatorProgress | None:
        batch = self.batch(batch_time)
        return batch.progress if batch is not None else None

    def verify(self, batch_time: int) -> None:
        """Every state partition ran: a partition that did not would lose its keys' batch."""
        batch = self.batch(batch_time)
        if batch is None or batch.ran is None or batch.reported is None:
            return
        stats = batch.reported
        if not self.all_reported(stats):
            batch.ran = None
            ran = [p for p in range(self.num_partitions) if stats.partitions >> p & 1]
            missing = sorted(set(range(self.num_partitions)) - set(ran))
            if self.metadata is not None:
                # After a restart the batch runs again, and no partition keeps what it recorded.
                self._checkpoint.events.forget_finished(batch_time, self.name, self.metadata.generation,
                                                        self.num_partitions)
            raise ConfigurationError(
                f"operator {self.name!r} has {self.num_partitions} state partitions, but its tasks ran partitions "
                f"{ran} (missing {missing}): state partitions must keep their identity. Something changed the "
                "operator's shuffle: adaptive execution must stay off while the pipeline runs (batchline turns it "
                "off at start; check that nothing turns it on again)"
            )


def _then(task: StateTask, handover: ArrowHandover, fn: ArrowFunction) -> ArrowFunction:
    """The state task, then ``fn`` on the rows it returns, in the same Python worker. The
    partition's finish record is written while ``fn`` works (a sink staging its file: on an
    object store, two round trips side by side); the task ends once it is written."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        endings: list[PartitionEnd] = []
        try:
            yield from fn(handover.batches(task.run(batches, endings)))
        except BaseException:
            for end in endings:
                end.settle()
            raise
        for end in endings:
            end.complete()
    return run


def _runtimes_of(nodes: tuple[StreamNode, ...], parents: Sequence[StreamRuntime]) -> tuple[WatermarkRuntime, ...]:
    """The runtimes of ``nodes`` (``with_watermark``s), in their order, found upstream of ``parents``."""
    found: dict[int, WatermarkRuntime] = {}
    seen: set[int] = set()
    stack = list(parents)
    while stack:
        runtime = stack.pop()
        if runtime.node.node_id in seen:
            continue
        seen.add(runtime.node.node_id)
        if isinstance(runtime, WatermarkRuntime):
            found[runtime.node.node_id] = runtime
        else:
            stack.extend(runtime.parents)
    return tuple(found[node.node_id] for node in nodes)
