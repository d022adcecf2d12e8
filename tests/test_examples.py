"""The shipped examples run as written."""

import os
import runpy
import sys
import threading
from pathlib import Path

import pyarrow.dataset as ds

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_files_to_parquet_example(spark, tmp_path, monkeypatch):
    incoming, out = tmp_path / "in", tmp_path / "out"
    incoming.mkdir()
    (incoming / "a.json").write_text(
        '{"user": 1, "action": "click", "ts": "2026-01-01T00:00:00Z"}\n'
        '{"user": 2, "action": "view"}\n'
        'garbage\n'
    )
    os.utime(incoming / "a.json", (0, 0))
    monkeypatch.setattr(sys, "argv", ["files_to_parquet.py", str(incoming), str(out), "4"])
    runner = threading.Thread(target=runpy.run_path, args=(str(EXAMPLES / "files_to_parquet.py"),),
                              kwargs={"run_name": "__main__"})
    runner.start()
    runner.join(120)
    assert not runner.is_alive()
    events = ds.dataset(str(out / "events"), format="parquet", partitioning="hive").to_table()
    assert sorted(events.column("user").to_pylist()) == [1, 2]
    dead = [line for p in (out / "dead_letters").rglob("part-*") for line in p.read_text().splitlines()]
    assert len(dead) == 1 and "garbage" in dead[0] and "malformed JSON" in dead[0]
    activity = ds.dataset(str(out / "activity"), format="parquet", partitioning="hive").to_table()
    assert set(activity.column("user").to_pylist()) == {1, 2}
