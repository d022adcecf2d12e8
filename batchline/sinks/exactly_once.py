"""An exactly-once sink in the usual shape: the tasks stage, the driver commits once per batch.

Modelled on Spark's ``DataSourceStreamWriter`` (``pyspark.sql.datasource``): every Spark task
writes its partition's rows and returns a small message; once every task of the batch
succeeded, the driver gets all of the messages in one call of ``commit``, or of ``abort``.
What Spark's writer does not hand over and an exactly-once sink needs is given here: the
batch time (the same every time the batch runs), the output's name and the fencing token of
this driver's checkpoint lease. A sink of this shape writes four methods::

    class MySink(ExactlyOnceSink):
        def is_committed(self, batch):                      # driver: was this batch committed before?
            ...
        def write_partition(self, rows, attempt, partition):  # a task: stage the rows, return a message
            ...
        def commit(self, messages, attempt):                # driver: the batch visible, in one step
            ...
        def abort(self, messages, attempt):                 # driver, optional: drop what was staged
            ...

The engine side is written once, here (``write``):

Step 1: ``is_committed(batch)`` on the driver. True: the batch was committed before (a batch
        runs again after a crash, with the same rows); it is skipped and nothing is computed.
        On ``batch.first_attempt`` no writer tried the batch before: a sink whose commit
        refuses to commit a batch twice may answer False without looking.
Step 2: ``prepare(df, attempt)`` on the driver (optional): what every task of this attempt
        needs (a staging table), handed to them as ``attempt.prepared``.
Step 3: the tasks run ``write_partition`` over their partitions' rows, through
        ``batch.map_in_arrow`` (one pass over an input written as read); the driver collects
        their messages, in partition order. A task that failed fails the batch: ``abort``
        runs, and the engine runs the batch again as its ``RetryPolicy`` allows.
Step 4: no task returned a message (no rows): ``abort``, and nothing is committed.
Step 5: ``commit(messages, attempt)``, once every job of the batch succeeded (the engine takes
        the returned ``PendingCommit`` in batch order; in a pipeline without stateful
        operators while the next batch's tasks run), or before ``write`` returns for a sink
        with ``commit_after_jobs = False``.

What makes it exactly once is the sink's part of the contract:

- ``commit`` makes the batch visible and records it as committed in one atomic step (a
  commit record created exclusively, one database transaction with a progress row), so that
  ``is_committed`` is true from then on and never before. It checks again inside that step:
  another driver may have committed the batch meanwhile, and a sink that can see other
  drivers' commits refuses a ``fencing_token`` older than the newest it recorded
  (``FencedError``). A commit that fails fails the batch; it runs again from Step 1.
- A commit of several steps (a record, then files moved into place) is completed by
  ``is_committed``: when it finds the record, it finishes what a crash left undone, then
  answers True.
- ``write_partition`` may run more than once for a partition (a task retry, an attempt that
  never commits): it stages under names of its own (``attempt.id`` and ``partition``) where
  no reader looks, and what it stages becomes visible only through ``commit``.
- The sink is pickled into every task: keep what does not pickle (connections, threads) out
  of its attributes, or leave it out in ``__getstate__``.
"""

from __future__ import annotations

import logging
import pickle
import threading
import uuid
from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any, ClassVar, Generic, TypeVar

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import from_arrow_schema

from batchline.sinks.sink import ArrowFunction, BatchContext, PendingCommit, Sink

__all__ = ["ExactlyOnceSink", "WriteAttempt"]

logger = logging.getLogger(__name__)

Message = TypeVar("Message")

_MESSAGES = pa.schema([("partition", pa.int32()), ("message", pa.binary())])
_MESSAGES_TYPE = from_arrow_schema(_MESSAGES)
"""``_MESSAGES`` as a Spark type, for the tasks' ``mapInArrow`` (a type, not DDL: no parse in the JVM every batch)."""
_NOTE_LOCK = threading.Lock()
"""Guards ``note_committed`` (a batch's commit and the next batch's skip may come from two
threads); a lock of the module's, so that a sink holds none and pickles as it is."""


@dataclass(frozen=True)
class WriteAttempt:
    """One attempt at writing a batch: what the driver and every task of it share (pickled
    into the tasks)."""

    batch: BatchContext
    """The batch: its time, the output's name, the pipeline and the fencing token."""
    id: str
    """16 hex digits, new for every attempt: name what the attempt stages by it."""
    prepared: Any = None
    """What ``prepare`` returned for this attempt (None without ``prepare``)."""

    @property
    def batch_time(self) -> int:
        """The batch's time in ms: the same every time the batch runs."""
        return int(self.batch.batch_time)


