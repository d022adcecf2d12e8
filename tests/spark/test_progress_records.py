"""Progress records (SPEC I3) checked against a known input: records, dead letters, late rows,
keys in state, timed-out keys, durations present and ordered; kept at the checkpoint location
for other processes; served as Prometheus metrics that agree with them; and listeners that
block never delay a batch."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql.types import IntegerType, StringType, StructField, StructType, TimestampType

from batchline import StreamingContext, StreamingListener
from batchline.batch_time import format_batch_time
from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import ManualClock
from batchline.observe.progress_log import read_progress
from batchline.scheduler.progress import BatchProgress
from batchline.state import GroupStateTimeout
from batchline.testing import BatchRecorder, CollectSink
from tests.helpers import Count, event_time_count, poll_until

SCHEMA = StructType([StructField("key", StringType(), False), StructField("value", IntegerType(), True),
                     StructField("ts", TimestampType(), True)])
START, INTERVAL = 100_000, 1000
OUTPUT_MS = 250
T0 = 1_000_000_000_000  # event time of the first rows, epoch ms


def line(key: str, ts_ms: int, value: int = 1) -> str:
    return json.dumps({"key": key, "value": value, "ts": format_batch_time(ts_ms)})


def write_files(directory: Path) -> None:
    """Batch 1: 10 rows over k0..k4 at T0, 2 bad lines. Batch 2: 3 rows of k0 a minute later, 1
    bad line: the watermark passes T0 + 5 s. Batch 3: 4 rows of k1, k2 at T0 (late) and one of
    k0; k1..k4 time out (their timers are at T0 + 5 s)."""
    directory.mkdir()
    batches = [
        [line(f"k{i % 5}", T0) for i in range(10)] + ["not json", json.dumps({"key": "k1", "value": "x"})],
        [line("k0", T0 + 60_000)] * 3 + ['{"broken'],
        [line("k1", T0), line("k2", T0), line("k1", T0), line("k2", T0), line("k0", T0 + 60_500)],
    ]
    for index, lines in enumerate(batches):
        (directory / f"batch-{index}.json").write_text("\n".join(lines) + "\n")


def test_progress_records_say_what_each_batch_did(spark, tmp_path):
    write_files(tmp_path / "in")
    clock = ManualClock(START)
    location = tmp_path / "checkpoint"
    ssc = StreamingContext(spark, INTERVAL / 1000, clock=clock, checkpoint=str(location), progress_records=2)
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    events = ssc.file_stream(str(tmp_path / "in"), "json", SCHEMA, settle=0, max_files_per_batch=1, name="events")
    counts = events.with_watermark("ts", "1 second").group_by_key("key").flat_map_groups_with_state(
        event_time_count, state_schema=Count, output_schema="key string, count long", name="counts",
        num_partitions=2, timeout=GroupStateTimeout.EVENT_TIME)
    collected = CollectSink()

    def out(df, batch_time):  # the output takes 250 ms of the manual clock: durations are exact
        collected(df, batch_time)
        clock.advance(OUTPUT_MS)

    counts.foreach_batch(out, name="out")
    ssc.start()
    try:
        for i in range(1, 4):
            clock.advance(INTERVAL)
            recorder.wait_for_batch(START + i * INTERVAL, 120)
        records = ssc.recent_progress
    finally:
        ssc.stop()

    assert [r.batch_time for r in records] == [START + 2 * INTERVAL, START + 3 * INTERVAL]  # progress_records=2
    assert ssc.last_progress == records[-1]
    by_batch = {r.batch_time: r for r in records}
    second, third = by_batch[START + 2 * INTERVAL], by_batch[START + 3 * INTERVAL]
    expected = [(second, (3, 1, 0, 0, 5)), (third, (5, 0, 4, 4, 1))]
    for record, (rows, dead, late, timed_out, keys) in expected:
        (events_in,) = record.inputs
        (operator,) = record.state_operators
        assert record.status == "completed" and record.attempts == 1 and not record.errors
        assert (events_in.name, events_in.records, events_in.dead_letters) == ("events", rows, dead)
        assert (record.records, record.dead_letters, record.late_records) == (rows, dead, late)
        assert (operator.operator, operator.late_rows, operator.timed_out, operator.state_keys) == (
            "counts", late, timed_out, keys)
        assert operator.delta_bytes > 0 and operator.state_bytes > 0
        assert events_in.input_rate == rows / (INTERVAL / 1000)
        (taken,) = events_in.position["files"]  # the input's position: the file this batch read
        assert str(taken).endswith(f"batch-{(record.batch_time - START) // INTERVAL - 1}.json"), taken
        # Durations, exact on the manual clock: each output took 250 ms of it, so the clock runs
        # 250 ms later with every batch, and batch n's timer fires 250 * (n - 1) ms late.
        late_by = OUTPUT_MS * ((record.batch_time - START) // INTERVAL - 1)
        assert (record.scheduling_delay_ms, record.processing_ms, record.total_delay_ms) == (
            late_by, OUTPUT_MS, late_by + OUTPUT_MS)
        assert record.submission_time_ms == record.processing_start_ms == record.batch_time + late_by
        assert [(j.kind, j.name, j.started_ms, j.duration_ms) for j in record.durations.jobs] == [
            ("state", "counts", record.processing_start_ms, 0),
            ("output", "out", record.processing_start_ms, OUTPUT_MS),  # the operator's tasks run in this job
            ("state_completion", "counts", record.processing_start_ms + OUTPUT_MS, 0)]
        assert (record.durations.generation_ms, record.durations.commit_ms) == (0, 0)
        assert events_in.processing_rate == rows / (OUTPUT_MS / 1000)
        assert events_in.late_records == late  # the operator reads only this input
        assert record.lease_token is not None and record.lease_holder
    assert second.watermark_ms == T0 - 1000 and third.watermark_ms == T0 + 60_000 - 1000
    # The record is JSON, and reads back the same.
    assert BatchProgress.from_json(json.loads(json.dumps(third.to_json()))) == third

    # Kept at the checkpoint location for other processes (the newest two).
    kept = read_progress(CheckpointStorage(str(location)))
    assert [r.batch_time for r in kept] == [r.batch_time for r in records]
    assert kept[-1].state_operators == third.state_operators


class Sleeper(StreamingListener):
    """Sleeps 5 s in every call."""

    def __init__(self) -> None:
        self.calls = 0

    def on_batch_completed(self, info) -> None:
        self.calls += 1
        time.sleep(5)

    def on_progress(self, progress) -> None:
        self.calls += 1
        time.sleep(5)


class Raiser(StreamingListener):
    def on_progress(self, progress) -> None:
        raise RuntimeError("a broken exporter")


def test_a_listener_that_sleeps_leaves_scheduling_delays_unchanged_and_metrics_agree(spark, tmp_path):
    """Real time, 300 ms batches for about 4 s, a listener sleeping 5 s per call and one that
    raises: batches keep their pace; /metrics, scraped over HTTP while the pipeline runs,
    agrees with the progress records."""
    ssc = StreamingContext(spark, "300ms", checkpoint=str(tmp_path / "checkpoint"), metrics_port=0, name="sleepy")
    sleeper = Sleeper()
    ssc.add_listener(sleeper)
    ssc.add_listener(Raiser())
    stream = ssc.generator_stream(2000, users=20, name="gen")
    stream.foreach_batch(lambda df, t: df.count(), name="count")
    ssc.start()
    try:
        poll_until(lambda: len(ssc.recent_progress) >= 12, 60, 0.1)
        with urllib.request.urlopen(ssc.metrics_url, timeout=10) as response:
            scraped = response.read().decode()
        records = ssc.recent_progress
    finally:
        ssc.stop()
    assert len(records) >= 12 and sleeper.calls <= 3  # the sleeper is still in its first calls
    delays = [r.scheduling_delay_ms for r in records[2:]]  # after the first batches' warm-up
    assert max(delays) < 1000, delays  # five seconds per listener call would have pushed them past 5 s
    assert all(r.status == "completed" for r in records)

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(scraped) for s in family.samples}
    completed = samples[("batchline_batches_total", (("status", "completed"),))]
    assert completed >= 12
    # The scrape happened after records[:completed] were observed; the counters add them up.
    observed = [r for r in records if r.batch_time <= records[int(completed) - 1].batch_time]
    assert samples[("batchline_input_records_total", (("input", "gen"),))] == sum(r.records for r in observed)
    last = observed[-1]
    assert samples[("batchline_last_batch_time_seconds", ())] == last.batch_time / 1000
    assert samples[("batchline_processing_time_seconds", ())] == last.processing_ms / 1000
    assert samples[("batchline_batch_duration_seconds_count", ())] == len(observed)
    assert ("batchline_pipeline_info", (("pipeline", "sleepy"),)) in samples
