"""The Source interface: an input a user can write in one file (SPEC B).

A source is read in batches. On the driver, ``plan`` decides what the next batch holds:
from the position where the last batch ended to a new one, cut into splits that Spark tasks
read in parallel. The plan (positions and splits, all JSON) goes to the batch log before any
job runs, so a restart gives a crashed batch exactly the same splits again. In the tasks,
``read`` turns one split into rows. After the batch committed, ``acknowledge`` may tell the
system it came from (errors there are logged, never fail the committed batch).

Positions are JSON objects of the source's choosing (a Redis entry id per stream, an offset
per partition, a file name). Nothing pickled goes into the checkpoint; the source object
itself is pickled into tasks, so open connections lazily where they are used.

The inputs batchline ships are ``Source``s too (files, generated events, a DataFrame, a
queue of DataFrames, the test list, the receivers). What some of them need beyond ``plan``
and ``read`` comes as optional hooks, each with a default that a plain source never needs
to change:

- ``plan_at``: a plan that depends on stream time (events at a rate);
- ``frame``: a batch Spark reads natively, with or without dead letters;
- ``SourceBatch.records``: a count known when planning, so no job counts the rows;
- ``counted = False``: rows nobody counts (a queue of the user's DataFrames);
- ``can_replay``: a source that cannot give a logged batch again (a queue);
- ``forget``: a batch no window needs any more (a queue lets its DataFrames go);
- ``attach``: the run's Spark session and checkpoint location (a DataFrame kept there);
- ``checkpoint_position``/``restore_position`` and ``log_batch``/``logged_batch``: how the
  position and each batch are written to the checkpoint and the batch log;
- ``start_receiving``/``stop_receiving``, ``has_unplanned`` and ``recover_received``: a
  source that is pushed records on the driver (a receiver) takes them in while the pipeline
  runs, a graceful stop waits until every record taken in is in a batch, and a restart takes
  back what it had written ahead.

A minimal source::

    class Numbers(batchline.Source):
        def schema(self):
            return StructType([StructField("n", LongType())])
        def initial_position(self):
            return {"next": 0}
        def plan(self, start, end_of_input):
            end = start["next"] + 100
            return SourceBatch(start, {"next": end}, splits=({"from": start["next"], "to": end},))
        def read(self, split):
            return ((n,) for n in range(split["from"], split["to"]))

    ssc.input(Numbers(), name="numbers")
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import Clock, SystemClock

__all__ = ["Source", "SourceBatch", "SourceRun", "BatchTimes", "DeadLetter", "Position", "Split"]

Position = Mapping[str, Any]
"""Where a source stands: a JSON object."""
Split = Mapping[str, Any]
"""What one Spark task reads: a JSON object."""


@dataclass(frozen=True)
class DeadLetter:
    """A record ``read`` could not turn into a row: it goes to the input's ``dead_letters``
    stream with its reason, and the batch goes on."""

    raw: str
    """The record as it came (JSON or text), to inspect or replay by hand."""
    reason: str
    """Why it was refused, for people: which field, what was found, what was expected."""


@dataclass(frozen=True)
class SourceBatch:
    """What a batch takes from a source: from ``start`` to ``end``, read as ``splits``."""

    start: Position
    end: Position
    splits: tuple[Split, ...] = ()
    """Each read by one Spark task, in order; none for an empty batch."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """Anything worth showing with the batch's input statistics (JSON), e.g. the entry ids read."""
    records: int | None = None
    """How many rows the batch holds, when the plan knows it (a range of generated events):
    shown at once, and no job counts the rows. None (the default): counted as they are read."""
    lag: int | None = None
    """How many records waited at the source beyond this batch when it was planned (a Kafka
    consumer's lag), shown in progress records, metrics and the dashboard; None: not known."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"start": dict(self.start), "end": dict(self.end),
                                "splits": [dict(s) for s in self.splits], "info": dict(self.info)}
        if self.records is not None:
            data["records"] = self.records
        if self.lag is not None:
            data["lag"] = self.lag
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SourceBatch:
        records, lag = data.get("records"), data.get("lag")
        return cls(dict(data["start"]), dict(data["end"]), tuple(dict(s) for s in data.get("splits", ())),
                   dict(data.get("info", {})), None if records is None else int(records),
                   None if lag is None else int(lag))


@dataclass(frozen=True)
class BatchTimes:
    """When a batch is planned: its time and the pipeline's zero time (ms of stream time;
    None before the pipeline started)."""

    batch_time_ms: int
    zero_time_ms: int | None


@dataclass(frozen=True)
class SourceRun:
    """What a source may use of the run it takes part in (``Source.attach``)."""

    name: str
    """The input's name in the pipeline (unique; the checkpoint finds the input by it)."""
    spark: SparkSession
    storage: CheckpointStorage | None
    """The checkpoint location, None for a pipeline without one."""
    clock: Clock = field(default_factory=SystemClock)
    """The pipeline's clock (a ``ManualClock`` in tests), for a source that acts on time of
    its own (a receiver cuts its blocks every block interval)."""


