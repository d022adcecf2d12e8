"""Inputs as the engine runs them: a node that names an input, and its runtime for one run.

Internal, and with exactly one implementation: ``sources.source_input`` runs every input, a
user's ``batchline.Source`` and every built-in one alike, on this contract. A source author
never meets it; the stream model only needs it because it sits below ``sources``.

Recovery contract (all JSON, never pickles): ``allocation(t)`` says what batch ``t`` took,
``restore_allocation`` gives a batch exactly that again after a restart, and
``snapshot``/``restore`` carry the input's position in a checkpoint.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from batchline.batch_time import format_batch_time
from batchline.scheduler.input_info import StreamInputInfo
from batchline.streams.base import RuntimeEnv, StreamNode, StreamRuntime

__all__ = ["InputNode", "InputRuntime"]

logger = logging.getLogger(__name__)


class InputNode(StreamNode):
    """A source of batches, found again in a checkpoint by its ``name`` (unique in the pipeline)."""

    def __init__(self, name: str, batch_interval_ms: int, bounded: bool = False) -> None:
        super().__init__(())
        self.name = name
        self._bounded = bounded
        self.input_id = -1
        """Its position among the pipeline's inputs, given when the graph registers it."""
        self._batch_interval_ms = batch_interval_ms

    @property
    def slide_ms(self) -> int:
        return self._batch_interval_ms

    @property
    def bounded(self) -> bool:
        """Whether it ends (SPEC G1): once exhausted, it is finished and later batches skip it."""
        return self._bounded

    @abstractmethod
    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> InputRuntime:
        """The source's reader for one run."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class InputRuntime(StreamRuntime):
    """A source's reader for one run: it picks each batch's data and builds its DataFrame."""

    node: InputNode

    def __init__(self, node: InputNode, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> None:
        super().__init__(node, env, parents)
        self._finished_after: int | None = None

    @property
    def name(self) -> str:
        return self.node.name

    def has_rows(self, batch_time: int) -> bool:
        """False when the batch's allocation is known to hold no record (its input statistics
        say 0 before any job ran); None (not known until read) counts as rows."""
        if self.finished_before(batch_time):
            return False
        info = self.env.input_info.get_info(batch_time).get(self.input_id)
        return info is None or info.num_records != 0

    # ---------------------------------------------------------------- finishing
    def exhausted(self) -> bool:
        """A bounded input's position has reached its end: nothing is left to allocate."""
        return False

    def finished_after(self) -> int | None:
        return self._finished_after

    def note_allocated(self, batch_time: int) -> None:
        """After ``batch_time`` took its data: a bounded input that took its last records is
        finished after that batch."""
        if self._finished_after is None and self.node.bounded and self.exhausted():
            self._finished_after = batch_time
            logger.info("Input %s is exhausted: batch %s took its last records, and later batches skip it",
                        self.name, format_batch_time(batch_time))

    def restore_finished(self, batch_time: int) -> None:
        """The checkpoint says this input finished after ``batch_time``: it is not read again."""
        self._finished_after = batch_time

    @property
    def input_id(self) -> int:
        return self.node.input_id

    @abstractmethod
    def start(self) -> None:
        """Called once the pipeline runs (after a restart has recovered what it must)."""

    @abstractmethod
    def stop(self, graceful: bool) -> None:
        """Called once when the pipeline stops, before its last batches (gracefully: let every
        record already received into a batch)."""

    @abstractmethod
    def allocate(self, batch_time: int) -> None:
        """Decide which data belongs to ``batch_time`` and report it; runs on the event loop."""

    @abstractmethod
    def allocation(self, batch_time: int) -> dict[str, Any]:
        """What ``allocate`` chose for ``batch_time``, to be written to the batch log."""

    @abstractmethod
    def restore_allocation(self, batch_time: int, allocation: dict[str, Any], advance: bool) -> None:
        """Give ``batch_time`` the logged allocation; with ``advance`` also move the source's
        position past it (a batch logged after the checkpoint)."""

    @abstractmethod
    def can_replay(self, batch_time: int) -> bool:
        """After a restart gave ``batch_time`` its logged allocation: whether reading it again
        gives the same data (else the batch re-runs whole, without it; SPEC F3). A source
        may raise ``SourceError`` instead, naming what is gone."""

    @abstractmethod
    def snapshot(self) -> dict[str, Any]:
        """The source's position, for a checkpoint."""

    @abstractmethod
    def restore(self, snapshot: dict[str, Any]) -> None:
        """Go back to a position that ``snapshot`` returned."""

    @abstractmethod
    def recover_after_restart(self) -> None:
        """Take back data received but not yet in any batch when the last driver died."""

    def clear_metadata(self, batch_time: int) -> None:
        super().clear_metadata(batch_time)
        self.forget_before(batch_time - self.remember_ms)

    @abstractmethod
    def forget_before(self, threshold_time: int) -> None:
        """Drop what was allocated to batches at or before ``threshold_time``."""

    def report(self, batch_time: int, num_records: int | None, dead_letters: int = 0,
               metadata: dict[str, Any] | None = None, lag: int | None = None) -> None:
        self.env.input_info.report(batch_time, StreamInputInfo(self.input_id, self.name, num_records,
                                                               dead_letters=dead_letters, metadata=metadata or {},
                                                               lag=lag))
