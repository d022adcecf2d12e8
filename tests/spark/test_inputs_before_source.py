"""A checkpoint written before every built-in input became a ``Source`` restarts exactly:
files, generated events and a DataFrame, with a batch logged after the last checkpoint that
the old driver died in. Nothing is read twice and nothing is skipped."""

import json
import os
import shutil

from tests.helpers import CHECKPOINT_FIXTURES, fixture_pipeline

FIXTURE = CHECKPOINT_FIXTURES / "inputs_before_source"


def test_a_checkpoint_of_the_inputs_before_source_restarts_exactly(spark, tmp_path):
    old = fixture_pipeline("inputs_before_source")
    shutil.rmtree(old.FILES_AT.parent, ignore_errors=True)
    shutil.copytree(FIXTURE / "files", old.FILES_AT)
    for path in old.FILES_AT.iterdir():
        os.utime(path, (old.FILE_TIME_S, old.FILE_TIME_S))
    old.write_files(old.RESTART_FILES)
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(FIXTURE / "checkpoint", checkpoint)
    first = json.loads((FIXTURE / "first_run.json").read_text())

    second = old.Pipeline(spark, checkpoint, 19_500)  # down for 15 000 < t < 20 000
    try:
        second.ssc.start()
        second.run_until(20_000)
    finally:
        second.ssc.stop()
        shutil.rmtree(old.FILES_AT.parent, ignore_errors=True)

    def together(name):
        return sorted(row for rows in [*first[name].values(), *second.rows[name].values()] for row in rows)

    # The batch the old driver died in runs again with exactly the events it had logged.
    assert second.rows["generator"][15_000] == [f"event-{n}" for n in range(40, 50)]
    events = together("generator")
    assert sorted(int(e.split("-")[1]) for e in events) == list(range(len(events)))
    assert len(events) > 50
    # Files: a, b, c and d were read before the restart (b's bad line is a dead letter); only e now.
    assert together("files") == list(range(1, 8))
    assert list(second.rows["files"].values()) == [[7]]
    # The DataFrame had been read to its end: every row once, none again.
    assert together("dataframe") == list(range(old.FRAME_ROWS))
    assert second.rows["dataframe"] == {}
