"""What a checkpoint location says of its pipeline, read by any process (SPEC I1).

``read_status`` reads the lease (who holds the location, since when, how fresh), the progress
records the running driver keeps there (the last batch, its delays, the backlog, each
operator's state, excluded executors), the newest checkpoint (finished inputs, whether the
pipeline finished) and the last stop's outcome. It changes nothing, and works on a location
nobody holds, or that holds nothing at all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from batchline.batch_time import format_batch_time
from batchline.checkpoint.lease import Lease, LeaseRecord
from batchline.checkpoint.storage import CheckpointStorage
from batchline.checkpoint.writer import load_latest_checkpoint
from batchline.clock import Clock
from batchline.observe.control import StopHow, StopOutcome, read_stop_outcome
from batchline.observe.progress_log import read_progress
from batchline.scheduler.progress import COMPLETED, BatchProgress

__all__ = ["PipelineStatus", "read_status", "last_run_ended", "own_stop", "RUNNING", "STOPPED", "FAILED",
           "FINISHED", "EMPTY", "ABANDONED"]

RUNNING = "running"
STOPPED = "stopped"
FAILED = "failed"
ABANDONED = "abandoned"
FINISHED = "finished"
EMPTY = "empty"

_ABANDONED_NOTE = "its driver died without releasing the lease"


def own_stop(lease: LeaseRecord | None, stop: StopOutcome | None) -> StopOutcome | None:
    """The stop record of the run that last held the lease; None when the record is stale (an
    earlier run wrote it: a driver that died holding the lease writes none). Without a lease
    file (a location of an older format) the record is taken as it is."""
    if stop is None or lease is None:
        return stop
    if stop.holder == lease.holder:
        return stop
    return None


def _how_it_stopped(stop: StopOutcome) -> str:
    at = format_batch_time(stop.stopped_at_ms)
    reason = f" ({stop.reason})" if stop.reason else ""
    return {
        StopHow.GRACEFUL: f"stopped gracefully at {at}",
        StopHow.GRACEFUL_TIMED_OUT: f"stopped at {at} after its graceful stop timed out",
        StopHow.IMMEDIATE: f"stopped immediately at {at}",
        StopHow.FINISHED: f"finished at {at}",
    }.get(stop.how, f"failed at {at}{reason}")


def last_run_ended(lease: LeaseRecord | None, stop: StopOutcome | None) -> str | None:
    """How the last run at a location ended, as a phrase (``stopped gracefully at T``, ``was
    abandoned: ...``), from the lease and stop record read before a new driver takes the
    lease; None when no run ever held it."""
    if lease is None:
        return _how_it_stopped(stop) if stop is not None else None
    if not lease.released:
        return f"was abandoned: {_ABANDONED_NOTE}"
    own = own_stop(lease, stop)
    if own is not None:
        return _how_it_stopped(own)
    at = f" at {format_batch_time(lease.renewed_at_ms)}" if lease.renewed_at_ms else ""
    return f"stopped{at}"


@dataclass(frozen=True)
class PipelineStatus:
    location: str
    state: str
    """``running``, ``stopped``, ``failed`` (the last run stopped on an error, or its start was
    refused), ``finished``, ``empty`` (nothing at all there: no checkpoint, lease or progress),
    or ``abandoned`` (the driver died without releasing its lease; the next start takes over)."""
    lease: LeaseRecord | None
    lease_age_ms: int | None
    """Since the holder last renewed the lease."""
    last_batch: BatchProgress | None
    """The last completed batch."""
    checkpoint_time: int | None
    finished_inputs: dict[str, int] = field(default_factory=dict)
    """Inputs that ended, with the batch after which they did, as of the newest checkpoint."""
    finished: bool = False
    last_stop: StopOutcome | None = None
    """How the run that last held the lease stopped (None: it never said, e.g. it was abandoned)."""
    failed_batches: tuple[BatchProgress, ...] = ()
    """Batches after the last completed one that failed, or that a stop cancelled."""

    @property
    def backlog(self) -> int:
        return self.last_batch.backlog if self.last_batch is not None else 0

    def to_json(self) -> dict[str, Any]:
        payload = dataclasses.asdict(self)
        payload["last_batch"] = self.last_batch.to_json() if self.last_batch is not None else None
        payload["failed_batches"] = [r.to_json() for r in self.failed_batches]
        payload["last_stop"] = self.last_stop.to_json() if self.last_stop is not None else None
        payload["backlog"] = self.backlog
        return payload

    def describe(self) -> str:
        """The status for people, a fact per line."""
        explained = {ABANDONED: f"abandoned: {_ABANDONED_NOTE}; the next start takes "
                                "over and re-runs what was not committed",
                     EMPTY: "nothing there: no checkpoint, lease or progress; check the path"}
        lines = [f"{self.location}: {explained.get(self.state, self.state)}"]
        lease = self.lease
        if lease is not None:
            since = f" since {format_batch_time(lease.acquired_at_ms)}" if lease.acquired_at_ms else ""
            age = f", lease renewed {self.lease_age_ms / 1000:.1f} s ago" if self.lease_age_ms is not None else ""
            role = "holder" if self.state == RUNNING else "last holder"
            lines.append(f"  {role}: {lease.describe()}{since}{age}")
        batch = self.last_batch
        if batch is not None:
            lines.append(f"  last completed batch: {batch.batch_time_iso}, {batch.records} records, "
                         f"{batch.dead_letters} dead letters, scheduling delay {batch.scheduling_delay_ms} ms, "
                         f"processing {batch.processing_ms} ms, total delay {batch.total_delay_ms} ms"
                         + (f", {batch.attempts} attempts" if batch.attempts > 1 else ""))
            lines.append(f"  backlog: {batch.backlog} batches")
            for op in batch.state_operators:
                lines.append(f"  operator {op.operator}: {op.state_keys} keys in state, about {op.state_bytes} bytes"
                             + (f", {op.partitions_finished} partitions finished" if op.partitions_finished else ""))
                if op.rerun_note is not None:
                    lines.append(f"    run again by a restart, which read: {op.rerun_note}")
            if batch.watermark_ms is not None:
                lines.append(f"  watermark: {format_batch_time(batch.watermark_ms)}")
            for executor in batch.excluded_executors:
                lines.append(f"  excluded executor {executor.executor_id} on {executor.host} since "
                             f"{format_batch_time(executor.since_ms)}")
            if not batch.excluded_executors:
                lines.append("  excluded executors: none")
            for error in batch.errors:
                lines.append(f"  error: {error}")
        elif self.state != EMPTY:
            lines.append("  no batch has completed yet")
        for failed in self.failed_batches:
            lines.append(f"  batch {failed.batch_time_iso} {failed.status}: {'; '.join(failed.errors) or 'no cause'}")
        if self.checkpoint_time is not None:
            lines.append(f"  newest checkpoint: batch {format_batch_time(self.checkpoint_time)}")
        for name, after in sorted(self.finished_inputs.items()):
            lines.append(f"  input {name} finished after batch {format_batch_time(after)}")
        if self.finished:
            lines.append("  the pipeline finished: every input ended and every output committed")
        if self.last_stop is not None and self.state != RUNNING:
            reason = f" ({self.last_stop.reason})" if self.last_stop.reason else ""
            lines.append(f"  last stop: {self.last_stop.how.value}{reason}, at "
                         f"{format_batch_time(self.last_stop.stopped_at_ms)}")
        return "\n".join(lines)


def read_status(storage: CheckpointStorage, clock: Clock) -> PipelineStatus:
    lease = Lease(storage, clock).read()
    now = clock.now_ms()
    checkpoint, _ = load_latest_checkpoint(storage)
    records = read_progress(storage)
    last = next((r for r in reversed(records) if r.status == COMPLETED), None)
    finished_inputs = checkpoint.finished_inputs if checkpoint is not None else {}
    finished = checkpoint is not None and checkpoint.final is not None
    if lease is not None and lease.is_live(now):
        state = RUNNING
    elif finished:
        state = FINISHED
    elif lease is None and checkpoint is None and last is None:
        state = EMPTY
    elif lease is not None and not lease.released:
        state = ABANDONED
    else:
        state = STOPPED
    stop = own_stop(lease, read_stop_outcome(storage))
    if state == STOPPED and stop is not None and stop.how is StopHow.FAILED:
        state = FAILED
    age = now - lease.renewed_at_ms if lease is not None and lease.renewed_at_ms is not None else None
    after = tuple(r for r in records if r.status != COMPLETED and (last is None or r.batch_time > last.batch_time))
    return PipelineStatus(storage.url, state, lease, age, last, checkpoint.time if checkpoint else None,
                          finished_inputs, finished, stop, after)
