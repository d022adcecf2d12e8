"""Input streams: each picks its data for a batch at batch time, then builds a DataFrame."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from batchline.api.stream import Stream
from batchline.scheduler.input_info import StreamInputInfo
from batchline.scheduler.job import Job

if TYPE_CHECKING:
    from batchline.api.env import PipelineEnv

__all__ = ["InputStream"]

logger = logging.getLogger(__name__)


class InputStream(Stream):
    """A source of batches. Subclasses implement ``allocate`` and ``_compute``.

    Recovery contract (all JSON, never pickles): ``allocation(t)`` says what batch ``t``
    took, ``restore_allocation`` gives a batch exactly that again after a restart, and
    ``snapshot``/``restore`` carry the source's position in a checkpoint. A source that
    cannot replay (``replayable = False``) loses the data of batches it must re-run.
    """

    replayable = False

    def __init__(self, env: PipelineEnv, name: str) -> None:
        super().__init__(env, ())
        self.name = name
        self.input_id = env.graph.add_input(self)

    @property
    def slide_ms(self) -> int:
        return self.env.batch_interval_ms

    def start(self) -> None:
        """Called once when the pipeline starts."""

    def stop(self) -> None:
        """Called once when the pipeline stops."""

    def allocate(self, batch_time: int) -> None:
        """Decide which data belongs to ``batch_time`` and report it; runs on the event loop."""
        self.report(batch_time, num_records=0)

    def allocation(self, batch_time: int) -> dict[str, Any]:
        """What ``allocate`` chose for ``batch_time``, to be written to the batch log."""
        return {}

    def restore_allocation(self, batch_time: int, allocation: dict[str, Any], advance: bool) -> None:
        """Give ``batch_time`` the logged allocation; with ``advance`` also move the source's
        position past it (a batch logged after the checkpoint)."""
        if not self.replayable:
            logger.warning("Input %s cannot replay batch %d: it re-runs without this input's data", self.name,
                           batch_time)
        self.report(batch_time, num_records=0)

    def snapshot(self) -> dict[str, Any]:
        """The source's position, for a checkpoint."""
        return {}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Go back to a position that ``snapshot`` returned."""

    def recover_after_restart(self) -> None:
        """Take back data received but not yet in any batch when the last driver died."""

    def prepare_job(self, batch_time: int) -> Job | None:
        """A job that must run before the batch's outputs (e.g. read, cache and count)."""
        return None

    def clear_metadata(self, batch_time: int) -> None:
        super().clear_metadata(batch_time)
        self.forget_before(batch_time - self.remember_ms)

    def forget_before(self, threshold_time: int) -> None:
        """Drop what was allocated to batches at or before ``threshold_time``."""

    def report(self, batch_time: int, num_records: int | None, **extra: object) -> None:
        self.env.report_input(
            batch_time, StreamInputInfo(self.input_id, self.name, num_records, **extra)  # type: ignore[arg-type]
        )

    def empty_frame(self, schema: StructType) -> DataFrame:
        return self.env.spark.createDataFrame([], schema)
