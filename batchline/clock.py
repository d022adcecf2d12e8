"""Injectable time: the scheduler, timers and stop logic read time only through a Clock.

Tests drive a :class:`ManualClock` with ``advance()``; nothing in the scheduling logic
calls ``time.time()`` or sleeps on its own.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod

__all__ = ["Clock", "SystemClock", "ManualClock"]

_NEVER = threading.Event()


class Clock(ABC):
    """Milliseconds since the epoch, and waiting for a moment to come."""

    @abstractmethod
    def now_ms(self) -> int:
        """The current time in milliseconds."""

    @abstractmethod
    def wait_until(self, target_ms: int, cancel: threading.Event = _NEVER) -> bool:
        """Block until ``now_ms() >= target_ms``; False when ``cancel`` was set first."""

    def sleep_ms(self, duration_ms: int) -> None:
        self.wait_until(self.now_ms() + duration_ms)


class SystemClock(Clock):
    """Wall-clock time."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def wait_until(self, target_ms: int, cancel: threading.Event = _NEVER) -> bool:
        while True:
            remaining = target_ms - self.now_ms()
            if remaining <= 0:
                return True
            if cancel.wait(remaining / 1000):
                return False


class ManualClock(Clock):
    """A clock that moves only when told to; waiters wake as soon as it passes their target."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms
        self._changed = threading.Condition()

    def now_ms(self) -> int:
        with self._changed:
            return self._now

    def advance(self, duration_ms: int) -> int:
        """Move time forward and wake every waiter whose target has come; returns the new time."""
        if duration_ms < 0:
            raise ValueError(f"a ManualClock only moves forward; got advance({duration_ms})")
        with self._changed:
            self._now += duration_ms
            self._changed.notify_all()
            return self._now

    def set_time(self, now_ms: int) -> None:
        with self._changed:
            if now_ms < self._now:
                raise ValueError(f"a ManualClock only moves forward: {now_ms} < {self._now}")
            self._now = now_ms
            self._changed.notify_all()

    def wait_until(self, target_ms: int, cancel: threading.Event = _NEVER) -> bool:
        with self._changed:
            while self._now < target_ms:
                if cancel.is_set():
                    return False
                # The timeout only lets a waiter notice ``cancel``; time itself moves by advance().
                self._changed.wait(0.02)
            return True
