"""A restart from a location holding a simulated year of metadata in the previous release's
format (the file source naming every file it read, a long event log, many output commit
records) gives the same output and the same state as a restart of the same pipeline from
the location as its short history left it (SPEC E6)."""

import json
import shutil
from pathlib import Path

from batchline.state import read_state
from benchmarks import year as bench

SMALL_YEAR = bench.Year(files_read=5_000, logged_batches=300, output_commits=1_200, history_batches=3,
                        steady_batches=3)


def outputs(root: Path) -> list[tuple[str, int]]:
    """Every row the output holds, whatever its batch time (the two runs' batch times differ)."""
    rows = []
    for path in sorted((root / "out").glob("batch_time=*/*.json")):
        rows += [(r["key"], r["count"]) for r in map(json.loads, path.read_text().splitlines())]
    return sorted(rows)


def restart_with_new_files(spark, root: Path) -> None:
    """Four new files, all waiting before the start: one per batch, in order, in both runs."""
    bench.write_files(root / "in", SMALL_YEAR.history_batches, 4)
    listener = bench._Batches()
    ssc = bench.build(spark, root, listener)
    ssc.start()
    try:
        listener.wait_for(4, 180)
    finally:
        ssc.stop(graceful=True)


def test_a_restart_from_a_simulated_year_gives_the_same_output_and_state_as_from_its_history(spark, tmp_path):
    plain, aged = tmp_path / "plain", tmp_path / "aged"
    bench.run_history(spark, plain, SMALL_YEAR.history_batches)
    shutil.copytree(plain, aged)
    bench.fabricate_year(aged, SMALL_YEAR)
    legacy = json.loads((aged / "checkpoint" / "checkpoints").glob("checkpoint-*.json").__next__()
                        .read_bytes().split(b"\n", 1)[1])
    assert len(legacy["inputs"]["events"]["seen"]) == SMALL_YEAR.files_read  # the old format, as a year left it

    restart_with_new_files(spark, plain)
    restart_with_new_files(spark, aged)

    assert outputs(aged) == outputs(plain) and len(outputs(plain)) == 7 * bench.KEYS
    state = {location: sorted(tuple(r) for r in read_state(spark, str(location / "checkpoint"), "counts").collect())
             for location in (plain, aged)}
    assert state[aged] == state[plain] and len(state[plain]) == bench.KEYS
    # The year is gone from what a restart reads: the source remembers only recent names, the
    # old batches' records were purged, and all but keep_commits output records were compacted.
    newest = max((aged / "checkpoint" / "checkpoints").glob("checkpoint-*.json"))
    position = json.loads(newest.read_bytes().split(b"\n", 1)[1])["inputs"]["events"]
    assert "seen" not in position and len(position["seen_files"]["files"]) == 7
    assert bench._what_is_left(aged)["event_log_batches_left"] < 30
    # Compacted at the run's first commit; the run's later commits wait for the next compaction.
    assert 1000 < bench._what_is_left(aged)["output_commit_records_left"] <= 1000 + 4
