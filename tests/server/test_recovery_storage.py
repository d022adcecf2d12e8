"""Write-ahead log recovery for receivers, and checkpoints on a real S3-compatible endpoint."""

import threading

import s3fs

from batchline import Receiver, StreamingContext
from batchline.clock import ManualClock
from batchline.testing import BatchRecorder, CollectSink
from tests.helpers import LogWatcher, poll_until


class FeedReceiver(Receiver):
    """The test stores records itself; nothing to start or stop."""

    def on_start(self):
        pass

    def on_stop(self):
        pass


def receiver_pipeline(spark, checkpoint, start_ms, block_at=None):
    clock = ManualClock(start_ms)
    ssc = StreamingContext(spark, "1s", clock=clock, checkpoint=str(checkpoint), checkpoint_interval="1s")
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    receiver = FeedReceiver()
    sink = CollectSink(sort=False)
    release = threading.Event()

    def output(df, batch_time):
        if batch_time == block_at:
            release.wait(60)
            raise RuntimeError("the driver died in this batch")
        sink(df, batch_time)

    ssc.receiver_stream(receiver, name="feed").foreach_batch(output)
    return ssc, clock, recorder, receiver, sink, release


def cut_block(ssc, clock, to_ms):
    """Move the clock to a block boundary and wait until the block is written ahead and queued."""
    clock.set_time(to_ms)
    assert poll_until(ssc.receiver_tracker.has_unallocated_blocks), "the block generator did not cut a block"


def test_received_blocks_survive_a_crash_whether_or_not_a_batch_had_taken_them(spark, tmp_path):
    ssc, clock, recorder, receiver, sink, release = receiver_pipeline(spark, tmp_path, 10_500, block_at=12_000)
    ssc.start()
    for record in "abcde":
        receiver.store(record)
    cut_block(ssc, clock, 10_800)
    clock.set_time(11_000)  # taken by batch 11 000
    recorder.wait_for_batch(11_000)
    for record in "fghij":
        receiver.store(record)
    cut_block(ssc, clock, 11_800)
    clock.set_time(12_000)  # taken by batch 12 000, which will die
    recorder.wait_for_event("started", 12_000)
    for record in "klmno":
        receiver.store(record)
    cut_block(ssc, clock, 12_200)  # written ahead; no batch has taken it yet
    blocks_on_disk = sorted(p.name for p in (tmp_path / "received" / "feed").iterdir())
    # a..e stays until the next batch completes (a stream remembers one batch); f..j is
    # taken by the dying batch; k..o by none yet.
    assert len(blocks_on_disk) == 3
    stopper = threading.Thread(target=ssc.stop)
    stopper.start()
    release.set()
    stopper.join(30)
    assert [r["value"] for r in sink.all_rows()] == list("abcde")

    ssc2, clock2, recorder2, _, sink2, _ = receiver_pipeline(spark, tmp_path, 12_500)
    with LogWatcher() as logs:
        ssc2.start()
        recorder2.wait_for_batch(12_000)
        clock2.advance(500)
        recorder2.wait_for_batch(13_000)
        ssc2.stop()
    assert "Batches pending processing (1 batches): 12000 ms" in logs.messages()
    assert any("Recovered 1 received blocks of feed" in m for m in logs.messages())
    assert sink2.batches == {12_000: [{"value": v} for v in "fghij"], 13_000: [{"value": v} for v in "klmno"]}




def test_checkpoints_round_trip_through_an_s3_endpoint(spark, s3_endpoint):
    location = "s3://batchline-test/pipeline-1"

    def build(start_ms):
        clock = ManualClock(start_ms)
        ssc = StreamingContext(spark, "1s", clock=clock, checkpoint=location, checkpoint_interval="2s",
                               checkpoint_storage_options=s3_endpoint)
        recorder = BatchRecorder()
        ssc.add_listener(recorder)
        sink = CollectSink()
        ssc.generator_stream(rate=5).select("data").foreach_batch(sink)
        return ssc, clock, recorder, sink

    ssc, clock, recorder, sink = build(10_500)
    ssc.start()
    clock.advance(500)
    for t in (11_000, 12_000, 13_000):
        recorder.wait_for_batch(t)
        if t < 13_000:
            clock.advance(1000)
    ssc.stop()

    fs = s3fs.S3FileSystem(**s3_endpoint)
    stored = {p.rsplit("/", 1)[-1] for p in fs.find("batchline-test/pipeline-1")}
    assert {"_manifest.json", "_lease.json"} <= stored
    assert any(name.startswith("checkpoint-") for name in stored)

    ssc2, clock2, recorder2, sink2 = build(15_500)
    with LogWatcher() as logs:
        ssc2.start()
        recorder2.wait_for_batch(15_000)
        ssc2.stop()
    assert "Batches during down time (2 batches): 14000 ms, 15000 ms" in logs.messages()
    numbers = sorted(int(r["data"].split("-")[1]) for r in sink.all_rows() + sink2.all_rows())
    assert numbers == list(range(25))  # 5 events/s for 5 s: each exactly once across the restart
