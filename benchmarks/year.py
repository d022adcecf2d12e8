"""A pipeline that ran for a year restarts like one that ran for an hour (SPEC E6, issue 19).

The same pipeline (a file source, a running count per key in state, a file output; 500 ms
batches) runs a short history, stops, and restarts on new input; three times:

- fresh: as the history left it;
- this release's year (the headline): with what a year of 500,000 batches under this release
  leaves added to the same location, written by the library's own classes: the file
  source's position of 1,000,000 files read over 365 days (``SeenFiles``: a watermark and
  the ~19,000 names modified within ``max_file_age``, 7 days, of the newest), the job event
  log purged continuously (only the history's recent batches and ``events/_purged.json``,
  past every old batch), and the file output's commit records compacted
  (``commits/_compacted.json`` plus the newest ``keep_commits``, 1000);
- the first restart after upgrading from a release before: with what a year under that
  release left: the file source's checkpoint naming 1,000,000 files read (the old format,
  which the restart converts), 500,000 completed batches in the job event log (a started
  and a completed record each, as the store writes them, before the history's first batch),
  and 100,000 commit records of the file output. This one restart pays a migration once
  (the conversion, and the background purge of 500,000 batch folders while batches run).

State versions are not fabricated: retention keeps 20 per partition and deletes older ones
in the background every 10 commits, so a year leaves what an hour does.

Figures, per case: restart (start, which takes the lease, to the first committed batch with
rows), steady batch time (median processing time of the batches after it), each against the
same fresh run, newest checkpoint size (goal: under 1 MB), and what is left of the year's
metadata once the run ends.

    python -m benchmarks.year            # the full year (fabricating the old format takes minutes)
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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.types import StructType

from batchline import StreamingContext, StreamingListener
from batchline.checkpoint.events import EVENTS, PURGE_RECORD, JobEventStore, PurgeRecord
from batchline.checkpoint.storage import CheckpointStorage, seal
from batchline.checkpoint.writer import CHECKPOINTS, load_latest_checkpoint
from batchline.durations import parse_duration_ms
from batchline.scheduler.listener import BatchInfo
from batchline.sinks.files import COMMITS_DIR, COMPACTED_RECORD, DEFAULT_KEEP_COMMITS, FileSink, own_location
from batchline.sources.seen_files import DEFAULT_MAX_FILE_AGE, SeenFiles
from batchline.spark import local_spark_session
from benchmarks.machine import write_result

INTERVAL_MS = 500
KEYS = 50
ROWS_PER_FILE = 200
SOURCE = "events"
YEAR_MS = 365 * 24 * 3600 * 1000
MAX_FILE_AGE_MS = parse_duration_ms(DEFAULT_MAX_FILE_AGE, "max_file_age", allow_zero=True)
"""The file source's ``max_file_age``: ``build`` leaves it at the default."""


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
        # That release's position carried no version field: the version it writes goes too.
        payload["inputs"][SOURCE] = {"seen": archived + read}
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


