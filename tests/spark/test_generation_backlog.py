"""Generation after down time (issue 12): at most ``max_batches_ahead`` batches generated and
not yet committed, the rest due in order, each commit's checkpoint before the next generation.

The generator runs on a manual clock with the batches, the checkpoint writer and the job
scheduler played by the test, so the order of what its event loop does is exact; the last
tests run a real restart through StreamingContext."""

import logging
import threading
from types import SimpleNamespace

import pytest

from batchline import ConfigurationError, StreamingContext
from batchline.clock import ManualClock
from batchline.scheduler.input_info import InputInfoTracker
from batchline.scheduler.job_generator import GeneratorSettings, JobGenerator
from batchline.scheduler.receiver_tracker import ReceiverTracker
from batchline.testing import wait_for
from tests.helpers import LogWatcher, drive_until_done, poll_until
from tests.spark.test_restart import Pipeline, event_numbers

GENERATOR = "batchline.scheduler.job_generator"
INTERVAL = 100
NO_LIMIT = None


def due_times(count: int) -> list[int]:
    """``count`` batch times from the first after zero time (0), as a restart returns them."""
    return [INTERVAL * (i + 1) for i in range(count)]


class Loop:
    """What the generator's event loop did, in order: batches generated, checkpoints written
    (at generation, or after the batch committed); and the job scheduler's side: commits."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, int]] = []
        self.committed: list[int] = []
        self.most_ahead = 0
        self.changed = threading.Condition()

    def add(self, kind: str, time: int) -> None:
        with self.changed:
            self.entries.append((kind, time))
            if kind == "generated":
                self.most_ahead = max(self.most_ahead, len(self.of("generated")) - len(self.committed))
            self.changed.notify_all()

    def of(self, kind: str) -> list[int]:
        return [t for k, t in self.entries if k == kind]

    def index(self, kind: str, time: int) -> int:
        with self.changed:
            return self.entries.index((kind, time))

    def wait(self, predicate, what: str) -> None:
        wait_for(predicate, self.changed, 10, what)

    def wait_for_entry(self, kind: str, time: int) -> None:
        self.wait(lambda: (kind, time) in self.entries, f"{kind} {time}")

    def commit(self, generator: JobGenerator, time: int) -> None:
        """The job scheduler committed ``time`` (counted before the generator hears of it)."""
        with self.changed:
            self.committed.append(time)
        generator.on_batch_committed(time)

    def commit_next(self, generator: JobGenerator) -> int:
        """Wait for a generated batch not committed yet; commit the oldest such."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.of("generated")) > len(self.committed), 10)
            waiting = [t for t in self.of("generated") if t not in self.committed]
        assert waiting, f"no batch was generated after {self.committed[-1:]}"
        self.commit(generator, waiting[0])
        return waiting[0]


class FakeBatches:
    """The pipeline: a restart returns ``due``; generating a batch takes no input and has no jobs."""

    max_input_remember_ms = 0

    def __init__(self, loop: Loop, due: list[int]) -> None:
        self.loop = loop
        self.due = due

    def start_fresh(self, zero_time):
        pass

    def restart(self, checkpoint, restart_time):
        return list(self.due)

    def jobs_for(self, batch_time):
        self.loop.add("generated", batch_time)
        return []

    def clear_metadata(self, batch_time):
        self.loop.add("cleared", batch_time)

    def operator_progress(self, batch_time):
        return {}

    def checkpoint(self, batch_time, pending):
        return SimpleNamespace(time=batch_time, pending_times=pending)


class FakeCheckpoints:
    """A checkpoint location with the batch interval as checkpoint interval; a write is done at once."""

    interval_ms = INTERVAL

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def checkpoint_writer(self):
        return self

    def write(self, checkpoint, on_written=None):
        self.loop.add("checkpoint after commit" if on_written else "checkpoint", checkpoint.time)
        if on_written is not None:
            on_written(checkpoint)

    def oldest_needed_time(self):
        return None


