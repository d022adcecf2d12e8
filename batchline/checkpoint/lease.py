"""One writer per checkpoint location: a lease with a fencing token (SPEC E5).

The lease file names its holder and a token that grows with every acquisition. A driver
checks, before every commit, that the lease still carries its own token; a driver that was
paused or cut off while another took over sees a larger token and stops instead of
committing. A holder that is gone (its lease expired, or its process is dead on this host)
can be taken over at once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from batchline.batch_time import format_batch_time
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, seal, unseal
from batchline.clock import Clock
from batchline.errors import BatchlineError

__all__ = ["Lease", "LeaseRecord", "CheckpointLockedError", "FencedError", "check_token"]

logger = logging.getLogger(__name__)

LEASE_FILE = "_lease.json"
_WRITTEN_BY_A_DRIVER = ("_manifest.json", "checkpoints")
"""What a driver writes at a location after taking its lease: a location holding one was used."""


class CheckpointLockedError(BatchlineError):
    """Another live driver holds the checkpoint location."""


class FencedError(BatchlineError):
    """This driver's lease was taken over: it must not commit anything more."""


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    host: str
    pid: int
    token: int
    expires_at_ms: int
    acquired_at_ms: int | None = None
    """When the holder took the lease (None in files of earlier releases)."""
    renewed_at_ms: int | None = None
    """When the holder last wrote the lease."""

    @property
    def released(self) -> bool:
        """The holder gave the lease up when it stopped (it expires at 0)."""
        return self.expires_at_ms == 0

    def is_live(self, now_ms: int) -> bool:
        """A driver holds the location: the lease is neither released nor expired, and its holder
        is not known to be dead."""
        return not self.released and self.expires_at_ms > now_ms and not _holder_is_gone(self)

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> LeaseRecord:
        """Fields a later release may add are ignored, so that a live lease never reads as unreadable."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in payload.items() if k in names})

    def describe(self) -> str:
        return f"{self.holder} (pid {self.pid} on {self.host}, token {self.token})"


def _holder_is_gone(record: LeaseRecord) -> bool:
    """The holder's process is known to be dead: it ran on this host and is no more."""
    if record.host != socket.gethostname():
        return False
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a killed child its parent has not reaped yet is a zombie: gone all the same
        with open(f"/proc/{record.pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


class Lease:
    def __init__(self, storage: CheckpointStorage, clock: Clock, ttl_ms: int = 15_000) -> None:
        self._storage = storage
        self._clock = clock
        self.ttl_ms = ttl_ms
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.token: int | None = None
        self._acquired_at_ms: int | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lock = threading.Lock()

    def read(self) -> LeaseRecord | None:
        return self._read()[0]

    def _read(self) -> tuple[LeaseRecord | None, str | None]:
        """The lease, or None with what is wrong with the file (None: there is none)."""
        data = self._storage.read_if_present(LEASE_FILE)
        if data is None:
            return None, None
        try:
            return LeaseRecord.from_json(unseal(data, LEASE_FILE)), None
        except (CorruptFileError, TypeError) as error:
            return None, str(error)

    def _first_token(self, current: LeaseRecord | None, damage: str | None) -> int:
        """The token this acquisition takes: one more than the lease's. Without a readable lease
        at a location that was used before (its lease damaged or deleted), the count is lost: the
        clock in milliseconds stands in, larger than any count, so that a sink that fences older
        tokens still refuses the drivers before and accepts this one."""
        if current is not None:
            return current.token + 1
        used = any(self._storage.exists(name) for name in _WRITTEN_BY_A_DRIVER)
        if damage is None and not used:
            return 1
        logger.warning(
            "The lease file %s is %s; taking the location as free, with a fencing token from the clock (%d). Make "
            "sure no other driver runs on %s", self._storage.full_url(LEASE_FILE),
            f"unreadable ({damage})" if damage is not None else "missing at a location that was used before",
            self._clock.now_ms(), self._storage.url)
        return max(1, self._clock.now_ms())

    def acquire(self) -> int:
        """Take the lease or raise CheckpointLockedError naming the live holder."""
        current, damage = self._read()
        now = self._clock.now_ms()
        if current is not None and current.holder != self.holder:
            expired = current.expires_at_ms <= now
            if not expired and not _holder_is_gone(current):
                raise CheckpointLockedError(
                    f"checkpoint location {self._storage.url} is held by driver {current.describe()} "
                    f"until {format_batch_time(current.expires_at_ms)}; stop that driver, or wait for "
                    "its lease to expire, before starting another on the same location"
                )
            logger.info("Taking over the checkpoint lease from %s", current.describe())
        token = self._first_token(current, damage)
        self._acquired_at_ms = now
        self._write(token)
        confirmed = self.read()
        if confirmed is None or confirmed.holder != self.holder:
            other = confirmed.describe() if confirmed else "nobody"
            raise CheckpointLockedError(
                f"another driver took checkpoint location {self._storage.url} at the same moment: {other}"
            )
        self.token = token
        self._renewer = threading.Thread(target=self._renew_loop, name="batchline-lease", daemon=True)
        self._renewer.start()
        logger.debug("Holding checkpoint lease on %s with token %d", self._storage.url, token)
        return token

    def check(self) -> None:
        """Raise FencedError unless the lease still carries this driver's token."""
        if self.token is None:
            raise FencedError(
                f"this driver released its lease on {self._storage.url} (it is stopping), so it commits nothing "
                "more; what it did not commit runs again at the next start"
            )
        current, damage = self._read()
        if current is None or current.holder != self.holder or current.token != self.token:
            taker = (current.describe() if current else f"no driver (the lease file is unreadable: {damage})"
                     if damage else "no driver (the lease file is gone)")
            raise FencedError(
                f"this driver ({self.holder}, token {self.token}) lost its lease on "
                f"{self._storage.url} to {taker}; it stops without committing. Run one driver per "
                "checkpoint location"
            )

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        with self._lock:
            current = self.read()
            if self.token is not None and current is not None and current.holder == self.holder:
                # Expired rather than deleted: the next holder's token must still be larger.
                try:
                    self._write(self.token, expires_at_ms=0)
                except OSError as error:
                    # A stop goes on (the location may be full): the lease lapses by itself.
                    logger.warning("Could not release the checkpoint lease on %s (%s); it expires at %s, and a "
                                   "start on this host takes it over as soon as this process has ended",
                                   self._storage.url, error, format_batch_time(current.expires_at_ms))
                else:
                    logger.debug("Released checkpoint lease on %s", self._storage.url)
            self.token = None

    def _write(self, token: int, expires_at_ms: int | None = None) -> None:
        now = self._clock.now_ms()
        if expires_at_ms is None:
            expires_at_ms = now + self.ttl_ms
        record = LeaseRecord(self.holder, socket.gethostname(), os.getpid(), token, expires_at_ms,
                             self._acquired_at_ms, now)
        self._storage.replace(LEASE_FILE, seal(asdict(record)))

    def _renew_loop(self) -> None:
        # On a fixed schedule (a third of the TTL), so that slow renewals never drift late.
        next_renewal = self._clock.now_ms() + self.ttl_ms // 3
        while not self._stop.is_set():
            if not self._clock.wait_until(next_renewal, self._stop) or self._stop.is_set():
                return
            next_renewal += self.ttl_ms // 3
            with self._lock:
                if self.token is None:
                    return
                try:
                    self.check()
                    self._write(self.token)
                except FencedError as error:
                    logger.error("%s", error)
                    return
                except OSError as error:
                    logger.warning("Could not renew the checkpoint lease (%s); retrying", error)


def check_token(storage: CheckpointStorage, token: int, what: str) -> None:
    """Raise FencedError unless the location's lease still carries ``token``: what a task checks
    before it records work done for its driver (a driver taken over must not record any)."""
    data = storage.read_if_present(LEASE_FILE)
    current = LeaseRecord.from_json(unseal(data, LEASE_FILE)) if data is not None else None
    if current is None or current.token != token:
        raise FencedError(
            f"{what}: the driver with lease token {token} lost its lease on {storage.url} (now "
            f"{current.describe() if current else 'no holder'}); its work is not recorded. The current driver "
            "runs the batch again"
        )
