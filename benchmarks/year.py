"""A pipeline that ran for a year restarts like one that ran for an hour (SPEC E6, issue 19).

The same pipeline (a file source, a running count per key in state, a file output; 500 ms
batches) runs a short history, stops, and restarts on new input twice:

- fresh: as the history left it;
- year: with what a year under the release before would have left added to the same
  location: the file source's checkpoint naming 1,000,000 files read (the old format, which
  the restart converts), 500,000 completed batches in the job event log (a started and a
  completed record each, as the store writes them, before the history's first batch), and
  100,000 commit records of the file output. State versions are not fabricated: retention
  keeps 20 per partition and deletes older ones in the background every 10 commits, so a
  year leaves what an hour does.

Figures: restart (start, which takes the lease, to the first committed batch with rows),
steady batch time (median processing time of the batches after it), newest checkpoint
size, and what is left of the fabricated metadata once the run ends.

    python -m benchmarks.year            # the full year (fabricating it takes minutes)
    python -m benchmarks.year --quick    # a smoke run with small counts
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.types import StructType

from batchline import StreamingContext, StreamingListener
from batchline.checkpoint.events import EVENTS
from batchline.checkpoint.storage import CheckpointStorage, seal
from batchline.checkpoint.writer import CHECKPOINTS, load_latest_checkpoint
from batchline.scheduler.listener import BatchInfo
from batchline.sinks.files import COMMITS_DIR, own_location
from batchline.spark import local_spark_session
from benchmarks.machine import write_result

INTERVAL_MS = 500
KEYS = 50
ROWS_PER_FILE = 200
SOURCE = "events"


@dataclass(frozen=True)
class Year:
    files_read: int
    logged_batches: int
    output_commits: int
    history_batches: int
    steady_batches: int


FULL = Year(files_read=1_000_000, logged_batches=500_000, output_commits=100_000, history_batches=10,
            steady_batches=40)
QUICK = Year(files_read=20_000, logged_batches=2_000, output_commits=1_000, history_batches=3, steady_batches=6)


def running_count(key: tuple[Any, ...], rows: Any, state: Any) -> Any:
    count, total = state.get() if state.exists else (0, 0)
    for row in rows:
        count, total = count + 1, total + row.value
    state.update((count, total))
    yield (key[0], count)


class _Batches(StreamingListener):
    def __init__(self) -> None:
        self.completed: list[BatchInfo] = []
        self.changed = threading.Condition()

        self.error: str | None = None

    def on_batch_completed(self, info: BatchInfo) -> None:
        with self.changed:
            if info.failure is not None:
                self.error = info.failure
            else:
                self.completed.append(info)
            self.changed.notify_all()

    def on_error(self, error: BaseException) -> None:
        with self.changed:
            self.error = str(error)
            self.changed.notify_all()

    def wait_for(self, count: int, timeout_s: float) -> list[BatchInfo]:
        """The first ``count`` completed batches with rows."""
        with self.changed:
            done = self.changed.wait_for(lambda: self.error is not None or len(self.with_rows()) >= count, timeout_s)
        if self.error is not None:
            raise RuntimeError(f"the pipeline failed: {self.error}")
        if not done:
            raise TimeoutError(f"{count} batches with rows did not complete within {timeout_s} s")
        return self.with_rows()[:count]

    def with_rows(self) -> list[BatchInfo]:
        return [info for info in self.completed if info.num_records]


def write_files(folder: Path, start: int, count: int) -> None:
    for index in range(start, start + count):
        rows = [{"key": f"k{(index * 7 + r) % KEYS}", "value": r} for r in range(ROWS_PER_FILE)]
        path = folder / f"part-{index:07d}.json"
        temporary = folder / f".{path.name}.tmp"
        temporary.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(temporary, path)


def build(spark: Any, root: Path, listener: _Batches) -> StreamingContext:
    ssc = StreamingContext(spark, INTERVAL_MS / 1000, checkpoint=str(root / "checkpoint"),
                           checkpoint_interval=f"{2 * INTERVAL_MS}ms")
    ssc.add_listener(listener)
    events = ssc.file_stream(str(root / "in"), "json", StructType.fromDDL("key string, value long"), settle=0,
                             name=SOURCE,
                             max_files_per_batch=1)
    events.group_by_key("key").flat_map_groups_with_state(
        running_count, state_schema="count long, total long", output_schema="key string, count long",
        name="counts", num_partitions=2).write_files(str(root / "out"), "json", name="out")
    return ssc


def run_history(spark: Any, root: Path, batches: int) -> None:
    """The pipeline's past: ``batches`` batches of one file each, then a graceful stop."""
    (root / "in").mkdir(parents=True)
    write_files(root / "in", 0, batches)
    listener = _Batches()
    ssc = build(spark, root, listener)
    ssc.start()
    try:
        listener.wait_for(batches, 300)
    finally:
        ssc.stop(graceful=True)


# ------------------------------------------------------------------------------ the year
def fabricate_year(root: Path, year: Year) -> dict[str, Any]:
    """Add to a stopped pipeline's location what a year under the previous release leaves."""
    began = time.perf_counter()
    storage = CheckpointStorage(str(root / "checkpoint"))
    zero_time = _old_format_source(storage, root / "in", year.files_read)
    source_s = time.perf_counter() - began
    _old_event_log(root / "checkpoint" / EVENTS, zero_time, year.logged_batches)
    events_s = time.perf_counter() - began - source_s
    _old_commit_records(Path(own_location(str(root / "out"))) / COMMITS_DIR, zero_time, year.output_commits)
    return {"fabricated": asdict(year), "fabrication_s": {
        "file_source": round(source_s, 1), "event_log": round(events_s, 1),
        "output_commits": round(time.perf_counter() - began - source_s - events_s, 1)}}


