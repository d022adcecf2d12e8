"""Deduplication end to end, one batch at a time: each key's first row passes, later ones are
dropped, late rows are counted, keys expire with the watermark."""

from batchline.testing import BatchHarness
from tests.spark.test_aggregations import at, naive

SCHEMA = "id string, value long, ts timestamp"


def harness(spark, tmp_path, build):
    return BatchHarness(spark, build, SCHEMA, checkpoint=str(tmp_path / "checkpoint")).start()


def ids(rows):
    return sorted((r["id"], r["value"], r["ts"]) for r in rows)


def test_within_watermark_passes_a_key_once_until_the_watermark_passes_its_first_row_plus_the_delay(spark, tmp_path):
    h = harness(spark, tmp_path, lambda s: s.with_watermark("ts", "10 seconds").drop_duplicates_within_watermark(
        "id", name="dedup", num_partitions=2))
    try:
        # Within the batch: the earliest row of each key passes.
        assert ids(h.batch([("a", 1, at(20)), ("a", 2, at(15)), ("b", 3, at(16))])) == [
            ("a", 2, naive(15)), ("b", 3, naive(16))]
        # Watermark 10 s now: a duplicate of "a" later on is dropped.
        assert h.batch([("a", 4, at(30))]) == []
        # Watermark 20 s: "a" expires at 15 + 10 = 25 s; "b" at 26 s. Late: ts <= 20 s.
        assert h.batch([("c", 5, at(19)), ("c", 6, at(45))]) == [{"id": "c", "value": 6, "ts": naive(45)}]
        operator = h.info().state_operators["dedup"]
        assert (operator.input_rows, operator.late_rows, operator.output_rows) == (2, 1, 1)
        # Watermark 35 s: the time of "a" (25 s) is up, but as in Spark this batch's rows are
        # still duplicates; the key goes after the batch, and passes again in the next.
        assert h.batch([("a", 7, at(40))]) == []
        assert ids(h.batch([("a", 8, at(41))])) == [("a", 8, naive(41))]
    finally:
        h.stop()


def test_drop_duplicates_on_the_event_time_column_keeps_a_key_until_the_watermark_reaches_it(spark, tmp_path):
    h = harness(spark, tmp_path, lambda s: s.with_watermark("ts", "5 seconds").drop_duplicates(
        "id", "ts", name="dedup", num_partitions=2))
    try:
        assert ids(h.batch([("a", 1, at(10)), ("a", 2, at(10)), ("a", 3, at(11))])) == [
            ("a", 1, naive(10)), ("a", 3, naive(11))]
        assert h.batch([("a", 9, at(11)), ("b", 1, at(30))]) == [{"id": "b", "value": 1, "ts": naive(30)}]
        assert h.batch([("a", 9, at(11))]) == []  # late now: the watermark is 25 s
        assert h.info().state_operators["dedup"].late_rows == 1
    finally:
        h.stop()


def test_without_a_watermark_keys_are_kept_for_ever(spark, tmp_path):
    h = harness(spark, tmp_path, lambda s: s.drop_duplicates("id", name="dedup"))
    try:
        assert ids(h.batch([("a", 1, at(10)), ("a", 1, at(10))])) == [("a", 1, naive(10))]
        assert h.batch([("a", 2, at(99))]) == []
        assert ids(h.batch([("b", 2, at(1))])) == [("b", 2, naive(1))]
    finally:
        h.stop()
