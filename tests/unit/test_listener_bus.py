"""Listeners run off the batches' threads (SPEC I3): in order, each on its own thread, a raising
listener logged, a blocking one holding up only itself."""

from __future__ import annotations

import threading
import time

from batchline.scheduler.listener import ListenerBus, ListenerEvent, StreamingListener
from tests.helpers import LogWatcher, poll_until


class Recorder(StreamingListener):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_batch_completed(self, info) -> None:
        self.seen.append(info)


class Blocker(StreamingListener):
    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def on_batch_completed(self, info) -> None:
        self.entered.set()
        self.release.wait(30)


class Raiser(StreamingListener):
    def on_batch_completed(self, info) -> None:
        raise RuntimeError(f"listener bug at {info}")


def test_events_reach_each_listener_in_order_off_the_posting_thread():
    bus = ListenerBus()
    recorder = Recorder()
    threads: list[str] = []

    class ThreadNoter(StreamingListener):
        def on_batch_completed(self, info) -> None:
            threads.append(threading.current_thread().name)

    bus.add(recorder)
    bus.add(ThreadNoter())
    for i in range(500):
        bus.post(ListenerEvent.BATCH_COMPLETED, i)
    assert bus.flush(10)
    assert recorder.seen == list(range(500))
    assert threading.current_thread().name not in threads and len(set(threads)) == 1


def test_a_blocking_listener_delays_neither_the_poster_nor_other_listeners():
    bus = ListenerBus()
    blocker, recorder = Blocker(), Recorder()
    bus.add(blocker)
    bus.add(recorder)
    started = time.monotonic()
    for i in range(100):
        bus.post(ListenerEvent.BATCH_COMPLETED, i)
    posting_s = time.monotonic() - started
    assert blocker.entered.wait(5)
    poll_until(lambda: len(recorder.seen) >= 100, 5, 0.01)
    assert recorder.seen == list(range(100))  # while the blocker is still stuck in its first event
    assert posting_s < 1.0
    with LogWatcher("batchline.scheduler.listener") as log:
        assert not bus.flush(0.3)  # the blocker cannot catch up; the flush gives up, and says so
    assert any("did not handle their events" in m for m in log.messages())
    blocker.release.set()
    assert bus.flush(5)


def test_a_raising_listener_is_logged_and_keeps_getting_events():
    bus = ListenerBus()
    raiser, recorder = Raiser(), Recorder()
    bus.add(raiser)
    bus.add(recorder)
    with LogWatcher("batchline.scheduler.listener") as log:
        for i in range(3):
            bus.post(ListenerEvent.BATCH_COMPLETED, i)
        assert bus.flush(5)
    failures = [r for r in log.records if "failed in on_batch_completed" in r.getMessage()]
    assert len(failures) == 3 and all(r.exc_info for r in failures)
    assert recorder.seen == [0, 1, 2]


def test_a_full_queue_drops_events_and_says_so():
    bus = ListenerBus(capacity=5)
    blocker = Blocker()
    bus.add(blocker)
    bus.post(ListenerEvent.BATCH_COMPLETED, 0)
    assert blocker.entered.wait(5)
    with LogWatcher("batchline.scheduler.listener") as log:
        for i in range(1, 11):
            bus.post(ListenerEvent.BATCH_COMPLETED, i)
    assert any("dropped 1 events" in m for m in log.messages(level=30))
    blocker.release.set()
    assert bus.flush(5)


def test_a_removed_listener_gets_nothing_more():
    bus = ListenerBus()
    recorder, staying = Recorder(), Recorder()
    bus.add(recorder)
    bus.add(staying)
    bus.post(ListenerEvent.BATCH_COMPLETED, 1)
    assert bus.flush(5)
    bus.remove(recorder)
    bus.post(ListenerEvent.BATCH_COMPLETED, 2)
    assert bus.flush(5)  # waits for every listener still added: the removed one too, were it still there
    assert (recorder.seen, staying.seen) == ([1], [1, 2])
