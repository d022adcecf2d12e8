"""What a graceful stop waits for: records the inputs were pushed (a receiver's blocks) that
no batch has taken yet (SPEC A3, B2)."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["ReceiverTracker"]


class ReceiverTracker:
    """Asks every input that is pushed records whether some wait for a batch.

    The records themselves stay with their input (a ``Source`` that holds them on the
    driver); an input says whether it holds any through the function it registers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inputs: list[Callable[[], bool]] = []

    def watch(self, has_unplanned: Callable[[], bool]) -> None:
        """Register an input's ``has_unplanned``: True while records it took in wait for a batch."""
        with self._lock:
            self._inputs.append(has_unplanned)

    def has_unallocated_blocks(self) -> bool:
        """Whether any input holds records no batch has taken yet."""
        with self._lock:
            inputs = list(self._inputs)
        return any(has_unplanned() for has_unplanned in inputs)
