"""Everything a pipeline keeps at its checkpoint location, behind one object."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batchline.checkpoint.events import EventPurger, JobEventStore
from batchline.checkpoint.lease import Lease
from batchline.checkpoint.model import Checkpoint, OperatorProgress
from batchline.checkpoint.storage import CheckpointStorage
from batchline.checkpoint.writer import CheckpointWriter, load_latest_checkpoint
from batchline.clock import Clock
from batchline.errors import ContextStateError

__all__ = ["CheckpointSettings", "CheckpointManager", "default_checkpoint_interval_ms"]

logger = logging.getLogger(__name__)

DEFAULT_KEEP = 10
DEFAULT_MIN_INTERVAL_MS = 10_000


def default_checkpoint_interval_ms(batch_interval_ms: int) -> int:
    """The smallest multiple of the batch interval that is at least ten seconds."""
    return -(-DEFAULT_MIN_INTERVAL_MS // batch_interval_ms) * batch_interval_ms


@dataclass(frozen=True)
class CheckpointSettings:
    location: str
    interval_ms: int
    keep: int = DEFAULT_KEEP
    lease_ttl_ms: int = 15_000
    storage_options: dict[str, Any] = field(default_factory=dict)
    batch_interval_ms: int | None = None
    """Lets the job event store tell a torn record at the tail from corruption before it."""


class CheckpointManager:
    def __init__(self, settings: CheckpointSettings, clock: Clock,
                 on_checkpoint_written: Callable[[int, int, int], None] | None = None) -> None:
        self.settings = settings
        self.storage = CheckpointStorage(settings.location, settings.storage_options)
        self.lease = Lease(self.storage, clock, settings.lease_ttl_ms)
        self.events = JobEventStore(self.storage, settings.batch_interval_ms)
        self.event_purger = EventPurger(self.events)
        self._clock = clock
        self.writer: CheckpointWriter | None = None
        self._on_checkpoint_written = on_checkpoint_written
        """Told each checkpoint written: its time, how long the write took (ms) and its size."""

    @property
    def interval_ms(self) -> int:
        return self.settings.interval_ms

    def open(self) -> Checkpoint | None:
        """Take the lease and load the newest valid checkpoint (None: start fresh)."""
        self.lease.acquire()
        checkpoint, retained = load_latest_checkpoint(self.storage)
        self.writer = CheckpointWriter(self.storage, self._clock, self.settings.keep, self.lease.check,
                                       known=retained, on_written=self._on_checkpoint_written)
        return checkpoint

    def checkpoint_writer(self) -> CheckpointWriter:
        if self.writer is None:
            raise ContextStateError(f"the checkpoint location {self.storage.url} is not open; call open() first")
        return self.writer

    def log_batch(self, batch_time: int, allocations: dict[str, dict[str, Any]]) -> None:
        self.lease.check()
        self.events.batch_started(batch_time, allocations, self.lease.token)

    def commit_batch(self, batch_time: int, operators: dict[str, OperatorProgress] | None = None,
                     lease_checked: bool = False) -> None:
        """The commit marker, under the lease: checked here unless the caller just did
        (``lease_checked``, beside the batch's other commits) and this driver has not let it
        go since (a stop releases it)."""
        if not lease_checked or self.lease.token is None:
            self.lease.check()
        self.events.batch_completed(batch_time, self.lease.token, operators)

    def purge_events_before(self, threshold_time: int) -> None:
        """Delete the job event records of batches before ``threshold_time`` on the purger's
        thread: the caller (the generator's loop) does not wait for the deletes."""
        self.event_purger.request(threshold_time)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.stop()
        self.event_purger.stop()
        self.lease.release()
