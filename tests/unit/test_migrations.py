"""Every conversion in ``batchline.checkpoint.migrations`` reads data as the older code wrote it
(``tests/fixtures/``, made by the ``make_*_fixtures.py`` beside them) and gives what this
release reads; records this release's predecessors wrote in today's layout read exactly as
before. No Spark (whole checkpoints of older formats: ``tests/spark/test_checkpoint_migrations.py``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from batchline.batch_time import BatchTime
from batchline.checkpoint import migrations
from batchline.checkpoint.events import PartitionFinished
from batchline.checkpoint.lease import LEASE_FILE, Lease
from batchline.checkpoint.migrations import (
    FILE_SOURCE_POSITION_VERSION,
    file_source_batch_mtimes,
    file_source_position_version,
    upgrade_file_source_position,
)
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError
from batchline.clock import ManualClock
from batchline.errors import CheckpointFormatError
from batchline.sinks.files import FileSink
from batchline.sinks.sink import NO_FENCING_TOKEN, BatchContext
from batchline.state.contract import PartitionFacts, Stats
from batchline.state.stateful import StatefulRuntime
from tests.fixtures import make_file_sink_fixtures as made_sink
from tests.fixtures import make_file_source_fixtures as made
from tests.helpers import ROOT
from tests.unit.test_file_source_age import checkpointed, make_reader, take

FIXTURES = ROOT / "tests" / "fixtures"
HOUR_MS = 3_600_000


def ms(seconds: float) -> int:
    return int(seconds * 1000)


# ---------------------------------------------------------------- file source positions
def file_source_fixture(release: str, kind: str, directory: Path | None = None) -> dict[str, Any]:
    """A file source's records as ``release`` wrote them; with ``directory``, its input files
    moved there (the records name files by their whole path)."""
    text = (FIXTURES / "file_source" / release / f"{kind}.json").read_text()
    if directory is not None:
        text = text.replace(made.ROOT, str(directory))
    return json.loads(text)


def unbounded_listing_now(root: str = made.ROOT) -> list[tuple[str, int]]:
    """The unbounded fixture's directory at the restart: what it read (one file deleted since)
    and what arrived after the checkpoint."""
    files = {**made.UNBOUNDED_READ_FIRST, **made.UNBOUNDED_ARRIVED_LATER}
    del files[made.UNBOUNDED_DELETED]
    return sorted((f"{root}/{name}", ms(modified)) for name, modified in files.items())


def base_name(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def materialise(directory: Path, files: dict[str, float]) -> None:
    for name, modified in files.items():
        (directory / name).write_text('{"id": 1}\n')
        os.utime(directory / name, (modified, modified))


def test_a_file_source_position_s_version_is_read_from_the_record_or_from_the_keys_before_it_had_one():
    assert file_source_position_version(file_source_fixture("v1", "unbounded")["position"], "x") == 1
    assert file_source_position_version(file_source_fixture("v1", "bounded")["position"], "x") == 1
    assert file_source_position_version(file_source_fixture("v2-unmarked", "unbounded")["position"], "x") == 2
    assert file_source_position_version(file_source_fixture("v2-unmarked", "bounded")["position"], "x") == 2
    assert file_source_position_version({"v": 2, "seen_files": {}}, "x") == FILE_SOURCE_POSITION_VERSION == 2
    assert file_source_position_version({"seen": []}, "x") == 1 == file_source_position_version({}, "x")
    with pytest.raises(CheckpointFormatError, match="newer than the 2 this release reads; run the release"):
        file_source_position_version({"v": 3, "seen_files": {}}, "files:/in")
    with pytest.raises(CorruptFileError, match="no valid version .* restore the checkpoint from a backup"):
        file_source_position_version({"v": "2"}, "files:/in")
    with pytest.raises(CorruptFileError, match="no valid version"):
        file_source_position_version({"v": True, "seen_files": {}}, "files:/in")


def test_an_unbounded_position_v1_becomes_a_watermark_that_still_reads_the_unread_files():
    record = file_source_fixture("v1", "unbounded")["position"]
    upgraded = upgrade_file_source_position(record, bounded=False, max_file_age_ms=HOUR_MS,
                                            listed=unbounded_listing_now, key=base_name, what="files:/in")
    old = {name: ms(t) for name, t in made.UNBOUNDED_READ_FIRST.items() if name != made.UNBOUNDED_DELETED}
    # The watermark is the newest file read that is still there; the horizon lies at the
    # oldest unread file, far below watermark - max_file_age, so that it is still read.
    assert upgraded == {"seen_files": {"watermark_ms": max(old.values()),
                                       "horizon_ms": ms(made.UNBOUNDED_ARRIVED_LATER["ancient-unread.json"]),
                                       "files": old}}
    # Without unread files the horizon is watermark - max_file_age, and older names go.
    read_only = [(n, t) for n, t in unbounded_listing_now() if base_name(n).startswith("old-")]
    upgraded = upgrade_file_source_position(record, bounded=False, max_file_age_ms=HOUR_MS,
                                            listed=lambda: read_only, key=base_name, what="files:/in")
    assert upgraded["seen_files"]["horizon_ms"] == max(old.values()) - HOUR_MS
    assert set(upgraded["seen_files"]["files"]) == {"old-1.json", "old-2.json"}
    # Nothing it named is listed any more: nothing remembered, nothing skipped.
    assert upgrade_file_source_position(record, bounded=False, max_file_age_ms=HOUR_MS, listed=list,
                                        key=base_name, what="files:/in") == {
        "seen_files": {"watermark_ms": None, "horizon_ms": None, "files": {}}}


def test_a_bounded_position_v1_becomes_its_listing_and_how_many_of_it_were_read():
    record = file_source_fixture("v1", "bounded")["position"]

    def not_listed() -> list[tuple[str, int]]:
        raise AssertionError("a bounded position is converted without a listing")

    upgraded = upgrade_file_source_position(record, bounded=True, max_file_age_ms=HOUR_MS, listed=not_listed,
                                            key=base_name, what="files:/in")
    assert upgraded == {"listing": sorted(f"{made.ROOT}/{name}" for name in made.BOUNDED_FILES), "taken": 2}
    # Checkpointed before its listing was made: nothing read yet.
    assert upgrade_file_source_position({"seen": []}, bounded=True, max_file_age_ms=HOUR_MS, listed=not_listed,
                                        key=base_name, what="files:/in") == {
        "seen_files": {"watermark_ms": None, "horizon_ms": None, "files": {}}}


@pytest.mark.parametrize("kind", ["unbounded", "bounded"])
def test_positions_written_before_the_version_field_are_today_s_layout_and_read_unchanged(kind):
    record = file_source_fixture("v2-unmarked", kind)["position"]

    def not_listed() -> list[tuple[str, int]]:
        raise AssertionError("today's layout is read without a listing")

    for written in (record, {"v": 2, **record}):
        assert upgrade_file_source_position(written, bounded=kind == "bounded", max_file_age_ms=HOUR_MS,
                                            listed=not_listed, key=base_name, what="files:/in") == record


def test_a_batch_logged_v1_gets_its_files_times_as_listed_now():
    logged = file_source_fixture("v1", "unbounded")["logged"]
    listed = dict(unbounded_listing_now())
    assert file_source_batch_mtimes(logged, listed=unbounded_listing_now, fallback_ms=5) == [
        listed[name] for name in logged["files"]]
    # A file gone since cannot be listed, so it is never read again: the newest time read so far.
    assert file_source_batch_mtimes(logged, listed=list, fallback_ms=5) == [5, 5]
    assert file_source_batch_mtimes(logged, listed=list, fallback_ms=None) == [0, 0]
    # A batch of version 2 names its times: they are used as logged, without a listing.
    logged = file_source_fixture("v2-unmarked", "unbounded")["logged"]
    assert file_source_batch_mtimes(logged, listed=lambda: [("x", 1)], fallback_ms=5) == logged["mtimes"]


def restarted(directory: Path, records: dict[str, Any], **options: Any) -> Any:
    """A reader restored from a fixture's position, its logged batch replayed (as a restart does)."""
    reader = make_reader(directory, opened=False, **options)
    reader.restore(records["position"])
    reader.restore_allocation(2000, records["logged"], advance=True)
    reader.open()
    return reader


