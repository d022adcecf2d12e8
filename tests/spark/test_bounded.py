"""Bounded inputs end to end (SPEC G1-G3, F4): pipelines that finish by themselves, drain
their timeouts, write a final checkpoint, and keep going after part of them ended."""

import datetime as dt
import json
import os
from dataclasses import dataclass

import pyarrow.json as pj
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from batchline import ConfigurationError, ContextState, StreamingContext
from batchline.checkpoint.events import EVENTS, JobEventStore
from batchline.checkpoint.storage import CheckpointStorage
from batchline.checkpoint.writer import load_latest_checkpoint
from batchline.cli.main import main
from batchline.sources.files import FileSource
from batchline.state import GroupStateTimeout, read_state
from batchline.testing import END, BatchRecorder, CollectSink, list_stream
from tests.helpers import Count, LogWatcher, running_count, wait_for

SCHEMA = StructType([StructField("key", StringType()), StructField("value", LongType()),
                     StructField("ts", TimestampType())])
T0 = 1_700_000_000
GAP_S = 30


@dataclass
class Session:
    start_ms: int
    end_ms: int
    count: int


def sessions_fn(key, rows, state):
    """A session closes once the key saw no event for GAP_S of event time: within a batch's
    rows by the gap, across batches by the event-time timeout."""
    if state.has_timed_out:
        s = state.get()
        state.remove()
        yield {"key": key, "start_ms": s.start_ms, "count": s.count}
        return
    s = state.get() if state.exists else None
    for ms in sorted(int(row.ts.replace(tzinfo=dt.UTC).timestamp() * 1000) for row in rows):
        if s is not None and ms >= s.end_ms + GAP_S * 1000:
            yield {"key": key, "start_ms": s.start_ms, "count": s.count}
            s = None
        s = Session(ms, ms, 1) if s is None else Session(s.start_ms, ms, s.count + 1)
    state.update(s)
    state.set_timeout_timestamp(s.end_ms + GAP_S * 1000)


def write_events(directory, files=6, per_file=40):
    """Per file, events of a few keys; keys pause longer than the session gap between some
    files, so sessions close mid-run and others stay open until the input ends."""
    directory.mkdir()
    events = []
    for f in range(files):
        rows = []
        for i in range(per_file):
            key = f"k{(i * 7 + f) % 5}" if f % 3 else f"k{i % 3}"
            seconds = T0 + f * 45 + i  # files 45 s apart: keys absent from a file close their session
            rows.append({"key": key, "value": 1, "ts": dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat()})
            events.append((key, seconds * 1000))
        (directory / f"events-{f:02d}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return events


def reference_sessions(events):
    """The sessions, computed straight from the events (processed file by file, as batches are)."""
    sessions, open_ = [], {}
    for key, ms in sorted(events, key=lambda e: e[1]):
        current = open_.get(key)
        if current is not None and ms >= current[1] + GAP_S * 1000:
            sessions.append((key, current[0], current[2]))
            current = None
        open_[key] = (ms, ms, 1) if current is None else (current[0], ms, current[2] + 1)
    sessions += [(key, start, count) for key, (start, _, count) in open_.items()]
    return sorted(sessions)


def read_output(out):
    rows = []
    for part in sorted(out.glob("batch_time=*/part-*.json")):
        table = pj.read_json(part)  # a plain reader never fails on what the sink published
        rows += [(r["key"], r["start_ms"], r["count"]) for r in table.to_pylist()]
    return sorted(rows)


def sessionization(spark, tmp_path, recorder=None):
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "checkpoint"))
    if recorder is not None:
        ssc.add_listener(recorder)
    events = ssc.file_stream(str(tmp_path / "in"), "json", SCHEMA, bounded=True, max_files_per_batch=2)
    sessions = events.with_watermark("ts", "5s").group_by_key("key").flat_map_groups_with_state(
        sessions_fn, state_schema=Session, output_schema="key string, start_ms long, count long",
        timeout=GroupStateTimeout.EVENT_TIME, name="sessions", num_partitions=3)
    sessions.write_files(str(tmp_path / "out"), "json", name="sessions-out")
    return ssc


