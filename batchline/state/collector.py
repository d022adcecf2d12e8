"""Python's cycle collector kept off a worker's resident state.

A worker holds every key of its partitions as Python tuples between batches. Left to itself,
the cycle collector walks those objects again and again: during a batch (while the batch
allocates its rows; about 40% of a task's time once) and right after it, when the first
allocation after re-enabling the collector makes it walk every object the batch created
(measured at 17% of a sessionization task's time). State tuples form no cycles and are freed
by reference counting, so walking them finds nothing.

``paused_collector`` turns the collector off for a task and, after it, moves every object
then alive to the permanent generation (``gc.freeze``), which later collections skip. Objects
still leave it when their count drops to zero; only cyclic garbage made during a task stays
frozen. So that such garbage cannot pile up over a long run, a full collection runs whenever
the frozen objects have doubled since the last one (looked at every ``CHECK_EVERY`` tasks):
its cost is paid once per doubling of the worker's live objects, not once per batch.
"""

from __future__ import annotations

import atexit
import gc
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_collector"]

logger = logging.getLogger(__name__)

FULL_COLLECTION_FLOOR = 200_000
"""Frozen objects below which no full collection runs (a worker's own modules and Spark's)."""
CHECK_EVERY = 16
"""Freezes between two counts of the frozen objects (counting walks them all)."""

_lock = threading.Lock()
_active = 0
_frozen_after_full = 0
_unfreezes_at_exit = False
_freezes = 0


@contextmanager
def paused_collector() -> Iterator[None]:
    """No cycle collection while the block runs; afterwards the survivors are frozen (see the
    module docstring). Nested and concurrent uses (tasks on threads) leave the collector off
    until the last one ends. Does nothing when the collector was off already."""
    global _active
    with _lock:
        if _active == 0 and not gc.isenabled():
            owner = False
        else:
            owner = True
            _active += 1
            gc.disable()
    try:
        yield
    finally:
        if owner:
            with _lock:
                _active -= 1
                if _active == 0:
                    try:
                        _freeze_survivors()
                    finally:
                        gc.enable()


def _freeze_survivors() -> None:
    global _frozen_after_full, _unfreezes_at_exit, _freezes
    if not _unfreezes_at_exit:
        # At exit, hand the frozen objects back, so that the interpreter's last collection
        # frees them as usual (extension modules report what was never freed as leaked). Spark's
        # workers leave through os._exit: this matters to drivers and the state tester.
        atexit.register(gc.unfreeze)
        _unfreezes_at_exit = True
    gc.freeze()
    _freezes += 1
    if _freezes % CHECK_EVERY:
        return
    frozen = gc.get_freeze_count()  # walks the frozen objects: not after every task
    if frozen > 2 * max(_frozen_after_full, FULL_COLLECTION_FLOOR // 2):
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        _frozen_after_full = gc.get_freeze_count()
        logger.debug("Full cycle collection over %d objects found %d unreachable; %d frozen", frozen, found,
                     _frozen_after_full)
