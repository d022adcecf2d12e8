"""Checkpoints written by older formats (``tests/fixtures/checkpoints/v<n>/``, made by
``tests/fixtures/make_checkpoint_fixtures.py`` with the code of that format) read as typed
checkpoints, lose nothing, and restart their pipelines exactly where they stopped."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from batchline.checkpoint.migrations import MIGRATIONS, upgrade
from batchline.checkpoint.model import FORMAT_VERSION, Checkpoint, FinalRecord, FinishedReport, OperatorProgress
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError, seal, unseal
from batchline.checkpoint.writer import CHECKPOINTS, MANIFEST, load_latest_checkpoint, read_checkpoint
from batchline.errors import CheckpointFormatError
from tests.fixtures.make_checkpoint_fixtures import KEYS, Batches, build, write_input
from tests.helpers import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "checkpoints"


def copy_fixture(version: int, name: str, tmp_path: Path) -> Path:
    """A copy of the fixture (a restart writes to its location). Git keeps no modification
    times: the input files get back those the file source recorded, as they had them."""
    root = tmp_path / name
    shutil.copytree(FIXTURES / f"v{version}" / name, root)
    checkpoint, _ = load_latest_checkpoint(CheckpointStorage(str(root / "checkpoint")))
    assert checkpoint is not None
    seen = checkpoint.inputs["events"].get("seen_files", {}).get("files", {})
    for file, modified_ms in seen.items():
        os.utime(root / "in" / file, ns=(modified_ms * 1_000_000, modified_ms * 1_000_000))
    return root


def raw_checkpoints(root: Path) -> list[dict]:
    folder = root / "checkpoint" / CHECKPOINTS
    return [unseal(path.read_bytes(), path.name) for path in sorted(folder.glob("checkpoint-*.json"))]


def output_rows(root: Path) -> list[tuple[str, int]]:
    rows = []
    for path in sorted((root / "out").glob("batch_time=*/*.json")):
        rows += [(r["key"], r["count"]) for r in map(json.loads, path.read_text().splitlines())]
    return sorted(rows)


def expected_rows(files: int) -> list[tuple[str, int]]:
    """Each file holds every key twice; each batch (one file) emits each key's running count."""
    return sorted((f"k{k}", 2 * (f + 1)) for f in range(files) for k in range(KEYS))


@pytest.mark.parametrize("name", ["stopped", "finished"])
def test_every_version_1_checkpoint_reads_as_typed_fields_holding_what_its_extra_held(name, tmp_path):
    root = copy_fixture(1, name, tmp_path)
    storage = CheckpointStorage(str(root / "checkpoint"))
    raws = raw_checkpoints(root)
    assert raws and {raw["format_version"] for raw in raws} == {1}
    for raw in raws:
        file = next(n for n in storage.list_names(CHECKPOINTS) if n.startswith(f"checkpoint-{raw['time']:015d}-"))
        checkpoint = read_checkpoint(storage, file)
        assert checkpoint.format_version == FORMAT_VERSION
        extra = raw["extra"]
        assert {n: p.to_json() for n, p in checkpoint.operators.items()} == extra.get("operators", {})
        assert (checkpoint.finished.to_json() if checkpoint.finished else {}) == extra.get("finished", {})
        assert (checkpoint.final.to_json() if checkpoint.final else None) == extra.get("final")
        assert (checkpoint.time, checkpoint.pending_times, checkpoint.inputs, checkpoint.outputs) == (
            raw["time"], tuple(raw["pending_times"]), raw["inputs"], tuple(raw["outputs"]))


def test_the_version_1_fixtures_hold_what_their_pipelines_left():
    stopped, _ = load_latest_checkpoint(CheckpointStorage(str(FIXTURES / "v1" / "stopped" / "checkpoint")))
    assert stopped is not None and stopped.final is None and stopped.finished is None
    assert set(stopped.operators["counts"].partitions or {}) == {0, 1}
    finished, _ = load_latest_checkpoint(CheckpointStorage(str(FIXTURES / "v1" / "finished" / "checkpoint")))
    assert finished is not None and finished.final is not None and finished.pending_times == ()
    assert set(finished.final.output_commits) == {"out"} and set(finished.finished_inputs) == {"events"}
    assert finished.operators["counts"].finished_partitions == (0, 1)