# ------------------------------------------------------------------------------ a year under this release
def fabricate_this_release_year(root: Path, year: Year) -> dict[str, Any]:
    """Add to a stopped pipeline's location what a year under this release leaves, written by
    the library's own classes, so that the formats cannot drift from what it writes:

    - the file source: ``year.files_read`` files read over 365 days before the history's,
      one batch's worth at a time through ``SeenFiles.add`` and ``purge`` (as the reader
      advances), so each retained checkpoint remembers the watermark and the names within
      ``max_file_age`` of the newest (the files themselves were moved away since, as in the
      upgrade case: nothing of the year is listed);
    - the job event log: the year's last batch logged by ``JobEventStore`` and then purged by
      ``purge_before`` up to the history's first batch (unless the history purged some of its
      own already), which leaves ``events/_purged.json`` past every batch of the year, as
      purging after every checkpoint would have: the batches before it are known purged, by name;
    - the file output: the newest ``keep_commits`` + 1 of the year's commit records, then
      ``FileSink.compact``, which leaves the snapshot (``through_ms`` covers every older
      record, all ``year.output_commits`` of them) and the newest ``keep_commits`` records,
      the history's among them, as compacting every 100 commits would have.
    """
    began = time.perf_counter()
    storage = CheckpointStorage(str(root / "checkpoint"))
    checkpoint, _ = load_latest_checkpoint(storage)
    if checkpoint is None:
        raise RuntimeError(f"no checkpoint at {storage.url}: run the history first")
    history = sorted(path.stat().st_mtime_ns // 1_000_000 for path in (root / "in").iterdir())
    files = _year_of_files(year.files_read - len(history), history[0])
    remembered = _this_release_source(storage, files, year)
    source_s = time.perf_counter() - began
    purged = _this_release_event_log(storage, root / "in", checkpoint.zero_time, files[-1])
    events_s = time.perf_counter() - began - source_s
    through = _this_release_commits(root, checkpoint.zero_time, year)
    newest = _newest_checkpoint(root)
    assert newest is not None
    return {"fabricated": asdict(year), "fabrication_s": {
        "file_source": round(source_s, 1), "event_log": round(events_s, 1),
        "output_commits": round(time.perf_counter() - began - source_s - events_s, 1)},
        "year_left": {"source_remembered_files": remembered, "event_log_purged_before_ms": purged,
                      "output_commits_compacted_through_ms": through,
                      "checkpoint_bytes": newest.stat().st_size}}


def _year_of_files(count: int, before_ms: int) -> list[tuple[str, int]]:
    """(name, modification time in ms) of ``count`` files spread evenly over the 365 days
    before ``before_ms``, oldest first; named as in the upgrade case."""
    spacing = YEAR_MS / max(1, count)
    return [(f"archived-{i:07d}.json", before_ms - round((count - i) * spacing)) for i in range(count)]


def _this_release_source(storage: CheckpointStorage, files: list[tuple[str, int]], year: Year) -> int:
    """Give every retained checkpoint's file source position the year's files read before
    the history's; returns how many names the newest remembers."""
    seen = SeenFiles(MAX_FILE_AGE_MS)
    per_batch = max(1, round(year.files_read / year.logged_batches))
    for index, (name, modified) in enumerate(files, 1):
        seen.add(name, modified)
        if index % per_batch == 0:
            seen.purge()  # as the reader does after each batch's files
    seen.purge()
    year_json = seen.to_json()
    remembered = 0
    _, entries = load_latest_checkpoint(storage)
    for entry in reversed(entries):  # oldest first: the newest is counted last
        name = f"{CHECKPOINTS}/{entry['name']}"
        payload = storage.read_sealed(name)
        position = SeenFiles.from_json(payload["inputs"][SOURCE]["seen_files"], MAX_FILE_AGE_MS)
        merged = SeenFiles.from_json(year_json, MAX_FILE_AGE_MS)
        for base, modified in sorted(position.files.items(), key=lambda item: (item[1], item[0])):
            merged.add(base, modified)
        merged.purge()
        payload["inputs"][SOURCE]["seen_files"] = merged.to_json()
        storage.replace(name, seal(payload))
        remembered = len(merged)
    return remembered


def _this_release_event_log(storage: CheckpointStorage, folder: Path, zero_time: int,
                            last_file: tuple[str, int]) -> int:
    """Every batch before the history's purged, as purging after each checkpoint leaves the
    log: unless the history purged some of its own batches already (its record is then past
    the year), the year's last batch is logged as the store does and purged with every batch
    before the history's. Returns where the purge record says the next purge starts."""
    last = zero_time - INTERVAL_MS
    if not storage.exists(PURGE_RECORD):
        events = JobEventStore(storage, INTERVAL_MS)
        events.batch_started(last, {SOURCE: {"files": [str(folder / last_file[0])], "mtimes": [last_file[1]]}}, 1)
        events.batch_completed(last, 1, {})
        events.purge_before(zero_time)
    record = PurgeRecord.from_json(storage.read_sealed(PURGE_RECORD))
    if record.next_ms <= last or (record.kept_ms is not None and record.kept_ms <= last) \
            or storage.exists(f"{EVENTS}/{last:015d}"):
        raise RuntimeError(f"the purge left {record} in {storage.full_url(EVENTS)}, not past the year's {last} ms")
    return record.next_ms


def _this_release_commits(root: Path, zero_time: int, year: Year) -> int:
    """The newest of the year's commit records, compacted by the output's own ``compact``;
    returns the snapshot's ``through_ms``."""
    own = CheckpointStorage(own_location(str(root / "out")))
    _old_commit_records(Path(own.path(COMMITS_DIR)), zero_time, min(year.output_commits, DEFAULT_KEEP_COMMITS + 1))
    if FileSink(str(root / "out"), "json", keep_commits=DEFAULT_KEEP_COMMITS).compact() == 0:
        raise RuntimeError(f"nothing of the year's {year.output_commits} commit records was compacted")
    return int(own.read_sealed(COMPACTED_RECORD)["through_ms"])


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
    newest = _newest_checkpoint(root)
    commits = Path(own_location(str(root / "out"))) / COMMITS_DIR
    remembered = None
    if newest is not None:
        position = CheckpointStorage(str(newest.parent)).read_sealed(newest.name)["inputs"][SOURCE]
        remembered = len(position["seen_files"]["files"]) if "seen_files" in position else len(position["seen"])
    return {
        "checkpoint_bytes": newest.stat().st_size if newest is not None else None,
        "source_remembered_files": remembered,
        "event_log_batches_left": sum(1 for n in os.listdir(root / "checkpoint" / EVENTS) if n.isdigit()),
        "output_commit_records_left": sum(1 for n in os.listdir(commits) if n[0].isdigit()),
    }


def _newest_checkpoint(root: Path) -> Path | None:
    checkpoints = sorted((root / "checkpoint" / CHECKPOINTS).glob("checkpoint-*.json"))
    return checkpoints[-1] if checkpoints else None


Fabricate = Callable[[Path, Year], dict[str, Any]]


def variant(spark: Any, year: Year, fabricate: Fabricate | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="batchline-year-") as directory:
        root = Path(directory)
        run_history(spark, root, year.history_batches)
        figures = fabricate(root, year) if fabricate is not None else {}
        return {**figures, **restart(spark, root, year)}


def against(case: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
    """A case's figures with its ratios against the fresh run."""
    return {"restart_ratio": round(case["restart_s"] / fresh["restart_s"], 3),
            "steady_batch_ratio": round(case["steady_batch_ms_median"] / max(1, fresh["steady_batch_ms_median"]), 3),
            **case}


GOALS = {"ratio_at_most": 1.2, "checkpoint_bytes_below": 1_000_000}


def meets_goals(case: dict[str, Any]) -> bool:
    return (case["restart_ratio"] <= GOALS["ratio_at_most"] and case["steady_batch_ratio"] <= GOALS["ratio_at_most"]
            and case["checkpoint_bytes"] < GOALS["checkpoint_bytes_below"])


def _summary(case: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in case.items() if k not in ("steady_batch_ms", "fabricated")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run, not the benchmark")
    args = parser.parse_args()
    year = QUICK if args.quick else FULL
    spark = local_spark_session("local[2]", "bench-year", shuffle_partitions=2)
    variant(spark, QUICK, None)  # warm-up: JIT, Python workers
    fresh = variant(spark, year, None)
    print("fresh:", json.dumps(fresh), flush=True)
    this_release = against(variant(spark, year, fabricate_this_release_year), fresh)
    print("this release's year:", json.dumps(this_release), flush=True)
    upgrade = against(variant(spark, year, fabricate_year), fresh)
    print("first restart after upgrading:", json.dumps(upgrade), flush=True)
    spark.stop()
    figures = {
        "batch_interval_ms": INTERVAL_MS,
        "goals": GOALS,
        "headline": {"case": "this_release_year", "restart_ratio": this_release["restart_ratio"],
                     "steady_batch_ratio": this_release["steady_batch_ratio"],
                     "checkpoint_bytes": this_release["checkpoint_bytes"], "meets_goals": meets_goals(this_release)},
        "fresh": fresh,
        "this_release_year": {"what": "a year of batches under this release: the restart a long-running pipeline "
                                      "makes", **this_release},
        "upgrade_from_previous_release": {
            "what": "the first restart after upgrading from a release before, which converts the year's metadata "
                    "once (the file source's names; the event log purged in the background)", **upgrade},
    }
    print(json.dumps({"headline": figures["headline"], "fresh": _summary(fresh),
                      "this_release_year": _summary(this_release),
                      "upgrade_from_previous_release": _summary(upgrade)}, indent=2))
    path = write_result("year-quick" if args.quick else "year", figures)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
