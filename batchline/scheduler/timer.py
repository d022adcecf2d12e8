"""A timer that calls back at every multiple of its period (SPEC A1)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from batchline.clock import Clock

__all__ = ["RecurringTimer"]

logger = logging.getLogger(__name__)


class RecurringTimer:
    """Calls ``callback(time)`` at ``start_time``, ``start_time + period``, ...

    ``stop(interrupt=False)`` lets the timer fire the time it is waiting for, so data that
    arrived just before the stop still gets a batch; ``stop(interrupt=True)`` fires nothing
    more. Both return the last time the callback was called for (or ``start_time - period``).
    """

    def __init__(self, clock: Clock, period_ms: int, callback: Callable[[int], None], name: str):
        self._clock = clock
        self.period_ms = period_ms
        self._callback = callback
        self.name = name
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._interrupt = threading.Event()
        self._next_time = 0
        self._prev_time = -1

    def get_start_time(self) -> int:
        """The next multiple of the period strictly after now."""
        return (self._clock.now_ms() // self.period_ms + 1) * self.period_ms

    def get_restart_time(self, original_start_time: int) -> int:
        """The next time after now on the grid the original start time lies on."""
        gap = self._clock.now_ms() - original_start_time
        return (gap // self.period_ms + 1) * self.period_ms + original_start_time

    def start(self, start_time: int) -> int:
        self._next_time = start_time
        self._prev_time = start_time - self.period_ms
        self._thread = threading.Thread(target=self._loop, name=f"RecurringTimer-{self.name}", daemon=True)
        self._thread.start()
        logger.debug("Started timer for %s at time %d", self.name, start_time)
        return start_time

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, interrupt: bool) -> int:
        if self._thread is None:
            return self._prev_time
        self._stopping = True
        if interrupt:
            self._interrupt.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        logger.debug("Stopped timer for %s after time %d", self.name, self._prev_time)
        return self._prev_time

    def _loop(self) -> None:
        while True:
            if not self._clock.wait_until(self._next_time, self._interrupt):
                return
            self._callback(self._next_time)
            self._prev_time = self._next_time
            self._next_time += self.period_ms
            if self._stopping:
                return
