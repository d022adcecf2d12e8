"""The cycle collector kept off a worker's resident state (batchline.state.collector)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from batchline.state import collector
from batchline.state.collector import paused_collector


@pytest.fixture(autouse=True)
def _restore_collector() -> Iterator[None]:
    was_enabled = gc.isenabled()
    yield
    gc.unfreeze()
    gc.enable() if was_enabled else gc.disable()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_no_collection_inside_and_survivors_frozen_after() -> None:
    gc.enable()
    with paused_collector():
        assert not gc.isenabled()
        kept = [(i, str(i)) for i in range(1000)]
        with paused_collector():  # nested: still off when the inner block ends
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(kept)


def test_leaves_a_disabled_collector_alone() -> None:
    gc.disable()
    frozen = gc.get_freeze_count()
    with paused_collector():
        pass
    assert not gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_frozen_cyclic_garbage_is_collected_once_the_frozen_objects_doubled(monkeypatch: pytest.MonkeyPatch) -> None:
    gc.enable()
    gc.unfreeze()
    gc.collect()
    monkeypatch.setattr(collector, "_frozen_after_full", 0)
    monkeypatch.setattr(collector, "FULL_COLLECTION_FLOOR", 2)
    monkeypatch.setattr(collector, "CHECK_EVERY", 1)
    with paused_collector():
        pass  # the first time: a full collection, which sets the baseline
    baseline = collector._frozen_after_full
    assert baseline > 0
    with paused_collector():
        # Unreachable at once, but only the cycle collector can free them.
        garbage = [weakref.ref(_Cycle()) for _ in range(baseline + 1000)]
    # The frozen objects more than doubled: a full collection freed the cycles.
    assert all(ref() is None for ref in garbage)
    with paused_collector():
        little = weakref.ref(_Cycle())
    assert little() is not None  # a little garbage stays frozen until the next doubling
