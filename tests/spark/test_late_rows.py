"""Late rows as a stream of their own (SPEC D3): a row an operator dropped behind its watermark
comes out of ``late_rows`` with the operator's name and the watermark it missed (for a window,
with the window it missed), is counted, and is never in a window that was already emitted."""

import pytest

from batchline import aggregates as agg
from batchline import session_window, window
from batchline.errors import ConfigurationError
from batchline.testing import BatchHarness, CollectSink
from tests.helpers import at, naive

SCHEMA = "user string, amount long, ts timestamp"


def run(spark, tmp_path, operator):
    late = CollectSink()

    def build(stream):
        result = operator(stream.with_watermark("ts", "10 seconds"))
        result.late_rows.foreach_batch(late, name="late")
        return result

    harness = BatchHarness(spark, build, SCHEMA, checkpoint=str(tmp_path / "checkpoint")).start()
    return harness, late


def late_of(late, harness):
    return late.batches.get(harness.batch_time, [])


def test_a_late_row_of_a_window_comes_out_with_the_window_and_the_watermark_it_missed(spark, tmp_path):
    h, late = run(spark, tmp_path, lambda s: s.group_by_key(window("ts", "60 seconds"), "user").aggregate(
        agg.count(), agg.sum("amount"), output_mode="append", name="per_minute", num_partitions=2))
    try:
        assert h.batch([("a", 1, at(5)), ("a", 2, at(75))]) == []
        emitted = h.batch([("b", 1, at(80))])  # watermark 65 s: [0, 60) closes
        assert [(r["user"], r["window_start"], r["count"]) for r in emitted] == [("a", naive(0), 1)]
        out = h.batch([("a", 100, at(59)), ("c", 1, at(90))])
        assert out == []  # the emitted window stays as it was
        assert late_of(late, h) == [{"user": "a", "amount": 100, "ts": naive(59), "window_start": naive(0),
                                     "window_end": naive(60), "operator": "per_minute", "watermark": naive(70)}]
        assert h.info().state_operators["per_minute"].late_rows == 1
        assert h.batch([("a", 3, at(95))]) == [] and late_of(late, h) == []  # on time: not late
    finally:
        h.stop()


def test_a_row_late_for_one_sliding_window_only_comes_once_and_counts_in_the_other(spark, tmp_path):
    h, late = run(spark, tmp_path, lambda s: s.group_by_key(window("ts", "60 seconds", "30 seconds"), "user")
                  .aggregate(agg.count(), output_mode="update", name="sliding", num_partitions=2))
    try:
        h.batch([("a", 1, at(100))])  # watermark 90 s from the next batch on
        out = h.batch([("a", 2, at(50))])  # windows [0, 60) (ended: late) and [30, 90) (ended at 90: late too)
        assert out == []
        assert sorted((r["window_start"], r["window_end"]) for r in late_of(late, h)) == [
            (naive(0), naive(60)), (naive(30), naive(90))]
        out = h.batch([("a", 3, at(95))])  # [60, 120) and [90, 150): both open
        assert sorted((r["window_start"], r["count"]) for r in out) == [(naive(60), 2), (naive(90), 2)]
        out = h.batch([("a", 4, at(85))])  # [30, 90) ended (late), [60, 120) open: counted there
        assert [(r["window_start"], r["count"]) for r in out] == [(naive(60), 3)]
        assert [(r["window_start"], r["amount"]) for r in late_of(late, h)] == [(naive(30), 4)]
    finally:
        h.stop()


def test_late_duplicates_and_session_rows_come_out_too(spark, tmp_path):
    h, late = run(spark, tmp_path, lambda s: s.drop_duplicates("user", "ts", name="dedup", num_partitions=2))
    try:
        h.batch([("a", 1, at(100))])
        assert h.batch([("b", 2, at(90)), ("c", 3, at(91))]) == [
            {"user": "c", "amount": 3, "ts": naive(91)}]
        assert [(r["user"], r["operator"], r["watermark"]) for r in late_of(late, h)] == [("b", "dedup", naive(90))]
    finally:
        h.stop()
    h, late = run(spark, tmp_path / "sessions", lambda s: s.group_by_key(session_window("ts", "5 seconds"), "user")
                  .aggregate(agg.count(), output_mode="append", name="sessions", num_partitions=2))
    try:
        h.batch([("a", 1, at(100))])
        h.batch([("b", 2, at(84)), ("c", 3, at(86))])  # watermark 90: b's session ends at 89, c's at 91
        assert [r["user"] for r in late_of(late, h)] == ["b"]
    finally:
        h.stop()


def test_an_operator_that_drops_nothing_has_no_late_rows(spark):
    from batchline import StreamingContext

    ssc = StreamingContext(spark, "1s")
    stream = ssc.queue_stream([], schema=SCHEMA)
    with pytest.raises(ConfigurationError, match="drops no row as late"):
        stream.group_by_key("user").aggregate(agg.count(), name="totals").late_rows  # noqa: B018
    with pytest.raises(ConfigurationError, match="stateful operator"):
        stream.late_rows  # noqa: B018