def test_an_unbounded_source_restarts_from_a_checkpoint_v1_reading_each_file_once(tmp_path):
    files = {**made.UNBOUNDED_READ_FIRST, **made.UNBOUNDED_ARRIVED_LATER}
    del files[made.UNBOUNDED_DELETED]
    materialise(tmp_path, files)
    records = file_source_fixture("v1", "unbounded", tmp_path)
    reader = restarted(tmp_path, records)
    assert reader.allocation(2000) == records["logged"]  # replayed as that release logged it
    materialise(tmp_path, {"newer.json": made.T0 + 13 * 3600})
    assert take(reader, 3000) == ["newer.json"]
    assert take(reader, 4000) == []
    written = checkpointed(reader)
    assert written["v"] == FILE_SOURCE_POSITION_VERSION
    assert written["seen_files"]["files"] == {"new-unread.json": ms(made.T0 + 12 * 3600),
                                              "newer.json": ms(made.T0 + 13 * 3600)}


def test_a_bounded_source_restarts_from_a_checkpoint_v1_after_the_files_it_read(tmp_path):
    materialise(tmp_path, made.BOUNDED_FILES)
    records = file_source_fixture("v1", "bounded", tmp_path)
    reader = restarted(tmp_path, records, bounded=True, max_files_per_batch=2)
    assert take(reader, 3000) == ["f4.json"]
    assert reader.exhausted()
    assert checkpointed(reader) == {"v": 2, "listing": sorted(str(tmp_path / name) for name in made.BOUNDED_FILES),
                                    "taken": 5}


