"""A sink's commit left as a ``PendingCommit``: taken after the batch's jobs, in batch order,
while the next batch's jobs run when no stateful operator orders the batches; a failed commit
runs the batch again; a batch whose predecessor did not commit lets go of what it staged."""

import threading

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from batchline import BatchFailedError, PendingCommit, RetryPolicy, Sink, StreamingContext
from batchline.testing import END, list_stream
from tests.helpers import Count, poll_until, running_count

ROWS = StructType([StructField("key", StringType(), False), StructField("value", LongType(), False)])
BATCHES = [[("a", 1), ("b", 2)], [("a", 3)], [("c", 4), ("a", 5)], [("b", 6)], END]


class StagingSink(Sink):
    """Stages a batch's rows in ``write`` (a Spark job) and makes them visible in its pending
    commit. ``events`` is what happened, in order; ``hold`` makes a batch's commit wait (up to
    ``hold_s``) until the next batch's write has staged, which only overlapping commits allow."""

    def __init__(self, hold=False, hold_s=20.0, failing_commits=0, first_batch_fails=False, gate=None):
        self.hold, self.hold_s = hold, hold_s
        self.gate = gate
        self.failing_commits = failing_commits
        self.first_batch_fails = first_batch_fails
        self.first: int | None = None
        self.last = 2**62
        """The time of the last batch with rows, once written: no later write comes for its commit to wait for."""
        self.events: list[tuple[str, int]] = []
        self.visible: dict[int, list[tuple]] = {}
        self._lock = threading.Lock()
        self._written = threading.Condition(self._lock)

    def _note(self, what, time_ms):
        with self._lock:
            self.events.append((what, time_ms))
            self._written.notify_all()

    def write(self, df, batch):
        time_ms = int(batch.batch_time)
        self.first = time_ms if self.first is None else self.first
        self._note("write", time_ms)
        staged = sorted(tuple(row) for row in df.collect())
        if ("b", 6) in staged:
            self.last = time_ms
        self._note("staged", time_ms)
        sink = self

        class Staged(PendingCommit):
            def commit(self):
                if sink.gate is not None:
                    sink.gate.wait(60)
                if sink.hold and time_ms < sink.last:
                    with sink._written:  # the next batch's write runs while this one commits
                        sink._written.wait_for(lambda: any(w == "staged" and t > time_ms for w, t in sink.events),
                                               sink.hold_s)
                if (sink.first_batch_fails and time_ms == sink.first) or sink.failing_commits:
                    sink.failing_commits = max(0, sink.failing_commits - 1)
                    sink._note("commit failed", time_ms)
                    raise ConnectionError("the database went away mid-commit")
                sink.visible[time_ms] = staged
                sink._note("commit", time_ms)

            def abandon(self):
                sink._note("abandon", time_ms)

        return Staged()


def committed_in_order(sink):
    commits = [t for what, t in sink.events if what == "commit"]
    return commits == sorted(commits) and len(set(commits)) == len(commits)


def test_a_stateless_pipeline_commits_each_batch_while_the_next_batch_runs_and_in_order(spark, tmp_path):
    sink = StagingSink(hold=True)
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"))
    list_stream(ssc, BATCHES, ROWS, bounded=True).write(sink, name="staged")
    assert ssc.run_until_finished(120)
    writes = [t for what, t in sink.events if what == "write"]
    assert len(writes) == 4 and committed_in_order(sink)
    for time_ms in writes[:-1]:  # every commit but the last saw the next batch's write done first
        assert sink.events.index(("staged", writes[writes.index(time_ms) + 1])) < sink.events.index(("commit",
                                                                                                     time_ms))
    assert [rows for _, rows in sorted(sink.visible.items())] == [
        [("a", 1), ("b", 2)], [("a", 3)], [("a", 5), ("c", 4)], [("b", 6)]]


