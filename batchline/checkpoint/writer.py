"""Writes checkpoints on a thread of its own, so batch generation never waits (SPEC E2, E3)."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batchline.checkpoint.migrations import upgrade
from batchline.checkpoint.model import Checkpoint
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, seal, unseal
from batchline.clock import Clock

__all__ = ["CheckpointWriter", "load_latest_checkpoint", "read_checkpoint", "MANIFEST", "CHECKPOINTS"]

logger = logging.getLogger(__name__)

MANIFEST = "_manifest.json"
CHECKPOINTS = "checkpoints"
_STOP = object()


@dataclass(frozen=True)
class _Request:
    checkpoint: Checkpoint
    on_written: Callable[[Checkpoint], None] | None


class CheckpointWriter:
    """Each checkpoint goes to a new file; then the manifest, naming the newest ``keep``
    checkpoints, is replaced. Failed writes are retried with backoff and logged.

    Step 1: check the lease (a fenced driver writes nothing).
    Step 2: write ``checkpoints/checkpoint-<time>-<unique>.json`` (immutable).
    Step 3: replace the manifest with the new list, newest first.
    Step 4: delete checkpoint files that fell off the list.
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        clock: Clock,
        keep: int,
        check_lease: Callable[[], None],
        retries: int = 3,
        retry_backoff_s: float = 0.2,
        known: list[dict[str, Any]] | None = None,
        on_written: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._keep = keep
        self._check_lease = check_lease
        self._retries = retries
        self._backoff_s = retry_backoff_s
        self._entries: list[dict[str, Any]] = list(known or [])
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="batchline-checkpoint-writer", daemon=True)
        self._thread.start()
        self.write_durations_ms: deque[float] = deque(maxlen=1000)
        """The latest writes' durations (bounded: a pipeline runs for months)."""
        self._on_written = on_written
        """Told each checkpoint written: its time, how long the write took (ms) and its size."""

    def write(self, checkpoint: Checkpoint, on_written: Callable[[Checkpoint], None] | None = None) -> None:
        self._queue.put(_Request(checkpoint, on_written))
        logger.debug("Submitted checkpoint of time %d ms to the writer queue", checkpoint.time)

    def write_now(self, checkpoint: Checkpoint) -> None:
        """Write on the caller's thread (the first checkpoint, before any batch runs)."""
        self._write_with_retries(checkpoint)

    def stop(self) -> None:
        """Write what is queued, then stop."""
        self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            backlog = [self._queue.get()]
            while not self._queue.empty():  # coalesce: only the newest checkpoint is worth writing
                backlog.append(self._queue.get())
            stopping = _STOP in backlog
            requests = [r for r in backlog if isinstance(r, _Request)]
            if not requests:
                continue
            newest = max(requests, key=lambda r: r.checkpoint.time)
            if len(requests) > 1:
                logger.debug("Writing only the newest of %d queued checkpoints (time %d ms)", len(requests),
                            newest.checkpoint.time)
            try:
                self._write_with_retries(newest.checkpoint)
            except Exception:
                logger.exception("Could not write checkpoint for time %d ms; the next one will try again",
                                 newest.checkpoint.time)
                continue
            for request in requests:  # a newer checkpoint covers the older ones
                if request.on_written is not None:
                    request.on_written(request.checkpoint)

    def _write_with_retries(self, checkpoint: Checkpoint) -> None:
        for attempt in range(1, self._retries + 1):
            try:
                self._write(checkpoint)
                return
            except OSError as error:
                if attempt == self._retries:
                    raise
                logger.warning("Writing checkpoint for time %d ms failed (attempt %d of %d): %s; retrying",
                               checkpoint.time, attempt, self._retries, error)
                time.sleep(self._backoff_s * 2 ** (attempt - 1))

    def _write(self, checkpoint: Checkpoint) -> None:
        began = time.perf_counter()
        # Step 1
        self._check_lease()
        # Step 2
        name = f"checkpoint-{checkpoint.time:015d}-{uuid.uuid4().hex[:8]}.json"
        data = seal(checkpoint.to_json())
        self._storage.write_new(f"{CHECKPOINTS}/{name}", data)
        # Step 3
        entry = {"name": name, "time": checkpoint.time, "needs_from": min([checkpoint.time, *checkpoint.pending_times])}
        # A second checkpoint for the same time (written again once its batch completed)
        # replaces the first, so that ``keep`` counts distinct times.
        replaced = [e for e in self._entries if e["time"] == checkpoint.time]
        entries = [entry, *(e for e in self._entries if e["time"] != checkpoint.time)]
        kept, dropped = entries[: self._keep], entries[self._keep:] + replaced
        self._storage.replace(MANIFEST, seal({"checkpoints": kept}))
        self._entries = kept
        # Step 4
        for old in dropped:
            self._storage.delete(f"{CHECKPOINTS}/{old['name']}")
        took_ms = (time.perf_counter() - began) * 1000
        self.write_durations_ms.append(took_ms)
        if self._on_written is not None:
            try:
                self._on_written(checkpoint.time, round(took_ms), len(data))
            except Exception:
                logger.exception("Reporting the checkpoint written for time %d ms failed", checkpoint.time)
        logger.debug("Checkpoint for time %d ms saved to %s (%d bytes, %.0f ms)",
                    checkpoint.time, self._storage.full_url(f"{CHECKPOINTS}/{name}"), len(data), took_ms)

    @property
    def retained(self) -> list[str]:
        return [entry["name"] for entry in self._entries]

    def oldest_needed_time(self) -> int | None:
        """The earliest batch any retained checkpoint may re-run: the batch log must reach back there."""
        return min((int(e["needs_from"]) for e in self._entries), default=None)


