"""What inputs share about bad records and counting: a batch's rows counted by the job that
reads them, and the stream of an input's dead letters (SPEC B6)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from pyspark.sql import DataFrame, Observation

from batchline.streams import InputNode, InputRuntime, RuntimeEnv, StreamNode, StreamRuntime

__all__ = ["CountedBatch", "DeadLetterNode", "DeadLetterReader"]


@dataclass(frozen=True)
class CountedBatch:
    """A batch's rows, good and bad, and the observation that counts them as a job reads them."""

    frame: DataFrame
    counts: Observation

    def counted(self) -> bool:
        """Whether a job that read every row has finished (without waiting for one)."""
        # PySpark's Observation only offers a blocking get; its JVM side tells without waiting.
        observation: Any = self.counts._jo  # noqa: SLF001
        return observation is not None and bool(observation.future().isCompleted())


class DeadLetterReader(StreamRuntime):
    """An input's runtime that can give a batch's bad records."""

    @abstractmethod
    def dead_letter_frame(self, batch_time: int) -> DataFrame:
        """The batch's bad records: ``raw_record``, ``reason``, ``source``, ``batch_time``."""


class DeadLetterNode(StreamNode):
    """The bad records of an input: ``raw_record``, ``reason``, ``source``, ``batch_time``."""

    def __init__(self, source: InputNode) -> None:
        super().__init__([source])

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> StreamRuntime:
        return _DeadLetters(self, env, parents)


class _DeadLetters(StreamRuntime):
    def has_rows(self, batch_time: int) -> bool:
        """Whether the batch may hold bad records: its input took something, or (once counted)
        some records were refused, even if none was good."""
        source = self.parents[0]
        if not isinstance(source, InputRuntime):
            return True
        info = self.env.input_info.get_info(batch_time).get(source.input_id)
        return info is None or info.num_records != 0 or info.dead_letters != 0

    def compute(self, batch_time: int) -> DataFrame:
        return cast(DeadLetterReader, self.parents[0]).dead_letter_frame(batch_time)