def test_a_checkpoint_round_trips_through_its_file(tmp_path):
    checkpoint = Checkpoint(
        time=3000, zero_time=1000, batch_interval_ms=1000, checkpoint_interval_ms=2000, pending_times=(2000, 3000),
        inputs={"events": {"taken": 2}}, outputs=("out",), written_at_ms=3500,
        operators={"counts": OperatorProgress(7, (0,), None, {0: [1, 2, None], 1: [0, 0, None]}, 0)},
        finished=FinishedReport({"events": 2000}, ("FileSource('events')",), {}),
        final=FinalRecord(3000, {"out": {"batch_time": 3000}}))
    storage = CheckpointStorage(str(tmp_path))
    storage.write_new(f"{CHECKPOINTS}/checkpoint-x.json", seal(checkpoint.to_json()))
    assert read_checkpoint(storage, "checkpoint-x.json") == checkpoint
    assert "extra" not in checkpoint.to_json() and checkpoint.to_json()["format_version"] == FORMAT_VERSION


def test_every_older_version_has_a_migration_and_a_fixture():
    assert set(MIGRATIONS) == set(range(1, FORMAT_VERSION))
    assert {int(p.name[1:]) for p in FIXTURES.iterdir() if re.fullmatch(r"v\d+", p.name)} >= set(MIGRATIONS)


def test_a_checkpoint_of_a_newer_format_is_refused_and_one_without_a_version_is_corrupt(tmp_path):
    with pytest.raises(CheckpointFormatError, match="newer than the .* run the release that wrote it"):
        upgrade({"format_version": FORMAT_VERSION + 1}, "checkpoint-x.json")
    with pytest.raises(CorruptFileError, match="no valid format version"):
        upgrade({"time": 1}, "checkpoint-x.json")
    # A newer driver's checkpoint is not skipped for an older one: that would run its batches again.
    root = copy_fixture(1, "stopped", tmp_path)
    storage = CheckpointStorage(str(root / "checkpoint"))
    newest = storage.read_sealed(MANIFEST)["checkpoints"][0]["name"]
    payload = storage.read_sealed(f"{CHECKPOINTS}/{newest}")
    storage.replace(f"{CHECKPOINTS}/{newest}", seal({**payload, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(CheckpointFormatError):
        load_latest_checkpoint(storage)


def test_a_pipeline_stopped_under_version_1_goes_on_with_new_files_reading_none_twice(spark, tmp_path):
    root = copy_fixture(1, "stopped", tmp_path)
    assert output_rows(root) == expected_rows(3)
    write_input(root / "in", 3, 3)
    # Arrived soon after the stop, as the fixture's own files did before it: not weeks after the
    # fixture was made, when the source's max_file_age would let it forget the old files' names.
    newest_ms = max(os.stat(root / "in" / f"part-{i:03d}.json").st_mtime_ns // 1_000_000 for i in range(3))
    for i in range(3, 6):
        arrived_ns = (newest_ms + 1000 * (i - 2)) * 1_000_000
        os.utime(root / "in" / f"part-{i:03d}.json", ns=(arrived_ns, arrived_ns))
    listener = Batches()
    ssc = build(spark, root, bounded=False, listener=listener)
    ssc.start()
    try:
        listener.wait_for(3, 180)
    finally:
        ssc.stop(graceful=True)
    assert output_rows(root) == expected_rows(6)
    assert {raw["format_version"] for raw in raw_checkpoints(root)} >= {FORMAT_VERSION}
    newest, _ = load_latest_checkpoint(CheckpointStorage(str(root / "checkpoint")))
    assert newest is not None and newest.format_version == FORMAT_VERSION
    assert set(newest.inputs["events"]["seen_files"]["files"]) == {f"part-{i:03d}.json" for i in range(6)}


def test_a_pipeline_finished_under_version_1_starts_finished_and_runs_nothing(spark, tmp_path):
    root = copy_fixture(1, "finished", tmp_path)
    before = output_rows(root)
    assert before == expected_rows(3)
    listener = Batches()
    ssc = build(spark, root, bounded=True, listener=listener)
    assert ssc.run_until_finished(timeout=60)
    assert listener.with_rows == 0 and output_rows(root) == before
    assert [raw["format_version"] for raw in raw_checkpoints(root)] == [1] * len(raw_checkpoints(root))