def _entries_from_files(storage: CheckpointStorage) -> list[dict[str, Any]]:
    names = sorted((n for n in storage.list_names(CHECKPOINTS) if n.startswith("checkpoint-")), reverse=True)
    # Without the manifest, "needs_from" is unknown: 0 keeps the whole batch log.
    return [{"name": n, "time": int(n.split("-")[1]), "needs_from": 0} for n in names]


def read_checkpoint(storage: CheckpointStorage, name: str) -> Checkpoint:
    """The checkpoint file ``name``, read in whatever format version it was written."""
    relative = f"{CHECKPOINTS}/{name}"
    return Checkpoint.from_json(upgrade(unseal(storage.read(relative), name), storage.full_url(relative)))


def load_latest_checkpoint(storage: CheckpointStorage) -> tuple[Checkpoint | None, list[dict[str, Any]]]:
    """The newest valid checkpoint and the manifest entries of the retained ones, newest first.

    A torn or corrupt newest checkpoint falls back to the previous valid one, with a WARN
    line; an unreadable manifest falls back to the checkpoint files themselves.
    """
    entries: list[dict[str, Any]] = []
    manifest_read = False
    try:
        manifest = storage.read_sealed_if_present(MANIFEST)
        if manifest is not None:
            manifest_read = True
            entries = list(manifest["checkpoints"])
    except (CorruptFileError, KeyError, TypeError) as error:
        logger.warning("The checkpoint manifest is unreadable (%s); looking at the checkpoint files", error)
    if not entries:
        entries = _entries_from_files(storage)
        if entries and not manifest_read:
            logger.warning("The checkpoint manifest %s is missing, but checkpoint files are there; reading them, "
                           "newest first", storage.full_url(MANIFEST))
    for index, entry in enumerate(entries):
        name = entry["name"]
        try:
            return read_checkpoint(storage, name), entries[index:]
        except (CorruptFileError, FileNotFoundError, TypeError, KeyError, json.JSONDecodeError) as error:
            following = entries[index + 1]["name"] if index + 1 < len(entries) else None
            logger.warning("Checkpoint %s is torn or corrupt (%s); falling back to %s",
                           name, error, following or "no checkpoint: starting fresh")
    return None, []
