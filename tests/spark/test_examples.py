"""The shipped examples that need only Spark run as their docstrings say."""

import json
import os
import runpy
import sys
import threading

import pyarrow.dataset as ds

from tests.helpers import ROOT, LineServer

EXAMPLES = ROOT / "examples"


def run_example(name, *args, timeout=180):
    runner = threading.Thread(target=runpy.run_path, args=(str(EXAMPLES / name),), kwargs={"run_name": "__main__"})
    sys.argv = [name, *args]
    runner.start()
    return runner


def test_files_to_parquet_example(spark, tmp_path, monkeypatch):
    incoming, out = tmp_path / "in", tmp_path / "out"
    incoming.mkdir()
    (incoming / "a.json").write_text(
        '{"user": 1, "action": "click", "ts": "2026-01-01T00:00:00Z"}\n'
        '{"user": 2, "action": "view"}\n'
        'garbage\n'
    )
    os.utime(incoming / "a.json", (0, 0))
    monkeypatch.setattr(sys, "argv", sys.argv)
    runner = run_example("files_to_parquet.py", str(incoming), str(out), "8")
    runner.join(120)
    assert not runner.is_alive()
    events = ds.dataset(str(out / "events"), format="parquet", partitioning="hive").to_table()
    assert sorted(events.column("user").to_pylist()) == [1, 2]
    dead = [line for p in (out / "dead_letters").rglob("part-*") for line in p.read_text().splitlines()]
    assert len(dead) == 1 and "garbage" in dead[0] and "malformed JSON" in dead[0]
    activity = ds.dataset(str(out / "activity"), format="parquet", partitioning="hive").to_table()
    assert set(activity.column("user").to_pylist()) == {1, 2}
    assert (out / "checkpoint").is_dir()  # where a rerun goes on


def test_socket_word_count_example_prints_each_batch_s_counts(spark, tmp_path, monkeypatch, capsys):
    server = LineServer()
    monkeypatch.setattr(sys, "argv", sys.argv)
    try:
        runner = run_example("socket_word_count.py", "--", str(server.port), "6", str(tmp_path / "checkpoint"))
        server.send(["hello world hello"])
        runner.join(120)
    finally:
        server.close()
    assert not runner.is_alive()
    assert "[('hello', 2), ('world', 1)]" in capsys.readouterr().out


def test_sessionization_example_prints_closed_sessions(spark, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", sys.argv)
    runner = run_example("sessionization.py", str(tmp_path / "checkpoint"), "10")
    runner.join(120)
    assert not runner.is_alive()
    out = capsys.readouterr().out
    assert f"Checkpoint: {tmp_path / 'checkpoint'}" in out
    assert "closed_by" in out and "last event" in out


def test_jsonl_sink_example_writes_every_event_once_also_when_run_again(spark, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", sys.argv)
    for _ in range(2):
        runner = run_example("jsonl_sink.py", str(tmp_path), "300")
        runner.join(120)
        assert not runner.is_alive()
        assert f"committed 300 rows in {tmp_path}/events" in capsys.readouterr().out
    rows = [json.loads(line) for p in (tmp_path / "events").glob("*.jsonl") for line in p.read_text().splitlines()]
    assert len(rows) == 300  # the second run wrote nothing again
