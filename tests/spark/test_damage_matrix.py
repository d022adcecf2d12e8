"""Every kind of file batchline keeps, damaged every way (issue 34, SPEC E3): a restart either
ends with exactly the output of an uninterrupted run, saying at WARN what it read around, or
stops before it commits anything on top of the damage, with an error that names the file,
what is wrong with it and what to do. No case ends with a wrong answer.

One pre-run (module-scoped) leaves a checkpoint location and Parquet output the way a driver
killed in a batch does: batches up to CRASH_AT committed, CRASH_AT's output committed but not
the batch. Each case copies it, damages the newest file of one kind one way (bytes flipped in
the middle, cut to half, emptied, deleted), restarts and runs through END_MS.

File kinds and how each is verified (``seal``: a header with the body's SHA-256 and length;
CRC-32: a footer after the Arrow IPC bytes):

- checkpoint: ``checkpoints/checkpoint-*.json``, sealed; the newest bad one falls back to the one before.
- manifest: ``_manifest.json``, sealed; a bad or missing one falls back to the checkpoint files.
- events (batch log, job events): ``events/<t>/started|operator-*|finished-*|completed.json``,
  sealed; a record a crash tore at the tail is dropped, anything else stops the restart.
- state delta and snapshot: ``state/<op>/g<g>/p<p>/<v>.delta|snapshot.arrow``, CRC-32; a bad
  snapshot is read around from an older snapshot and the deltas after it; a bad delta of the
  batch being recovered makes its partition run that batch again.
- operator metadata: ``state/<op>/_metadata.json``, sealed.
- lease: ``_lease.json``, sealed; a bad one frees the location with a fencing token from the clock.
- file sink commit record: ``.<out>.batchline/commits/<t>.json``, sealed.
- progress: ``_progress.json``, sealed; only shown, never needed for a restart.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from batchline.errors import BatchlineError
from batchline.scheduler.retry import RetryPolicy
from tests.helpers import LogWatcher, wait_for
from tests.spark.damage_pipeline import CRASH_AT, END_MS, START_MS, CountsRun, output_rows

DAMAGES = ("flipped", "truncated", "emptied", "deleted")
_V = f"{CRASH_AT:015d}"


def _newest(pattern: str) -> Callable[[Path], Path]:
    def find(root: Path) -> Path:
        found = sorted(root.glob(pattern))
        assert found, pattern
        return found[-1]
    return find


KINDS: dict[str, Callable[[Path], Path]] = {
    "checkpoint": _newest("checkpoint/checkpoints/checkpoint-*.json"),
    "manifest": _newest("checkpoint/_manifest.json"),
    "batch log (started)": _newest(f"checkpoint/events/{_V}/started.json"),
    "job event (operator)": _newest(f"checkpoint/events/{_V}/operator-counts-g0.json"),
    "job event (finished)": _newest(f"checkpoint/events/{_V}/finished-counts-g0-p00000.json"),
    "job event (completed)": _newest("checkpoint/events/*/completed.json"),
    "state delta": _newest("checkpoint/state/counts/g0/p00000/*.delta.arrow"),
    "state snapshot": _newest("checkpoint/state/counts/g0/p00000/*.snapshot.arrow"),
    "operator metadata": _newest("checkpoint/state/counts/_metadata.json"),
    "lease": _newest("checkpoint/_lease.json"),
    "sink commit record": _newest(".out.batchline/commits/*.json"),
    "progress": _newest("checkpoint/_progress.json"),
}


@dataclass(frozen=True)
class Exact:
    """The output equals the uninterrupted run's; ``warns``: a WARN names the damaged file
    (None: the file's absence is what a crash before writing it leaves, and the restart does
    what it does then: runs the work again)."""

    warns: bool = True


@dataclass(frozen=True)
class Stops:
    """The restart stops, before committing anything on top of the damage, with an error that
    names the file, says what is wrong (one of ``problem``) and what to do."""

    problem: tuple[str, ...]


CHECKSUM = Stops(("checksum", "altered"))
TORN = Stops(("torn", "cut short", "written after it"))
EMPTY = Stops(("empty", "written after it"))
MISSING = Stops(("missing",))

EXPECTED: dict[tuple[str, str], Exact | Stops] = {
    **{("checkpoint", d): Exact() for d in DAMAGES},
    **{("manifest", d): Exact() for d in DAMAGES},
    # CRASH_AT ran (its partitions recorded their finish, its output committed): its inputs
    # cannot be given again from a record that is not whole.
    ("batch log (started)", "flipped"): CHECKSUM,
    ("batch log (started)", "truncated"): TORN,
    ("batch log (started)", "emptied"): EMPTY,
    ("batch log (started)", "deleted"): MISSING,
    ("job event (operator)", "flipped"): CHECKSUM,
    ("job event (operator)", "truncated"): TORN,
    ("job event (operator)", "emptied"): EMPTY,
    ("job event (operator)", "deleted"): Exact(warns=False),
    # A finish record at the tail: torn by a crash is what it looks like; the partition runs again.
    ("job event (finished)", "flipped"): CHECKSUM,
    ("job event (finished)", "truncated"): Exact(),
    ("job event (finished)", "emptied"): Exact(),
    ("job event (finished)", "deleted"): Exact(warns=False),
    # The newest commit marker: no later one follows, so a cut one is a crash's; its batch runs again.
    ("job event (completed)", "flipped"): CHECKSUM,
    ("job event (completed)", "truncated"): Exact(),
    ("job event (completed)", "emptied"): Exact(),
    ("job event (completed)", "deleted"): Exact(warns=False),
    # The newest delta is the crashed batch's: its partition is not kept but runs that batch
    # again from the version before, writing the delta anew (a damaged delta of a committed
    # batch stops the restart: tests/spark/test_state_damage.py).
    **{("state delta", d): Exact() for d in DAMAGES},
    ("state snapshot", "flipped"): Exact(),
    ("state snapshot", "truncated"): Exact(),
    ("state snapshot", "emptied"): Exact(),
    ("state snapshot", "deleted"): Exact(warns=False),  # the older snapshot and the deltas stand in
    ("operator metadata", "flipped"): CHECKSUM,
    ("operator metadata", "truncated"): TORN,
    ("operator metadata", "emptied"): EMPTY,
    ("operator metadata", "deleted"): MISSING,
    **{("lease", d): Exact() for d in DAMAGES},
    # CRASH_AT re-runs: its record is read; its batch directory was renamed into place whole.
    **{("sink commit record", d): Exact() for d in DAMAGES},
    ("progress", "flipped"): Exact(),
    ("progress", "truncated"): Exact(),
    ("progress", "emptied"): Exact(),
    ("progress", "deleted"): Exact(warns=False),
}


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flipped":
        middle = len(data) // 2
        data[middle:middle + 4] = bytes(b ^ 0xFF for b in data[middle:middle + 4])
        path.write_bytes(bytes(data))
    elif how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "emptied":
        path.write_bytes(b"")
    else:
        path.unlink()


@pytest.fixture(scope="module")
def crashed(spark, tmp_path_factory) -> Path:
    """A checkpoint location and output as a driver killed in batch CRASH_AT leaves them."""
    root = tmp_path_factory.mktemp("crashed")
    CountsRun(spark, root, START_MS, crash_at=CRASH_AT).crash()
    # Snapshots are written by the Python workers in the background: wait until they are done.
    listing: list[tuple[str, int]] = []

    def settled() -> bool:  # the same files, of the same sizes, as half a second before
        nonlocal listing
        before, listing = listing, sorted((str(p), p.stat().st_size) for p in root.rglob("*") if p.is_file())
        return listing == before

    wait_for(settled, "end of the background snapshot writes", timeout_s=120, step_s=0.5)
    assert not [name for name, _ in listing if "/.tmp-" in name]
    return root


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_damaged_file_gives_the_exact_output_or_stops_naming_it(spark, tmp_path, crashed, counts_reference,
                                                                  kind, how):
    case = tmp_path / "case"
    shutil.copytree(crashed, case)
    damaged = KINDS[kind](case)
    before = output_rows(case / "out")
    damage(damaged, how)
    expected = EXPECTED[(kind, how)]

    run = CountsRun(spark, case, CRASH_AT + 500, retry=RetryPolicy(max_attempts=3, initial_backoff="100ms"))
    error: BaseException | None = None
    with LogWatcher() as logs:
        try:
            run.ssc.start()
            run.run_through(END_MS)
        except BatchlineError as failure:
            error = failure
        finally:
            run.ssc.stop()
    output = output_rows(case / "out")

    if isinstance(expected, Exact):
        assert error is None, f"expected the exact output, got {error!r}"
        assert output == counts_reference
        warned = [m for m in logs.messages(level=logging.WARNING) if damaged.name in m]
        assert bool(warned) == expected.warns, logs.messages(level=logging.WARNING)
        return
    assert error is not None, "expected the restart to stop naming the file; it ran to the end"
    message = str(error)
    assert str(damaged) in message, message
    assert any(word in message for word in expected.problem), message
    assert "Restore" in message, message
    # Nothing was committed on top of the damage: the output holds what the first run
    # committed, and nothing else (CRASH_AT was committed to the output before the crash).
    assert output == before
    assert all(rows == counts_reference[t] for t, rows in output.items())