class Generator:
    """A JobGenerator on a manual clock, zero time 0, with the fakes above."""

    def __init__(self, limit: int | None, due: list[int] | None = None, checkpoints: bool = True,
                 stop_timeout_ms: int = 600_000) -> None:
        self.loop = Loop()
        self.errors: list[BaseException] = []
        self.clock = ManualClock((due[-1] if due else 0) + INTERVAL // 2)
        self.generator = JobGenerator(
            GeneratorSettings(INTERVAL, stop_timeout_ms, limit), FakeBatches(self.loop, due or []), self.clock,
            ReceiverTracker(), InputInfoTracker(), lambda job_set: None, lambda message, e: self.errors.append(e),
            FakeCheckpoints(self.loop) if checkpoints else None,
        )
        self.restart_time = self.clock.now_ms() + INTERVAL // 2
        timer = self.generator.timer
        fire = timer._callback

        def fired(time: int) -> None:
            fire(time)
            self.loop.add("fired", time)

        timer._callback = fired

    def restart(self) -> None:
        self.generator.start(SimpleNamespace(zero_time=0))
        assert self.generator.start_time == self.restart_time

    def stop_now(self) -> None:
        self.generator.stop(process_received_data=False)
        assert not self.errors

    def advance_to(self, time: int) -> None:
        """Move the clock to ``time`` and wait until the timer has fired it."""
        self.clock.advance(time - self.clock.now_ms())
        self.loop.wait_for_entry("fired", time)


def test_a_restart_with_150_due_batches_generates_two_ahead_and_checkpoints_each_commit_first():
    due = due_times(150)
    g = Generator(limit=2, due=due)
    with LogWatcher() as logs:
        g.restart()
        # D(200) was posted while the restart's batches were handled: once it is written, that is over.
        g.loop.wait_for_entry("checkpoint", 200)
        assert g.loop.of("generated") == [100, 200]
        g.loop.commit(g.generator, 100)
        g.loop.wait_for_entry("generated", 300)
        # The committed batch's checkpoint came first; the next batch waited for it.
        assert g.loop.index("checkpoint after commit", 100) < g.loop.index("generated", 300)
        while g.loop.commit_next(g.generator) != due[-1]:
            pass
        g.loop.wait_for_entry("checkpoint after commit", due[-1])
        g.stop_now()
    assert g.loop.of("generated") == due
    assert g.loop.most_ahead == 2
    for time in due[2:]:  # each commit's checkpoint before the generation its room allowed
        assert g.loop.index("checkpoint after commit", time - 2 * INTERVAL) < g.loop.index("generated", time)
    lines = logs.messages(GENERATOR)
    assert lines.count("150 batches are due; generating them as earlier ones commit, at most 2 ahead") == 1
    assert [m for m in lines if m.startswith("Worked off the backlog")] == [
        "Worked off the backlog: 150 batches generated in 0 ms; batches are generated when due again"]


def test_timer_times_join_the_backlog_in_order_none_lost_or_twice():
    due = due_times(30)
    g = Generator(limit=2, due=due)
    g.restart()
    g.loop.wait_for_entry("checkpoint", 200)
    g.advance_to(g.restart_time + 4 * INTERVAL)  # five timer times while 28 batches wait
    assert g.loop.of("generated") == [100, 200]
    commits = 0
    while g.clock.now_ms() < g.restart_time + 20 * INTERVAL:
        g.loop.commit_next(g.generator)
        commits += 1
        if commits % 3 == 0:  # the timer keeps firing as the backlog is worked off
            g.clock.advance(INTERVAL)
    last = g.clock.now_ms() // INTERVAL * INTERVAL
    expected = due + list(range(g.restart_time, last + 1, INTERVAL))
    while g.loop.commit_next(g.generator) != last:
        pass
    g.stop_now()
    generated = g.loop.of("generated")
    assert generated == expected  # strictly increasing, each once, the timer's after the restart's
    assert g.loop.most_ahead == 2


def test_without_checkpoints_a_commit_makes_room_too():
    g = Generator(limit=2, checkpoints=False)
    g.generator.start()
    start = g.generator.start_time
    g.advance_to(start + 4 * INTERVAL)  # five batches due; no commit yet
    g.loop.wait_for_entry("generated", start + INTERVAL)
    for _ in range(5):
        g.loop.commit_next(g.generator)
    g.loop.wait_for_entry("cleared", start + 4 * INTERVAL)  # the handler that marks it processed
    g.stop_now()
    assert g.loop.of("generated") == [start + i * INTERVAL for i in range(5)]
    assert g.loop.most_ahead == 2
    assert g.generator.last_processed_batch == start + 4 * INTERVAL


class Committer(threading.Thread):
    """The job scheduler: commits every generated batch, oldest first, as it comes."""

    def __init__(self, g: Generator) -> None:
        super().__init__(daemon=True)
        self.g = g
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            with self.g.loop.changed:
                self.g.loop.changed.wait_for(
                    lambda: self.stopped.is_set() or len(self.g.loop.of("generated")) > len(self.g.loop.committed), 1)
            if len(self.g.loop.of("generated")) > len(self.g.loop.committed):
                self.g.loop.commit_next(self.g.generator)

    def stop(self) -> None:
        self.stopped.set()
        with self.g.loop.changed:
            self.g.loop.changed.notify_all()
        self.join(10)


def stop_gracefully(g: Generator) -> threading.Thread:
    """A graceful stop on a thread of its own, returned once it has asked the timer to stop:
    the timer then fires the time it waits for and no other. (Driving the clock before that
    let a slow stopper see one more time fire.)"""
    stopper = threading.Thread(target=g.generator.stop, kwargs={"process_received_data": True})
    stopper.start()
    assert poll_until(lambda: g.generator.timer._stopping), "the stop did not reach the timer within 10 s"
    return stopper


def test_a_graceful_stop_generates_and_finishes_the_whole_queued_backlog():
    due = due_times(40)
    g = Generator(limit=2, due=due)
    g.restart()
    g.loop.wait_for_entry("checkpoint", 200)
    committer = Committer(g)
    with LogWatcher() as logs:
        stopper = stop_gracefully(g)  # before any commit: 38 batches are queued
        committer.start()
        drive_until_done(g.clock, stopper)
    committer.stop()
    # The stop let the timer fire the time it was waiting for; that batch ran too.
    assert g.loop.of("generated") == [*due, g.restart_time]
    assert g.loop.committed == [*due, g.restart_time]
    assert g.generator.pending_up_to(10**9) == ()
    assert g.generator.last_processed_batch == g.restart_time
    assert not logs.messages(GENERATOR, level=30)
    assert not g.errors


def test_a_graceful_stop_that_times_out_names_the_queued_batches():
    due = due_times(10)
    g = Generator(limit=2, due=due, stop_timeout_ms=1000)
    g.restart()
    for _ in range(3):  # then the job scheduler is stuck in batch 400
        g.loop.commit_next(g.generator)
    # Handled after 300's checkpoint was written and the batch marked processed:
    g.loop.wait_for_entry("checkpoint", 500)
    with LogWatcher() as logs:
        stopper = stop_gracefully(g)
        drive_until_done(g.clock, stopper)
    assert g.loop.committed == [100, 200, 300]
    assert g.loop.of("generated") == [100, 200, 300, 400, 500]
    unprocessed = [*due[3:], g.restart_time]
    assert logs.messages(GENERATOR, level=30) == [
        f"Timed out while waiting for jobs to be processed (timeout = 1000); unprocessed batches: {unprocessed}"]
    assert (f"6 due batches were not generated (600 to {g.restart_time} ms); nothing of them was logged, so the "
            "next start runs them as missed batches") in logs.messages(GENERATOR)


def test_without_a_limit_every_due_batch_is_generated_before_the_first_commits_checkpoint():
    # Spark Streaming's order, which benchmarks/restart_backlog.py compares against.
    due = due_times(150)
    g = Generator(limit=NO_LIMIT, due=due)
    with LogWatcher() as logs:
        g.restart()
        g.loop.wait_for_entry("generated", 100)
        g.loop.commit(g.generator, 100)  # while the restart's batches are still being generated
        g.loop.wait_for_entry("checkpoint after commit", 100)
        g.stop_now()
    assert g.loop.of("generated") == due
    # All 150 were generated before the generator took the commit on. (Counted from the loop's
    # own order: the test's commit lands while generation runs, so the scheduler's count of
    # commits may include it before the last batches are generated, on a busy machine.)
    taken_on = g.loop.index("checkpoint after commit", 100)
    assert [t for kind, t in g.loop.entries[:taken_on] if kind == "generated"] == due
    assert not [m for m in logs.messages(GENERATOR) if "due" in m or "backlog" in m]


# ---------------------------------------------------------------- through StreamingContext
def test_a_restart_after_101_batches_of_down_time_checkpoints_its_first_commits_early(spark, tmp_path):
    first = Pipeline(spark, tmp_path, 10_500)
    first.ssc.start()
    first.run_until(12_000)
    first.ssc.stop()
    second = Pipeline(spark, tmp_path, 113_500)  # down for 12 000 < t < 114 000: 101 batches due
    assert second.ssc.max_batches_ahead == 2
    with LogWatcher() as logs:
        second.ssc.start()
        second.recorder.wait_for_batch(113_000, timeout=120)
        second.ssc.stop()
    loop = [m for m in logs.messages(level=logging.DEBUG)
            if m.startswith(("Added jobs for time", "Checkpointing graph for time"))]
    # 14 000 is the first on the 2 s checkpoint interval: checkpointed when generated, and after it committed.
    after_commit = [i for i, m in enumerate(loop) if m == "Checkpointing graph for time 14000 ms"][1]
    added = [m for m in loop[:after_commit] if m.startswith("Added")]
    # 13 000 and 14 000, and 15 000 if 13 000's commit made room for it first; never all 101.
    assert added[:2] == ["Added jobs for time 13000 ms", "Added jobs for time 14000 ms"]
    assert len(added) <= 3, added
    assert "101 batches are due; generating them as earlier ones commit, at most 2 ahead" in logs.messages(GENERATOR)
    completed = [t for kind, t in second.recorder.events if kind == "completed"]
    assert completed == list(range(13_000, 114_000, 1000))
    # 10 events/s from zero time 10 000, at most 15 a batch: the backlog is caught up, each event once.
    assert event_numbers(first.sink) + event_numbers(second.sink) == list(range(1030))


@pytest.mark.parametrize("value", [0, 1.5, "2", True])
def test_max_batches_ahead_is_a_whole_number_of_at_least_concurrent_jobs(spark, value):
    with pytest.raises(ConfigurationError, match=r"max_batches_ahead must be .* at least concurrent_jobs \(1\)"):
        StreamingContext(spark, "1s", max_batches_ahead=value)


def test_max_batches_ahead_defaults_to_one_more_than_concurrent_jobs(spark):
    assert StreamingContext(spark, "1s").max_batches_ahead == 2
    with pytest.raises(ConfigurationError, match=r"at least concurrent_jobs \(3\).*got 2.*default \(4\)"):
        StreamingContext(spark, "1s", concurrent_jobs=3, max_batches_ahead=2)
    assert StreamingContext(spark, "1s", concurrent_jobs=3).max_batches_ahead == 4
    assert StreamingContext(spark, "1s", max_batches_ahead=10**9).max_batches_ahead == 10**9
