"""The stateful operator on the driver: ``flat_map_groups_with_state`` (SPEC D1–D5, D8).

Each batch the operator shuffles its input into ``num_partitions`` state partitions with
``repartition(n, keys)`` (a shuffle by number, which adaptive execution never coalesces;
the task count is checked every batch) and runs the state function in ``mapInArrow``. Its
job caches the output, so outputs that read it never run the function twice, and collects
the batch's statistics. Values that depend on the previous batch (the version to build on,
the watermark) reach the tasks as Spark local properties of the job, because the batch's
DataFrame is built before the previous batch has finished.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel, TaskContext
from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from batchline.api.stream import Stream
from batchline.errors import ConfigurationError
from batchline.scheduler.job import Job
from batchline.state.execution import ERROR_END, ERROR_START, StateFunctionError, Stats, TaskSpec, run_partition
from batchline.state.frames import write_state_frame
from batchline.state.group_state import GroupStateTimeout
from batchline.state.schema import RowSchema
from batchline.state.store import StateFiles, StateMetadata

if TYPE_CHECKING:
    from batchline.api.stream import KeyedStream
    from batchline.checkpoint.manager import CheckpointManager

__all__ = ["StatefulStream", "StateOperatorProgress", "DEFAULT_STATE_PARTITIONS"]

logger = logging.getLogger(__name__)

DEFAULT_STATE_PARTITIONS = 8
RETAINED_VERSIONS = 20
"""Versions of each partition kept loadable (for the reader and for restarts)."""
PURGE_EVERY = 10
_RUNTIME_PROPERTY = "batchline.state.runtime"
_ERROR = re.compile(re.escape(ERROR_START) + "(.*?)" + re.escape(ERROR_END), re.S)


@dataclass(frozen=True)
class StateOperatorProgress:
    """What a stateful operator did in one batch."""

    operator: str
    input_rows: int
    late_rows: int
    keys_called: int
    updated: int
    removed: int
    timed_out: int
    output_rows: int
    state_keys: int
    watermark_ms: int | None


class _StatsParam(AccumulatorParam):  # type: ignore[type-arg]
    def zero(self, value: Stats) -> Stats:
        return Stats()

    def addInPlace(self, a: Stats, b: Stats) -> Stats:  # noqa: N802 - Spark's name
        return a.merge(b)


class StatefulStream(Stream):
    def __init__(
        self,
        keyed: KeyedStream,
        fn: Callable[..., Any],
        *,
        flat: bool,
        state_schema: Any,
        output_schema: Any,
        timeout: GroupStateTimeout,
        name: str | None,
        num_partitions: int | None,
        initial_state: DataFrame | None,
    ) -> None:
        parent = keyed.stream
        super().__init__(parent.env, [parent])
        if not all(isinstance(k, str) for k in keyed.keys):
            raise ConfigurationError(
                "a stateful operator groups by column names; add computed keys with with_column first"
            )
        if not isinstance(timeout, GroupStateTimeout):
            raise ConfigurationError(f"timeout must be a GroupStateTimeout; got {timeout!r}")
        self.key_names: tuple[str, ...] = tuple(keyed.keys)  # type: ignore[arg-type]
        self.fn = fn
        self.flat = flat
        self.state_schema = RowSchema.of(state_schema)
        self.output_schema = RowSchema.of(output_schema)
        self.timeout = timeout
        self.requested_partitions = num_partitions
        if num_partitions is not None and num_partitions < 1:
            raise ConfigurationError(f"num_partitions must be at least 1; got {num_partitions}")
        self.initial_state = initial_state
        self.watermark = _find_watermark(parent)
        if timeout is GroupStateTimeout.EVENT_TIME and self.watermark is None:
            raise ConfigurationError(
                "event-time timeouts need a watermark: call stream.with_watermark(column, delay) before grouping"
            )
        self.name = self.env.graph.add_stateful(self, name or ("flat_map_groups_with_state" if flat
                                                               else "map_groups_with_state"))
        self.metadata: StateMetadata | None = None
        self._manager: CheckpointManager | None = None
        self._files: StateFiles | None = None
        self.prev_version: int | None = None
        self.max_event_time_ms: int | None = None
        self._stats: dict[int, Any] = {}
        self._ran: set[int] = set()
        self._commits = 0

    # ---------------------------------------------------------------- lifecycle
    def open(self, manager: CheckpointManager, zero_time: int) -> None:
        """Check the stored state against this operator, or set it up (with its initial state)."""
        self._manager = manager
        self._files = StateFiles(manager.storage, self.name)
        self.metadata = self._files.read_metadata()
        if self.metadata is None:
            if self.initial_state is not None:
                self._write_initial_state(zero_time)
            return
        stored = self.metadata
        if self.requested_partitions is not None and self.requested_partitions != stored.num_partitions:
            raise ConfigurationError(
                f"operator {self.name!r} keeps its state in {stored.num_partitions} partitions at "
                f"{manager.storage.url}, but num_partitions={self.requested_partitions} was given; the count is "
                f"fixed in the checkpoint. Run `batchline state rescale {manager.storage.url} --operator "
                f"{self.name} --partitions {self.requested_partitions}` while the pipeline is stopped, or drop "
                "the argument"
            )
        if stored.timeout != self.timeout.name:
            logger.info("Operator %s changes its timeout kind from %s to %s", self.name, stored.timeout,
                        self.timeout.name)
        self.state_schema.check_compatible(stored.state_schema, f"operator {self.name!r}")
        if self.initial_state is not None:
            logger.info("Operator %s resumes its stored state; the initial state is not applied again", self.name)

    @property
    def num_partitions(self) -> int:
        if self.metadata is not None:
            return self.metadata.num_partitions
        return self.requested_partitions or DEFAULT_STATE_PARTITIONS

    def _ensure_metadata(self, key_schema: StructType) -> StateMetadata:
        if self.metadata is None:
            assert self._files is not None
            self.metadata = StateMetadata(self.name, self.num_partitions, 0, key_schema, self.state_schema.struct,
                                          self.timeout.name)
            self._files.write_metadata(self.metadata)
        elif self.metadata.key_schema.simpleString() != key_schema.simpleString():  # nullability may differ
            raise ConfigurationError(
                f"operator {self.name!r}: the key columns are now {key_schema.simpleString()}, but the stored "
                f"state is keyed by {self.metadata.key_schema.simpleString()}; keys cannot change type"
            )
        elif self.metadata.state_schema.simpleString() != self.state_schema.struct.simpleString():
            self.metadata = dataclasses.replace(self.metadata, state_schema=self.state_schema.struct,
                                                timeout=self.timeout.name)
            self._files.write_metadata(self.metadata)  # type: ignore[union-attr]
        return self.metadata

    def _write_initial_state(self, zero_time: int) -> None:
        assert self.initial_state is not None and self._files is not None
        df = self.initial_state
        missing = [c for c in (*self.key_names, *self.state_schema.names) if c not in df.columns]
        if missing:
            raise ConfigurationError(
                f"the initial state of operator {self.name!r} lacks column(s) {missing}; it needs the key "
                f"columns {list(self.key_names)} and the state fields {self.state_schema.names}"
            )
        key_schema = StructType([df.schema[k] for k in self.key_names])
        metadata = StateMetadata(self.name, self.num_partitions, 0, key_schema, self.state_schema.struct,
                                 self.timeout.name)
        count = write_state_frame(df, self._files, metadata, self.state_schema, zero_time, initial=True)
        self._files.write_metadata(metadata)  # last: until then, a restart writes the initial state again
        self.metadata = metadata
        logger.info("Operator %s starts from an initial state of %d keys", self.name, count)

    def restore_progress(self, progress: dict[str, Any]) -> None:
        self.max_event_time_ms = progress.get("max_event_time_ms")

    def progress_json(self) -> dict[str, Any]:
        return {"max_event_time_ms": self.max_event_time_ms}

    def on_batch_committed(self, batch_time: int) -> None:
        if batch_time in self._ran:
            self._ran.discard(batch_time)
            self.prev_version = batch_time
            self._commits += 1
            if self._commits % PURGE_EVERY == 0:
                threading.Thread(target=self._purge, name=f"batchline-state-purge-{self.name}", daemon=True).start()

    def _purge(self) -> None:
        """Delete state files older than the retained versions, off the batch's path."""
        assert self._files is not None and self.metadata is not None
        try:
            removed = sum(self._files.purge(self.metadata.generation, p, RETAINED_VERSIONS)
                          for p in range(self.metadata.num_partitions))
            if removed:
                logger.info("Operator %s: removed %d state files older than its %d retained versions", self.name,
                            removed, RETAINED_VERSIONS)
        except Exception:
            logger.exception("Purging old state files of operator %s failed; retrying after later batches",
                             self.name)

    # ---------------------------------------------------------------- batches
    def _compute(self, batch_time: int) -> DataFrame:
        if self._manager is None:
            raise ConfigurationError(
                f"operator {self.name!r} keeps its state at the checkpoint location; create the "
                "StreamingContext with checkpoint=<path or URL>"
            )
        df = self.parents[0].get_or_compute(batch_time)
        assert df is not None
        missing = [k for k in self.key_names if k not in df.columns]
        if missing:
            raise ConfigurationError(f"operator {self.name!r}: key column(s) {missing} are not in {df.columns}")
        metadata = self._ensure_metadata(StructType([df.schema[k] for k in self.key_names]))
        stats = self.env.spark.sparkContext.accumulator(Stats(), _StatsParam())
        self._stats[batch_time] = stats
        assert self._files is not None
        template = TaskSpec(
            files=self._files, generation=metadata.generation, key_names=self.key_names, key_schema=metadata.key_schema,
            state=self.state_schema, output=self.output_schema, fn=self.fn, flat=self.flat, timeout=self.timeout,
            batch_time=batch_time, prev_version=None, token=0, watermark_ms=None,
            event_time_column=self.watermark[0] if self.watermark else None, stats=stats,
        )

        def task(batches: Any) -> Any:
            context = TaskContext.get()
            runtime = json.loads(context.getLocalProperty(_RUNTIME_PROPERTY) or "{}").get(template.operator, {})
            spec = TaskSpec(**{**template.__dict__, **runtime})
            return run_partition(spec, batches, context.partitionId())

        out = df.repartition(metadata.num_partitions, *self.key_names).mapInArrow(task, self.output_schema.struct)
        return out.persist(StorageLevel.MEMORY_AND_DISK)

    def _release(self, batch_time: int, df: DataFrame) -> None:
        df.unpersist()
        self._stats.pop(batch_time, None)

    def watermark_ms(self) -> int | None:
        if self.watermark is None or self.max_event_time_ms is None:
            return None
        return self.max_event_time_ms - self.watermark[1]

    def job(self, batch_time: int) -> Job | None:
        df = self.get_or_compute(batch_time)
        if df is None:
            return None
        return Job(batch_time, f"state:{self.name}", lambda: self._run(batch_time, df))

    def _run(self, batch_time: int, df: DataFrame) -> None:
        assert self._manager is not None
        watermark = self.watermark_ms()
        runtime = {"prev_version": self.prev_version, "token": self._manager.lease.token or 0,
                   "watermark_ms": watermark}
        spark_context = self.env.spark.sparkContext
        current = json.loads(spark_context.getLocalProperty(_RUNTIME_PROPERTY) or "{}")
        current[self.name] = runtime
        spark_context.setLocalProperty(_RUNTIME_PROPERTY, json.dumps(current))
        try:
            df.count()
        except Exception as error:
            match = _ERROR.search(str(error))
            if match is None:
                raise
            raise StateFunctionError(match.group(1).strip()) from None
        stats: Stats = self._stats[batch_time].value
        if stats.partitions != (1 << self.num_partitions) - 1:
            raise ConfigurationError(
                f"operator {self.name!r} ran {bin(stats.partitions).count('1')} of its {self.num_partitions} state "
                "partitions; something (adaptive execution?) changed the shuffle, and state partitions must keep "
                "their identity"
            )
        if stats.max_event_time_ms is not None:
            self.max_event_time_ms = max(self.max_event_time_ms or stats.max_event_time_ms, stats.max_event_time_ms)
        self._ran.add(batch_time)
        self.env.input_info.report_operator(batch_time, StateOperatorProgress(
            self.name, stats.rows, stats.late_rows, stats.keys_called, stats.updated, stats.removed,
            stats.timed_out, stats.output_rows, stats.state_keys, watermark))
        if stats.late_rows:
            logger.info("Operator %s dropped %d late rows in batch %d (watermark %s)", self.name, stats.late_rows,
                        batch_time, watermark)


def _find_watermark(stream: Stream) -> tuple[str, int] | None:
    """The nearest ``with_watermark`` upstream: (event-time column, delay ms)."""
    watermark = getattr(stream, "watermark", None)
    if watermark is not None:
        return watermark  # type: ignore[no-any-return]
    for parent in stream.parents:
        found = _find_watermark(parent)
        if found is not None:
            return found
    return None

