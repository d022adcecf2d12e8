"""An index of per-key deadlines (SPEC D2): due keys are popped from a heap, never found by
scanning every key."""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["TimeoutIndex"]

K = TypeVar("K", bound=Hashable)


class TimeoutIndex(Generic[K]):
    """Deadlines by key. Setting a new deadline or removing a key leaves its old heap entry
    behind; entries that no longer match the key's deadline are skipped when popped, and the
    heap is rebuilt when such stale entries outnumber the live ones."""

    def __init__(self) -> None:
        self._deadline: dict[K, int] = {}
        self._heap: list[tuple[int, int, K]] = []
        self._counter = 0

    def __len__(self) -> int:
        return len(self._deadline)

    def __contains__(self, key: object) -> bool:
        return key in self._deadline

    def get(self, key: K) -> int | None:
        return self._deadline.get(key)

    def set(self, key: K, deadline_ms: int) -> None:
        if self._deadline.get(key) == deadline_ms:
            return
        self._deadline[key] = deadline_ms
        self._counter += 1
        heapq.heappush(self._heap, (deadline_ms, self._counter, key))
        self._compact_if_stale()

    def remove(self, key: K) -> None:
        if self._deadline.pop(key, None) is not None:
            self._compact_if_stale()

    def next_deadline(self) -> int | None:
        self._drop_stale_top()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> list[tuple[K, int]]:
        """Remove and return the keys whose deadline is at or before ``now_ms``, earliest first."""
        due = []
        while True:
            self._drop_stale_top()
            if not self._heap or self._heap[0][0] > now_ms:
                return due
            deadline, _, key = heapq.heappop(self._heap)
            del self._deadline[key]
            due.append((key, deadline))

    def _drop_stale_top(self) -> None:
        while self._heap and self._deadline.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)

    def _compact_if_stale(self) -> None:
        if len(self._heap) > 2 * len(self._deadline) + 64:
            self._heap = [(d, i, k) for i, (k, d) in enumerate(self._deadline.items())]
            heapq.heapify(self._heap)
            self._counter = len(self._heap)
