"""SPEC E6, an idle pipeline costs nothing: a batch with no new input and no timer due runs no
Spark job and writes no state version; a batch whose only work is due timers runs only the
partitions that hold them; a restarted driver knows the timers from the last commit, so the
batches after it are skipped as well, and the timers still fire in their batch."""

from batchline import StreamingContext
from batchline.clock import ManualClock
from batchline.state import GroupStateTimeout
from batchline.state.store import FileStateStore
from batchline.testing import BatchHarness, BatchRecorder, CollectSink, list_stream

START, INTERVAL = 100_000, 1000
PARTITIONS = 4
KEYS = [f"k{i}" for i in range(12)]


def closing_sessions(key, rows, state):
    """Counts a key's rows; four seconds of processing time after its last row, emits the count
    with the batch that closed it and forgets the key."""
    if state.has_timed_out:
        count = state.get()[0]
        state.remove()
        yield {"key": key, "count": count, "closed_in": state.current_processing_time_ms()}
        return
    count = (state.get()[0] if state.exists else 0) + sum(1 for _ in rows)
    state.update((count,))
    state.set_timeout_duration("4 seconds")


def items():
    """Batch 101000: every key, twice (their timers fall due in batch 105000); 102000: k0 again
    (its timer moves to 106000); then nothing."""
    return [[(k, 1) for k in KEYS] * 2, [("k0", 1)]] + [[] for _ in range(20)]


def start(spark, checkpoint, start_ms):
    clock = ManualClock(start_ms)
    ssc = StreamingContext(spark, INTERVAL / 1000, clock=clock, checkpoint=checkpoint)
    recorder, sink = BatchRecorder(), CollectSink()
    ssc.add_listener(recorder)
    list_stream(ssc, items(), "key string, n long").group_by_key("key").flat_map_groups_with_state(
        closing_sessions, state_schema="count long", output_schema="key string, count long, closed_in long",
        name="sessions", num_partitions=PARTITIONS, timeout=GroupStateTimeout.PROCESSING_TIME).foreach_batch(sink)
    ssc.start()
    return ssc, clock, recorder, sink


def run_until(ssc, clock, recorder, last_batch):
    while clock.now_ms() < last_batch:
        clock.advance(INTERVAL)
        info = recorder.wait_for_batch(clock.now_ms(), 120)
        assert info.failure is None, info.failure


def spark_jobs(spark, ssc, batch_time):
    prefix = ssc.job_group_prefix
    return sorted(spark.sparkContext.statusTracker().getJobIdsForGroup(f"{prefix}-{batch_time}"))


def versions_by_partition(checkpoint):
    store = FileStateStore.open(checkpoint, "sessions")
    metadata = store.read_metadata()
    return {p: set(store.list_versions(metadata.generation, p)) for p in range(metadata.num_partitions)}


