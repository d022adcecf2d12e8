"""Receivers run on the driver and store records; a block generator cuts them into blocks."""

from __future__ import annotations

import itertools
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable

from batchline.checkpoint.received_blocks import Block
from batchline.clock import Clock
from batchline.scheduler.timer import RecurringTimer

__all__ = ["Receiver", "BlockGenerator"]

logger = logging.getLogger(__name__)


class BlockGenerator:
    """Buffers stored records and pushes them as one block every block interval (SPEC B2)."""

    def __init__(
        self,
        stream_id: int,
        clock: Clock,
        block_interval_ms: int,
        push_block: Callable[[Block], None],
        first_block_id: int = 0,
    ) -> None:
        self._stream_id = stream_id
        self._clock = clock
        self._push_block = push_block
        self._buffer: list[str] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(first_block_id)
        self._timer = RecurringTimer(clock, block_interval_ms, self._cut_block, f"BlockGenerator-{stream_id}")

    def start(self) -> None:
        self._timer.start(self._timer.get_start_time())

    def add(self, record: str) -> None:
        with self._lock:
            self._buffer.append(record)

    def stop(self) -> None:
        """Stop cutting on the timer and push what is still buffered as a last block."""
        self._timer.stop(interrupt=True)
        self._cut_block(self._clock.now_ms())

    def _cut_block(self, time_ms: int) -> None:
        with self._lock:
            records, self._buffer = self._buffer, []
        if records:
            self._push_block(Block(self._stream_id, next(self._ids), tuple(records), time_ms))


class Receiver(ABC):
    """Subclass and implement ``on_start``/``on_stop``; call ``store`` from your own threads.

    ``on_stop`` must return only once no more ``store`` calls will come: a graceful stop
    (``stopping_gracefully``) counts on every record received before it being stored.
    """

    def __init__(self) -> None:
        self._block_generator: BlockGenerator | None = None
        self._stopped = threading.Event()
        self.stopping_gracefully = False

    @abstractmethod
    def on_start(self) -> None:
        """Start the threads that receive data; return at once."""

    @abstractmethod
    def on_stop(self) -> None:
        """Stop receiving, flushing what was already received through ``store``."""

    def store(self, record: str) -> None:
        if self._block_generator is None:
            raise RuntimeError("store() called on a receiver that was not started by a streaming context")
        self._block_generator.add(record)

    @property
    def is_stopped(self) -> bool:
        return self._stopped.is_set()

    def start_receiving(self, block_generator: BlockGenerator) -> None:
        """Called by the pipeline once it runs: records stored from now on go into blocks."""
        self._block_generator = block_generator
        block_generator.start()
        self.on_start()

    def stop_receiving(self, graceful: bool) -> None:
        """Called by the pipeline when it stops (gracefully: flush what was received)."""
        self.stopping_gracefully = graceful
        self._stopped.set()
        try:
            self.on_stop()
        finally:
            if self._block_generator is not None:
                self._block_generator.stop()
