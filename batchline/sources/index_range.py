"""A source whose position is one index into what it can give again (a list's items, a
DataFrame's kept files, the generator's event numbers): the checkpoint keeps
``{position_key: next}`` and the batch log ``{"start": ..., "end": ...}``, the shapes these
inputs have always had on disk."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from batchline.sources.source import BatchTimes, Position, Source, SourceBatch

__all__ = ["IndexRangeSource"]


class IndexRangeSource(Source):
    position_key: ClassVar[str] = "next"

    @abstractmethod
    def _range(self, start: int, end: int, at: BatchTimes | None = None) -> SourceBatch:
        """The batch of the items ``start`` (included) to ``end`` (excluded), planned ``at``
        (None where the plan does not depend on the batch's time)."""

    def _end_after_restart(self) -> Position | None:
        """The end of input a restart knows at once (None: asked again at ``open``)."""
        return self.end_of_input() if self.bounded else None

    def checkpoint_position(self, position: Position | None, end_of_input: Position | None) -> dict[str, Any]:
        return {self.position_key: int(position[self.position_key]) if position else 0}

    def restore_position(self, record: Mapping[str, Any]) -> tuple[Position | None, Position | None]:
        return {self.position_key: int(record[self.position_key])}, self._end_after_restart()

    def log_batch(self, batch: SourceBatch) -> dict[str, Any]:
        return {"start": int(batch.start[self.position_key]), "end": int(batch.end[self.position_key])}

    def logged_batch(self, record: Mapping[str, Any], position: Position | None, at: BatchTimes) -> SourceBatch:
        return self._range(int(record["start"]), int(record["end"]), at)
