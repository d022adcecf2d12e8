"""The stateful operator's driver side, apart from the stream runtime that schedules it
(``batchline.state.stateful``): its settings, the record of what it did in a batch, and the
driver's half of the task contract (``batchline.state.contract``).

- ``operator_task``: the ``mapInArrow`` function of a batch, with the accumulator that
  gathers the tasks' ``Stats`` (``tasks_reported`` sums them).
- ``run_batch_job``: publish the batch's ``BatchParams`` to the job's tasks, evaluate the
  operator's DataFrame, and turn a task's failure of the state function back into a
  ``StateFunctionError``.
- ``purge_old_versions``: delete the files the retained versions no longer need.

The settings are read when used, so tests may change them on this module.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pyspark import SparkContext
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame

from batchline.scheduler.progress import StateOperatorProgress
from batchline.state.contract import (
    BATCH_PARAMS_PROPERTY,
    BatchParams,
    OperatorSpec,
    StateFunctionError,
    Stats,
    with_batch_params,
)
from batchline.state.execution import StateTask, spark_task
from batchline.state.store import DamagedStateFileError, KeptOutputLostError, StateMetadata, StateStore

__all__ = [
    "DEFAULT_STATE_PARTITIONS",
    "PURGE_EVERY",
    "RETAINED_VERSIONS",
    "ReportedStats",
    "StateOperatorProgress",
    "operator_progress",
    "operator_task",
    "publish_batch_params",
    "purge_old_versions",
    "rerun_note",
    "run_batch_job",
    "tasks_reported",
]

logger = logging.getLogger(__name__)

DEFAULT_STATE_PARTITIONS = 8
RETAINED_VERSIONS = 20
"""Versions of each partition kept loadable (for the reader and for restarts)."""
PURGE_EVERY = 10
"""Committed batches between two clean-ups of old state files."""


def operator_progress(operator: str, stats: Stats, watermark_ms: int | None, partitions_kept: int = 0,
                      partitions_finished: int = 0, rerun_note: str | None = None) -> StateOperatorProgress:
    """What the operator's tasks reported for one batch, as its progress record."""
    return StateOperatorProgress(operator, stats.rows, stats.late_rows, stats.keys_called, stats.updated,
                                 stats.removed, stats.timed_out, stats.output_rows, stats.state_keys, watermark_ms,
                                 partitions_kept, stats.state_bytes, stats.delta_bytes, partitions_finished,
                                 rerun_note)


def rerun_note(kept: frozenset[int], rerun: Sequence[int], unreplayable: Sequence[str]) -> str:
    """Why a batch that a restart runs again reads its inputs again, and for which partitions:
    for its progress record, as a re-run that keeps most partitions still reads everything."""
    if unreplayable:
        return (f"input(s) {', '.join(unreplayable)} cannot give the batch its rows again: it ran without them, "
                "every partition again, on what its other inputs still hold")
    if not kept:
        return ("everything its inputs still hold, for every partition: none had finished the batch durably before "
                "the restart")
    shown = ", ".join(map(str, rerun[:_PARTITIONS_SHOWN])) + (
        f" and {len(rerun) - _PARTITIONS_SHOWN} more" if len(rerun) > _PARTITIONS_SHOWN else "")
    return (f"everything its inputs still hold, for {len(rerun)} partition(s) ({shown}); {len(kept)} kept what "
            "they had finished, and their rows were left out of the state shuffle: a row's state partition "
            "follows from its key once the row is read, so no source can give some partitions' rows alone")


_PARTITIONS_SHOWN = 10
"""Partitions a note names; a longer list is counted."""


ReportedStats = dict[int, Stats]
"""The tasks' ``Stats`` by the partitions they report (``Stats.partitions``)."""


class _StatsParam(AccumulatorParam):  # type: ignore[type-arg]
    """A partition's latest report replaces its earlier one. A batch that runs again in the
    same driver runs its DataFrame again, with no cache in between when its output reads it in
    one pass: the partitions that finished in the failed attempt run again and report what their
    finish records kept, which counts once."""

    def zero(self, value: ReportedStats) -> ReportedStats:
        return {}

    def addInPlace(self, a: ReportedStats, b: ReportedStats) -> ReportedStats:  # noqa: N802 - Spark's name
        a.update(b)
        return a


def operator_task(spark_context: SparkContext, spec: OperatorSpec, batch_time: int
                  ) -> tuple[StateTask, Accumulator[ReportedStats]]:
    """The ``mapInArrow`` function of the operator's DataFrame for ``batch_time``, and the
    accumulator in which its tasks report their ``Stats`` (read it with ``tasks_reported``
    after the job ran)."""
    reports: Accumulator[ReportedStats] = spark_context.accumulator({}, _StatsParam())
    return spark_task(spec, batch_time, lambda stats: reports.add({stats.partitions: stats})), reports


def tasks_reported(reports: Accumulator[ReportedStats]) -> Stats:
    """The sum of the partitions' latest reports."""
    total = Stats()
    for stats in reports.value.values():
        total = total.merge(stats)
    return total


def publish_batch_params(spark_context: SparkContext, operator: str, params: BatchParams) -> None:
    """Make ``params`` the operator's parameters for the jobs this thread submits next."""
    current = spark_context.getLocalProperty(BATCH_PARAMS_PROPERTY)
    spark_context.setLocalProperty(BATCH_PARAMS_PROPERTY, with_batch_params(current, operator, params))


def run_batch_job(spark_context: SparkContext, operator: str, params: BatchParams, df: DataFrame) -> None:
    """Evaluate the operator's DataFrame of ``params.batch_time`` with its parameters
    published to the tasks. A failure of the state function raises ``StateFunctionError``
    (with the key and the task's Python traceback), a damaged state file ``DamagedStateFileError``
    (naming it), a kept partition whose output cannot be read back ``KeptOutputLostError``
    (naming it); any other failure is raised as it is."""
    publish_batch_params(spark_context, operator, params)
    try:
        df.count()
    except Exception as error:
        failure = (StateFunctionError.carried_in(error) or DamagedStateFileError.carried_in(error)
                   or KeptOutputLostError.carried_in(error))
        if failure is None:
            raise
        raise failure from None


def purge_old_versions(store: StateStore, metadata: StateMetadata, committed_through: int | None = None) -> int:
    """Delete the state files that the newest ``RETAINED_VERSIONS`` versions of every
    partition do not need, and the kept outputs of committed batches; returns how many went.
    Failures are logged: a later purge retries."""
    try:
        removed = sum(store.purge(metadata.generation, p, RETAINED_VERSIONS, committed_through)
                      for p in range(metadata.num_partitions))
    except Exception:
        logger.exception("Purging old state files of operator %s failed; retrying after later batches",
                         store.operator)
        return 0
    if removed:
        logger.info("Operator %s: removed %d state files older than its %d retained versions", store.operator,
                    removed, RETAINED_VERSIONS)
    return removed
