"""The two halves of every stream (SPEC A5, C1).

A ``StreamNode`` describes a stream: configuration only, with stable names.
``create_runtime`` turns it into a ``StreamRuntime`` that does the work of one run, so
building a pipeline touches no storage and no Spark job.

Each batch time maps to one lazy DataFrame. A runtime remembers the DataFrames it generated
for as long as a downstream window needs them; ``clear_metadata`` releases the rest after
every batch. The lifecycle hooks are no-ops here; a runtime overrides those it takes part in.
"""

from __future__ import annotations

import itertools
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from batchline.checkpoint.manager import CheckpointManager
from batchline.checkpoint.model import OperatorProgress
from batchline.clock import Clock
from batchline.scheduler.input_info import InputInfoTracker
from batchline.scheduler.job import Job
from batchline.scheduler.progress import StateOperatorProgress
from batchline.scheduler.receiver_tracker import ReceiverTracker
from batchline.sinks.sink import ArrowFunction

__all__ = ["ArrowFunction", "Readers", "RuntimeEnv", "StreamNode", "StreamRuntime", "Watermark", "lowest_watermark"]

logger = logging.getLogger(__name__)

_node_ids = itertools.count()



@dataclass(frozen=True)
class Readers:
    """Who reads a node's rows in a batch's jobs (``StreamGraph.readers``)."""

    jobs: int
    """How many of the batch's jobs read them."""
    first_reads_all: bool
    """Whether the first of those jobs reads every row (not a ``console`` output's ``show``)."""


@dataclass(frozen=True)
class RuntimeEnv:
    """What every runtime of one run shares."""

    spark: SparkSession
    clock: Clock
    batch_interval_ms: int
    input_info: InputInfoTracker
    receiver_tracker: ReceiverTracker
    checkpoint: CheckpointManager | None
    """The checkpoint location (taken under its lease), or None for a pipeline without one."""
    consumed: frozenset[int]
    """Ids of the nodes some output reads from."""
    readers: Mapping[int, Readers] = field(default_factory=dict)
    """Per input node id: who reads its rows."""
    read_by_one_output: frozenset[int] = frozenset()
    """Ids of the nodes only one output operation reads, directly (``StreamGraph.read_by_one_output``)."""
    read_in_one_pass: frozenset[int] = frozenset()
    """Of those, the ones whose output reads them in one pass (``StreamGraph.read_in_one_pass``)."""

    def empty_frame(self, schema: StructType) -> DataFrame:
        """No rows, over no partitions: a batch without input runs no task for it. (An empty
        list would be parallelized into a Python task per core: in an idle pipeline's batch
        that fires a timer, forking those workers took a second of a 1 s interval.)"""
        return self.spark.createDataFrame(self.spark.sparkContext.emptyRDD(), schema)


@dataclass(frozen=True)
class Watermark:
    """Event time is read from ``column``; rows older than the newest seen minus ``delay_ms`` are late."""

    column: str
    delay_ms: int
    idle_timeout_ms: int | None = None
    """After this much processing time without a row, event time is taken to go on with the
    clock (Flink's source idleness): the watermark then moves on by the time idle since the
    last batch with rows, so that the last windows of a quiet stream close."""

    def after(self, max_event_time_ms: int) -> int:
        """The watermark once ``max_event_time_ms`` was seen: minus the delay, never below 0 (as Spark's)."""
        return max(0, max_event_time_ms - self.delay_ms)

    def at(self, max_event_time_ms: int, batch_time: int, last_rows_at: int | None) -> int:
        """The watermark of the batch at ``batch_time``, the newest batch with rows having been
        ``last_rows_at``: ``after(max_event_time_ms)``, moved on by the time idle once that
        passes the idle timeout."""
        idle = 0 if last_rows_at is None else batch_time - last_rows_at
        if self.idle_timeout_ms is None or idle < self.idle_timeout_ms:
            return self.after(max_event_time_ms)
        return self.after(max_event_time_ms + idle)


def lowest_watermark(watermarks: Sequence[Watermark], newest: Mapping[int, int], batch_time: int,
                     last_rows_at: int | None) -> int | None:
    """The watermark of a stream whose rows came through several ``with_watermark``s (a union):
    as Spark's global watermark under its default policy ("min"), the lowest of theirs, each
    from the newest event time seen at it (``newest``, by index into ``watermarks``); 0 until
    every one has seen some, None while none has."""
    if not newest:
        return None
    if any(i not in newest for i in range(len(watermarks))):
        return 0
    return min(w.at(newest[i], batch_time, last_rows_at) for i, w in enumerate(watermarks))


