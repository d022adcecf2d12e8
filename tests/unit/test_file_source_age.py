"""The file source remembers files by a watermark on modification time and the names near it
(``max_file_age``, SPEC E6): no file is read twice and none is skipped across the point where
names are forgotten, through restarts, and from checkpoints of the release before. No Spark:
the reader's allocation, snapshot and restore are plain Python."""

import json
import logging
import os

import pytest
from pyspark.sql.types import IntegerType, StructField, StructType

from batchline.clock import ManualClock
from batchline.errors import ConfigurationError
from batchline.scheduler.input_info import InputInfoTracker
from batchline.sources.files import FileSource
from batchline.sources.seen_files import SeenFiles
from batchline.sources.source_input import SourceInput, SourceReader
from batchline.streams import RuntimeEnv

HOUR = 3600.0
T0 = 1_700_000_000.0  # file times, epoch seconds, long settled


def write(directory, name, modified_s):
    path = directory / name
    path.write_text('{"id": 1}\n')
    os.utime(path, (modified_s, modified_s))
    return path


def make_reader(directory, opened=True, **options) -> SourceReader:
    """A file source's reader, opened as a pipeline opens it at its first start (unless not ``opened``)."""
    options.setdefault("settle_s", 0)
    options.setdefault("max_file_age", "1 hour")
    source = FileSource(str(directory), "json", StructType([StructField("id", IntegerType())]), **options)
    node = SourceInput(source, f"files:{directory}", 1000)
    env = RuntimeEnv(None, ManualClock(0), 1000, InputInfoTracker(), None, None, frozenset())  # type: ignore[arg-type]
    reader = node.create_runtime(env, [])
    if opened:
        reader.open()
    return reader


def take(reader, batch_time):
    """The base names the batch takes (allocated as the job generator does)."""
    reader.allocate(batch_time)
    return [os.path.basename(name) for name in reader.allocation(batch_time)["files"]]


def checkpointed(reader):
    """The reader's snapshot as a checkpoint holds it: JSON, round-tripped."""
    snapshot = reader.snapshot()
    return json.loads(json.dumps({k: (json.loads(v.data) if hasattr(v, "data") else v) for k, v in snapshot.items()}))


def restarted(directory, snapshot, logged=(), **options):
    """A new run restored from ``snapshot``, given the batches logged after it (as a restart does)."""
    reader = make_reader(directory, opened=False, **options)
    reader.restore(snapshot)
    for batch_time, allocation in logged:
        reader.restore_allocation(batch_time, json.loads(json.dumps(allocation)), advance=True)
    reader.open()
    return reader


def test_files_older_than_the_horizon_are_forgotten_and_never_read_again(tmp_path):
    write(tmp_path, "a.json", T0)
    write(tmp_path, "b.json", T0 + 600)
    reader = make_reader(tmp_path)
    assert take(reader, 1000) == ["a.json", "b.json"]
    write(tmp_path, "c.json", T0 + 2 * HOUR)
    assert take(reader, 2000) == ["c.json"]
    remembered = checkpointed(reader)["seen_files"]
    # The watermark is c's time; a and b lie more than an hour before it: forgotten.
    assert remembered["files"] == {"c.json": int((T0 + 2 * HOUR) * 1000)}
    assert remembered["horizon_ms"] == int((T0 + HOUR) * 1000)
    assert take(reader, 3000) == []
    assert take(restarted(tmp_path, checkpointed(reader)), 4000) == []


def test_files_are_taken_oldest_first_so_the_watermark_follows_a_backlog(tmp_path):
    write(tmp_path, "z-old.json", T0)
    write(tmp_path, "a-new.json", T0 + 3 * HOUR)
    write(tmp_path, "m-mid.json", T0 + 1800)
    reader = make_reader(tmp_path, max_files_per_batch=1)
    assert [take(reader, t) for t in (1000, 2000, 3000, 4000)] == [["z-old.json"], ["m-mid.json"], ["a-new.json"], []]


