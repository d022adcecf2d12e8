"""Resuming from a checkpoint: which batches re-run, with which inputs (SPEC E2, E3).

Batches logged but not committed re-run with exactly their logged inputs; the batches the
driver missed while it was down follow, in time order. The log lines are Spark Streaming's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from batchline.batch_time import format_batch_time
from batchline.checkpoint.manager import CheckpointManager
from batchline.checkpoint.model import Checkpoint, OperatorProgress
from batchline.errors import ConfigurationError
from batchline.streams import PipelineRuntime

__all__ = ["RestartPlan", "plan_restart"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPlan:
    to_reschedule: list[int]
    """Batch times to run before the timer takes over, oldest first."""
    restored: set[int] = field(default_factory=set)
    """Those among them whose logged inputs were given back: they are not allocated again."""


def _times(times: list[int], shown: int = 20) -> str:
    """The seed's list of batch times, shortened in the middle when it is long."""
    if len(times) <= shown:
        return ", ".join(f"{t} ms" for t in times)
    head, tail = times[: shown // 2], times[-(shown // 2):]
    return (", ".join(f"{t} ms" for t in head) + f", ... ({len(times) - shown} more), "
            + ", ".join(f"{t} ms" for t in tail))


def plan_restart(pipeline: PipelineRuntime, checkpoints: CheckpointManager, checkpoint: Checkpoint,
                 restart_time: int, batch_interval_ms: int) -> RestartPlan:
    """Give the inputs back their position and the logged batches their inputs, restore the
    operators' progress, and say which batches run before ``restart_time``."""
    if checkpoint.batch_interval_ms != batch_interval_ms:
        raise ConfigurationError(
            f"the checkpoint at {checkpoints.storage.url} was written with a batch interval of "
            f"{checkpoint.batch_interval_ms} ms, but this pipeline uses {batch_interval_ms} ms; "
            "keep the interval, or start from a new checkpoint location"
        )
    events = checkpoints.events
    interval = batch_interval_ms
    pipeline.start(checkpoint.zero_time)
    pipeline.restore(checkpoint.inputs)
    pipeline.restore_finished(checkpoint.finished)
    restored: dict[int, dict[str, dict[str, Any]]] = {}
    # The checkpoint's pending batches and the batches a window may still need get their
    # logged allocations back, without advancing the sources: the checkpointed position
    # already includes them.
    window_start = max(checkpoint.zero_time + interval,
                       checkpoint.time - pipeline.max_input_remember_ms + interval)
    for past in sorted(set(checkpoint.pending_times) | set(range(window_start, checkpoint.time + 1, interval))):
        allocations = events.started(past)
        if allocations is not None:
            pipeline.restore_allocations(past, allocations, advance=False)
            restored[past] = allocations
    # Batches logged after the checkpoint: advance the sources past them.
    last_logged = checkpoint.time
    while (allocations := events.started(last_logged + interval)) is not None:
        last_logged += interval
        pipeline.restore_allocations(last_logged, allocations, advance=True)
        restored[last_logged] = allocations
    # The log ends where a batch was never logged: unless its record was lost afterwards.
    events.check_logged(last_logged + interval)
    for past in checkpoint.pending_times:
        if past not in restored:
            events.check_logged(past)
    pipeline.recover_after_restart()
    pipeline.restore_progress(_last_committed_progress(checkpoints, checkpoint, last_logged, interval))
    pipeline.open()

    down_times = list(range(last_logged + interval, restart_time, interval))
    logger.info("Batches during down time (%d batches): %s", len(down_times), _times(down_times))
    candidates = sorted(set(checkpoint.pending_times) | {t for t in restored if t > checkpoint.time})
    pending = [t for t in candidates if t < restart_time and not events.is_completed(t)]
    logger.info("Batches pending processing (%d batches): %s", len(pending), _times(pending))
    to_reschedule = sorted(set(pending) | set(down_times))
    logger.info("Batches to reschedule (%d batches): %s", len(to_reschedule), _times(to_reschedule))
    rerun = sorted(set(restored) & set(pending))
    for batch_time in rerun:
        # SPEC F2/F3: a re-run keeps what it finished durably, unless an input cannot replay.
        unreplayable = pipeline.unreplayable(batch_time, restored[batch_time])
        if unreplayable:
            logger.warning("Batch %s read input(s) %s, which cannot give it the same data again; the whole batch "
                           "re-runs", format_batch_time(batch_time), unreplayable)
        pipeline.recover_batch(batch_time, unreplayable)
    return RestartPlan(to_reschedule, set(rerun))


def _last_committed_progress(checkpoints: CheckpointManager, checkpoint: Checkpoint, last_logged: int,
                             interval: int) -> dict[str, OperatorProgress]:
    """Operators' progress as of the newest committed batch (its commit marker).

    The checkpoint holds the progress of the last batch committed when it was written, which
    may lie far behind its time (generation runs ahead of processing); every batch committed
    after it was written is one of its pending batches or a later one, so the newest marker
    is searched from the last logged batch down to its oldest pending batch."""
    oldest = min([checkpoint.time, *checkpoint.pending_times])
    for time in range(last_logged, oldest - interval, -interval):
        commit = checkpoints.events.completed(time)
        if commit is not None:
            return dict(commit.operators)
    return dict(checkpoint.operators)
