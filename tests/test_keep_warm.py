"""Keeping Python workers warm while a pipeline idles (issue 19): Spark stops Python workers
idle for a minute, so the batch that fires a timer after a long wait would start cold. The
warm-up job runs again when no batch ran a Spark job for a while; on a manual clock here."""

from __future__ import annotations

import threading

from batchline.api.warmup import DEFAULT_KEEP_WARM_MS, KeepWorkersWarm
from batchline.clock import ManualClock
from batchline.scheduler.progress import COMPLETED, BatchProgress, JobTiming, PhaseDurations


def progress(clock: ManualClock, ran_a_job: bool) -> BatchProgress:
    jobs = (JobTiming("out", "output", clock.now_ms(), 12),) if ran_a_job else ()
    return BatchProgress(batch_time=clock.now_ms(), status=COMPLETED, submission_time_ms=clock.now_ms(),
                         processing_start_ms=clock.now_ms(), processing_end_ms=clock.now_ms(),
                         batch_interval_ms=1000, attempts=1, durations=PhaseDurations(jobs=tuple(jobs)))


class Warmings:
    """The warm-up stand-in: notes the clock's time of each call."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.times: list[int] = []

    def __call__(self) -> None:
        self.times.append(self.clock.now_ms())

    def batches(self, keeper: KeepWorkersWarm, seconds: range, jobs_at: frozenset[int] = frozenset()) -> None:
        """One batch a second, each heard by ``keeper``; those in ``jobs_at`` ran a Spark job."""
        for second in seconds:
            self.clock.set_time(second * 1000)
            keeper.on_progress(progress(self.clock, second in jobs_at))
            keeper.join(5)


def test_workers_are_warmed_after_every_40_s_without_a_spark_job_and_not_while_batches_run_jobs():
    clock = ManualClock(0)
    warmings = Warmings(clock)
    keeper = KeepWorkersWarm(warmings, clock, DEFAULT_KEEP_WARM_MS)
    # A job every 30 s: the workers never sit idle for 40 s.
    warmings.batches(keeper, range(1, 121), jobs_at=frozenset({30, 60, 90, 120}))
    assert warmings.times == []
    # Then idle batches only: a warm-up 40 s after the last job, then every 40 s.
    warmings.batches(keeper, range(121, 250))
    assert warmings.times == [160_000, 200_000, 240_000]


def test_a_warm_up_still_running_is_not_started_again():
    clock = ManualClock(0)
    started = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    def slow_warm() -> None:
        calls.append(1)
        started.set()
        release.wait(5)

    keeper = KeepWorkersWarm(slow_warm, clock, 10_000)
    for second in range(1, 40):
        clock.set_time(second * 1000)
        keeper.on_progress(progress(clock, False))
        if second == 10:
            assert started.wait(5)
    release.set()
    assert calls == [1]