def test_a_file_that_appears_older_than_the_horizon_is_not_read_and_named_in_a_warning(tmp_path, caplog):
    write(tmp_path, "first.json", T0)
    write(tmp_path, "newest.json", T0 + 5 * HOUR)
    reader = make_reader(tmp_path)
    assert take(reader, 1000) == ["first.json", "newest.json"]
    horizon = T0 + 4 * HOUR
    write(tmp_path, "late.json", horizon - 0.001)  # one millisecond too old
    write(tmp_path, "just-in-time.json", horizon)  # exactly at the horizon: still read
    with caplog.at_level(logging.INFO, logger="batchline.sources.files"):
        assert take(reader, 2000) == ["just-in-time.json"]
        assert take(reader, 3000) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # once, not every batch; first.json was read, not late
    assert str(tmp_path / "late.json") in warnings[0]
    assert "max_file_age" in warnings[0] and "touch" in warnings[0]
    # The documented way out: a new modification time makes it a new file.
    write(tmp_path, "late.json", T0 + 5 * HOUR + 1)
    assert take(reader, 4000) == ["late.json"]
    assert take(reader, 5000) == []


def test_after_a_restart_old_files_in_the_folder_are_summarised_not_warned_about(tmp_path, caplog):
    write(tmp_path, "a.json", T0)
    write(tmp_path, "b.json", T0 + 3 * HOUR)
    reader = make_reader(tmp_path)
    take(reader, 1000)
    with caplog.at_level(logging.INFO, logger="batchline.sources.files"):
        again = restarted(tmp_path, checkpointed(reader))
        assert take(again, 2000) == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("1 files under" in r.getMessage() and "not read" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("per_batch", [None, 2])
def test_no_file_is_read_twice_or_skipped_across_forgetting_and_restarts(tmp_path, per_batch):
    """Files arrive for 40 batches, a few out of order (but within max_file_age); the pipeline
    restarts from a checkpoint taken every 3 batches, replaying the batches logged after it."""
    arrived: list[str] = []
    read: list[str] = []
    logged: list[tuple[int, dict]] = []
    reader = make_reader(tmp_path, max_files_per_batch=per_batch)
    snapshot, snapshot_time = checkpointed(reader), 0
    for batch in range(1, 41):
        for i in range(3):
            name = f"f{batch:03d}-{i}.json"
            # Every file 10 minutes after the last; every third one 40 minutes late.
            write(tmp_path, name, T0 + batch * 600 + i - (2400 if i == 2 else 0))
            arrived.append(name)
        batch_time = batch * 1000
        read += take(reader, batch_time)
        logged.append((batch_time, reader.allocation(batch_time)))
        if batch % 3 == 0:
            snapshot, snapshot_time = checkpointed(reader), batch_time
        if batch % 7 == 0:  # a crash: restart from the checkpoint, replay what was logged after it
            reader = restarted(tmp_path, snapshot, [(t, a) for t, a in logged if t > snapshot_time],
                               max_files_per_batch=per_batch)
    for batch in range(41, 100):  # drain the backlog
        read += take(reader, batch * 1000)
    assert sorted(read) == sorted(arrived)  # each once: none twice, none skipped
    remembered = checkpointed(reader)["seen_files"]["files"]
    assert len(remembered) <= 3 * 7  # an hour of files (and the last late ones), not all 120


def test_a_checkpoint_of_the_release_before_is_converted_without_rereading_or_skipping(tmp_path):
    """The old checkpoint names every file ever read; the conversion keeps reading exactly the
    files that release would have read next, even an unread one far older than the others."""
    read_before = [write(tmp_path, f"old-{i}.json", T0 + i * HOUR) for i in range(10)]
    unread_ancient = write(tmp_path, "ancient-unread.json", T0 - 30 * 24 * HOUR)
    unread_new = write(tmp_path, "new-unread.json", T0 + 12 * HOUR)
    legacy = {"seen": [str(p) for p in read_before] + [str(tmp_path / "deleted-since.json")]}
    reader = restarted(tmp_path, legacy)
    assert sorted(take(reader, 1000)) == sorted([unread_ancient.name, unread_new.name])
    assert take(reader, 2000) == []
    remembered = checkpointed(reader)["seen_files"]
    # Now only the files within the hour before the newest read are remembered, by base name.
    assert remembered["files"] == {"new-unread.json": int((T0 + 12 * HOUR) * 1000)}
    assert take(restarted(tmp_path, checkpointed(reader)), 3000) == []


def test_a_batch_logged_by_the_release_before_is_replayed_with_the_times_listed_now(tmp_path):
    write(tmp_path, "a.json", T0)
    write(tmp_path, "b.json", T0 + 60)
    reader = restarted(tmp_path, {"seen": []}, [(1000, {"files": [str(tmp_path / "a.json")]})])
    assert reader.allocation(1000) == {"files": [str(tmp_path / "a.json")]}
    assert take(reader, 2000) == ["b.json"]
    assert take(reader, 3000) == []


def test_raising_max_file_age_later_does_not_bring_back_forgotten_files(tmp_path):
    write(tmp_path, "a.json", T0)
    write(tmp_path, "b.json", T0 + 2 * HOUR)
    reader = make_reader(tmp_path)
    take(reader, 1000)
    assert take(restarted(tmp_path, checkpointed(reader), max_file_age="7 days"), 2000) == []
    # Lowering it takes effect at once: fewer names remembered.
    write(tmp_path, "c.json", T0 + 2 * HOUR - 60)
    lowered = restarted(tmp_path, checkpointed(reader), max_file_age="10 minutes")
    assert take(lowered, 2000) == ["c.json"]
    assert list(checkpointed(lowered)["seen_files"]["files"]) == ["b.json", "c.json"]


def test_a_bounded_source_reads_every_file_present_whatever_its_age(tmp_path):
    for day in range(30):
        write(tmp_path, f"day-{day:02d}.json", T0 + day * 24 * HOUR)
    reader = make_reader(tmp_path, bounded=True, max_files_per_batch=4)
    reader.open()
    first = take(reader, 1000)
    snapshot = checkpointed(reader)
    assert snapshot["taken"] == 4 and len(snapshot["listing"]) == 30
    write(tmp_path, "later.json", T0)  # not present at the first start: never read
    again = restarted(tmp_path, snapshot, bounded=True, max_files_per_batch=4)
    rest = [name for t in range(2000, 10000, 1000) for name in take(again, t)]
    assert first + rest == [f"day-{day:02d}.json" for day in range(30)]
    assert again.exhausted()


def test_a_bounded_checkpoint_of_the_release_before_resumes_after_the_files_it_read(tmp_path):
    paths = [str(write(tmp_path, f"f{i}.json", T0 + i)) for i in range(5)]
    reader = restarted(tmp_path, {"seen": paths[:2], "listing": paths}, bounded=True)
    assert take(reader, 1000) == ["f2.json", "f3.json", "f4.json"]
    assert reader.exhausted()


def test_max_file_age_must_be_a_duration_of_zero_or_more(tmp_path):
    with pytest.raises(ConfigurationError, match="max_file_age must be zero or more"):
        make_reader(tmp_path, max_file_age=-1)
    with pytest.raises(ConfigurationError, match="max_file_age 'a week' is not a duration"):
        make_reader(tmp_path, max_file_age="a week")


def test_the_seen_map_forgets_by_the_horizon_and_never_moves_it_back():
    seen = SeenFiles(max_age_ms=100)
    for name, t in (("a", 1000), ("b", 1050), ("c", 1200)):
        seen.add(name, t)
    assert seen.purge() == ["a", "b"] and seen.horizon_ms == 1100
    assert not seen.is_new("c", 1200) and not seen.is_new("x", 1099) and seen.is_new("x", 1100)
    seen.add("late", 1150)  # a late file within the age: the watermark stays
    assert seen.purge() == [] and seen.horizon_ms == 1100
    restored = SeenFiles.from_json(json.loads(json.dumps(seen.to_json())), max_age_ms=10_000)
    assert restored.horizon_ms == 1100 and set(restored.files) == {"c", "late"}