class Source(ABC):
    """An input of batches: plan on the driver, read in tasks, replay from the batch log.

    ``bounded`` sources end: ``end_of_input`` is asked once, when the pipeline first starts,
    kept in the checkpoint, and handed to every ``plan``; the input is finished once a batch
    ends there (``exhausted``).
    """

    bounded: bool = False
    counted: bool = True
    """False for a source whose rows the engine should not count (a queue of the user's
    DataFrames: counting would run their plans once more); its records show as unknown."""
    reads_fields_by_name: bool = False
    """True for a source that finds each column in its records by name (JSON and CSV files):
    a field the records spell otherwise is null in every row, not an error, so the engine
    counts each column's values in the job that counts the rows and names a column null in
    every good row of a batch at WARN, once per run."""

    @abstractmethod
    def schema(self) -> StructType:
        """The rows' columns (a Spark schema); every batch has exactly these."""

    @abstractmethod
    def initial_position(self) -> Position:
        """Where a pipeline that never ran before starts reading."""

    def end_of_input(self) -> Position:
        """A bounded source's last position, asked once at the first start (e.g. the newest
        entry present then). Unbounded sources never get asked."""
        raise NotImplementedError(f"{type(self).__name__} is bounded but does not say where it ends: implement "
                                  "end_of_input()")

    def plan(self, start: Position, end_of_input: Position | None) -> SourceBatch:
        """On the driver, at every batch: what the batch takes from ``start`` on (never
        beyond ``end_of_input`` when bounded). Return ``SourceBatch(start, start)`` when
        nothing is new. Every source implements this, or ``plan_at``."""
        raise NotImplementedError(f"{type(self).__name__} does not say what a batch takes: implement plan()")

    def plan_at(self, start: Position, end_of_input: Position | None, at: BatchTimes) -> SourceBatch:
        """What the engine calls to plan a batch: ``plan``, unless the batch's content depends
        on stream time (events at a rate since the pipeline's zero time), which ``at`` gives."""
        return self.plan(start, end_of_input)

    @abstractmethod
    def read(self, split: Split) -> Iterable[Any]:
        """In a Spark task: the split's rows, each a tuple or dict of ``schema()``, a
        ``DeadLetter``, or a whole ``pyarrow.RecordBatch`` of ``schema()``. Raise
        ``SourceError`` (naming what is missing) when the split cannot be read as planned."""

    def can_replay(self, batch: SourceBatch) -> bool:
        """After a restart, before a logged batch runs again: whether ``read`` can still give
        its splits' rows. False re-runs the batch without them (SPEC F3, logged); raise
        ``SourceError`` instead to stop the pipeline with what is gone."""
        return True

    def exhausted(self, position: Position, end_of_input: Position) -> bool:
        """Whether a bounded source standing at ``position`` has read everything."""
        return dict(position) == dict(end_of_input)

    def acknowledge(self, batch: SourceBatch) -> None:  # noqa: B027 (optional hook)
        """After the batch committed, on the driver (e.g. XACK, a consumer group's offset)."""

    def forget(self, batch: SourceBatch) -> None:  # noqa: B027 (optional hook)
        """When the engine no longer needs the batch (committed, and past every window that
        reads it): a source that holds a batch's data in memory lets it go."""

    def frame(self, spark: SparkSession, batch: SourceBatch) -> DataFrame | None:
        """A source whose splits Spark reads natively may build the batch's DataFrame itself
        (``spark.range``, ``spark.read``); None (the default) reads every split with ``read``.

        The frame has ``schema()``'s columns; one that parses records may add the dead-letter
        columns of ``batchline.sources.parsing`` (``RAW`` and ``REASON``, null for a good row,
        and ``SOURCE_FILE``, where a bad record came from): the engine counts and routes them."""
        return None

    def record_fields(self, batch: SourceBatch) -> list[str] | None:
        """The field names the batch's records hold, if cheap to learn on the driver (the
        first record's), for the warning about a column null in every row; None: unknown."""
        return None

    def attach(self, run: SourceRun) -> None:  # noqa: B027 (optional hook)
        """When the pipeline is built for a run, before a restart restores or replays anything:
        the Spark session and the checkpoint location, for a source that keeps data there."""

    # ---------------------------------------------------------------- how it is written down
    def checkpoint_position(self, position: Position | None, end_of_input: Position | None) -> dict[str, Any]:
        """The position (None before the first ``open``) and a bounded source's end, as the
        checkpoint keeps them (JSON)."""
        return {"position": None if position is None else dict(position),
                "end_of_input": None if end_of_input is None else dict(end_of_input)}

    def restore_position(self, record: Mapping[str, Any]) -> tuple[Position | None, Position | None]:
        """The position and end of input that ``checkpoint_position`` wrote (None: not known
        yet, asked again at ``open``)."""
        return record.get("position"), record.get("end_of_input")

    def log_batch(self, batch: SourceBatch) -> dict[str, Any]:
        """The batch as the batch log keeps it (JSON), written before any of its jobs runs."""
        return batch.to_json()

    def logged_batch(self, record: Mapping[str, Any], position: Position | None, at: BatchTimes) -> SourceBatch:
        """After a restart, the batch ``log_batch`` wrote. For a batch logged after the
        checkpoint, ``position`` is where the source stands (the batch's start) and the
        batch's end becomes its position; for one before, which only runs again, it is None."""
        return SourceBatch.from_json(record)

    def open(self) -> None:  # noqa: B027 (optional hook)
        """Once per run on the driver, before the first plan."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Once when the pipeline stops, after ``stop_receiving``."""

    # ---------------------------------------------------------------- records pushed to the driver
    def recover_received(self, position: Position) -> None:  # noqa: B027 (optional hook)
        """After a restart, once the checkpoint's position and every logged batch are given
        back, before ``open`` and the first plan: ``position`` is where the next batch starts.
        A source that wrote what it was pushed ahead to the checkpoint location takes back
        here what no batch had taken, so the first batches after the restart get it."""

    def start_receiving(self) -> None:  # noqa: B027 (optional hook)
        """Once the pipeline runs (after ``open``, and after a restart recovered what it must):
        a source that is pushed records on the driver (a receiver) starts taking them in."""

    def stop_receiving(self, graceful: bool) -> None:  # noqa: B027 (optional hook)
        """When the pipeline stops, before its last batches are planned and before ``close``:
        stop taking records in; ``graceful``: first take in every record already sent, so the
        last batches get it (``has_unplanned`` says until when)."""

    def has_unplanned(self) -> bool:
        """Whether records taken in wait for a batch to plan them: a graceful stop waits (up to
        its timeout) until none does."""
        return False
