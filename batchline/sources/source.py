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

__all__ = ["Source", "SourceBatch", "DeadLetter", "Position", "Split"]

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

    def to_json(self) -> dict[str, Any]:
        return {"start": dict(self.start), "end": dict(self.end), "splits": [dict(s) for s in self.splits],
                "info": dict(self.info)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SourceBatch:
        return cls(dict(data["start"]), dict(data["end"]), tuple(dict(s) for s in data.get("splits", ())),
                   dict(data.get("info", {})))


class Source(ABC):
    """An input of batches: plan on the driver, read in tasks, replay from the batch log.

    ``bounded`` sources end: ``end_of_input`` is asked once, when the pipeline first starts,
    kept in the checkpoint, and handed to every ``plan``; the input is finished once a batch
    ends there (``exhausted``).
    """

    bounded: bool = False

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

    @abstractmethod
    def plan(self, start: Position, end_of_input: Position | None) -> SourceBatch:
        """On the driver, at every batch: what the batch takes from ``start`` on (never
        beyond ``end_of_input`` when bounded). Return ``SourceBatch(start, start)`` when
        nothing is new."""

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

    def frame(self, spark: SparkSession, batch: SourceBatch) -> DataFrame | None:
        """A source whose splits Spark reads natively may build the batch's DataFrame itself
        (``spark.range``, ``spark.read``); None (the default) reads every split with ``read``."""
        return None

    def open(self) -> None:  # noqa: B027 (optional hook)
        """Once per run on the driver, before the first plan."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Once when the pipeline stops."""