@pytest.mark.parametrize("kind", ["unbounded", "bounded"])
def test_a_position_without_the_version_field_restores_as_the_same_position_with_a_version(kind, tmp_path):
    files = made.BOUNDED_FILES if kind == "bounded" else made.UNBOUNDED_READ_FIRST
    materialise(tmp_path, files)
    # The age that release ran with: a smaller one would forget names at the restart, on purpose.
    options: dict[str, Any] = {"bounded": True, "max_files_per_batch": 2} if kind == "bounded" else {
        "max_file_age": "7 days"}
    position = file_source_fixture("v2-unmarked", kind, tmp_path)["position"]
    reader = make_reader(tmp_path, opened=False, **options)
    reader.restore(position)
    reader.open()
    assert checkpointed(reader) == {"v": 2, **position}
    again = make_reader(tmp_path, opened=False, **options)
    again.restore(checkpointed(reader))
    again.open()
    assert checkpointed(again) == checkpointed(reader)


def test_the_migrations_module_imports_nothing_above_the_checkpoint_room():
    imported = {line.split()[1] for line in Path(migrations.__file__).read_text().splitlines()
                if line.startswith(("from batchline", "import batchline"))}
    assert all(name.startswith(("batchline.checkpoint", "batchline.errors")) for name in imported), imported


# ---------------------------------------------------------------- file sink commit records
def sink_fixture(tmp_path: Path) -> Path:
    """A copy of the output that the sink's layout 1 left (a restart changes it)."""
    shutil.copytree(FIXTURES / "file_sink" / "v1" / "out", tmp_path / "out")
    return tmp_path / "out"


def batch(time_ms: int, out: Path) -> BatchContext:
    return BatchContext(BatchTime(time_ms), f"files:{out}", "batchline", NO_FENCING_TOKEN)


def lines(folder: Path) -> list[str]:
    return sorted(line for path in folder.glob("*.json") for line in path.read_text().splitlines())


