"""Restart from a checkpoint on a manual clock: which batches, in which order, which lines."""

import logging
import os
import threading

import pytest

from batchline import ConfigurationError, StreamingContext
from batchline.checkpoint.lease import CheckpointLockedError
from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import ManualClock
from batchline.testing import BatchRecorder, CollectSink
from tests.helpers import LogWatcher, wait_for

GENERATOR = "batchline.scheduler.job_generator"
RESTART = "batchline.recovery.restart"  # the seed's restart lines, now beside the batch commit


class Pipeline:
    """The same pipeline code, as a restarted script would build it again."""

    def __init__(self, spark, checkpoint, start_ms, block_at=None, **kwargs):
        self.clock = ManualClock(start_ms)
        self.ssc = StreamingContext(spark, "1s", clock=self.clock, checkpoint=str(checkpoint),
                                    checkpoint_interval="2s", **kwargs)
        self.recorder = BatchRecorder()
        self.ssc.add_listener(self.recorder)
        self.events = self.ssc.generator_stream(rate=10, users=3, max_records_per_batch=15)
        self.sink = CollectSink()
        self.release = threading.Event()
        self.block_at = block_at if isinstance(block_at, tuple) else (block_at,)

        def output(df, batch_time):
            if batch_time in self.block_at:
                self.release.wait(60)
                raise RuntimeError("the driver died in this batch")
            self.sink(df.select("data"), batch_time)

        self.events.foreach_batch(output, name="collect")

    def run_until(self, batch_time):
        while self.clock.now_ms() < batch_time:
            self.clock.advance(min(1000, batch_time - self.clock.now_ms()))
        self.recorder.wait_for_batch(batch_time)


def event_numbers(sink):
    return sorted(int(row["data"].split("-")[1]) for row in sink.all_rows())


def test_restart_reruns_the_pending_batch_then_the_down_time_batches_in_order(spark, tmp_path):
    first = Pipeline(spark, tmp_path, 10_500, block_at=15_000)
    first.ssc.start()
    first.run_until(14_000)
    first.clock.advance(1000)  # batch 15 000 is logged and starts, then the driver "dies" in it
    first.recorder.wait_for_event("started", 15_000)
    stopper = threading.Thread(target=first.ssc.stop)
    stopper.start()
    first.release.set()
    stopper.join(30)
    assert sorted(first.sink.batches) == [11_000, 12_000, 13_000, 14_000]

    second = Pipeline(spark, tmp_path, 19_500)  # down for 15 000 < t < 20 000
    with LogWatcher() as logs:
        second.ssc.start()
        second.recorder.wait_for_batch(19_000)
        second.run_until(20_000)
        second.ssc.stop()
    lines = logs.messages(RESTART) + logs.messages(GENERATOR, level=logging.DEBUG)
    assert "Batches during down time (4 batches): 16000 ms, 17000 ms, 18000 ms, 19000 ms" in lines
    assert "Batches pending processing (1 batches): 15000 ms" in lines
    assert ("Batches to reschedule (5 batches): 15000 ms, 16000 ms, 17000 ms, 18000 ms, 19000 ms"
            in lines)
    assert "Restarted JobGenerator at 20000 ms" in lines
    assert [t for kind, t in second.recorder.events if kind == "completed"] == [
        15_000, 16_000, 17_000, 18_000, 19_000, 20_000]
    # 10 events/s from zero time 10 000: every event up to 20 000 exactly once, none twice.
    assert event_numbers(first.sink) + event_numbers(second.sink) == list(range(100))


def test_batches_pending_at_the_checkpoint_rerun_with_their_logged_inputs(spark, tmp_path):
    first = Pipeline(spark, tmp_path, 10_500, block_at=(13_000, 14_000))
    first.ssc.start()
    first.run_until(12_000)
    first.clock.advance(1000)
    first.recorder.wait_for_event("started", 13_000)
    first.clock.advance(1000)  # 14 000 is generated behind the stuck 13 000; a checkpoint is taken
    manifest = tmp_path / "_manifest.json"
    wait_for(lambda: "000000000014000" in (manifest.read_text() if manifest.exists() else ""),
             "checkpoint for 14 000", timeout_s=30, step_s=0.01)
    stopper = threading.Thread(target=first.ssc.stop)
    stopper.start()
    first.release.set()
    stopper.join(30)

    second = Pipeline(spark, tmp_path, 15_500)
    with LogWatcher() as logs:
        second.ssc.start()
        second.recorder.wait_for_batch(15_000)
        second.ssc.stop()
    assert "Batches pending processing (2 batches): 13000 ms, 14000 ms" in logs.messages(RESTART)
    assert event_numbers(first.sink) + event_numbers(second.sink) == list(range(50))


def test_the_backlog_after_down_time_is_spread_under_the_rate_limit(spark, tmp_path):
    first = Pipeline(spark, tmp_path, 10_500)
    first.ssc.start()
    first.run_until(12_000)
    first.ssc.stop()
    second = Pipeline(spark, tmp_path, 30_500, concurrent_jobs=1)
    # A new generator rate after an upgrade: the backlog is 50 events a batch, the cap 15.
    second.events.node.source.rate = 50
    second.ssc.start()
    second.recorder.wait_for_batch(30_000)
    second.ssc.stop()
    sizes = [len(rows) for t, rows in sorted(second.sink.batches.items())]
    assert max(sizes) == 15
    assert event_numbers(first.sink) + event_numbers(second.sink) == list(range(20 + sum(sizes)))


