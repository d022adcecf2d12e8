"""The year benchmark's headline case: what a year under this release leaves at a location
(benchmarks/year.py, ``fabricate_this_release_year``) is bounded as the release keeps it, and a
restart from it gives the same output and state as from the location its short history left
(SPEC E6, issue 19)."""

import shutil
from pathlib import Path

from batchline.checkpoint.events import PURGE_RECORD, PurgeRecord
from batchline.checkpoint.storage import CheckpointStorage
from batchline.checkpoint.writer import load_latest_checkpoint
from batchline.sinks.files import COMMITS_DIR, COMPACTED_RECORD, DEFAULT_KEEP_COMMITS, own_location
from batchline.state import read_state
from benchmarks import year as bench
from tests.spark.test_year_restart import SMALL_YEAR, outputs, restart_with_new_files


def newest_position(root: Path) -> dict:
    newest = bench._newest_checkpoint(root)
    return CheckpointStorage(str(newest.parent)).read_sealed(newest.name)["inputs"][bench.SOURCE]["seen_files"]


def test_a_year_under_this_release_is_bounded_and_restarts_to_the_same_output_and_state(spark, tmp_path):
    plain, aged = tmp_path / "plain", tmp_path / "aged"
    bench.run_history(spark, plain, SMALL_YEAR.history_batches)
    shutil.copytree(plain, aged)
    figures = bench.fabricate_this_release_year(aged, SMALL_YEAR)

    # The source remembers the names within max_file_age (7 days) of the newest, of files spread over a year.
    position = newest_position(aged)
    expected = (SMALL_YEAR.files_read - SMALL_YEAR.history_batches) * 7 / 365 + SMALL_YEAR.history_batches
    assert abs(len(position["files"]) - expected) <= 2
    assert position["horizon_ms"] == position["watermark_ms"] - bench.MAX_FILE_AGE_MS
    assert min(position["files"].values()) >= position["horizon_ms"]
    assert figures["year_left"]["source_remembered_files"] == len(position["files"])
    # The event log holds the history's batches only, and the purge record is past every batch of the year.
    events = aged / "checkpoint" / "events"
    history_batches = sorted(int(p.name) for p in (plain / "checkpoint" / "events").iterdir() if p.name.isdigit())
    assert sorted(int(p.name) for p in events.iterdir() if p.name.isdigit()) == history_batches
    storage = CheckpointStorage(str(aged / "checkpoint"))
    record = PurgeRecord.from_json(storage.read_sealed(PURGE_RECORD))  # the history's own, if it purged already
    zero_time = load_latest_checkpoint(storage)[0].zero_time
    assert zero_time - bench.INTERVAL_MS < record.next_ms == figures["year_left"]["event_log_purged_before_ms"]
    assert record.kept_ms is None or record.kept_ms >= zero_time
    assert all(t >= record.next_ms or t == record.kept_ms for t in history_batches)
    # The output keeps the newest keep_commits records, the history's among them; the snapshot covers the rest.
    own = CheckpointStorage(own_location(str(aged / "out")))
    records = sorted(int(n.split(".")[0]) for n in own.list_names(COMMITS_DIR) if n[0].isdigit())
    history_commits = sorted(int(n.split(".")[0]) for n in
                             CheckpointStorage(own_location(str(plain / "out"))).list_names(COMMITS_DIR)
                             if n[0].isdigit())
    assert len(records) == DEFAULT_KEEP_COMMITS and records[-len(history_commits):] == history_commits
    assert own.read_sealed(COMPACTED_RECORD)["through_ms"] < records[0]
    assert figures["year_left"]["checkpoint_bytes"] < 1_000_000

    restart_with_new_files(spark, plain)
    restart_with_new_files(spark, aged)

    assert outputs(aged) == outputs(plain) and len(outputs(plain)) == 7 * bench.KEYS
    state = {location: sorted(tuple(r) for r in read_state(spark, str(location / "checkpoint"), "counts").collect())
             for location in (plain, aged)}
    assert state[aged] == state[plain] and len(state[plain]) == bench.KEYS
    # What the year left stays as bounded after the restart: recent names, recent batches, compacted commits.
    left = bench._what_is_left(aged)
    assert abs(left["source_remembered_files"] - len(position["files"]) - 4) <= 2
    assert left["event_log_batches_left"] < 30
    assert DEFAULT_KEEP_COMMITS <= left["output_commit_records_left"] <= DEFAULT_KEEP_COMMITS + 4
