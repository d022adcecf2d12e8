"""A checkpoint location that fills up in the middle of a batch (issue 34, SPEC E3): the batch
fails with an error that names the location, says there is no space left and what to do; no
file is left half-written for a restart to trust; once there is space again a restart
resumes, and the output equals an uninterrupted run's.

On a real size-limited tmpfs where this machine lets the test mount one (as root), and always
on ``meteredfile://`` (tests/metered_fs.py), the fsspec file system that CI without
root gets instead: the test never skips.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from batchline.checkpoint.storage import StorageFullError, unseal
from batchline.errors import BatchFailedError
from batchline.scheduler.retry import RetryPolicy
from batchline.state.store import decode_version_file
from tests.metered_fs import metered_location
from tests.spark.damage_pipeline import END_MS, START_MS, CountsRun, output_rows

FULL_AFTER = 15_000
"""Batches up to here commit; then the location is filled to a few pages below full."""
LEFT_BYTES = 6_000
"""Room left: less than one batch writes (two state deltas, two kept outputs and the event
records, each a 4 KiB page on tmpfs), more than its first records."""


@dataclass
class Space:
    """A checkpoint location with little room: its URL and options, the directory behind it."""

    url: str
    options: dict[str, Any]
    root: Path
    room: Any
    """Bytes free now (a function)."""
    filler: Path = field(init=False)

    def __post_init__(self) -> None:
        self.filler = self.root / "filler"

    def fill_leaving(self, free_bytes: int) -> None:
        """A filler file that leaves about ``free_bytes`` free. The running pipeline's own
        threads may take a page between the measure and the write (once in a full run of the
        suite): the filler is then measured again."""
        for attempt in range(3):
            size = self.room() - free_bytes
            assert size > 0, (self.room(), free_bytes)
            try:
                with open(self.filler, "wb") as handle:
                    handle.write(b"\0" * size)
                break
            except OSError as error:
                self.filler.unlink(missing_ok=True)
                if error.errno != errno.ENOSPC or attempt == 2:
                    raise
        assert self.room() < free_bytes + 8192

    def free(self) -> None:
        self.filler.unlink()


def _mounted_tmpfs(directory: Path, size: str) -> bool:
    """Mount a tmpfs of ``size`` at ``directory``; False where the machine does not allow it."""
    directory.mkdir(parents=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _statvfs_room(root: Path) -> Any:
    def room() -> int:
        stats = os.statvfs(root)
        return stats.f_bavail * stats.f_frsize
    return room


@pytest.fixture(params=["small filesystem", "metered"])
def space(request, tmp_path) -> Iterator[Space]:
    """``small filesystem``: a 2 MiB tmpfs, or the metered file system where none can be mounted;
    ``metered``: the metered file system always (what CI without root runs)."""
    mount = tmp_path / "tmpfs"
    if request.param == "small filesystem" and _mounted_tmpfs(mount, "2m"):
        try:
            yield Space(str(mount / "checkpoint"), {}, mount, _statvfs_room(mount))
        finally:
            subprocess.run(["umount", str(mount)], check=True, timeout=60)
        return
    root = tmp_path / "metered"
    url, options = metered_location(str(root), 2 * 1024 * 1024)
    meter = options["meter"]
    yield Space(f"{url}/checkpoint", options, root, lambda: meter.limit_bytes - meter.used())


def _every_file_verifies(root: Path) -> int:
    """What a restart could trust is whole: every sealed record unseals, every state file
    matches its checksum, and no temporary file is left; returns how many files there are."""
    count = 0
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name == "filler":
            continue
        count += 1
        assert not path.name.startswith(".tmp-"), f"{path} was left half-written: {path.read_bytes()[:300]!r}"
        data = path.read_bytes()
        if path.suffix == ".json":
            unseal(data, str(path))
        elif path.suffix == ".arrow":
            kind = path.name.split(".")[1]
            decode_version_file(data, kind, str(path))
    return count


def test_a_full_checkpoint_location_fails_the_batch_clearly_and_resumes_exact_once_there_is_space(
        spark, tmp_path, space, counts_reference):
    # Not retried: a retry waits its backoff on the test's manual clock, which only moves between batches.
    run = CountsRun(spark, tmp_path, START_MS, retry=RetryPolicy.never(), checkpoint=space.url,
                    storage_options=space.options, lease_ttl="2s")
    run.ssc.start()
    run.run_through(FULL_AFTER)
    space.fill_leaving(LEFT_BYTES)
    # The batch fails in a task (a state file), or before its jobs, when its start cannot be logged.
    with pytest.raises((BatchFailedError, StorageFullError)) as failure:
        run.run_through(END_MS, timeout_s=60)
    run.ssc.stop()
    error = failure.value
    cause = error.cause if isinstance(error, BatchFailedError) else error
    message = str(error)
    assert isinstance(cause, StorageFullError), repr(cause)
    assert f"no space left at {space.url}" in message and "Free space there" in message, message
    assert "start the pipeline again" in message
    # A batch soon after the location filled failed (the first, or the second when the first
    # fitted in what was left): those before it stay committed, nothing after.
    committed = sorted(i.batch_time for i in run.recorder.completed)
    failed = committed[-1] + 1000
    assert FULL_AFTER <= committed[-1] <= FULL_AFTER + 2000, committed
    assert _every_file_verifies(space.root) > 20

    space.free()
    # The full location may have kept the first driver from releasing its lease; in one process
    # (its holder looks alive) the restart waits for it to lapse: 2 s of the manual clock.
    again = CountsRun(spark, tmp_path, failed + 2500, checkpoint=space.url, storage_options=space.options)
    again.ssc.start()
    again.run_through(END_MS)
    again.ssc.stop()
    assert output_rows(tmp_path / "out") == counts_reference


def test_a_batch_whose_inputs_could_not_be_logged_runs_again_with_its_data(spark, tmp_path, counts_reference):
    """The store refuses one write: the log of a batch's inputs (its ``started`` record). The
    inputs had already taken the batch's data when the log failed, so no checkpoint written
    after it may hold their moved position: a restart would run the batch with no data."""
    url, options = metered_location(str(tmp_path / "metered"), 1 << 30)
    meter, refused_at = options["meter"], 16_000
    started = f"checkpoint/events/{refused_at:015d}/started.json"
    run = CountsRun(spark, tmp_path, START_MS, checkpoint=f"{url}/checkpoint", storage_options=options,
                    lease_ttl="2s")
    run.ssc.start()
    run.run_through(refused_at - 1000)
    meter.refuse(started)
    with pytest.raises((BatchFailedError, StorageFullError)) as failure:
        run.run_through(END_MS, timeout_s=60)
    run.ssc.stop()
    assert "started.json" in str(failure.value), failure.value
    assert max(i.batch_time for i in run.recorder.completed) == refused_at - 1000

    meter.allow(started)
    again = CountsRun(spark, tmp_path, refused_at + 2500, checkpoint=f"{url}/checkpoint", storage_options=options)
    again.ssc.start()
    again.run_through(END_MS)
    again.ssc.stop()
    assert output_rows(tmp_path / "out") == counts_reference