def test_idle_batches_run_no_job_and_due_timers_run_only_their_partitions_across_a_restart(spark, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    ssc, clock, recorder, first_sink = start(spark, checkpoint, START)
    try:
        run_until(ssc, clock, recorder, START + 3000)
        jobs = {t: spark_jobs(spark, ssc, t) for t in range(START + 1000, START + 3001, 1000)}
    finally:
        ssc.stop()
    assert jobs[START + 1000] and jobs[START + 2000], jobs  # rows: the operator's job and the output's
    assert jobs[START + 3000] == [], jobs  # no row, nothing due: no job
    assert first_sink.all_rows() == []
    assert [i.batch_time for i in recorder.completed if i.failure is None] == [START + 1000, START + 2000,
                                                                              START + 3000]
    versions = versions_by_partition(checkpoint)
    assert all(START + 1000 in v for v in versions.values())
    assert not any(START + 3000 in v for v in versions.values()), versions
    assert all(START + 2000 in v for v in versions.values())  # a batch with rows runs every partition
    # The partition k0 lies in, as the operator's shuffle places it (Murmur3 of the key, pmod n).
    k0_partition = [spark.sql(f"SELECT pmod(hash('k0'), {PARTITIONS}) AS p").first().p]

    # A new driver: it knows every partition's earliest timer from the last commit, so its
    # first batch, idle, runs no job either.
    ssc, clock, recorder, sink = start(spark, checkpoint, START + 3000)
    try:
        run_until(ssc, clock, recorder, START + 8000)
        jobs = {t: spark_jobs(spark, ssc, t) for t in range(START + 4000, START + 8001, 1000)}
    finally:
        ssc.stop()
    closed = {t: sorted(r["key"] for r in rows) for t, rows in sink.batches.items() if rows}
    assert closed == {START + 5000: sorted(KEYS[1:]), START + 6000: ["k0"]}, closed  # each in its batch
    assert sink.batches[START + 6000] == [{"key": "k0", "count": 3, "closed_in": START + 6000}]
    assert all(r["count"] == 2 and r["closed_in"] == START + 5000 for r in sink.batches[START + 5000])
    assert jobs[START + 4000] == [], jobs
    assert jobs[START + 5000] and jobs[START + 6000], jobs
    assert jobs[START + 7000] == [] and jobs[START + 8000] == [], jobs
    versions = versions_by_partition(checkpoint)
    # 105000 ran the partitions holding keys due then; 106000 ran k0's partition alone.
    assert [p for p, v in versions.items() if START + 6000 in v] == k0_partition, versions
    assert not any(START + 4000 in v or START + 7000 in v for v in versions.values()), versions
    progress = {p.batch_time: p for p in ssc.recent_progress}
    assert progress[START + 4000].state_operators[0].state_keys == len(KEYS)  # as the last batch left it
    assert progress[START + 7000].state_operators[0].state_keys == 0


def test_a_union_and_a_window_over_an_operator_that_skips_batches_lose_nothing(spark, tmp_path):
    """The operator skips batches while another input of a union has rows, and a window reads
    skipped batches: decided when the batch is generated (the batch before has committed), and
    when its job runs (generated together with a batch still running)."""
    clock = ManualClock(START)
    ssc = StreamingContext(spark, INTERVAL / 1000, clock=clock, checkpoint=str(tmp_path / "checkpoint"))
    recorder, unioned, windowed = BatchRecorder(), CollectSink(), CollectSink()
    ssc.add_listener(recorder)
    events = list_stream(ssc, [[(k, 1) for k in KEYS[:4]]] + [[] for _ in range(10)], "key string, n long")
    others = list_stream(ssc, [[], [("x", 0, 0)], [], [("y", 0, 0)]] + [[] for _ in range(10)],
                         "key string, count long, closed_in long", name="others")
    sessions = events.group_by_key("key").flat_map_groups_with_state(
        closing_sessions, state_schema="count long", output_schema="key string, count long, closed_in long",
        name="sessions", num_partitions=PARTITIONS, timeout=GroupStateTimeout.PROCESSING_TIME)
    sessions.union(others).foreach_batch(unioned, name="unioned")
    sessions.window("3s").foreach_batch(windowed, name="windowed")
    ssc.start()
    try:
        clock.advance(2 * INTERVAL)  # 101000 (rows) and 102000 generated at once: 102000's skip is decided as it runs
        for t in (START + 1000, START + 2000):
            assert recorder.wait_for_batch(t, 120).failure is None
        run_until(ssc, clock, recorder, START + 7000)
    finally:
        ssc.stop()
    closed = [{"key": k, "count": 1, "closed_in": START + 5000} for k in sorted(KEYS[:4])]
    # 101000 ran the operator (rows came, nothing closed): its outputs are called, with no row.
    assert unioned.batches == {START + 1000: [], START + 2000: [{"key": "x", "count": 0, "closed_in": 0}],
                               START + 4000: [{"key": "y", "count": 0, "closed_in": 0}],
                               START + 5000: closed}
    # Windows of three batches: those that reach back to 101000 (no row) or to 105000's closed
    # sessions; the window of 102000 to 104000 holds only skipped batches and is not called.
    assert windowed.batches == {START + 1000: [], START + 2000: [], START + 3000: [],
                                **{t: closed for t in (START + 5000, START + 6000, START + 7000)}}


def test_a_count_still_gives_its_row_for_a_batch_without_rows(spark):
    """``count()`` is one row per batch, zero included: a transform may make rows from nothing,
    so only the ones that say they keep empty batches empty (select, filter, union, grouped
    aggregations) let an idle batch skip them."""
    harness = BatchHarness(spark, lambda s: s.count(), "key string").start()
    try:
        assert harness.batch([("a",), ("b",)]) == [{"count": 2}]
        assert harness.batch() == [{"count": 0}]
    finally:
        harness.stop()
    harness = BatchHarness(spark, lambda s: s.where("key != 'x'"), "key string").start()
    try:
        assert harness.batch([("a",)]) == [{"key": "a"}]
        harness.batch()
        assert harness.batch_time not in harness.sink.batches  # no row: the output was not called
    finally:
        harness.stop()

