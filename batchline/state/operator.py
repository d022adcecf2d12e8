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

from pyspark import SparkContext
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame

from batchline.scheduler.progress import StateOperatorProgress
from batchline.sinks.sink import ArrowFunction
from batchline.state.contract import (
    BATCH_PARAMS_PROPERTY,
    BatchParams,
    OperatorSpec,
    StateFunctionError,
    Stats,
    with_batch_params,
)
from batchline.state.execution import spark_task
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
                      partitions_finished: int = 0, rerun_input: str | None = None) -> StateOperatorProgress:
    """What the operator's tasks reported for one batch, as its progress record."""
    return StateOperatorProgress(operator, stats.rows, stats.late_rows, stats.keys_called, stats.updated,
                                 stats.removed, stats.timed_out, stats.output_rows, stats.state_keys, watermark_ms,
                                 partitions_kept, stats.state_bytes, stats.delta_bytes, partitions_finished,
                                 rerun_input)


def rerun_input(kept: frozenset[int], whole: bool, partitions: int) -> str | None:
    """What a batch re-run after a restart read of its input again, and why: said in its
    progress record, since a re-run that keeps most partitions still takes as long to read."""
    if whole:
        return ("all of it, for every partition: an input cannot give the batch the same rows again, so no "
                "partition keeps what it had finished")
    if not kept:
        return None
    rerun = sorted(set(range(partitions)) - kept)
    return (f"all of it, for the {len(rerun)} re-run partition(s) {rerun}: a row's state partition follows from "
            "its key once it is read, so no source can give the rows of some partitions alone; the rows of the "
            f"{len(kept)} kept partition(s) were read and left out of the shuffle")


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
                  ) -> tuple[ArrowFunction, Accumulator[ReportedStats]]:
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
