"""Keeping Python workers warm while a pipeline idles (issue 19): Spark stops Python workers
idle for a minute, so the batch that fires a timer after a long wait would start cold. The
warm-up job runs again when no batch used Python workers for a while; on a manual clock here,
and wired into a running context at the end."""

from __future__ import annotations

import logging
import threading
import time

from batchline import StreamingContext
from batchline.api import warmup
from batchline.api.warmup import DEFAULT_KEEP_WARM_MS, JOB_GROUP, KeepWorkersWarm
from batchline.clock import ManualClock
from batchline.scheduler.progress import COMPLETED, BatchProgress, InputProgress, StateOperatorProgress
from tests.helpers import poll_until


def progress(clock: ManualClock, records: int = 0, keys_called: int = 0) -> BatchProgress:
    operators = (StateOperatorProgress(operator="sessions", input_rows=0, late_rows=0, keys_called=keys_called,
                                       updated=0, removed=0, timed_out=0, output_rows=0, state_keys=10,
                                       watermark_ms=None),)
    return BatchProgress(batch_time=clock.now_ms(), status=COMPLETED, submission_time_ms=clock.now_ms(),
                         processing_start_ms=clock.now_ms(), processing_end_ms=clock.now_ms(),
                         batch_interval_ms=1000, attempts=1, inputs=(InputProgress("events", records),),
                         state_operators=operators)


class Warmings:
    """The warm-up stand-in: notes the clock's time of each call."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.times: list[int] = []

    def __call__(self) -> None:
        self.times.append(self.clock.now_ms())


def run(keeper: KeepWorkersWarm, clock: ManualClock, seconds: range, worked: dict[int, BatchProgress]) -> None:
    """One batch a second (``worked``: the ones that used Python workers), each followed by
    the keeper's check, as its own thread makes it."""
    for second in seconds:
        clock.set_time(second * 1000)
        keeper.on_progress(worked.get(second) or progress(clock))
        keeper.check()
        keeper.join(5)


def test_workers_are_warmed_after_40_s_without_work_for_them_and_not_while_batches_use_them():
    clock = ManualClock(0)
    warmings = Warmings(clock)
    keeper = KeepWorkersWarm(warmings, clock.now_ms, DEFAULT_KEEP_WARM_MS)
    # Rows read every 30 s, then a timer firing (keys called, no rows): never 40 s idle.
    run(keeper, clock, range(1, 121), {30: progress(clock, records=5), 60: progress(clock, records=1),
                                       90: progress(clock, keys_called=3), 120: progress(clock, records=2)})
    assert warmings.times == []
    # Then batches that use no Python worker: a warm-up 40 s after the last work, then every 40 s.
    run(keeper, clock, range(121, 250), {})
    assert warmings.times == [160_000, 200_000, 240_000]


def test_the_check_warms_in_time_whatever_the_batch_interval():
    # Batches every 5 minutes: the keeper's own checks (every few seconds) warm in between.
    clock = ManualClock(0)
    warmings = Warmings(clock)
    keeper = KeepWorkersWarm(warmings, clock.now_ms, DEFAULT_KEEP_WARM_MS)
    for second in range(5, 301, 5):
        clock.set_time(second * 1000)
        keeper.check()
        keeper.join(5)
    assert warmings.times == [40_000, 80_000, 120_000, 160_000, 200_000, 240_000, 280_000]


def test_a_running_warm_up_is_not_started_again_and_is_cancelled_by_stop():
    clock = ManualClock(0)
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []
    cancelled: list[bool] = []

    def slow_warm() -> None:
        calls.append(1)
        started.set()
        release.wait(5)

    def cancel() -> None:
        cancelled.append(True)
        release.set()

    keeper = KeepWorkersWarm(slow_warm, clock.now_ms, 10_000, cancel=cancel)
    for second in range(1, 40):
        clock.set_time(second * 1000)
        keeper.check()
        if second == 10:
            assert started.wait(5)
    assert calls == [1]
    keeper.stop(5)
    assert cancelled == [True]
    clock.set_time(100_000)
    keeper.check()  # stopped: no more warm-ups
    assert calls == [1]


def _keep_warm_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("batchline-keep-warm") and t.is_alive()}


def test_a_context_keeps_workers_warm_until_it_stops_unless_told_not_to(spark):
    for keep in (True, False):
        before = _keep_warm_threads()  # a context another test left running has its own
        ssc = StreamingContext(spark, "200ms", keep_workers_warm=keep)
        ssc.generator_stream(1, partitions=1, name="events").foreach_batch(lambda df, t: None, name="out")
        ssc.start()
        try:
            started = _keep_warm_threads() - before
            assert [t.name for t in started] == (["batchline-keep-warm-checker"] if keep else [])
        finally:
            ssc.stop()
        assert not any(t.is_alive() for t in started)


def _cold_warm_task(batches):
    """The start-up warm-up's task as on a cold start, slowed down: it is still running when
    the pipeline stops (forking workers and importing takes seconds on a cold JVM)."""
    import time

    time.sleep(60)
    yield from warmup._warm_task(batches)


def test_a_pipeline_stopped_right_after_its_start_cancels_its_warm_up_quietly(spark, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(warmup, "_warmed", set())  # the suite's session was warmed by an earlier test
    monkeypatch.setattr(warmup, "_warm_task", _cold_warm_task)
    tracker = spark.sparkContext.statusTracker()

    def warm_up_jobs() -> list[int]:
        return [j for j in tracker.getJobIdsForGroup(JOB_GROUP) if (info := tracker.getJobInfo(j)) is not None
                and info.status == "RUNNING"]

    before = {t for t in threading.enumerate() if t.name == "batchline-warm-up"}
    # batchline's own logger too: the command line's tests leave a level of their own on it.
    caplog.set_level(logging.DEBUG, logger="batchline")
    with caplog.at_level(logging.DEBUG):
        ssc = StreamingContext(spark, "1s", checkpoint=str(tmp_path / "checkpoint"))
        ssc.generator_stream(1, partitions=1, name="events").foreach_batch(lambda df, t: None, name="out")
        ssc.start()
        began = time.monotonic()
        try:
            assert poll_until(warm_up_jobs, 10, 0.05), "the start-up warm-up job did not start"
            warming = [t for t in threading.enumerate() if t.name == "batchline-warm-up" and t not in before]
            assert warming, "the context started no warm-up thread"
        finally:
            ssc.stop(graceful=False)
        stopped_in = time.monotonic() - began
        for thread in warming:
            thread.join(20)
    assert stopped_in < 10, f"the stop took {stopped_in:.1f} s"
    # The stop cancelled the warm-up: nothing of it runs on once the pipeline has stopped.
    assert not any(t.is_alive() for t in warming), "the warm-up still runs after the pipeline stopped"
    assert poll_until(lambda: not warm_up_jobs(), 10, 0.05), f"warm-up jobs still running: {warm_up_jobs()}"
    errors = [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
    said = [r for r in caplog.records if r.name == "batchline.api.warmup"]
    assert [r.levelno for r in said] == [logging.DEBUG] and "cancelled" in said[0].getMessage(), \
        [(r.levelname, r.getMessage()) for r in said]
