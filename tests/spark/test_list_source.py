"""batchline.testing's list source: one item a batch, END ends it, Abort() crashes once, and
a restart from the checkpoint replays exactly and passes the abort by."""

import pytest

from batchline import StreamingContext
from batchline.testing import END, Abort, AbortedForTest, BatchHarness, BatchRecorder, CollectSink, ManualClock
from batchline.testing import list_stream as make_list_stream

SCHEMA = "key string, value long"


def run(spark, checkpoint, items, start_ms, batches):
    clock = ManualClock(start_ms)
    ssc = StreamingContext(spark, "1s", clock=clock, checkpoint=str(checkpoint))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    sink = CollectSink()
    make_list_stream(ssc, items, SCHEMA).foreach_batch(sink)
    ssc.start()
    clock.advance(500)
    try:
        for i in range(batches):
            recorder.wait_for_completed(i + 1, timeout=60)
            clock.advance(1000)
    finally:
        ssc.stop()
    return sink, ssc


def test_each_item_is_one_batch_and_end_ends_the_input(spark, tmp_path):
    items = [[("a", 1), ("b", 2)], [("c", 3)], END, [("never", 0)]]
    sink, _ = run(spark, tmp_path, items, 10_500, 4)
    assert sink.batches[11_000] == [{"key": "a", "value": 1}, {"key": "b", "value": 2}]
    assert sink.batches[12_000] == [{"key": "c", "value": 3}]
    # Batches that hold no row (the input has ended) call no output and run no job (SPEC E6).
    assert 13_000 not in sink.batches and 14_000 not in sink.batches


def test_abort_fails_once_and_a_restart_from_the_checkpoint_goes_on_exactly(spark, tmp_path):
    abort = Abort()
    items = [[("a", 1)], [("b", 2)], abort, [("c", 3)], END]
    clock = ManualClock(10_500)
    ssc = StreamingContext(spark, "1s", clock=clock, checkpoint=str(tmp_path))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    first = CollectSink()
    make_list_stream(ssc, items, SCHEMA).foreach_batch(first)
    ssc.start()
    clock.advance(500)
    recorder.wait_for_completed(1)
    clock.advance(1000)
    recorder.wait_for_completed(2)
    clock.advance(1000)  # the third batch meets Abort()
    with pytest.raises(AbortedForTest, match="met Abort\\(\\) at item 2"):
        ssc.await_termination(60)
    assert abort.fired

    second, _ = run(spark, tmp_path, items, 13_500, 2)
    rows = [r for t in sorted(first.batches) for r in first.batches[t]]
    rows += [r for t in sorted(second.batches) for r in second.batches[t]]
    assert sorted(r["key"] for r in rows) == ["a", "b", "c"]  # nothing lost, nothing twice


def test_the_harness_runs_one_batch_at_a_time(spark):
    harness = BatchHarness(spark, lambda s: s.group_by_key("key").count(), SCHEMA).start()
    try:
        assert harness.batch([("a", 1), ("a", 2), ("b", 3)]) == [{"key": "a", "count": 2}, {"key": "b", "count": 1}]
        assert harness.batch() == []
        assert harness.info().batch_time == harness.batch_time
    finally:
        harness.stop()