class StreamNode(ABC):
    """A stream in a pipeline's description: its parents and what it computes from them."""

    ordered_batches = False
    """True when each batch builds on the previous one, so batches may not run concurrently."""
    shuffles_input = False
    """True when each of its partitions reads every partition of its parents (a shuffle: an
    all-to-all edge for the trigger set); otherwise partition i reads its parents' partition i."""
    materializes = False
    """True when a job of its own (``prepare_job``) reads every row of its input and keeps its
    output for the jobs after it (stateful operators), or, read by one output only, that
    output's job does: readers downstream do not read its parents again."""

    def __init__(self, parents: Sequence[StreamNode] = ()) -> None:
        self.parents: tuple[StreamNode, ...] = tuple(parents)
        self.node_id = next(_node_ids)

    @property
    def slide_ms(self) -> int:
        """How often this stream produces a DataFrame; inputs slide every batch interval."""
        return self.parents[0].slide_ms

    @abstractmethod
    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> StreamRuntime:
        """The object that runs this node for one run of the pipeline."""

    def watermark(self) -> Watermark | None:
        """The nearest watermark upstream, if any."""
        for parent in self.parents:
            found = parent.watermark()
            if found is not None:
                return found
        return None

    def watermark_nodes(self) -> tuple[StreamNode, ...] | None:
        """The ``with_watermark`` nodes this stream's rows came through, each once, in the
        order of the parents; None when some path's watermark is not a ``with_watermark``'s
        (a stateful operator's, whose event time is its own)."""
        found: list[StreamNode] = []
        for parent in self.parents:
            theirs = parent.watermark_nodes()
            if theirs is None:
                return None
            found.extend(node for node in theirs if all(node is not known for known in found))
        return tuple(found)

    def checkpoint_claim(self) -> tuple[str, str] | None:
        """(folder, name) of what this node keeps at the checkpoint location, if anything:
        an entry of that folder that no node of the pipeline claims is refused at start."""
        return None

    @property
    def bounded(self) -> bool:
        """Whether the stream ends: true when every input it reads from ends."""
        return all(parent.bounded for parent in self.parents)

    def ancestors(self) -> set[int]:
        """Ids of this node and every node it reads from."""
        seen = {self.node_id}
        for parent in self.parents:
            seen |= parent.ancestors()
        return seen

    def __repr__(self) -> str:
        return f"{type(self).__name__}#{self.node_id}"


