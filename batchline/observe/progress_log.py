"""The last progress records, kept at the checkpoint location so that another process
(``batchline status``, a dashboard of its own) can read them (SPEC I3).

One file, ``_progress.json``, replaced after each batch with the newest ``keep`` records,
oldest first. It is written by a listener, off the batches' threads; a write that fails is
logged and tried again with the next record, and never stops the pipeline.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from typing import Any

from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, seal, unseal
from batchline.scheduler.listener import StreamingListener
from batchline.scheduler.progress import BatchProgress

__all__ = ["PROGRESS_FILE", "ProgressLog", "read_progress"]

logger = logging.getLogger(__name__)

PROGRESS_FILE = "_progress.json"


class ProgressLog(StreamingListener):
    """Writes the newest ``keep`` records to ``storage`` after each batch."""

    def __init__(self, storage: CheckpointStorage, keep: int, earlier: list[BatchProgress] | None = None) -> None:
        self._storage = storage
        # As JSON, made once per record: every batch rewrites all of them.
        self._records: deque[dict[str, Any]] = deque((r.to_json() for r in earlier or ()), maxlen=max(1, keep))
        self._failing = False

    def on_progress(self, progress: BatchProgress) -> None:
        self._records.append(progress.to_json())
        try:
            self._storage.replace(PROGRESS_FILE, seal({"progress": list(self._records)}))
        except OSError as error:
            if not self._failing:
                logger.warning("Could not write the progress records to %s (%s); batches go on, and the next "
                               "batch tries again", self._storage.full_url(PROGRESS_FILE), error)
            self._failing = True
        else:
            if self._failing:
                logger.info("Progress records are written to %s again", self._storage.full_url(PROGRESS_FILE))
            self._failing = False

    def __repr__(self) -> str:
        return f"ProgressLog({self._storage.full_url(PROGRESS_FILE)})"


def read_progress(storage: CheckpointStorage) -> list[BatchProgress]:
    """The records kept at the location, oldest first; none when there are none (or they are torn)."""
    try:
        data = storage.read_if_present(PROGRESS_FILE)
        if data is None:
            return []
        payload = unseal(data, PROGRESS_FILE)
        return [BatchProgress.from_json(record) for record in payload.get("progress", ())]
    except (CorruptFileError, TypeError, KeyError, json.JSONDecodeError) as error:
        logger.warning("The progress records at %s are unreadable (%s); showing none",
                       storage.full_url(PROGRESS_FILE), error)
        return []
