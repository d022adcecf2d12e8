"""Stopping a running pipeline from any terminal, through its checkpoint location (SPEC I1).

``batchline stop LOCATION`` writes a stop request naming the lease token of the driver that
holds the location; that driver polls for it (every batch interval, at most every 2 s),
stops gracefully or immediately as asked, and writes how it ended. A request naming an
older token is ignored: it was meant for a driver that is gone, so it never stops the one
that took over. Nothing here relies on listing: both files have fixed names.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from batchline.checkpoint.lease import Lease, LeaseRecord
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, seal, unseal
from batchline.clock import Clock
from batchline.errors import BatchlineError

__all__ = [
    "STOP_REQUEST_FILE",
    "STOP_OUTCOME_FILE",
    "NotRunningError",
    "StopHow",
    "StopOutcome",
    "StopRequest",
    "StopWatcher",
    "read_stop_outcome",
    "record_stop_outcome",
    "request_stop",
    "running_holder",
]

logger = logging.getLogger(__name__)

STOP_REQUEST_FILE = "_stop_request.json"
STOP_OUTCOME_FILE = "_stop_outcome.json"
MAX_POLL_MS = 2_000


class NotRunningError(BatchlineError):
    """No live driver holds the checkpoint location."""


@dataclass(frozen=True)
class StopRequest:
    request_id: str
    immediate: bool
    token: int
    """The lease token of the driver asked to stop."""
    requested_at_ms: int
    requested_by: str
    """host:pid of the process that asked."""


class StopHow(enum.Enum):
    GRACEFUL = "graceful"
    """Every received record was processed and every generated batch committed."""
    GRACEFUL_TIMED_OUT = "graceful, timed out"
    """The graceful-stop timeout cut it short: what was not committed runs at the next start."""
    IMMEDIATE = "immediate"
    """Running batches were cancelled; they run again at the next start."""
    FINISHED = "finished"
    """Every input had ended: the pipeline finished and wrote its final checkpoint."""
    FAILED = "failed"
    """A batch failed for good, or the stop itself failed: see the driver's log."""


@dataclass(frozen=True)
class StopOutcome:
    request_id: str
    holder: str
    how: StopHow
    stopped_at_ms: int
    last_committed: int | None
    unfinished: list[int] = field(default_factory=list)
    reason: str | None = None
    """Why a failed run stopped: the error, or ``start refused: ...`` for a start that never ran."""

    def to_json(self) -> dict[str, Any]:
        """The record as written: ``how`` as its text, the only form the file has ever had."""
        return {**asdict(self), "how": self.how.value}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> StopOutcome:
        """Fields a later release may add are ignored, as the lease's are. A way of stopping
        this release does not know reads as failed: every message about a stop always said
        "failed" for one, so a reader is told to look at the log rather than told it went well."""
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in payload.items() if k in names}
        if "how" in known:
            known["how"] = next((h for h in StopHow if h.value == known["how"]), StopHow.FAILED)
        return cls(**known)


def running_holder(storage: CheckpointStorage, clock: Clock) -> LeaseRecord | None:
    """The lease of the driver running at the location, or None when nobody runs there (no
    lease, released, expired, or its process is known to be dead)."""
    record = Lease(storage, clock).read()
    return record if record is not None and record.is_live(clock.now_ms()) else None


def request_stop(storage: CheckpointStorage, clock: Clock, immediate: bool) -> tuple[StopRequest, LeaseRecord]:
    """Ask the driver holding the location to stop; NotRunningError when none does."""
    holder = running_holder(storage, clock)
    if holder is None:
        raise NotRunningError(f"no pipeline is running at {storage.url}: no driver holds its lease. "
                              f"`batchline status {storage.url}` shows how it last ended")
    request = StopRequest(uuid.uuid4().hex, immediate, holder.token, clock.now_ms(),
                          f"{socket.gethostname()}:{os.getpid()}")
    storage.replace(STOP_REQUEST_FILE, seal(asdict(request)))
    return request, holder


def read_stop_outcome(storage: CheckpointStorage) -> StopOutcome | None:
    try:
        data = storage.read_if_present(STOP_OUTCOME_FILE)
        return None if data is None else StopOutcome.from_json(unseal(data, STOP_OUTCOME_FILE))
    except (CorruptFileError, TypeError):
        return None


def record_stop_outcome(storage: CheckpointStorage, outcome: StopOutcome) -> None:
    """Write how the run at the location ended, for ``batchline stop``'s requester and for
    ``batchline status``; written while the driver still holds the lease, so the record is the
    holder's own. A failed write is logged, not raised: the stop goes on."""
    try:
        storage.replace(STOP_OUTCOME_FILE, seal(outcome.to_json()))
    except OSError as error:
        logger.warning("Could not record how the pipeline stopped at %s (%s); `batchline status` shows the lease "
                       "released and the last batch", storage.full_url(STOP_OUTCOME_FILE), error)


def _read_request(storage: CheckpointStorage) -> StopRequest | None:
    try:
        data = storage.read_if_present(STOP_REQUEST_FILE)
        return None if data is None else StopRequest(**unseal(data, STOP_REQUEST_FILE))
    except (CorruptFileError, TypeError) as error:
        logger.warning("Ignoring an unreadable stop request at %s (%s)", storage.full_url(STOP_REQUEST_FILE), error)
        return None


class StopWatcher:
    """The driver's side: polls for stop requests meant for its lease token and hands each to
    ``on_request`` once, until closed; ``report`` writes how the stop ended for the process that
    asked."""

    def __init__(self, storage: CheckpointStorage, clock: Clock, token: Callable[[], int | None], poll_ms: int,
                 on_request: Callable[[StopRequest], None]) -> None:
        self._storage = storage
        self._clock = clock
        self._token = token
        self._poll_ms = max(50, min(poll_ms, MAX_POLL_MS))
        self._on_request = on_request
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batchline-stop-watcher", daemon=True)
        self._handled: set[str] = set()

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._done.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def poll_once(self) -> StopRequest | None:
        """Look for a request meant for this driver; hand it on (once) and return it when one is there."""
        request = _read_request(self._storage)
        token = self._token()
        if request is None or token is None or request.token != token or request.request_id in self._handled:
            return None
        self._handled.add(request.request_id)
        logger.warning("%s asked this pipeline to stop %s (request %s); stopping", request.requested_by,
                       "immediately" if request.immediate else "gracefully", request.request_id)
        self._on_request(request)
        return request

    def report(self, outcome: StopOutcome) -> None:
        record_stop_outcome(self._storage, outcome)

    def _run(self) -> None:
        next_poll = self._clock.now_ms() + self._poll_ms
        while not self._done.is_set():
            if not self._clock.wait_until(next_poll, self._done):
                return
            next_poll = self._clock.now_ms() + self._poll_ms
            try:
                self.poll_once()  # and on: a second request during the stop is answered too
            except OSError as error:
                logger.warning("Could not look for a stop request at %s (%s); looking again",
                               self._storage.full_url(STOP_REQUEST_FILE), error)