class StreamRuntime(ABC):
    """A node's DataFrames, batch by batch, and its part in the run's lifecycle."""

    def __init__(self, node: StreamNode, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> None:
        self.node = node
        self.env = env
        self.parents = tuple(parents)
        self.zero_time: int | None = None
        self.remember_ms = 0
        self._generated: dict[int, DataFrame] = {}
        self._lock = threading.RLock()

    # ---------------------------------------------------------------- DataFrames per batch
    @abstractmethod
    def compute(self, batch_time: int) -> DataFrame:
        """Build (lazily) this node's DataFrame for a valid batch time."""

    def release(self, batch_time: int, df: DataFrame) -> None:
        """Free what a forgotten batch held (cached data, blocks); nothing by default."""
        return None

    def parent_remember_ms(self) -> int:
        return self.remember_ms

    def is_time_valid(self, batch_time: int) -> bool:
        if self.zero_time is None or batch_time <= self.zero_time:
            return False
        return (batch_time - self.zero_time) % self.node.slide_ms == 0

    def generated(self, batch_time: int) -> DataFrame | None:
        """The DataFrame generated for ``batch_time``, if it was. Read without the lock: the
        generator holds it while it builds the next batch's frames (tens of milliseconds of
        calls to the JVM), and the running batch must not wait for that to find its own."""
        return self._generated.get(batch_time)  # one dict lookup: atomic

    def get_or_compute(self, batch_time: int) -> DataFrame | None:
        """This node's DataFrame for ``batch_time``; None when the time is not on its slide."""
        done = self.generated(batch_time)
        if done is not None:
            return done
        with self._lock:
            if batch_time in self._generated:
                return self._generated[batch_time]
            if not self.is_time_valid(batch_time):
                return None
            df = self.compute(batch_time)
            self._generated[batch_time] = df
            return df

    def parent_frame(self, batch_time: int, index: int = 0) -> DataFrame:
        """A parent's DataFrame at a time on this node's slide (which is on every parent's)."""
        df = self.parents[index].get_or_compute(batch_time)
        if df is None:
            raise ValueError(f"{self.parents[index].node!r} has no batch at {batch_time}; it slides every "
                             f"{self.parents[index].node.slide_ms} ms")
        return df

    def initialize(self, zero_time: int) -> None:
        self.zero_time = zero_time

    def remember(self, duration_ms: int) -> None:
        """Keep generated DataFrames for at least ``duration_ms``; parents keep what we need."""
        if duration_ms > self.remember_ms:
            self.remember_ms = duration_ms
        for parent in self.parents:
            parent.remember(self.parent_remember_ms())

    def clear_metadata(self, batch_time: int) -> None:
        """Forget DataFrames generated at or before ``batch_time - remember``."""
        with self._lock:
            old = [t for t in self._generated if t <= batch_time - self.remember_ms]
            released = [(t, self._generated.pop(t)) for t in old]
        for t, df in released:
            self.release(t, df)
        if old:
            logger.debug("Cleared %d old batches of %r at %d", len(old), self.node, batch_time)

    def generated_times(self) -> list[int]:
        with self._lock:
            return sorted(self._generated)

    def has_rows(self, batch_time: int) -> bool:
        """Whether the batch may hold rows of this stream: False only when the driver knows it
        holds none (every input it reads took nothing, and no state timer is due). Outputs
        run no job for such a batch (SPEC E6: an idle pipeline's batches run no Spark job). Asked when
        the batch's jobs are generated and again when they run: a stateful operator whose
        previous batch was still running decides only as its own job runs."""
        return any(parent.has_rows(batch_time) for parent in self.parents)

    # ---------------------------------------------------------------- finishing (SPEC G1, G2)
    def finished_after(self) -> int | None:
        """The batch time after which this stream produces nothing and runs no work (None
        while it may still): a derived stream finishes with the last of its inputs."""
        times = [parent.finished_after() for parent in self.parents]
        if not times or any(t is None for t in times):
            return None
        return max(t for t in times if t is not None)

    def finished_before(self, batch_time: int) -> bool:
        """True when ``batch_time`` comes after this stream finished: it has nothing to do."""
        finished = self.finished_after()
        return finished is not None and batch_time > finished

    def finished_partitions(self) -> frozenset[int]:
        """Partitions done for good while the stream as a whole still runs (stateful operators
        drain partition by partition); the partition count is ``partitions()``."""
        return frozenset(range(self.partitions())) if self.finished_after() is not None else frozenset()

    def partitions(self) -> int:
        """How many partitions the trigger-set computation sees: one, except for streams that
        keep partition identity (stateful operators) and their per-partition children."""
        return self.parents[0].partitions() if self.parents else 1

    # ---------------------------------------------------------------- lifecycle
    def open(self) -> None:
        """Check what the checkpoint location holds for this node, or set it up; once per run,
        after a restart has restored the inputs."""
        return None

    def prepare_job(self, batch_time: int) -> Job | None:
        """A job that must run before the batch's outputs (run the state function, or decide
        and publish what the output's job runs of it)."""
        return None

    def finish_job(self, batch_time: int) -> Job | None:
        """A job that must run after the batch's outputs: complete work that ran inside an
        output's job (a stateful operator read by one output only)."""
        return None

    def map_in_arrow(self, batch_time: int, df: DataFrame, fn: ArrowFunction, schema: Any) -> DataFrame:
        """What ``BatchContext.map_in_arrow`` runs for an output of this stream:
        ``df.mapInArrow(fn, schema)`` here; an input whose batch ``df`` is exactly as read runs
        ``fn`` in the tasks that read it."""
        return df.mapInArrow(fn, schema)

    def explain_failure(self, batch_time: int, error: BaseException) -> BaseException | None:
        """What an output's failed job means when this stream's own work ran inside it (a state
        function that raised, a task of the operator that died): the error to raise instead (a
        ``FailedIn`` names the part that failed), or None to raise ``error`` as it is."""
        return None

    def after_jobs(self, batch_time: int) -> None:
        """Every job of the batch succeeded: report what they counted along the way (an input's
        records and dead letters, counted by the jobs that read them)."""
        return None

    def recover_batch(self, batch_time: int, unreplayable: Sequence[str]) -> None:
        """A restart runs ``batch_time`` again with its logged inputs: keep what it had finished
        durably, unless an input it read cannot replay (``unreplayable`` names them, SPEC F3)."""
        return None

    def verify(self, batch_time: int) -> None:
        """Raise when the batch's work is incomplete (a state partition that did not run)."""
        return None

    def operator_progress(self, batch_time: int) -> StateOperatorProgress | None:
        """What a stateful operator did in the batch, for its progress record; None for other nodes."""
        return None

    def progress(self) -> OperatorProgress | None:
        """Progress that must survive a restart (e.g. the newest event time), kept in each commit."""
        return None

    def restore_progress(self, progress: OperatorProgress) -> None:
        """Take back what ``progress`` returned as of the last committed batch."""
        return None

    def on_batch_committed(self, batch_time: int) -> None:
        """The batch is committed: move on (e.g. the state version the next batch builds on)."""
        return None
