"""Received blocks: queued as they arrive, allocated to a batch at its batch time (SPEC A3, B2)."""

from __future__ import annotations

import logging
import threading

from batchline.checkpoint.received_blocks import Block

__all__ = ["ReceiverTracker"]

logger = logging.getLogger(__name__)


class ReceiverTracker:
    """Holds every receiver's blocks until a batch takes them and that batch is cleaned up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unallocated: dict[int, list[Block]] = {}
        self._allocated: dict[int, dict[int, list[Block]]] = {}
        self._last_allocated_time: int | None = None

    def add_block(self, block: Block) -> None:
        with self._lock:
            self._unallocated.setdefault(block.stream_id, []).append(block)

    def allocate_blocks_to_batch(self, batch_time: int) -> None:
        """Move every queued block to ``batch_time``; a time already allocated is left as it is."""
        with self._lock:
            if self._last_allocated_time is not None and batch_time <= self._last_allocated_time:
                logger.info("Possibly processed batch %d needs to be processed again", batch_time)
                return
            self._allocated[batch_time] = {sid: blocks for sid, blocks in self._unallocated.items()}
            self._unallocated = {sid: [] for sid in self._unallocated}
            self._last_allocated_time = batch_time

    def restore_batch(self, batch_time: int, stream_id: int, blocks: list[Block]) -> None:
        """Give a re-run batch the blocks the batch log says it had."""
        with self._lock:
            self._allocated.setdefault(batch_time, {})[stream_id] = list(blocks)
            if self._last_allocated_time is None or batch_time > self._last_allocated_time:
                self._last_allocated_time = batch_time

    def get_blocks_of_batch(self, batch_time: int, stream_id: int) -> list[Block]:
        with self._lock:
            return list(self._allocated.get(batch_time, {}).get(stream_id, []))

    def has_unallocated_blocks(self) -> bool:
        with self._lock:
            return any(self._unallocated.values())

    def cleanup_old_batches(self, threshold_time: int) -> None:
        """Release blocks of batches strictly older than ``threshold_time``."""
        with self._lock:
            old = [t for t in self._allocated if t < threshold_time]
            for batch_time in old:
                del self._allocated[batch_time]
        if old:
            logger.debug("Released blocks of %d batches older than %d", len(old), threshold_time)