def test_a_stateful_pipeline_commits_a_batch_before_the_next_batch_runs(spark, tmp_path):
    sink = StagingSink(hold=True, hold_s=0.5)  # a commit waits for the next write, which must not come
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"))
    counts = list_stream(ssc, BATCHES, ROWS, bounded=True).group_by_key("key").flat_map_groups_with_state(
        running_count, state_schema=Count, output_schema="key string, count long", num_partitions=2)
    counts.write(sink, name="staged")
    assert ssc.run_until_finished(120)
    kinds = [what for what, _ in sink.events]
    assert kinds == ["write", "staged", "commit"] * (len(kinds) // 3) and len(kinds) >= 12
    assert committed_in_order(sink)
    assert sorted(row for rows in sink.visible.values() for row in rows) == [
        ("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 1)]


def test_a_failed_commit_runs_the_batch_again_and_the_next_batch_after_it(spark, tmp_path):
    sink = StagingSink(hold=True, failing_commits=1)  # the next batch has staged when the first commit fails
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"),
                           retry=RetryPolicy(max_attempts=3, initial_backoff="10ms"))
    list_stream(ssc, BATCHES, ROWS, bounded=True).write(sink, name="staged")
    assert ssc.run_until_finished(120)
    first, events = sink.first, sink.events
    failed = events.index(("commit failed", first))
    second = next(t for what, t in events if what == "staged" and t > first)
    assert events.index(("staged", second)) < failed  # it ran beside the failing commit ...
    assert ("abandon", second) in events[failed:]  # ... so what it staged is let go
    last_staged = {t: max(i for i, e in enumerate(events) if e == ("staged", t)) for t in sink.visible}
    assert sorted(last_staged, key=last_staged.get) == sorted(sink.visible)  # the writes that count, in order
    assert committed_in_order(sink) and len(sink.visible) == 4
    assert sum(len(rows) for rows in sink.visible.values()) == 6  # every row once


def test_when_a_batch_fails_for_good_the_next_one_lets_go_of_what_it_staged(spark, tmp_path):
    sink = StagingSink(hold=True, hold_s=2.0, first_batch_fails=True)
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"), retry=RetryPolicy.never())
    list_stream(ssc, BATCHES, ROWS, bounded=True).write(sink, name="staged")
    with pytest.raises(BatchFailedError, match="the database went away mid-commit"):
        ssc.run_until_finished(120)
    assert ("commit failed", sink.first) in sink.events and not sink.visible
    later = [t for what, t in sink.events if what == "staged" and t > sink.first]
    assert later and all(("abandon", t) in sink.events for t in later)


def test_an_immediate_stop_lets_go_of_a_batch_waiting_for_its_turn(spark, tmp_path):
    gate = threading.Event()
    sink = StagingSink(gate=gate)  # the first batch's commit waits for the gate
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"))
    list_stream(ssc, BATCHES, ROWS, bounded=True).write(sink, name="staged")
    ssc.start()
    try:
        assert poll_until(lambda: sum(what == "staged" for what, _ in sink.events) >= 2, timeout_s=60)
        stopper = threading.Thread(target=ssc.stop)
        stopper.start()
        assert poll_until(lambda: ("abandon", sink.events[-1][1]) in sink.events, timeout_s=30), sink.events
    finally:
        gate.set()
        stopper.join(60)
    waiting = [t for what, t in sink.events if what == "staged" and t > sink.first]
    assert waiting and all(("abandon", t) in sink.events and ("commit", t) not in sink.events for t in waiting)


class Counting(Sink):
    """An older sink that returns what it wrote: the engine ignores it, with a warning."""

    def __init__(self):
        self.rows = 0

    def write(self, df, batch):
        self.rows += df.count()
        return self.rows


def test_a_sink_that_returns_something_else_is_warned_about_once_and_still_written(spark, tmp_path, caplog):
    sink = Counting()
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"))
    list_stream(ssc, BATCHES, ROWS, bounded=True).write(sink, name="counting")
    assert ssc.run_until_finished(120)
    assert sink.rows == 6
    warnings = [r for r in caplog.records if "is not a PendingCommit" in r.getMessage()]
    assert len(warnings) == 1 and "return None" in warnings[0].getMessage()