def test_the_names_of_the_sink_s_layout_1_are_where_its_code_kept_records_and_staging(tmp_path):
    out = sink_fixture(tmp_path)
    storage = CheckpointStorage(str(out))
    for time_ms in (made_sink.PUBLISHED, made_sink.STAGED):
        record = migrations.file_sink_record(storage.read_sealed(migrations.file_sink_record_name_v1(time_ms)),
                                             under_output=True)
        assert record["under_output"] and record["batch_time"] == time_ms and record["format"] == "json"
        assert record["staging"].startswith(migrations.file_sink_staging_v1(time_ms) + "/")
    assert (out / migrations.file_sink_staging_v1(made_sink.STAGED)).is_dir()
    written = {"batch_time": 1, "format": "json", "staging": "staging/1/a", "files": []}
    assert migrations.file_sink_record(written, under_output=False) == {**written, "under_output": False}


def test_a_batch_committed_and_published_under_layout_1_is_not_written_again(tmp_path):
    out = sink_fixture(tmp_path)
    before = lines(out / f"batch_time={made_sink.PUBLISHED}")
    sink = FileSink(str(out), "json")
    assert sink.is_committed(batch(made_sink.PUBLISHED, out))
    assert lines(out / f"batch_time={made_sink.PUBLISHED}") == before and len(before) == len(made_sink.ROWS)
    assert not (tmp_path / ".out.batchline" / "commits").exists()  # nothing written of the new layout


def test_a_batch_committed_but_not_published_under_layout_1_is_published_from_its_staging_there(tmp_path):
    out = sink_fixture(tmp_path)
    staged = lines(next((out / migrations.file_sink_staging_v1(made_sink.STAGED)).iterdir()))
    sink = FileSink(str(out), "json")
    assert sink.last_commit() == {"path": str(out), "batch_time": made_sink.STAGED,
                                  "record": str(out / migrations.file_sink_record_name_v1(made_sink.STAGED))}
    assert sink.is_committed(batch(made_sink.STAGED, out))
    assert lines(out / f"batch_time={made_sink.STAGED}") == staged and len(staged) == len(made_sink.ROWS)
    assert not (out / migrations.file_sink_staging_v1(made_sink.STAGED)).exists()  # its staging dropped there
    assert (out / migrations.file_sink_record_name_v1(made_sink.STAGED)).exists()  # the record stays, as it was
    assert not sink.is_committed(batch(made_sink.STAGED + 1000, out))


# ---------------------------------------------------------------- read without a conversion
def test_a_lease_written_before_it_held_its_times_reads_them_as_unknown_and_is_taken_over(tmp_path):
    shutil.copy(FIXTURES / "records" / "lease-v1" / LEASE_FILE, tmp_path / LEASE_FILE)
    lease = Lease(CheckpointStorage(str(tmp_path)), ManualClock(20_000))
    record = lease.read()
    assert record is not None and record.released and record.token == 1
    assert (record.acquired_at_ms, record.renewed_at_ms) == (None, None)
    assert lease.acquire() == 2
    lease.release()


def test_a_finish_record_written_before_partitions_reported_their_facts_makes_the_operator_learn_them_again():
    payload = json.loads((FIXTURES / "records" / "finish-v1" / "finished.json").read_text())
    record = PartitionFinished.from_json(payload)
    stats = Stats.from_json(record.stats)
    assert (stats.rows, stats.state_keys, stats.partitions) == (4, 2, 1 << record.partition)
    assert stats.partitions_after == {} and stats.input_max_event_time_ms == {} and stats.warnings == ()
    # The operator kept partition 1 from that record and ran partition 0: it does not know
    # partition 1's facts, so it knows none until a batch runs whole.
    ran_now = Stats(partitions=1, partitions_after={0: PartitionFacts(3, 68, None)})
    operator = SimpleNamespace(_drained=set(), _facts={0: PartitionFacts(3, 68, None), 1: PartitionFacts(2, 46, None)})
    assert StatefulRuntime._facts_after(operator, frozenset({0, 1}), ran_now.merge(stats)) is None
    # With a record of today's layout it knows both.
    today = Stats.from_json({**record.stats, "partitions_after": {"1": [2, 46, None]}})
    assert StatefulRuntime._facts_after(operator, frozenset({0, 1}), ran_now.merge(today)) == {
        0: PartitionFacts(3, 68, None), 1: PartitionFacts(2, 46, None)}
