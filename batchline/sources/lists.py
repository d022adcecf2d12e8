"""A replayable source over a Python list, for tests (Bytewax's TestingSource).

Each item of the list is one batch's rows, or a marker: ``END`` (the input has nothing more;
later batches are empty) or an ``Abort()`` (the first time a batch would take it, generating
that batch fails with ``AbortedForTest``, as a crash would; a run after it passes it by).
Positions are list indices, so a restart replays logged batches exactly. A ``bounded`` list
ends at its end or at ``END``: the pipeline can finish.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from batchline.errors import BatchlineError
from batchline.streams import InputNode, RangeReader, RuntimeEnv, StreamRuntime

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


class ListSource(InputNode):
    """One item of ``items`` per batch: a list of rows (dicts or tuples of ``schema``) or a marker."""

    replayable = True

    def __init__(self, batch_interval_ms: int, items: Sequence[Any], schema: StructType, name: str = "list",
                 bounded: bool = False) -> None:
        super().__init__(name, batch_interval_ms, bounded)
        self.items = items
        self.schema = schema

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> ListReader:
        return ListReader(self, env, parents)


class ListReader(RangeReader):
    node: ListSource

    def allocate(self, batch_time: int) -> None:
        items, start = self.node.items, self.next_index
        end = start
        while end < len(items) and isinstance(items[end], Abort) and items[end].fired:
            end += 1  # passed by an earlier run
        if end < len(items) and isinstance(items[end], Abort):
            items[end].fired = True
            raise AbortedForTest(f"input {self.name!r} met Abort() at item {end} (batch {batch_time}); "
                                 "start the pipeline again from its checkpoint to go on")
        if end < len(items) and items[end] is not END:
            end += 1
        self.restore_allocation(batch_time, {"start": start, "end": end}, advance=True)

    def exhausted(self) -> bool:
        items = self.node.items
        return self.next_index >= len(items) or items[self.next_index] is END

    def report_range(self, batch_time: int, start: int, end: int) -> None:
        self.report(batch_time, len(self._rows(start, end)))

    def _rows(self, start: int, end: int) -> list[Any]:
        return [row for item in self.node.items[start:end] if isinstance(item, list) for row in item]

    def compute(self, batch_time: int) -> DataFrame:
        return self.env.spark.createDataFrame(self._rows(*self.range_of(batch_time)), self.node.schema)