class ExactlyOnceSink(Sink, Generic[Message]):
    """A sink whose tasks stage their partitions and whose driver commits each batch once
    (see the module's documentation for the contract)."""

    commit_after_jobs: ClassVar[bool] = True
    """Whether ``commit`` waits until every job of the batch succeeded (``write`` returns it as
    a ``PendingCommit``), or runs before ``write`` returns (another output of the batch may
    then still fail; the batch's re-run finds it committed)."""

    evaluates_once = True  # Step 3 is the one pass; ``prepare`` looks at the columns only

    _newest_commit: int | None = None

    # ---------------------------------------------------------------- what a sink writes
    @abstractmethod
    def is_committed(self, batch: BatchContext) -> bool:
        """On the driver, before anything of the batch runs: whether this output committed
        ``batch.batch_time`` before (in this run or an earlier one). Complete a commit of
        several steps that a crash interrupted before answering True; call
        ``note_committed`` to have ``last_commit`` name the batch."""

    def prepare(self, df: DataFrame, attempt: WriteAttempt) -> Any:
        """On the driver, before the tasks: what they need (a staging table's name, how to
        encode the rows); it reaches them, ``commit`` and ``abort`` as ``attempt.prepared``.
        Check the batch's columns here and raise ``ConfigurationError`` with what to change."""
        return None

    @abstractmethod
    def write_partition(self, rows: Iterator[pa.RecordBatch], attempt: WriteAttempt,
                        partition: int) -> Message | None:
        """In a Spark task: stage one partition's rows (Arrow record batches of the stream's
        schema, none of them empty, at least one) where no reader looks, and return a small
        picklable message for ``commit`` (what was staged: file names, row counts); None
        when nothing was staged. It may run more than once for a partition."""

    @abstractmethod
    def commit(self, messages: list[Message], attempt: WriteAttempt) -> None:
        """On the driver, once per attempt whose tasks all succeeded, with their messages in
        partition order: make the batch visible and record it committed, in one atomic step
        (see the module's documentation). Raise to fail the batch."""

    def abort(self, messages: list[Message], attempt: WriteAttempt) -> None:  # noqa: B027 (optional hook)
        """On the driver, instead of ``commit``: a task failed, no task staged anything, or
        another part of the batch failed. Let go of what the attempt staged (the messages of
        the tasks that reported, and what ``prepare`` made). Errors are logged, not raised."""

    def write_failed(self, error: Exception, attempt: WriteAttempt) -> Exception:
        """What the batch fails with when its tasks failed (``abort`` has run): ``error`` as it
        is, unless the sink says what it means for its destination and what to do."""
        return error

    # ---------------------------------------------------------------- what the engine calls
    def write(self, df: DataFrame, batch: BatchContext) -> PendingCommit | None:
        """Steps 1 to 4, and Step 5 as the returned commit (or taken here, see
        ``commit_after_jobs``)."""
        # Step 1
        if self.is_committed(batch):
            logger.info("Output %s: batch %s was committed before; not writing it again", batch.output,
                        batch.batch_time)
            return None
        # Step 2
        attempt = WriteAttempt(batch, uuid.uuid4().hex[:16])
        attempt = replace(attempt, prepared=self.prepare(df, attempt))
        # Step 3
        try:
            found = batch.map_in_arrow(df, _partition_task(self, attempt), _MESSAGES_TYPE).collect()
        except BaseException as error:
            self._abort_logged([], attempt)
            if isinstance(error, Exception):
                explained = self.write_failed(error, attempt)
                if explained is not error:
                    raise explained from error
            raise
        messages: list[Message] = [pickle.loads(row["message"])
                                   for row in sorted(found, key=lambda row: row["partition"])]
        # Step 4
        if not messages:
            self._abort_logged(messages, attempt)
            return None
        # Step 5
        pending = _BatchCommit(self, messages, attempt)
        if self.commit_after_jobs:
            return pending
        pending.commit()
        return None

    def note_committed(self, batch_time: int) -> None:
        """Remember ``batch_time`` as committed, for ``last_commit`` (the engine calls it after
        every commit; ``is_committed`` may, for a batch it found committed)."""
        with _NOTE_LOCK:
            newest = self._newest_commit
            self._newest_commit = batch_time if newest is None else max(newest, batch_time)

    @property
    def newest_commit(self) -> int | None:
        """The newest batch time this sink committed or found committed in this run."""
        return self._newest_commit

    def last_commit(self) -> dict[str, Any] | None:
        return {"batch_time": self._newest_commit}

    def _abort_logged(self, messages: list[Message], attempt: WriteAttempt) -> None:
        try:
            self.abort(messages, attempt)
        except Exception as error:  # noqa: BLE001 (an attempt that is not committed is never visible)
            logger.warning("Output %s: letting go of what batch %s staged failed (%s); it is never visible, and a "
                           "later run may clean it up", attempt.batch.output, attempt.batch.batch_time, error)


@dataclass(frozen=True)
class _BatchCommit(PendingCommit, Generic[Message]):
    """Step 5 of an attempt whose tasks all staged their rows."""

    sink: ExactlyOnceSink[Message]
    messages: list[Message]
    attempt: WriteAttempt

    def commit(self) -> None:
        self.sink.commit(self.messages, self.attempt)
        self.sink.note_committed(self.attempt.batch_time)

    def abandon(self) -> None:
        self.sink._abort_logged(self.messages, self.attempt)  # noqa: SLF001 (its own sink's step)


# ------------------------------------------------------------------------------ in the tasks
def _partition_task(sink: ExactlyOnceSink[Any], attempt: WriteAttempt) -> ArrowFunction:
    """The function each Spark task runs: its partition's rows to ``write_partition`` (not
    called for an empty partition), its message pickled into one row."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        rows = (batch for batch in batches if batch.num_rows)
        first = next(rows, None)
        if first is None:
            return
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        message = sink.write_partition(chain([first], rows), attempt, partition)
        if message is not None:
            yield pa.RecordBatch.from_pylist([{"partition": partition, "message": pickle.dumps(message)}],
                                             schema=_MESSAGES)

    return write
