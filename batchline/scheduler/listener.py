"""Batch lifecycle events for listeners (SPEC A4, H2, H3): submitted, started, retrying, completed."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from batchline.scheduler.input_info import StreamInputInfo

__all__ = ["BatchInfo", "ExcludedExecutor", "StreamingListener", "ListenerBus"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExcludedExecutor:
    """An executor Spark stopped scheduling tasks on after too many failures (exclude-on-failure)."""

    executor_id: str
    host: str
    since_ms: int
    """When batchline first saw it excluded (the end of that batch), in epoch milliseconds."""


@dataclass(frozen=True)
class BatchInfo:
    batch_time: int
    submission_time: int
    processing_start_time: int | None = None
    processing_end_time: int | None = None
    input_infos: dict[int, StreamInputInfo] = field(default_factory=dict)
    failure: str | None = None
    """Why the batch failed; while it is retrying (``on_batch_retrying``), why the last run failed."""
    state_operators: dict[str, Any] = field(default_factory=dict)
    """Each stateful operator's ``StateOperatorProgress`` for the batch, by operator name."""
    attempts: int = 0
    """How many times the batch's jobs have run so far: 0 when submitted, 1 when started, more
    after retries (SPEC H3)."""
    excluded_executors: list[ExcludedExecutor] = field(default_factory=list)
    """Executors Spark excluded for failures, as the batch ended (SPEC H2); empty when none are."""

    @property
    def scheduling_delay_ms(self) -> int | None:
        """From the batch's time until its first job started."""
        if self.processing_start_time is None:
            return None
        return self.processing_start_time - self.batch_time

    @property
    def processing_delay_ms(self) -> int | None:
        if self.processing_start_time is None or self.processing_end_time is None:
            return None
        return self.processing_end_time - self.processing_start_time

    @property
    def total_delay_ms(self) -> int | None:
        if self.processing_end_time is None:
            return None
        return self.processing_end_time - self.batch_time

    @property
    def num_records(self) -> int:
        return sum(info.num_records or 0 for info in self.input_infos.values())

    @property
    def dead_letters(self) -> int:
        return sum(info.dead_letters for info in self.input_infos.values())

    @property
    def late_records(self) -> int:
        """Rows dropped by stateful operators for arriving behind the watermark."""
        return sum(p.late_rows for p in self.state_operators.values())


class StreamingListener:
    """Override what you need; every method is called on the scheduler's threads, so keep it quick."""

    def on_batch_submitted(self, info: BatchInfo) -> None:
        pass

    def on_batch_started(self, info: BatchInfo) -> None:
        pass

    def on_batch_retrying(self, info: BatchInfo) -> None:
        """Run ``info.attempts`` of the batch failed (``info.failure``); it runs again after a backoff."""

    def on_batch_completed(self, info: BatchInfo) -> None:
        pass

    def on_error(self, error: BaseException) -> None:
        pass


class ListenerBus:
    """Delivers events synchronously, in order; a listener that raises is logged, not fatal."""

    def __init__(self) -> None:
        self._listeners: list[StreamingListener] = []
        self._lock = threading.Lock()

    def add(self, listener: StreamingListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove(self, listener: StreamingListener) -> None:
        with self._lock:
            self._listeners.remove(listener)

    def post(self, method: str, payload: object) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                getattr(listener, method)(payload)
            except Exception:
                logger.exception("Listener %r failed in %s; continuing", listener, method)