def test_bounded_sessionization_finishes_with_every_session_closed(spark, tmp_path, capsys):
    events = write_events(tmp_path / "in")
    recorder = BatchRecorder()
    with LogWatcher() as log:
        assert sessionization(spark, tmp_path, recorder).run_until_finished(timeout=120)
    assert read_output(tmp_path / "out") == reference_sessions(events)
    assert len(reference_sessions(events)) > 5  # sessions closed mid-run and at the end

    # Batches of at most two files; the drain batch after the input ended fired every timeout.
    with_input = [info for info in recorder.completed if info.num_records]
    assert len(with_input) == 3
    drained = [info.state_operators["sessions"] for info in recorder.completed
               if "sessions" in info.state_operators and info.state_operators["sessions"].timed_out]
    assert drained[-1].state_keys == 0
    assert read_state(spark, str(tmp_path / "checkpoint"), "sessions").count() == 0
    messages = log.messages()
    assert any("is exhausted" in m for m in messages)
    assert any("Operator sessions finished in batch" in m for m in messages)
    assert any(m.startswith("Final checkpoint written") for m in messages)

    # G3: the final checkpoint is the newest, records everything finished and the sink's commit.
    final, _ = load_latest_checkpoint(CheckpointStorage(str(tmp_path / "checkpoint")))
    assert final is not None and final.pending_times == ()
    assert final.final is not None
    commit = final.final.output_commits["sessions-out"]
    assert commit["batch_time"] is not None
    assert commit["record"] == str(tmp_path / ".out.batchline" / "commits" / f"{commit['batch_time']:015d}.json")
    assert os.path.exists(commit["record"])
    assert set(final.finished_inputs) == {f"files:{tmp_path / 'in'}"}
    assert final.operators["sessions"].finished_partitions == (0, 1, 2)
    capsys.readouterr()
    assert main(["checkpoints", "list", str(tmp_path / "checkpoint")]) == 0
    assert "final: the pipeline finished" in capsys.readouterr().out.splitlines()[2]

    # A restart of the finished pipeline does nothing, and says so.
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    again = BatchRecorder()
    with LogWatcher() as log:
        assert sessionization(spark, tmp_path, again).run_until_finished(timeout=60)
    assert any("already finished" in m for m in log.messages())
    assert again.submitted == [] and sorted(p.name for p in (tmp_path / "out").iterdir()) == before


@pytest.mark.parametrize("at_end", ["keep", "time_out"])
def test_processing_time_state_at_the_end_is_kept_or_timed_out(spark, tmp_path, at_end):
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "checkpoint"))
    rows = list_stream(ssc, [[("a", 1), ("b", 2)], [("a", 3)], END], "key string, value long", bounded=True)

    def fn(key, values, state):
        if state.has_timed_out:
            yield {"key": key, "count": state.get().count}
            state.remove()
            return
        yield from running_count(key, values, state)
        state.set_timeout_duration("1h")

    counted = rows.group_by_key("key").flat_map_groups_with_state(
        fn, state_schema=Count, output_schema="key string, count long",
        timeout=GroupStateTimeout.PROCESSING_TIME, name="counts", num_partitions=2, at_end=at_end)
    sink = CollectSink()
    counted.foreach_batch(sink)
    assert ssc.run_until_finished(timeout=60)
    state = read_state(spark, str(tmp_path / "checkpoint"), "counts").collect()
    if at_end == "keep":
        assert len(sink.all_rows()) == 3 and sorted(r.key for r in state) == ["a", "b"]
    else:  # every key timed out and emitted its count once more
        assert len(sink.all_rows()) == 5 and state == []


def test_the_final_state_stays_readable_once_the_records_of_its_last_batch_are_purged(spark, tmp_path):
    """Batches after the pipeline finished commit on (until it stops, or for good when it runs
    on in part), and clean-up purges the records of the operator's last batch: its state is
    still the newest committed version."""
    location = str(tmp_path / "checkpoint")
    ssc = StreamingContext(spark, "200ms", checkpoint=location)
    rows = list_stream(ssc, [[("a", 1), ("b", 2)], [("a", 3)], END], "key string, value long", bounded=True)
    rows.group_by_key("key").flat_map_groups_with_state(
        running_count, state_schema=Count, output_schema="key string, count long", name="counts",
        num_partitions=2).foreach_batch(CollectSink())
    assert ssc.run_until_finished(timeout=60)
    storage = CheckpointStorage(location)
    newest = max(int(name) for name in storage.list_names(EVENTS) if name.isdigit())
    events = JobEventStore(storage)
    events.batch_completed(newest + 10_000, token=None)
    events.purge_before(newest + 10_000)
    assert {r["key"]: (r["count"], r["total"]) for r in read_state(spark, location, "counts").collect()} == {
        "a": (2, 4), "b": (1, 2)}


def test_generator_total_ends_in_rate_limited_batches(spark, tmp_path):
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "checkpoint"))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    counts = CollectSink()
    ssc.generator_stream(1_000_000, total=2_500, max_records_per_batch=1_000, name="gen").count().foreach_batch(counts)
    assert ssc.run_until_finished(timeout=60)
    assert [info.num_records for info in recorder.completed if info.num_records] == [1000, 1000, 500]
    assert sum(r["count"] for r in counts.all_rows()) == 2_500


