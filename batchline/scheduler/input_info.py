"""Per-batch, per-input statistics (Spark's InputInfoTracker)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StreamInputInfo", "InputInfoTracker"]


@dataclass(frozen=True)
class StreamInputInfo:
    """What one input contributed to one batch."""

    input_id: int
    input_name: str
    num_records: int | None
    """None until known: a file source learns it when the batch reads its files."""
    dead_letters: int = 0
    late_records: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    lag: int | None = None
    """Records waiting at the source beyond this batch, when the source knows (Kafka)."""


class InputInfoTracker:
    """Per batch: what each input contributed (sources report while the batch is planned and
    as its jobs count their rows)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_batch: dict[int, dict[int, StreamInputInfo]] = {}

    def report(self, batch_time: int, info: StreamInputInfo) -> None:
        """Record (or replace, once counts are known) an input's statistics for a batch."""
        with self._lock:
            self._by_batch.setdefault(batch_time, {})[info.input_id] = info

    def get_info(self, batch_time: int) -> dict[int, StreamInputInfo]:
        with self._lock:
            return dict(self._by_batch.get(batch_time, {}))

    def cleanup(self, threshold_time: int) -> None:
        """Forget batches strictly older than ``threshold_time``."""
        with self._lock:
            for batch_time in [t for t in self._by_batch if t < threshold_time]:
                del self._by_batch[batch_time]

