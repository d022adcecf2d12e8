"""The Sink interface: where every batch of a stream goes (SPEC C2).

A sink is handed each batch's DataFrame with a :class:`BatchContext`: the batch time, the
output's name, the pipeline and the fencing token of the driver's checkpoint lease. The
engine may hand it the same batch more than once (a batch re-runs after a crash or a failed
job, with the same rows), so ``write`` must be idempotent per (pipeline, output, batch time):
the built-in sinks keep a commit record per batch and skip a batch already committed. A sink
that keeps its commits where another driver could write too (a database) refuses a batch
whose fencing token is older than the newest it has recorded: that driver lost its lease.

Write your own in one file::

    class MySink(batchline.Sink):
        def open(self, context):            # once per run, on the driver: check the destination
            ...
        def write(self, df, batch):         # every batch: idempotent per batch.batch_time
            ...
        def last_commit(self):              # the newest batch committed, for the final checkpoint
            ...

    stream.write(MySink(), name="mine")

A sink whose tasks stage their partitions and whose driver then commits the batch (files
moved into place, a database transaction) need not write the protocol itself: subclass
:class:`batchline.ExactlyOnceSink` (``batchline.sinks.exactly_once``) and write what to stage,
how to commit and how to know a batch is committed; ``write_files`` and ``write_postgres``
are built on it.

``write`` runs on the driver and may start Spark jobs (``df.mapInArrow``, ``df.foreachPartition``,
``df.collect``); code that runs in tasks gets the sink pickled, so open connections there.
Start them from the thread ``write`` was called on, before it returns: a stateful operator
that only this output reads runs inside the output's job, and its tasks find the batch's
parameters among that thread's Spark local properties (a thread of your own must be a
``pyspark.InheritableThread``).

A sink whose commit is a step on the driver after its Spark jobs (moving what the tasks
staged into place, in one transaction) returns that step from ``write`` as a
:class:`PendingCommit` instead of taking it before it returns. The engine calls its
``commit`` once all of the batch's jobs succeeded, in batch order; in a pipeline without
stateful operators the next batch's jobs run meanwhile, so the commit costs no time of its
own. ``commit`` starts no Spark job.

A sink that writes Arrow batches from its tasks should call ``batch.map_in_arrow(df, fn,
schema)`` rather than ``df.mapInArrow(fn, schema)``: when the output writes an input as read
(``ssc.input(source).write(sink)``), ``fn`` then runs in the tasks that read the source, one
Python pass per split instead of a read, a trip through Spark's JVM and a second pass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pyspark.sql import DataFrame

from batchline.batch_time import BatchTime
from batchline.scheduler.job import PendingCommit

__all__ = ["Sink", "SinkContext", "BatchContext", "ForeachBatchSink", "PendingCommit", "NO_FENCING_TOKEN",
           "ArrowFunction"]

ArrowFunction = Callable[[Iterator[Any]], Iterator[Any]]
"""A ``mapInArrow`` function: one partition's ``pyarrow.RecordBatch``es in, batches out."""

NO_FENCING_TOKEN = 0
"""The token of a pipeline without a checkpoint location (no lease): older than any lease's."""


@dataclass(frozen=True)
class SinkContext:
    """What a sink learns when the pipeline starts."""

    pipeline: str
    """The pipeline's identity: its checkpoint location's URL ("batchline" without one). A
    sink that records commits keys them by pipeline and output."""
    output: str
    """The output's name, unique in the pipeline (``name=``)."""


