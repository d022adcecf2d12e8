"""An index of per-key deadlines (SPEC D2): due keys are popped by deadline, never found by
scanning every key."""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["TimeoutIndex"]

K = TypeVar("K", bound=Hashable)


class TimeoutIndex(Generic[K]):
    """Keys bucketed by deadline, with a heap of the distinct deadlines.

    Processing-time timeouts set in one batch share one deadline (batch time plus the
    duration), so setting a key's deadline is two set operations, not a heap push per key;
    event-time deadlines, which differ per key, cost a heap entry each, as a plain heap would.
    """

    def __init__(self) -> None:
        self._deadline: dict[K, int] = {}
        self._buckets: dict[int, set[K]] = {}
        self._heap: list[int] = []

    def __len__(self) -> int:
        return len(self._deadline)

    def __contains__(self, key: object) -> bool:
        return key in self._deadline

    def get(self, key: K) -> int | None:
        return self._deadline.get(key)

    def set(self, key: K, deadline_ms: int) -> None:
        old = self._deadline.get(key)
        if old == deadline_ms:
            return
        if old is not None:
            self._buckets[old].discard(key)
        self._deadline[key] = deadline_ms
        bucket = self._buckets.get(deadline_ms)
        if bucket is None:
            bucket = self._buckets[deadline_ms] = set()
            heapq.heappush(self._heap, deadline_ms)
        bucket.add(key)

    def remove(self, key: K) -> None:
        old = self._deadline.pop(key, None)
        if old is not None:
            self._buckets[old].discard(key)

    def next_deadline(self) -> int | None:
        self._drop_empty_top()
        return self._heap[0] if self._heap else None

    def pop_due(self, now_ms: int) -> list[tuple[K, int]]:
        """Remove and return the keys whose deadline is at or before ``now_ms``, earliest first
        (keys sharing a deadline in the order of their ``repr``)."""
        due: list[tuple[K, int]] = []
        while True:
            self._drop_empty_top()
            if not self._heap or self._heap[0] > now_ms:
                return due
            deadline = heapq.heappop(self._heap)
            # Sorted, so that a batch calls its keys in the same order in every process (a set's
            # order follows the hash seed of the Python worker).
            for key in sorted(self._buckets.pop(deadline), key=repr):
                del self._deadline[key]
                due.append((key, deadline))

    def _drop_empty_top(self) -> None:
        while self._heap and not self._buckets.get(self._heap[0]):
            self._buckets.pop(heapq.heappop(self._heap), None)