def _old_format_source(storage: CheckpointStorage, folder: Path, files_read: int) -> int:
    """Rewrite every retained checkpoint's file source position as the release before wrote
    it: the full name of every file ever read (archived since, but for the history's)."""
    checkpoint, entries = load_latest_checkpoint(storage)
    if checkpoint is None:
        raise RuntimeError(f"no checkpoint at {storage.url}: run the history first")
    for entry in entries:
        name = f"{CHECKPOINTS}/{entry['name']}"
        payload = storage.read_sealed(name)
        remembered = payload["inputs"][SOURCE].pop("seen_files")["files"]
        read = [str(folder / base) for base in remembered]
        archived = [f"{folder}/archived-{i:07d}.json" for i in range(max(0, files_read - len(read)))]
        payload["inputs"][SOURCE]["seen"] = archived + read
        storage.replace(name, seal(payload))
    return checkpoint.zero_time


def _old_event_log(events: Path, zero_time: int, batches: int) -> None:
    """``batches`` completed batches before the history's first, as the store writes them
    (the same names and sealed records; without an fsync per file, to keep this minutes)."""
    for k in range(1, batches + 1):
        batch_time = zero_time - k * INTERVAL_MS
        folder = events / f"{batch_time:015d}"
        folder.mkdir(parents=True)
        started = {"time": batch_time, "token": 1,
                   "allocations": {SOURCE: {"files": [f"archived-{k:07d}.json"], "mtimes": [batch_time]}}}
        (folder / "started.json").write_bytes(seal(started))
        (folder / "completed.json").write_bytes(seal({"time": batch_time, "token": 1, "operators": {}}))


def _old_commit_records(commits: Path, zero_time: int, count: int) -> None:
    commits.mkdir(parents=True, exist_ok=True)
    for k in range(1, count + 1):
        batch_time = zero_time - k * INTERVAL_MS
        record = {"batch_time": batch_time, "format": "json", "staging": f"staging/{batch_time}/0000000000000000",
                  "files": [{"file": "part-00000.json", "rows": ROWS_PER_FILE, "bytes": 4000}]}
        (commits / f"{batch_time:015d}.json").write_bytes(seal(record))


# ------------------------------------------------------------------------------ the restart
def restart(spark: Any, root: Path, year: Year) -> dict[str, Any]:
    """Start again with new files waiting; time the restart and the batches after it."""
    first_new = year.history_batches
    write_files(root / "in", first_new, 1)
    listener = _Batches()
    ssc = build(spark, root, listener)
    feeding = threading.Event()

    def feed() -> None:  # one file per batch interval after the first batch
        for index in range(first_new + 1, first_new + 1 + year.steady_batches):
            if feeding.wait(INTERVAL_MS / 1000):
                return
            write_files(root / "in", index, 1)

    began = time.perf_counter()
    ssc.start()
    try:
        listener.wait_for(1, 600)
        restart_s = time.perf_counter() - began
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        steady = listener.wait_for(1 + year.steady_batches, 600)[1:]
    finally:
        feeding.set()
        ssc.stop(graceful=True)
    processing = [info.processing_delay_ms or 0 for info in steady]
    return {"restart_s": round(restart_s, 2), "steady_batch_ms_median": statistics.median(processing),
            "steady_batch_ms": processing, **_what_is_left(root)}


def _what_is_left(root: Path) -> dict[str, Any]:
    checkpoints = sorted((root / "checkpoint" / CHECKPOINTS).glob("checkpoint-*.json"))
    commits = Path(own_location(str(root / "out"))) / COMMITS_DIR
    return {
        "checkpoint_bytes": checkpoints[-1].stat().st_size if checkpoints else None,
        "event_log_batches_left": sum(1 for n in os.listdir(root / "checkpoint" / EVENTS) if n.isdigit()),
        "output_commit_records_left": sum(1 for n in os.listdir(commits) if n[0].isdigit()),
    }


def variant(spark: Any, year: Year, fabricated: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="batchline-year-") as directory:
        root = Path(directory)
        run_history(spark, root, year.history_batches)
        figures = fabricate_year(root, year) if fabricated else {}
        return {**figures, **restart(spark, root, year)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run, not the benchmark")
    args = parser.parse_args()
    year = QUICK if args.quick else FULL
    spark = local_spark_session("local[2]", "bench-year", shuffle_partitions=2)
    variant(spark, QUICK, fabricated=False)  # warm-up: JIT, Python workers
    fresh = variant(spark, year, fabricated=False)
    print("fresh:", json.dumps(fresh), flush=True)
    old = variant(spark, year, fabricated=True)
    print("year:", json.dumps(old), flush=True)
    spark.stop()
    figures = {
        "batch_interval_ms": INTERVAL_MS,
        "fresh": fresh,
        "year": old,
        "restart_ratio": round(old["restart_s"] / fresh["restart_s"], 3),
        "steady_batch_ratio": round(old["steady_batch_ms_median"] / max(1, fresh["steady_batch_ms_median"]), 3),
        "goals": {"ratio_at_most": 1.2, "checkpoint_bytes_below": 1_000_000},
    }
    print(json.dumps({k: v for k, v in figures.items() if k not in ("fresh", "year")}, indent=2))
    path = write_result("year-quick" if args.quick else "year", figures)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
