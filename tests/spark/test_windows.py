"""Windows over batches and the release of batch data no window needs any more (SPEC A5, C1)."""

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from batchline import ConfigurationError, StreamingContext
from batchline.clock import ManualClock
from batchline.testing import BatchRecorder, CollectSink
from tests.helpers import poll_until

SCHEMA = StructType([StructField("n", LongType(), False)])


def run_batches(spark, build, count, start_ms=10_500, settled=None):
    """``count`` batches; with ``settled``, a predicate of the runtimes, waits (10 s at most)
    until it holds before stopping: the generator cleans up after a batch on its own thread,
    and a stop drops what it has not handled yet."""
    clock = ManualClock(start_ms)
    ssc = StreamingContext(spark, "1s", clock=clock)
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    result = build(ssc)
    ssc.start()
    try:
        clock.advance(500)
        for i in range(count):
            recorder.wait_for_completed(i + 1)
            if i + 1 < count:
                clock.advance(1000)
        if settled is not None:
            poll_until(lambda: settled(_runtimes(ssc, result)))
    finally:
        ssc.stop()
    # What the test built, as the runtimes the run left behind (generated batches, memory).
    return _runtimes(ssc, result)


def _runtimes(ssc, result):
    if isinstance(result, tuple):
        return tuple(ssc.runtime_of(stream) for stream in result)
    return ssc.runtime_of(result) if result is not None else None


def numbered_batches(spark, count):
    return [spark.createDataFrame([(i,)], SCHEMA) for i in range(1, count + 1)]


def test_sliding_window_contents_over_several_batches(spark):
    sink = CollectSink()

    def build(ssc):
        queue = ssc.queue_stream(numbered_batches(spark, 8), schema=SCHEMA)
        queue.window("3s", "2s").foreach_batch(sink)
        return queue

    queue = run_batches(spark, build, 8)
    # Zero time is 10 000; batch 11 000 holds 1, 12 000 holds 2, ... ; the window slides on
    # 12 000, 14 000, ... and covers (t - 3 s, t].
    assert sink.batches == {
        12_000: [{"n": 1}, {"n": 2}],
        14_000: [{"n": 2}, {"n": 3}, {"n": 4}],
        16_000: [{"n": 4}, {"n": 5}, {"n": 6}],
        18_000: [{"n": 6}, {"n": 7}, {"n": 8}],
    }
    # The queue only keeps what the next window still needs (remember = slide + window).
    assert queue.remember_ms == 5000
    assert queue.generated_times() == [14_000, 15_000, 16_000, 17_000, 18_000]


def test_tumbling_window_with_aggregation(spark):
    sink = CollectSink()

    def build(ssc):
        queue = ssc.queue_stream(numbered_batches(spark, 6), schema=SCHEMA)
        queue.window("2s", "2s").transform(lambda df: df.agg(F.sum("n").alias("total"))).foreach_batch(sink)

    run_batches(spark, build, 6)
    assert sink.batches == {12_000: [{"total": 3}], 14_000: [{"total": 7}], 16_000: [{"total": 11}]}


def test_without_windows_each_batch_is_released_after_it_completes(spark):
    sink = CollectSink()

    def build(ssc):
        queue = ssc.queue_stream(numbered_batches(spark, 4), schema=SCHEMA)
        doubled = queue.with_column("twice", F.col("n") * 2)
        doubled.foreach_batch(sink)
        return queue, doubled

    def released(runtimes):
        return all(len(runtime.generated_times()) <= 1 for runtime in runtimes)

    queue, doubled = run_batches(spark, build, 4, settled=released)
    assert sink.all_rows() == [{"n": i, "twice": 2 * i} for i in range(1, 5)]
    assert released((queue, doubled))


def test_transform_may_take_the_batch_time_and_union_merges_streams(spark):
    sink = CollectSink()

    def build(ssc):
        a = ssc.queue_stream(numbered_batches(spark, 2), schema=SCHEMA)
        b = ssc.queue_stream([spark.createDataFrame([(100,)], SCHEMA)], schema=SCHEMA)
        tagged = a.union(b).transform(lambda df, batch_time: df.withColumn("at", F.lit(int(batch_time))))
        tagged.foreach_batch(sink)

    run_batches(spark, build, 2)
    assert sink.batches == {
        11_000: [{"n": 1, "at": 11_000}, {"n": 100, "at": 11_000}],
        12_000: [{"n": 2, "at": 12_000}],
    }


def test_window_lengths_must_be_multiples_of_the_slide(spark):
    ssc = StreamingContext(spark, "1s")
    queue = ssc.queue_stream([], schema=SCHEMA)
    with pytest.raises(ConfigurationError, match="multiple of the parent stream's slide"):
        queue.window("1500ms")
    with pytest.raises(ConfigurationError, match="slide interval"):
        queue.window("4s", "2500ms")


def test_transform_must_return_a_dataframe(spark):
    def build(ssc):
        ssc.queue_stream(numbered_batches(spark, 1), schema=SCHEMA).transform(lambda df: df.count()).foreach_batch(
            lambda df, t: None
        )

    clock = ManualClock(10_500)
    ssc = StreamingContext(spark, "1s", clock=clock)
    build(ssc)
    ssc.start()
    clock.advance(500)
    with pytest.raises(TypeError, match="must return a DataFrame; it returned int"):
        ssc.await_termination(60)
