"""A replayable source over a Python list, for tests (Bytewax's TestingSource).

Each item of the list is one batch's rows, or a marker: ``END`` (the input has nothing more;
later batches are empty) or an ``Abort()`` (the first time a batch would take it, generating
that batch fails with ``AbortedForTest``, as a crash would; a run after it passes it by).
Positions are list indices, so a restart replays logged batches exactly. A ``bounded`` list
ends at its end or at ``END``: the pipeline can finish.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from batchline.errors import BatchlineError
from batchline.sources.index_range import IndexRangeSource
from batchline.sources.source import BatchTimes, Position, SourceBatch, SourceRun, Split
from batchline.state.schema import as_struct

__all__ = ["ListSource", "END", "Abort", "AbortedForTest"]

logger = logging.getLogger(__name__)


class _End:
    def __repr__(self) -> str:
        return "END"


END = _End()
"""The input has nothing more."""


class Abort:
    """Fails the batch that would take it, once: a test's crash at a chosen point."""

    def __init__(self) -> None:
        self.fired = False

    def __repr__(self) -> str:
        return f"Abort(fired={self.fired})"


class AbortedForTest(BatchlineError):
    """Raised where a list source meets an ``Abort()`` marker; run the pipeline again to go on."""


class ListSource(IndexRangeSource):
    """One item of ``items`` per batch: a list of rows (dicts or tuples of ``schema``) or a marker.

    Its position is the next item's index (``{"next": n}``); a batch is a range of items,
    whose rows Spark is handed as they are (``frame``)."""

    def __init__(self, items: Sequence[Any], schema: StructType | str | type, bounded: bool = False) -> None:
        self.items = items
        self.row_schema = as_struct(schema, "the schema of list_stream")
        self.bounded = bounded
        self.name = "list"

    def schema(self) -> StructType:
        return self.row_schema

    def attach(self, run: SourceRun) -> None:
        self.name = run.name

    def initial_position(self) -> Position:
        return {"next": 0}

    def end_of_input(self) -> Position:
        # Where the list ends is decided as batches take it (an END marker): exhausted() tells.
        return {"next": len(self.items)}

    def exhausted(self, position: Position, end_of_input: Position) -> bool:
        items, index = self.items, int(position["next"])
        return index >= len(items) or items[index] is END

    def plan_at(self, start: Position, end_of_input: Position | None, at: BatchTimes) -> SourceBatch:
        items, first = self.items, int(start["next"])
        end = first
        while end < len(items) and isinstance(items[end], Abort) and items[end].fired:
            end += 1  # passed by an earlier run
        if end < len(items) and isinstance(items[end], Abort):
            items[end].fired = True
            raise AbortedForTest(f"input {self.name!r} met Abort() at item {end} (batch {at.batch_time_ms}); "
                                 "start the pipeline again from its checkpoint to go on")
        if end < len(items) and items[end] is not END:
            end += 1
        return self._range(first, end)

    def _range(self, start: int, end: int, at: BatchTimes | None = None) -> SourceBatch:
        rows = self._rows(start, end)
        return SourceBatch({"next": start}, {"next": end}, ({"start": start, "end": end},) if rows else (),
                           records=len(rows))

    def _rows(self, start: int, end: int) -> list[Any]:
        return [row for item in self.items[start:end] if isinstance(item, list) for row in item]

    def frame(self, spark: SparkSession, batch: SourceBatch) -> DataFrame:
        [split] = batch.splits
        return spark.createDataFrame(self._rows(int(split["start"]), int(split["end"])), self.row_schema)

    def read(self, split: Split) -> Iterable[Any]:
        return self._rows(int(split["start"]), int(split["end"]))
