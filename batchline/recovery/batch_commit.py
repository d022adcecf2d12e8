"""The batch commit: how one batch becomes durable, in order (SPEC A4, E1, E2).

Step 1: log the batch: its inputs' allocations go to the batch log before any job runs
        (``jobs_for``, on the generator's loop).
Step 2: run its jobs: operators read their input and write their state, outputs commit their data
        (``scheduler.batch_run.BatchRun``, on the batch's thread, which calls ``commit`` once its
        jobs and the commits they left succeeded, in batch order).
Step 3: count and verify: inputs report what the jobs counted of them, and each node checks
        its work is whole (``commit``).
Step 4: commit marker, with the operators' progress, under the lease's fencing token.
Step 5: advance versions: every node moves on to build the next batch on this one.
Step 6: checkpoint: the generator clears what no batch needs and writes a checkpoint on
        the checkpoint interval (``checkpoint``, from the writer's thread).

Once a committed batch leaves every output's stream finished (SPEC G1-G3), ``on_finished`` is
told; the context then stops and writes the final checkpoint (``final_checkpoint``). Batches
generated after that take no input, log nothing and commit nothing.

A driver that dies before Step 4 leaves a logged batch without a marker: the restart
(``restart.plan_restart``) runs it again with exactly the logged inputs, and every output
and state write of Step 2 is idempotent per batch time.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from batchline.batch_time import format_batch_time
from batchline.checkpoint.manager import CheckpointManager
from batchline.checkpoint.model import Checkpoint, FinalRecord
from batchline.clock import Clock
from batchline.errors import ContextStateError
from batchline.recovery.restart import plan_restart
from batchline.scheduler.job import Job
from batchline.scheduler.progress import StateOperatorProgress
from batchline.streams import PipelineRuntime

__all__ = ["BatchCommit"]

logger = logging.getLogger(__name__)


class BatchCommit:
    """The steps above for one pipeline run; what the job generator calls ``Batches``."""

    def __init__(self, pipeline: PipelineRuntime, checkpoints: CheckpointManager | None, clock: Clock,
                 on_finished: Callable[[int], None] | None = None) -> None:
        self.pipeline = pipeline
        self._checkpoints = checkpoints
        self._clock = clock
        self._on_finished = on_finished
        self._restored: set[int] = set()
        """Batches a restart re-runs; their logged inputs were given back when it began."""
        self._idle: set[int] = set()
        """Batches generated after the pipeline finished: nothing logged, nothing to commit."""
        self.last_committed: int | None = None
        self._roots: list[str] = []

    @property
    def max_input_remember_ms(self) -> int:
        return self.pipeline.max_input_remember_ms

    def start_fresh(self, zero_time: int) -> None:
        self.pipeline.start(zero_time)
        self.pipeline.open()
        if self._checkpoints is not None:
            # The first checkpoint, at zero time, is written before any batch: a crash at
            # any later moment restarts from a checkpoint, never from nothing.
            self._checkpoints.checkpoint_writer().write_now(self.checkpoint(zero_time, ()))

    def restart(self, checkpoint: Checkpoint, restart_time: int) -> list[int]:
        if self._checkpoints is None:
            raise ContextStateError("a restart needs the checkpoint location it restarts from")
        plan = plan_restart(self.pipeline, self._checkpoints, checkpoint, restart_time,
                            self.pipeline.graph.batch_interval_ms)
        self._restored = set(plan.restored)
        self.last_committed = checkpoint.time
        return plan.to_reschedule

    def jobs_for(self, batch_time: int) -> list[Job]:
        if self._finished_before(batch_time):
            self._idle.add(batch_time)
            return []
        self._log_roots(batch_time)
        # Step 1
        logged_here = False
        if batch_time in self._restored:
            self._restored.discard(batch_time)  # its logged inputs were given back by the restart
        else:
            self.pipeline.allocate_inputs(batch_time)
            if self._checkpoints is not None:
                self._checkpoints.log_batch(batch_time, self.pipeline.allocations(batch_time))
                # Written before any job of the batch runs: where it is created exclusively, no
                # driver ran this batch before.
                logged_here = self._checkpoints.storage.exclusive_creates
        # Step 2 runs these on the job scheduler
        return self.pipeline.generate_jobs(batch_time, logged_here)

    def check_commit(self, batch_time: int) -> None:
        """Step 4's lease check, beside the commits the batch's jobs left (``BatchRun``)."""
        if self._checkpoints is not None and batch_time not in self._idle:
            self._checkpoints.lease.check()

    def commit(self, batch_time: int, lease_checked: bool = False) -> None:
        """Called by the batch's ``BatchRun``, on its thread, once every job of the batch succeeded."""
        if batch_time in self._idle:
            self._idle.discard(batch_time)
            self.last_committed = max(batch_time, self.last_committed or batch_time)
            return
        # Step 3
        self.pipeline.after_jobs(batch_time)
        self.pipeline.verify(batch_time)
        # Step 4
        if self._checkpoints is not None:
            self._checkpoints.commit_batch(batch_time, self.pipeline.progress(), lease_checked=lease_checked)
        # Step 5
        self.pipeline.on_batch_committed(batch_time)
        self.last_committed = max(batch_time, self.last_committed or batch_time)
        finished = self.pipeline.finished_after()
        if finished is not None and batch_time >= finished and self._on_finished is not None:
            self._on_finished(batch_time)

    def operator_progress(self, batch_time: int) -> dict[str, StateOperatorProgress]:
        return self.pipeline.operator_progress(batch_time)

    def _finished_before(self, batch_time: int) -> bool:
        finished = self.pipeline.finished_after()
        return finished is not None and batch_time > finished

    def _log_roots(self, batch_time: int) -> None:
        """Once parts of the pipeline have finished, say where each batch's work starts (SPEC G4)."""
        if not any(r.finished_partitions() for r in self.pipeline.runtimes):
            return
        roots = [f"{runtime.node!r}[{partition}]" for runtime, partition in self.pipeline.tasks_to_trigger()]
        if roots != self._roots:
            self._roots = roots
            logger.info("From batch %s, work starts at %s (the streams before them have finished)",
                        format_batch_time(batch_time), ", ".join(roots) or "nothing")

    def clear_metadata(self, batch_time: int) -> None:
        self.pipeline.clear_metadata(batch_time)

    def checkpoint(self, batch_time: int, pending: tuple[int, ...]) -> Checkpoint:
        # Step 6
        if self._checkpoints is None or self.pipeline.zero_time is None:
            raise ContextStateError("a checkpoint needs a started pipeline with a checkpoint location")
        return Checkpoint(
            time=batch_time,
            zero_time=self.pipeline.zero_time,
            batch_interval_ms=self.pipeline.graph.batch_interval_ms,
            checkpoint_interval_ms=self._checkpoints.interval_ms,
            pending_times=pending,
            inputs=self.pipeline.snapshot(),
            outputs=tuple(op.name for op in self.pipeline.graph.outputs),
            written_at_ms=self._clock.now_ms(),
            operators=self.pipeline.progress(),
            finished=self.pipeline.finished_report(),
        )

    def final_checkpoint(self) -> Checkpoint:
        """The checkpoint a finished pipeline ends with (SPEC G3): as of its last committed
        batch, nothing pending, every output's last commit; a restart finds it and does nothing."""
        if self.last_committed is None:
            raise ContextStateError("a final checkpoint needs a committed batch")
        commits = {op.name: op.sink.last_commit() for op in self.pipeline.graph.outputs}
        return dataclasses.replace(self.checkpoint(self.last_committed, ()),
                                   final=FinalRecord(self.pipeline.finished_after(), commits))
