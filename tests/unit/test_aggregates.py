"""The aggregates' halves in the state, without Spark: merging a batch's partial into the
stored one, and the value a row out carries."""

import datetime as dt

import pytest

from batchline import TimeWindow, window
from batchline import aggregates as agg
from batchline.errors import ConfigurationError


def merged(aggregate, *partials):
    merge, finish = aggregate.merger(), aggregate.finisher()
    stored = partials[0]
    for batch in partials[1:]:
        stored = merge(stored, batch)
    return finish(stored)


def test_sums_counts_and_extremes_skip_nulls_as_spark_does():
    assert merged(agg.count(), (2,), (3,)) == 5
    assert merged(agg.sum("x"), (None,), (4,), (None,)) == 4
    assert merged(agg.min("x"), (5,), (None,), (3,)) == 3
    assert merged(agg.max("x"), (None,), (None,)) is None
    assert merged(agg.avg("x"), (6.0, 2), (None, 0), (3.0, 1)) == 3.0
    assert merged(agg.avg("x"), (None, 0)) is None


def test_first_and_last_follow_event_time_and_keep_the_earlier_batch_on_ties():
    t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    early, late = t, t + dt.timedelta(seconds=1)
    assert merged(agg.first("x"), (late, "b"), (early, "a")) == "a"
    assert merged(agg.first("x"), (early, "a"), (early, "z")) == "a"
    assert merged(agg.last("x"), (late, "b"), (early, "a")) == "b"
    assert merged(agg.last("x"), (late, "b"), (late, "c")) == "c"  # a later batch wins a tie
    assert merged(agg.first("x"), (None, None), (early, "a")) == "a"


def test_collections_append_and_unite():
    assert merged(agg.collect_list("x"), ([1, 2],), ([2],)) == [1, 2, 2]
    assert merged(agg.collect_set("x"), ([2, 3],), ([1, 3],)) == [1, 2, 3]
    assert merged(agg.collect_set("x"), ([{"a": 1}],), ([{"a": 1}, {"b": 2}],)) == [{"a": 1}, {"b": 2}]
    assert merged(agg.collect_list("x"), (None,)) == []


def test_names_and_aliases():
    assert [a.name for a in (agg.count(), agg.count("x"), agg.sum("amount"), agg.avg("x").alias("mean"))] == [
        "count", "count_x", "sum_amount", "mean"]
    assert agg.avg("x").stored_names() == ["avg_x_sum", "avg_x_count"]
    with pytest.raises(ConfigurationError, match="takes a column name"):
        agg.sum(1)
    with pytest.raises(ConfigurationError, match=r"two aggregates are called \['count'\]"):
        agg.check_aggregates((agg.count(), agg.count()), "aggregate()")


def test_windows_are_checked_as_spark_checks_them():
    assert window("ts", "5 minutes", "1 minute", "30 seconds") == TimeWindow("ts", 300_000, 60_000, 30_000)
    with pytest.raises(ConfigurationError, match="cannot be longer than its length"):
        window("ts", "1 minute", "2 minutes")
    with pytest.raises(ConfigurationError, match="must be shorter than its slide"):
        window("ts", "1 minute", None, "1 minute")


def test_an_idle_timeout_moves_the_watermark_on_with_the_time_idle():
    from batchline.streams.base import Watermark

    plain, idle = Watermark("ts", 5_000), Watermark("ts", 5_000, idle_timeout_ms=3_000)
    assert plain.at(60_000, batch_time=1_000_000, last_rows_at=990_000) == 55_000  # as Spark: it waits
    assert idle.at(60_000, batch_time=992_000, last_rows_at=990_000) == 55_000  # idle 2 s: not yet
    assert idle.at(60_000, batch_time=993_000, last_rows_at=990_000) == 58_000  # idle 3 s: on by 3 s
    assert idle.at(60_000, batch_time=1_000_000, last_rows_at=None) == 55_000
