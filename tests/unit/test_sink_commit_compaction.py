"""File output commit records stay bounded (SPEC E6): all but the newest ``keep_commits`` are
folded into one snapshot in the background, and a re-run of a batch is still recognised as
committed, whether its record is a file or was compacted. No Spark: commits are made the way
the sink makes them once its tasks have staged their files."""

import json
import os
import threading
import uuid

import pytest

from batchline.checkpoint.storage import seal
from batchline.errors import ConfigurationError, SinkError
from batchline.sinks import files as files_module
from batchline.sinks.files import COMPACTED_RECORD, FileSink

T0 = 1_780_000_000_000
INTERVAL = 1000


def stage(sink, time_ms, rows=2):
    """What the tasks leave before the commit: one staged file; returns the commit record."""
    staged_dir = f"staging/{time_ms}/{uuid.uuid4().hex[:16]}"
    directory = sink._own.path(staged_dir)
    os.makedirs(directory)
    with open(f"{directory}/part-00000.json", "w") as handle:
        handle.write("".join(json.dumps({"t": time_ms, "i": i}) + "\n" for i in range(rows)))
    return {"batch_time": time_ms, "format": "json", "staging": staged_dir,
            "files": [{"file": "part-00000.json", "rows": rows, "bytes": 10}]}


def commit(sink, times):
    for t in times:
        sink._commit(t, stage(sink, t), None)  # no look ahead: the commit lists for itself


def records(tmp_path):
    return sorted(n for n in os.listdir(tmp_path / ".out.batchline" / "commits") if n[0].isdigit())


def published(tmp_path):
    return sorted(os.listdir(tmp_path / "out"))


def batches(n):
    return [T0 + i * INTERVAL for i in range(n)]


def test_all_but_the_newest_records_are_compacted_and_a_rerun_of_an_old_batch_writes_nothing(tmp_path):
    sink = FileSink(str(tmp_path / "out"), "json", keep_commits=5)
    commit(sink, batches(20))
    before = published(tmp_path)
    assert sink.compact() == 15
    assert records(tmp_path) == [f"{t:015d}.json" for t in batches(20)[15:]]
    assert sink._own.read_sealed(COMPACTED_RECORD) == {"through_ms": batches(20)[14]}
    restarted = FileSink(str(tmp_path / "out"), "json", keep_commits=5)
    # The DataFrame is never looked at: a committed batch is neither computed nor written again.
    restarted.write(None, batches(20)[3])  # type: ignore[arg-type]
    restarted.write(None, batches(20)[14])  # type: ignore[arg-type]
    restarted.write(None, batches(20)[17])  # type: ignore[arg-type]  (kept record: completed from it)
    assert published(tmp_path) == before
    assert FileSink(str(tmp_path / "out"), "json").last_commit()["batch_time"] == batches(20)[-1]


def test_a_batch_committed_but_not_yet_published_is_still_completed_after_a_compaction(tmp_path):
    """A crash after the record and before publishing leaves the newest batch re-running: its
    record is among those kept, so the re-run publishes it from the staging, exactly once."""
    sink = FileSink(str(tmp_path / "out"), "json", keep_commits=2)
    commit(sink, batches(6)[:5])
    crashed = batches(6)[5]
    sink._own.write_new(f"commits/{crashed:015d}.json", seal(stage(sink, crashed, rows=3)))
    sink.compact()
    assert f"batch_time={crashed}" not in published(tmp_path)
    FileSink(str(tmp_path / "out"), "json", keep_commits=2).write(None, crashed)  # type: ignore[arg-type]
    assert f"batch_time={crashed}" in published(tmp_path)
    assert len(open(tmp_path / "out" / f"batch_time={crashed}" / "part-00000.json").readlines()) == 3


def test_a_new_batch_after_the_snapshot_is_not_taken_for_committed(tmp_path):
    sink = FileSink(str(tmp_path / "out"), "json", keep_commits=1)
    commit(sink, batches(3))
    sink.compact()
    restarted = FileSink(str(tmp_path / "out"), "json", keep_commits=1)
    assert restarted._read_record(batches(2)[1])["compacted"]
    assert restarted._read_record(batches(3)[2])["staging"]  # the kept record itself
    assert restarted._read_record(batches(3)[2] + INTERVAL) is None  # written anew when it runs


def test_commits_are_compacted_in_the_background_every_so_many_commits(tmp_path, monkeypatch):
    monkeypatch.setattr(files_module, "COMPACT_EVERY", 10)
    sink = FileSink(str(tmp_path / "out"), "json", keep_commits=3)
    listed = threading.Event()
    release = threading.Event()
    original = sink._own.list_names

    def slow_list(relative):
        listed.set()
        release.wait(10)
        return original(relative)

    monkeypatch.setattr(sink._own, "list_names", slow_list)
    commit(sink, batches(1))  # a run's first commit starts a compaction (of what earlier runs left) and returns
    assert listed.wait(10)
    commit(sink, batches(12)[1:])  # batches go on while it runs
    assert len(records(tmp_path)) == 12
    release.set()
    assert sink.wait_for_compaction(10)
    assert len(records(tmp_path)) == 3 and sink.compaction_error is None
    listed.clear()
    commit(sink, batches(13)[12:])  # the commits made while it ran still count: this one compacts again
    assert listed.wait(10) and sink.wait_for_compaction(10)
    assert len(records(tmp_path)) == 3
    listed.clear()
    commit(sink, batches(22)[13:])  # nine more: not yet
    assert not listed.is_set()
    sink.close()


def test_a_compaction_that_fails_leaves_every_batch_committed_and_is_done_later(tmp_path, monkeypatch):
    sink = FileSink(str(tmp_path / "out"), "json", keep_commits=2)
    commit(sink, batches(8))
    original = sink._own.delete
    calls = []

    def failing_delete(relative, recursive=False):
        calls.append(relative)
        if len(calls) == 3:
            raise OSError("injected: the store refused the delete")
        return original(relative, recursive)

    monkeypatch.setattr(sink._own, "delete", failing_delete)
    sink.compact_in_background()
    assert sink.wait_for_compaction(10)
    assert "tried again after" in str(sink.compaction_error)
    restarted = FileSink(str(tmp_path / "out"), "json", keep_commits=2)
    assert all(restarted._read_record(t) is not None for t in batches(8))  # a record, or the snapshot
    assert restarted.compact() == 4  # the ones left behind
    assert len(records(tmp_path)) == 2
    assert all(restarted._read_record(t) is not None for t in batches(8))


def test_the_snapshot_never_moves_back(tmp_path):
    sink = FileSink(str(tmp_path / "out"), "json", keep_commits=2)
    commit(sink, batches(6))
    sink.compact()
    wider = FileSink(str(tmp_path / "out"), "json", keep_commits=100)
    assert wider.compact() == 0
    assert wider._read_record(batches(6)[3])["compacted"]


def test_an_unreadable_snapshot_stops_the_write_saying_what_to_do(tmp_path):
    sink = FileSink(str(tmp_path / "out"), "json", keep_commits=1)
    commit(sink, batches(3))
    sink.compact()
    (tmp_path / ".out.batchline" / "commits" / "_compacted.json").write_bytes(b"torn")
    with pytest.raises(SinkError, match="Restore it from a backup"):
        FileSink(str(tmp_path / "out"), "json").write(None, batches(3)[0])  # type: ignore[arg-type]


def test_keep_commits_must_be_positive(tmp_path):
    with pytest.raises(ConfigurationError, match="keep_commits must be at least 1"):
        FileSink(str(tmp_path / "out"), "json", keep_commits=0)
