"""Running and event-time windowed aggregations end to end, one batch at a time: partials in
Spark, their merge in the state, append and update modes, late partials dropped and counted."""

import pytest

from batchline import aggregates as agg
from batchline import session_window, window
from batchline.errors import ConfigurationError
from batchline.testing import BatchHarness
from tests.helpers import at, naive

SCHEMA = "user string, amount long, ts timestamp"


def harness(spark, tmp_path, build):
    return BatchHarness(spark, build, SCHEMA, checkpoint=str(tmp_path / "checkpoint")).start()


def windowed_counts(mode, slide=None):
    def build(stream):
        return (stream.with_watermark("ts", "10 seconds")
                .group_by_key(window("ts", "60 seconds", slide), "user")
                .aggregate(agg.count(), agg.sum("amount"), agg.max("amount"), output_mode=mode, name="per_minute",
                           num_partitions=2))
    return build


def test_append_emits_each_window_once_when_the_watermark_passes_its_end(spark, tmp_path):
    h = harness(spark, tmp_path, windowed_counts("append"))
    try:
        assert h.batch([("a", 1, at(5)), ("a", 2, at(20)), ("b", 7, at(30))]) == []
        assert h.batch([("a", 4, at(50))]) == []  # watermark 10 s: the first window [0, 60) is open
        # Newest event 75 s: watermark 65 s passes the end of [0, 60), in the batch after.
        assert h.batch([("a", 8, at(75))]) == []
        out = h.batch([("b", 1, at(80))])
        assert sorted(out, key=lambda r: r["user"]) == [
            {"user": "a", "window_start": naive(0), "window_end": naive(60), "count": 3, "sum_amount": 7,
             "max_amount": 4},
            {"user": "b", "window_start": naive(0), "window_end": naive(60), "count": 1, "sum_amount": 7,
             "max_amount": 7},
        ]
        # Late: [0, 60) ended at or before the watermark (70 s): dropped, counted, never emitted again.
        assert h.batch([("a", 100, at(59)), ("c", 1, at(90))]) == []
        operator = h.info().state_operators["per_minute"]
        assert (operator.late_rows, operator.input_rows) == (1, 2)
    finally:
        h.stop()


def test_update_emits_the_windows_that_changed_each_batch(spark, tmp_path):
    h = harness(spark, tmp_path, windowed_counts("update"))
    try:
        first = h.batch([("a", 1, at(5)), ("a", 2, at(65))])
        assert sorted((r["window_start"], r["count"], r["sum_amount"]) for r in first) == [
            (naive(0), 1, 1), (naive(60), 1, 2)]
        assert [(r["window_start"], r["count"], r["sum_amount"]) for r in h.batch([("a", 5, at(70))])] == [
            (naive(60), 2, 7)]
        assert h.batch([]) == []
    finally:
        h.stop()


def test_sliding_windows_count_a_row_in_every_window_it_falls_in(spark, tmp_path):
    h = harness(spark, tmp_path, windowed_counts("update", slide="30 seconds"))
    try:
        out = h.batch([("a", 1, at(45))])
        assert sorted((r["window_start"], r["window_end"]) for r in out) == [(naive(0), naive(60)),
                                                                             (naive(30), naive(90))]
    finally:
        h.stop()


def test_a_running_aggregation_keeps_totals_across_batches(spark, tmp_path):
    h = harness(spark, tmp_path, lambda s: s.group_by_key("user").aggregate(
        agg.count(), agg.sum("amount").alias("total"), agg.avg("amount"), agg.min("amount"),
        agg.collect_set("amount"), agg.collect_list("amount"), name="totals", num_partitions=2))
    try:
        assert h.batch([("a", 1, at(1)), ("a", 3, at(2))]) == [
            {"user": "a", "count": 2, "total": 4, "avg_amount": 2.0, "min_amount": 1, "collect_set_amount": [1, 3],
             "collect_list_amount": [1, 3]}]
        out = h.batch([("a", 3, at(3)), ("b", 5, at(3))])
        by_user = {r["user"]: r for r in out}
        assert (by_user["a"]["count"], by_user["a"]["total"], by_user["a"]["collect_set_amount"]) == (3, 7, [1, 3])
        assert by_user["b"]["total"] == 5
        assert h.batch([]) == []  # nothing changed: nothing emitted
    finally:
        h.stop()


def test_first_and_last_pick_by_event_time_across_batches(spark, tmp_path):
    h = harness(spark, tmp_path, lambda s: s.with_watermark("ts", "1 hour").group_by_key("user").aggregate(
        agg.first("amount"), agg.last("amount"), name="first_last"))
    try:
        assert h.batch([("a", 2, at(20)), ("a", 1, at(10))]) == [
            {"user": "a", "first_amount": 1, "last_amount": 2}]
        assert h.batch([("a", 0, at(5)), ("a", 9, at(15))]) == [
            {"user": "a", "first_amount": 0, "last_amount": 2}]
    finally:
        h.stop()


def test_a_global_aggregation_without_keys(spark, tmp_path):
    h = harness(spark, tmp_path, lambda s: s.aggregate(agg.count(), agg.sum("amount"), name="everything"))
    try:
        assert h.batch([("a", 1, at(1)), ("b", 2, at(2))]) == [{"count": 2, "sum_amount": 3}]
        assert h.batch([("c", 4, at(3))]) == [{"count": 3, "sum_amount": 7}]
    finally:
        h.stop()