def test_checkpoints_are_written_only_on_the_checkpoint_interval(spark, tmp_path):
    pipeline = Pipeline(spark, tmp_path, 10_500)
    pipeline.ssc.start()
    pipeline.run_until(17_000)
    pipeline.ssc.stop(graceful=False)
    manifest = CheckpointStorage(str(tmp_path)).read_sealed("_manifest.json")
    times = sorted(entry["time"] for entry in manifest["checkpoints"])
    assert times[0] == 10_000  # the first checkpoint, at zero time, before any batch
    assert all((t - 10_000) % 2000 == 0 for t in times)
    assert 16_000 in times  # the newest due one; an older one may be coalesced into a newer one


def test_a_checkpoint_location_without_a_checkpoint_starts_fresh(spark, tmp_path):
    (tmp_path / "unrelated.txt").write_text("hello")
    pipeline = Pipeline(spark, tmp_path, 10_500)
    with LogWatcher() as logs:
        pipeline.ssc.start()
        pipeline.run_until(11_000)
        pipeline.ssc.stop()
    assert any("No checkpoint in" in m and "starting fresh" in m for m in logs.messages())
    assert "Started JobGenerator at 11000 ms" in logs.messages(GENERATOR, level=logging.DEBUG)


def test_a_second_driver_on_the_same_location_is_refused(spark, tmp_path):
    first = Pipeline(spark, tmp_path, 10_500)
    first.ssc.start()
    try:
        second = Pipeline(spark, tmp_path, 10_500)
        with pytest.raises(CheckpointLockedError, match=f"pid {os.getpid()}"):
            second.ssc.start()
    finally:
        first.ssc.stop()


@pytest.mark.parametrize("interval", ["1500ms", "500ms"])
def test_the_checkpoint_interval_must_be_a_multiple_of_the_batch_interval(spark, tmp_path, interval):
    with pytest.raises(ConfigurationError, match="positive multiple of the batch interval"):
        StreamingContext(spark, "1s", checkpoint=str(tmp_path), checkpoint_interval=interval)


def test_the_default_checkpoint_interval_is_documented_and_valid(spark, tmp_path):
    assert StreamingContext(spark, "3s", checkpoint=str(tmp_path)).checkpoint_settings.interval_ms == 12_000
    assert StreamingContext(spark, "1s", checkpoint=str(tmp_path)).checkpoint_settings.interval_ms == 10_000


def test_a_changed_batch_interval_is_refused_on_restart(spark, tmp_path):
    first = Pipeline(spark, tmp_path, 10_500)
    first.ssc.start()
    first.run_until(11_000)
    first.ssc.stop()
    ssc = StreamingContext(spark, "2s", clock=ManualClock(20_000), checkpoint=str(tmp_path), checkpoint_interval="2s")
    ssc.generator_stream(rate=1).foreach_batch(lambda df, t: None)
    with pytest.raises(ConfigurationError, match="batch interval of 1000 ms, but this pipeline uses 2000 ms"):
        ssc.start()
    # The refused driver let go of the lease: the right code starts at once.
    again = Pipeline(spark, tmp_path, 12_500)
    again.ssc.start()
    again.ssc.stop()


def test_changed_code_keeps_the_offsets_of_inputs_it_still_has(spark, tmp_path):
    first = Pipeline(spark, tmp_path, 10_500)
    extra = first.ssc.generator_stream(rate=1, name="retired-input")
    extra.foreach_batch(lambda df, t: None, name="retired-output")
    first.ssc.start()
    first.run_until(13_000)
    first.ssc.stop()

    # New code: a different transformation, a new output, the second input gone.
    clock = ManualClock(15_500)
    ssc = StreamingContext(spark, "1s", clock=clock, checkpoint=str(tmp_path), checkpoint_interval="2s")
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    events = ssc.generator_stream(rate=10, users=3, max_records_per_batch=15)
    sink = CollectSink()
    events.filter("id >= 0").select("data").foreach_batch(sink, name="collect")
    events.count().foreach_batch(lambda df, t: None, name="new-output")
    with LogWatcher() as logs:
        ssc.start()
        recorder.wait_for_batch(15_000)
        ssc.stop()
    assert any("'retired-input', which this pipeline no longer has" in m for m in logs.messages(level=30))
    assert event_numbers(first.sink) + event_numbers(sink) == list(range(50))


def test_a_driver_that_lost_its_lease_stops_instead_of_committing(spark, tmp_path):
    from batchline.checkpoint.lease import LEASE_FILE, FencedError, LeaseRecord
    from batchline.checkpoint.storage import seal
    from batchline.errors import BatchFailedError

    pipeline = Pipeline(spark, tmp_path, 10_500)
    release = threading.Event()
    pipeline.events.foreach_batch(lambda df, t: release.wait(60) if t == 12_000 else None, name="slow")
    pipeline.ssc.start()
    pipeline.run_until(11_000)
    pipeline.clock.advance(1000)
    pipeline.recorder.wait_for_event("started", 12_000)
    storage = CheckpointStorage(str(tmp_path))
    current = LeaseRecord(**storage.read_sealed(LEASE_FILE))
    successor = LeaseRecord("successor", current.host, current.pid, current.token + 1, 10**15)
    storage.replace(LEASE_FILE, seal(successor.__dict__))  # another driver took over meanwhile
    release.set()
    with pytest.raises(BatchFailedError, match="in the batch's commit.*FencedError.*lost its lease") as raised:
        pipeline.ssc.await_termination(60)
    assert isinstance(raised.value.cause, FencedError)
    assert not (tmp_path / "commits" / f"{12_000:015d}.json").exists()