def test_unbounded_input_keeps_running_after_a_bounded_one_ended(spark, tmp_path, monkeypatch):
    """A history directory (bounded) and a live one feed one stateful count: after the history
    ended, batches and checkpoints go on and record it finished; a restart reads none of it."""
    history, live = tmp_path / "history", tmp_path / "live"
    history.mkdir()
    live.mkdir()
    for f in range(3):
        (history / f"h{f}.json").write_text("".join(json.dumps({"key": f"k{i % 2}", "value": 1}) + "\n"
                                                    for i in range(4)))
    read_paths: list[str] = []
    original = FileSource.frame

    def spying_frame(self, spark, batch):
        read_paths.extend(split["file"] for split in batch.splits)
        return original(self, spark, batch)

    monkeypatch.setattr(FileSource, "frame", spying_frame)
    schema = "key string, value long"

    def build():
        ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "checkpoint"), checkpoint_interval="400ms")
        old = ssc.file_stream(str(history), "json", StructType.fromDDL(schema), bounded=True, max_files_per_batch=1,
                              name="history")
        new = ssc.file_stream(str(live), "json", StructType.fromDDL(schema), settle=0, name="live")
        totals = ssc.union(old, new).group_by_key("key").flat_map_groups_with_state(
            running_count, state_schema=Count, output_schema="key string, count long", name="totals",
            num_partitions=2)
        sink = CollectSink()
        totals.foreach_batch(sink)
        return ssc, sink

    ssc, sink = build()
    with LogWatcher() as log:
        ssc.start()
        try:
            log.wait_for("Input history is exhausted")
            # G1: checkpoints go on after the bounded input ended, and record it finished (G2).
            log.wait_for("Checkpoint for time", timeout=30)
            storage = CheckpointStorage(str(tmp_path / "checkpoint"))
            def history_finished():
                checkpoint, _ = load_latest_checkpoint(storage)
                return checkpoint if checkpoint is not None and "history" in checkpoint.finished_inputs else None

            checkpoint = wait_for(history_finished, "checkpoint that recorded the history input as finished",
                                  timeout_s=10, step_s=0.1)
            assert "live" not in checkpoint.finished_inputs
            (live / "l0.json").write_text(json.dumps({"key": "k0", "value": 1}) + "\n")
            sink.wait_for_rows(lambda rows: {"key": "k0", "count": 7} in rows)
            assert ssc.state is ContextState.ACTIVE  # a mixed pipeline never finishes by itself
        finally:
            ssc.stop(graceful=True)
    assert sorted(p.rsplit("/", 1)[-1] for p in read_paths) == ["h0.json", "h1.json", "h2.json", "l0.json"]

    read_paths.clear()
    ssc, sink = build()
    with LogWatcher() as log:
        ssc.start()
        try:
            (live / "l1.json").write_text(json.dumps({"key": "k1", "value": 1}) + "\n")
            sink.wait_for_rows(lambda rows: {"key": "k1", "count": 7} in rows)
        finally:
            ssc.stop(graceful=True)
    assert any("Input history finished before the restart" in m for m in log.messages())
    assert not [m for m in log.messages() if "takes" in m and str(history) in m]
    assert [p.rsplit("/", 1)[-1] for p in read_paths] == ["l1.json"]


def test_run_until_finished_refuses_inputs_that_never_end(spark, tmp_path):
    ssc = StreamingContext(spark, "200ms")
    ssc.generator_stream(10, name="endless").count().foreach_batch(lambda df, t: None)
    with pytest.raises(ConfigurationError, match=r"never return.*endless.*never end.*bounded=True"):
        ssc.run_until_finished()
    with pytest.raises(ConfigurationError, match="cannot be bounded.*file_stream"):
        ssc.socket_text_stream("127.0.0.1", 9, bounded=True)


def test_a_derived_stream_finishes_with_its_last_input(spark, tmp_path):
    """Streams fed only by finished inputs run no job; the pipeline's outputs decide its end."""
    ssc = StreamingContext(spark, "200ms")
    a = list_stream(ssc, [[("x", 1)], END], "key string, value long", name="a", bounded=True)
    b = list_stream(ssc, [[("y", 1)], [("y", 2)], [("y", 3)], END], "key string, value long", name="b",
                    bounded=True)
    only_a, both = CollectSink(), CollectSink()
    a.foreach_batch(only_a, name="only-a")
    a.union(b).foreach_batch(both, name="both")
    with LogWatcher() as log:
        assert ssc.run_until_finished(timeout=60)
    assert len(only_a.batches) == 1 and [r["key"] for r in only_a.all_rows()] == ["x"]
    assert len(both.batches) == 3 and sorted(r["value"] for r in both.all_rows()) == [1, 1, 2, 3]
    assert any("Input a is exhausted" in m for m in log.messages())
    assert any("Input b is exhausted" in m for m in log.messages())


def test_a_dataframe_is_a_bounded_input_in_rate_limited_batches(spark, tmp_path):
    df = spark.createDataFrame([(f"k{i % 4}", i) for i in range(25)], "key string, value long")
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "checkpoint"))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    sink = CollectSink()
    ssc.dataframe_stream(df, max_records_per_batch=10, name="history").foreach_batch(sink)
    assert ssc.run_until_finished(timeout=60)
    sizes = [info.num_records for info in recorder.completed if info.num_records]
    assert len(sizes) >= 3 and max(sizes) <= 10 and sum(sizes) == 25
    assert sorted(r["value"] for r in sink.all_rows()) == list(range(25))
    # The rows were kept at the checkpoint location: written once, never read from df again.
    assert CheckpointStorage(str(tmp_path / "checkpoint")).exists("inputs/history/manifest.json")