def test_aggregates_that_cannot_merge_are_refused_with_the_ones_that_can(spark, tmp_path):
    from pyspark.sql import functions as F

    from batchline import StreamingContext

    ssc = StreamingContext(spark, 1, checkpoint=str(tmp_path))
    stream = ssc.queue_stream([], schema=SCHEMA)
    with pytest.raises(ConfigurationError, match=r"aggregates\.count\(\), aggregates\.sum\(\).*got Column"):
        stream.group_by_key("user").aggregate(F.percentile_approx("amount", 0.5))
    with pytest.raises(ConfigurationError, match="needs a window and a watermark"):
        stream.group_by_key("user").aggregate(agg.count(), output_mode="append")
    with pytest.raises(ConfigurationError, match="output_mode must be one of"):
        stream.group_by_key("user").aggregate(agg.count(), output_mode="complete")
    with pytest.raises(ConfigurationError, match=r"use \.aggregate"):
        stream.group_by_key(window("ts", "1 minute")).count()


def sessions(mode):
    def build(stream):
        return (stream.with_watermark("ts", "5 seconds")
                .group_by_key(session_window("ts", "10 seconds"), "user")
                .aggregate(agg.count(), agg.sum("amount"), output_mode=mode, name="sessions", num_partitions=2))
    return build


def test_session_windows_merge_across_batches_and_a_restart_and_close_on_the_watermark(spark, tmp_path):
    h = harness(spark, tmp_path, sessions("append"))
    try:
        assert h.batch([("a", 1, at(10)), ("a", 2, at(15)), ("b", 7, at(12))]) == []  # a [10, 25), b [12, 22)
        assert h.batch([("a", 3, at(30))]) == []  # a [30, 40) apart from [10, 25): the watermark is 10 s
        restart_at = h.batch_time
    finally:
        h.stop()
    h = BatchHarness(spark, sessions("append"), SCHEMA, checkpoint=str(tmp_path / "checkpoint"),
                     start_ms=restart_at + 500).start()
    h.batch_time = restart_at  # batches keep to the interval's grid: the next is one interval on
    try:
        # a@20 bridges [10, 25) and [30, 40) into [10, 40); the watermark (25 s) closes b's
        # session [12, 22); a@14's own session [14, 24) ended at the watermark: late.
        assert h.batch([("a", 4, at(20)), ("a", 100, at(14)), ("c", 1, at(40))]) == [
            {"user": "b", "window_start": naive(12), "window_end": naive(22), "count": 1, "sum_amount": 7}]
        assert h.info().state_operators["sessions"].late_rows == 1
        assert h.batch([("c", 1, at(50))]) == []  # the watermark is 35 s: [10, 40) is still open
        assert h.batch([]) == [  # 45 s
            {"user": "a", "window_start": naive(10), "window_end": naive(40), "count": 4, "sum_amount": 10}]
    finally:
        h.stop()


def test_session_windows_in_update_mode_emit_the_sessions_that_changed(spark, tmp_path):
    h = harness(spark, tmp_path, sessions("update"))
    try:
        assert h.batch([("a", 1, at(10)), ("a", 2, at(30))]) == [
            {"user": "a", "window_start": naive(10), "window_end": naive(20), "count": 1, "sum_amount": 1},
            {"user": "a", "window_start": naive(30), "window_end": naive(40), "count": 1, "sum_amount": 2}]
        assert h.batch([("a", 5, at(35))]) == [
            {"user": "a", "window_start": naive(30), "window_end": naive(45), "count": 2, "sum_amount": 7}]
    finally:
        h.stop()


def test_an_idle_input_with_an_idle_timeout_closes_its_last_windows_and_without_one_they_stay_open(spark, tmp_path):
    def build(idle_timeout):
        return lambda s: (s.with_watermark("ts", "10 seconds", idle_timeout=idle_timeout)
                          .group_by_key(window("ts", "60 seconds"), "user")
                          .aggregate(agg.count(), output_mode="append", name="per_minute", num_partitions=2))

    quiet = harness(spark, tmp_path / "quiet", build("3 seconds"))
    try:
        assert quiet.batch([("a", 1, at(50))]) == []  # watermark 40 s after it: [0, 60) open
        # Batches of 1 s without rows: 3 s idle moves the watermark on by the time idle, so it
        # reaches 60 s once 40 s + idle >= 60 s, 20 batches after the data.
        closed_at = next((n for n in range(1, 25) if quiet.batch([])), None)
        assert closed_at == 20
        assert quiet.sink.batches[quiet.batch_time] == [
            {"user": "a", "window_start": naive(0), "window_end": naive(60), "count": 1}]
    finally:
        quiet.stop()
    waiting = harness(spark, tmp_path / "waiting", build(None))
    try:
        assert waiting.batch([("a", 1, at(50))]) == []
        assert all(waiting.batch([]) == [] for _ in range(25))  # as Spark: open until a row moves it
    finally:
        waiting.stop()


def test_session_windows_without_keys_are_one_group(spark, tmp_path):
    h = harness(spark, tmp_path, lambda s: s.with_watermark("ts", "5 seconds").group_by_key(
        session_window("ts", "10 seconds")).aggregate(agg.count(), output_mode="update", name="sessions"))
    try:
        assert h.batch([("a", 1, at(10)), ("b", 2, at(15))]) == [
            {"window_start": naive(10), "window_end": naive(25), "count": 2}]
    finally:
        h.stop()