@dataclass(frozen=True)
class BatchContext:
    """One batch as a sink sees it."""

    batch_time: BatchTime
    """The batch's stable id (epoch ms): the same every time the batch runs."""
    output: str
    pipeline: str
    fencing_token: int
    """The token of the checkpoint lease this driver holds (``NO_FENCING_TOKEN`` without a
    checkpoint): it grows with every driver that takes the location over, so a commit with a
    token older than one already recorded comes from a driver that lost its lease."""
    arrow_mapper: Callable[[DataFrame, ArrowFunction, Any], DataFrame] | None = field(
        default=None, repr=False, compare=False)
    """How this batch's stream runs ``map_in_arrow`` (set by the engine; None: plain ``mapInArrow``).
    It holds the engine's runtime, so it stays on the driver: a pickled context (in a task's
    closure) has none."""
    first_attempt: bool = False
    """No write of this batch to this output was tried before, by this driver or an earlier one:
    the driver logged the batch itself, at a checkpoint location that creates its log records
    exclusively, and this is its first call of ``write``. A sink may then skip looking for what
    an earlier attempt committed or left (a round trip each on an object store), as long as its
    commit still refuses to commit a batch twice. False whenever the engine cannot be sure (a
    restart's re-run, a retry, a call from ``foreach_batch`` code)."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "arrow_mapper": None}

    def map_in_arrow(self, df: DataFrame, fn: ArrowFunction, schema: Any) -> DataFrame:
        """``df.mapInArrow(fn, schema)``, in one pass where it can be: when ``df`` is an input's
        batch as read (the output writes the input itself, which nothing else reads), ``fn``
        gets each split's rows in the task that reads them; when it is a stateful operator's
        rows and this sink ``evaluates_once``, in the state task that makes them. Either way
        ``fn`` gets Arrow batches of the stream's schema (as Spark would cut and type them) and
        is called once per partition, as ``mapInArrow`` calls it. Let ``fn`` read all of its
        input: the tasks then count the input's records, which otherwise takes one more read of
        the batch. In a state task, ``fn`` runs while the partition's finish record is written:
        a task that fails after ``fn`` ran may run the state function again, so write what
        ``fn`` writes under its attempt's name and make it visible in ``commit``, as
        ``ExactlyOnceSink`` does."""
        if self.arrow_mapper is None:
            return df.mapInArrow(fn, schema)
        return self.arrow_mapper(df, fn, schema)


class Sink(ABC):
    """Where a stream's batches go: ``stream.write(sink)``."""

    reads_all_rows: ClassVar[bool] = True
    """Whether ``write`` reads every row of the DataFrame. An input's counts come from the
    first job that does; a sink that reads only some (``console``'s ``show``) says False."""

    evaluates_once: ClassVar[bool] = False
    """Whether ``write`` evaluates the DataFrame in one pass (one Spark job, each partition
    read once). A stateful operator that only such a sink reads hands its rows straight to
    the write; otherwise Spark caches them, so that a second pass does not run the operator
    again (it would be correct, reading back each partition's recorded output, but slower)."""

    needs_checkpoint: ClassVar[bool] = True
    """Whether the pipeline must have a checkpoint location to write here. Without one, every
    run starts from the beginning of its inputs and writes again what an earlier run wrote
    (and the sink's commit records cannot tell the runs apart), so ``start()`` refuses an
    output whose sink writes outside the process. False only for sinks whose output lives and
    dies with the process (``console``) or whose idempotence is the user's (``foreach_batch``)."""

    def open(self, context: SinkContext) -> None:  # noqa: B027 (optional hook)
        """Called once per run on the driver, before any batch: connect, check the destination
        (a table's columns), clean up what a crashed run left. Raise ``ConfigurationError``
        with what to change when the destination does not fit."""

    @abstractmethod
    def write(self, df: DataFrame, batch: BatchContext) -> PendingCommit | None:
        """Write one batch, idempotently per ``batch.batch_time``; raise to fail the batch
        (it is retried with the same rows, see ``RetryPolicy``). Return None when the batch
        is written by the time ``write`` returns, or the commit still to take (see above)."""

    def last_commit(self) -> dict[str, Any] | None:
        """The newest batch this sink committed (JSON), kept in a finished pipeline's final
        checkpoint (SPEC G3); None when it keeps no commits of its own."""
        return None

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Called once when the pipeline stops."""


class ForeachBatchSink(Sink):
    """``fn(df, batch_time)`` for every batch: the user's code decides what idempotent means.

    ``batch_time`` is the same every time a batch runs, across restarts too, only with a
    checkpoint location: without one, a new run starts from the beginning of its inputs with
    new batch times, so a function that writes outside the process should be used with
    ``StreamingContext(..., checkpoint=...)`` and key what it writes by ``batch_time``."""

    needs_checkpoint = False  # the function decides where it writes; see above

    def __init__(self, fn: Callable[[DataFrame, BatchTime], Any]) -> None:
        self.fn = fn

    def write(self, df: DataFrame, batch: BatchContext) -> None:
        self.fn(df, batch.batch_time)
