"""A stateful operator's part of one batch: ``OperatorBatch`` (SPEC D4, E1, E6).

The operator (``StatefulRuntime``) keeps one of these per batch it is concerned with, in one
map, and nothing else keyed by batch time. A batch's part is made when the batch first
concerns the operator (a restart that re-runs it, its job generated, its DataFrame built),
filled in as its job runs, taken on when the batch commits, and dropped when the operator
forgets the batch: at its commit, or as long after as a window downstream reads it.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

from pyspark.accumulators import Accumulator
from pyspark.sql import DataFrame

from batchline.scheduler.progress import StateOperatorProgress
from batchline.state.contract import BatchParams, PartitionFacts, Stats
from batchline.state.execution import StateTask
from batchline.state.operator import ReportedStats

__all__ = ["OperatorBatch", "Started"]


@dataclass(frozen=True)
class Started:
    """A batch's run as decided when its operator job started."""

    params: BatchParams
    running: frozenset[int]
    ending: bool
    watermark_ms: int | None
    recorded: Future[None] | None = None
    """The batch's operator record (its partition count, in the job event store), being
    written beside the batch's job on S3; the operator's completion waits for it."""


@dataclass
class OperatorBatch:
    """What one batch is to one stateful operator, from the restart or generation that makes it
    known to its commit."""

    time: int
    kept: frozenset[int] = frozenset()
    """Re-run by a restart: the partitions that keep what they had finished (their output is stored)."""
    rerun_whole: bool = False
    """Re-run whole by a restart: its partitions keep nothing they had finished."""
    rerun_note: str | None = None
    """Run again by a restart: what of its inputs it reads again and why, for its progress
    record (every attempt's: a retry does not undo the restart's decision)."""
    awaiting_commit: bool = False
    """Its job was generated and it has not committed yet."""
    skipped: bool = False
    """No row came and no timer was due: no job ran, no version was written (SPEC E6)."""
    stats: Accumulator[ReportedStats] | None = None
    """What its tasks report, by partition, as they run (made with its DataFrame;
    ``operator.tasks_reported`` sums it)."""
    tasks: tuple[DataFrame, StateTask] | None = None
    """The rows shuffled to the state partitions and the function of its tasks, when its only
    output reads its rows in one pass: the output's function runs in those tasks."""
    started: Started | None = None
    """Its parameters are published and its tasks run inside its output's job; the completion
    job takes them on."""
    reported: Stats | None = None
    """What its partitions reported, in all, once its tasks ran."""
    ran: frozenset[int] | None = None
    """The partitions that wrote its version (None: its tasks have not run, or did not all report)."""
    facts_after: dict[int, PartitionFacts] | None = None
    """What each partition holds after it (None: not known), the driver's view once its jobs
    all succeeded."""
    facts_pending: bool = False
    """``facts_after`` waits for the batch's jobs to succeed (a failed attempt's never count)."""
    progress: StateOperatorProgress | None = None
    """What the operator did in the batch, for the batch's progress record (the last attempt's)."""
    counted_event_times: bool = False
    """Its rows' event times are counted into the operator's newest; ``newest_before`` was it until then."""
    newest_before: int | None = None

    def took_on(self, stats: Stats, ran: frozenset[int], facts: dict[int, PartitionFacts] | None) -> None:
        """Its tasks ran and reported ``stats``: ``ran`` wrote its version and leave ``facts``."""
        self.reported = stats
        self.rerun_whole = False  # a retry keeps what this run finished
        self.ran = ran
        self.facts_after = facts
        self.facts_pending = True

    def take_facts(self) -> tuple[bool, dict[int, PartitionFacts] | None]:
        """Whether its facts wait to become the driver's view, and the facts (once)."""
        pending, self.facts_pending = self.facts_pending, False
        return pending, self.facts_after

    def committed(self) -> frozenset[int] | None:
        """The batch committed: the partitions that wrote its version (None: it ran no job).
        What only its run needed is let go; whether it was skipped stays known."""
        ran = self.ran
        self.awaiting_commit = False
        self.ran = self.started = self.reported = self.facts_after = None
        self.kept = frozenset()
        return ran
