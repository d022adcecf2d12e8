"""Event-time windows: batchline's ``aggregate`` over ``window(...)`` against Spark Structured
Streaming's native stateful aggregation, on the same Parquet files, in one run.

The input: 1M events ``{key, value, ts}`` from 100k keys (uniform), ``value`` in [0, 1000),
about one event per millisecond of event time (event ``i`` at BASE_MS + i ms plus up to 2 s of
disorder, well inside the 10 s watermark delay, so no event is late), in 100 Parquet files of
10k events, written once (deterministic) and reused. The input's last event is a marker a day
later in event time (a key of its own): Structured Streaming never moves its watermark past
the last event, so without it the last windows would stay in its state; with it both sides
emit every real window (batchline also emits the marker's own windows, at the end of time;
they are left out of the comparison and counted).

Cases (``CASES``; a case is how to compute the expected rows here and, in
``benchmarks/windows_run.py``, each side's pipeline):
- ``a``: 1-minute tumbling windows per key, ``count``, ``sum(value)``, ``max(value)``, append;
- ``b``: the same over 5-minute windows sliding every minute;
- ``c``: the same over session windows with a 30 s gap per key (``session_window``); with 100k
  keys and an event a millisecond, a key's events are about 100 s apart, so most sessions
  hold one event;
- ``d``: deduplication on ``key`` within the watermark's delay (``with_watermark("ts", "10
  minutes")``, ``drop_duplicates_within_watermark("key")`` / ``dropDuplicatesWithinWatermark``),
  the rows kept out. A key stays in the state until the watermark (newest event time minus
  10 minutes) passes its first row's event time plus 10 minutes, i.e. 20 minutes of event time
  later: longer than the 1M-event input (about 17 minutes), so every key passes once.

Bounded run (each case): each side is a fresh Python process (``benchmarks/windows_run.py``,
timed as ``benchmarks/bounded.py`` times its sides, from process start to exit), reading 10
files per batch (``max_files_per_batch``, ``maxFilesPerTrigger``), 4 state partitions and 4
shuffle partitions, checkpoint to a fresh directory, parquet out; the machine is waited idle
before each side. Both outputs are compared with a direct computation (numpy) as multisets of
``(key, window_start, window_end, count, sum, max)`` (case ``d``: of the rows kept, ``(key,
value, ts)``); any difference fails the benchmark. Case ``d``, Structured Streaming: of a key's
rows in one batch, Spark passes whichever its task meets first (the order of the files in the
scan and of the shuffle blocks, not event time), batchline the earliest; so Spark's rows are
checked to be input rows and compared as multisets of ``(key, batch of the row)``, the number
of keys where it kept another row of that batch than batchline counted.

Steady small batches (case ``a``): as ``benchmarks/small_batches.py``, in one process on one
SparkSession, rounds alternating: batchline's pipeline reading one 7k-event Parquet file per
1 s batch (manual clock, as fast as batches complete) against a bare PySpark job of the same
shape per file (read the Parquet file, the same partial ``groupBy(window, key)``, a shuffle
into 4 partitions by key and window, write parquet).

    python -m benchmarks.windows [--events 1000000] [--keys 100000] [--cases a,b,c,d] [--no-small-batches]
                                 [--rounds 3] [--batches 15] [--small-events 7000] [--profile] [--no-wait-idle]
                                 [--idle-give-up 900] [--no-write]

The results merge into ``benchmarks/results/windows.json``: the cases and the small batches
run replace their own entries and keep the others; each entry carries its run (date,
command, input size).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import windows_profile
from benchmarks.bounded import Side, batchline_figures, peer_figures, wait_until_idle

BASE_MS = 1_800_000_000_000  # a whole minute
MARKER_DELAY_MS = 86_400_000  # the last event: a day after the others
DISORDER_MS = 2_000
VALUES = 1_000
GOAL_THROUGHPUT = 1.0  # batchline / Structured Streaming, events/s
GOAL_SMALL_BATCH = 1.3  # batchline / bare PySpark, median batch time
COLUMNS = ("key", "window_start", "window_end", "count", "sum_value", "max_value")
DEDUP_COLUMNS = ("key", "value", "ts")
INPUTS = Path(tempfile.gettempdir()) / "batchline-bench-windows-inputs"
MINUTE_MS = 60_000


# ------------------------------------------------------------------ the input
def make_events(events: int, keys: int, seed: int = 20261126, first_ms: int = BASE_MS, marker: bool = True
                ) -> dict[str, np.ndarray]:
    """Event ``i``: a random key and value at ``first_ms`` + i ms + up to DISORDER_MS; with
    ``marker``, the last one is the marker (key ``keys``, a day later)."""
    rng = np.random.default_rng(seed)
    key = rng.integers(0, keys, events).astype(np.int64)
    value = rng.integers(0, VALUES, events).astype(np.int64)
    ts = first_ms + np.arange(events, dtype=np.int64) + rng.integers(0, DISORDER_MS, events)
    if marker:
        key[-1], ts[-1] = keys, first_ms + events + MARKER_DELAY_MS
    return {"key": key, "value": value, "ts": ts}


def write_parquet_files(directory: Path, events: dict[str, np.ndarray], files: int, first: int = 0) -> list[Path]:
    """``files`` Parquet files of consecutive events, named and modified in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(events["key"]), files + 1).astype(int)
    paths = []
    for f in range(files):
        part = slice(bounds[f], bounds[f + 1])
        table = pa.table({"key": events["key"][part], "value": events["value"][part],
                          "ts": pa.array(events["ts"][part] * 1000, pa.timestamp("us", tz="UTC"))})
        path = directory / f"events-{first + f:05d}.parquet"
        pq.write_table(table, path)
        # Structured Streaming takes files in modification-time order, batchline in name order: make them agree.
        os.utime(path, (1_700_000_000 + first + f, 1_700_000_000 + first + f))
        paths.append(path)
    return paths


def input_files(events: dict[str, np.ndarray], files: int, keys: int) -> Path:
    """The bounded runs' input, reused when already written."""
    count = len(events["key"])
    directory = INPUTS / f"{count}-events-{files}-files-{keys}-keys"
    done = directory / "complete.json"
    if not done.exists():
        shutil.rmtree(directory, ignore_errors=True)
        write_parquet_files(directory / "events", events, files)
        done.write_text(json.dumps({"events": count, "files": files, "keys": keys}))
    return directory / "events"


# ------------------------------------------------------------------ the expected rows
def window_rows(events: dict[str, np.ndarray], length_ms: int, slide_ms: int) -> np.ndarray:
    """``(key, window_start, window_end, count, sum, max)`` per key and window (as Spark's
    ``window()``: every ``[start, start + length)`` with ``start`` on the slide's grid that
    holds the event), computed directly; rows sorted."""
    key, value, ts = events["key"], events["value"], events["ts"]
    starts = [ts - ts % slide_ms - k * slide_ms for k in range(-(-length_ms // slide_ms))]
    key = np.concatenate([key] * len(starts))
    value = np.concatenate([value] * len(starts))
    start = np.concatenate(starts)
    inside = start + length_ms > np.concatenate([ts] * len(starts))
    key, value, start = key[inside], value[inside], start[inside]
    first, slots = start.min(initial=0), (start.max(initial=0) - start.min(initial=0)) // slide_ms + 1
    codes, index = np.unique(key * slots + (start - first) // slide_ms, return_inverse=True)
    groups = np.column_stack([codes // slots, first + codes % slots * slide_ms])
    count = np.bincount(index, minlength=len(groups))
    total = np.bincount(index, weights=value, minlength=len(groups)).astype(np.int64)
    biggest = np.full(len(groups), np.iinfo(np.int64).min)
    np.maximum.at(biggest, index, value)
    return sort_rows(np.column_stack([groups[:, 0], groups[:, 1], groups[:, 1] + length_ms, count, total, biggest]))


def session_rows(events: dict[str, np.ndarray], gap_ms: int) -> np.ndarray:
    """``(key, window_start, window_end, count, sum, max)`` per key and session (as Spark's
    ``session_window()``: a key's events sorted by time, an event within ``gap_ms`` of the
    previous one, ``ts <= previous + gap``, joins its session; a session ends ``gap_ms``
    after its last event), computed directly; rows sorted."""
    key, value, ts = events["key"], events["value"], events["ts"]
    if not len(key):
        return np.zeros((0, len(COLUMNS)), np.int64)
    order = np.lexsort((ts, key))
    key, value, ts = key[order], value[order], ts[order]
    new = np.ones(len(key), bool)
    new[1:] = (key[1:] != key[:-1]) | (ts[1:] - ts[:-1] > gap_ms)
    first = np.flatnonzero(new)
    count = np.diff(np.append(first, len(key)))
    return sort_rows(np.column_stack([key[first], ts[first], np.maximum.reduceat(ts, first) + gap_ms, count,
                                      np.add.reduceat(value, first), np.maximum.reduceat(value, first)]))


def batch_of_events(events: int, files: int, files_per_batch: int) -> np.ndarray:
    """The batch of each event (incl. the marker): its file (as ``write_parquet_files`` cuts
    them) over ``files_per_batch``; both sides take the files in order, ``files_per_batch`` a batch."""
    bounds = np.linspace(0, events, files + 1).astype(int)
    return (np.searchsorted(bounds, np.arange(events), side="right") - 1) // files_per_batch


def dedup_rows(events: dict[str, np.ndarray], batch: np.ndarray, delay_ms: int, within_ms: int
               ) -> tuple[np.ndarray, dict[str, int]]:
    """The rows ``drop_duplicates_within_watermark(key)`` keeps, ``(key, value, ts)`` sorted,
    batch by batch: a batch's watermark is the newest event time of the batches before it minus
    ``delay_ms``; a row at or before it is late (dropped); a key in the state drops its rows; a
    key not in it passes its row of the batch with the earliest event time (then the smallest
    value) and stays until a batch's watermark reaches that time plus ``within_ms`` (that
    batch's rows still dropped). Also how many rows were late and keys expired."""
    key, value, ts = events["key"], events["value"], events["ts"]
    size = int(key.max(initial=-1)) + 1
    kept_in_state = np.zeros(size, bool)
    expires = np.zeros(size, np.int64)
    kept: list[np.ndarray] = []
    newest, late, expired = None, 0, 0
    for b in range(int(batch.max(initial=-1)) + 1):
        in_batch = rows = np.flatnonzero(batch[: len(key)] == b)
        watermark = None if newest is None else newest - delay_ms
        if watermark is not None:
            on_time = ts[rows] > watermark
            late += int((~on_time).sum())
            rows = rows[on_time]
        rows = rows[~kept_in_state[key[rows]]]
        rows = rows[np.lexsort((value[rows], ts[rows], key[rows]))]
        rows = rows[np.unique(key[rows], return_index=True)[1]]  # each new key's earliest row
        if watermark is not None:
            gone = kept_in_state & (expires <= watermark)
            expired += int(gone.sum())
            kept_in_state &= ~gone
        kept_in_state[key[rows]] = True
        expires[key[rows]] = ts[rows] + within_ms
        kept.append(rows)
        if len(in_batch):
            newest = max(int(ts[in_batch].max()), -(2**62) if newest is None else newest)
    rows = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    return sort_rows(np.column_stack([key[rows], value[rows], ts[rows]])), {"late": late, "keys_expired": expired}


def sort_rows(rows: np.ndarray) -> np.ndarray:
    return rows[np.lexsort(rows.T[::-1])] if len(rows) else rows


def check_dedup_peer(got: np.ndarray, want: np.ndarray, events: dict[str, np.ndarray], batch: np.ndarray
                     ) -> dict[str, Any]:
    """Structured Streaming's kept rows against the expected ones, case ``d``: of a key's rows
    in a batch, Spark passes the first its task meets (not defined by event time), so: each
    row out must be an input row, and the rows out as ``(key, batch of the row)`` the same
    multiset as the expected ones; the keys where Spark kept another row of that batch are
    counted. Fails the benchmark on any difference."""
    batch_of = {row: b for row, b in zip(zip(events["key"].tolist(), events["value"].tolist(), events["ts"].tolist(),
                                             strict=True), batch.tolist(), strict=True)}
    rows = [tuple(r) for r in got.tolist()]
    strange = [r for r in rows if r not in batch_of]
    if strange:
        raise SystemExit(f"OUTPUTS DIFFER: Structured Streaming emitted {len(strange)} rows that are not input rows, "
                         f"e.g. {strange[:3]} (columns {DEDUP_COLUMNS}, times in epoch ms)")

    def by_batch(rows: list[tuple[int, ...]]) -> np.ndarray:
        return sort_rows(np.array([(r[0], batch_of[r]) for r in rows], np.int64).reshape(-1, 2))

    compare("Structured Streaming", by_batch(rows), by_batch([tuple(r) for r in want.tolist()]),
            "the direct computation", ("key", "batch"))
    other = len(set(rows) - {tuple(r) for r in want.tolist()})
    return {"structured_streaming_keys_with_another_row_of_the_batch": other}


@dataclasses.dataclass(frozen=True)
class Case:
    """A case of the benchmark: what it computes (its pipelines are ``windows_run.CASES``)."""

    name: str
    describe: str
    expected: Callable[[dict[str, np.ndarray], np.ndarray], np.ndarray]
    """The rows out without the marker's, sorted, as ``read_rows`` reads a side's output, from
    the events (without the marker) and each event's batch."""
    marker_rows: int
    """Rows batchline emits for the marker alone (its windows close at the end of time; case
    ``d``: its row passes)."""
    peer_marker_rows: int = 0
    """Rows Structured Streaming emits for the marker (its watermark never passes the marker's
    windows; case ``d``: its row passes)."""
    columns: tuple[str, ...] = COLUMNS
    rows_out: str = "windows_out"
    watermark_delay: str = "10 seconds"
    check_peer: Callable[[np.ndarray, np.ndarray, dict[str, np.ndarray], np.ndarray], dict[str, Any]] | None = None
    """Structured Streaming's rows against the expected ones (default: the same multiset)."""
    notes: Callable[[dict[str, np.ndarray], np.ndarray, np.ndarray], dict[str, Any]] | None = None
    """Figures of the expected rows worth keeping, from the events, their batches and those rows."""


def session_notes(events: dict[str, np.ndarray], batch: np.ndarray, want: np.ndarray) -> dict[str, Any]:
    return {"sessions_of_one_event": int((want[:, 3] == 1).sum()), "events_per_session": round(
        len(events["key"]) / max(len(want), 1), 3), "longest_session_events": int(want[:, 3].max(initial=0))}


def dedup_notes(events: dict[str, np.ndarray], batch: np.ndarray, want: np.ndarray) -> dict[str, Any]:
    _, counts = dedup_rows(events, batch, 10 * MINUTE_MS, 10 * MINUTE_MS)
    return {"rows_in": len(events["key"]), "keys_in": len(np.unique(events["key"])), "rows_kept": len(want),
            "late_rows_expected": counts["late"], "keys_expired_before_the_end": counts["keys_expired"]}


CASES: dict[str, Case] = {
    "a": Case("a", "1-minute tumbling windows, count + sum + max, append",
              lambda e, b: window_rows(e, MINUTE_MS, MINUTE_MS), 1),
    "b": Case("b", "5-minute windows sliding every minute, count + sum + max, append",
              lambda e, b: window_rows(e, 5 * MINUTE_MS, MINUTE_MS), 5),
    "c": Case("c", "session windows with a 30 s gap per key, count + sum + max, append",
              lambda e, b: session_rows(e, 30_000), 1, rows_out="sessions_out", notes=session_notes),
    "d": Case("d", "deduplication on key within 10 minutes (watermark delay 10 minutes), the rows kept",
              lambda e, b: dedup_rows(e, b, 10 * MINUTE_MS, 10 * MINUTE_MS)[0], 1, peer_marker_rows=1,
              columns=DEDUP_COLUMNS, rows_out="rows_out", watermark_delay="10 minutes",
              check_peer=check_dedup_peer, notes=dedup_notes),
}


# ------------------------------------------------------------------ the outputs
def read_rows(directory: Path, names: tuple[str, ...] = COLUMNS, null: int | None = None) -> np.ndarray:
    """A side's parquet output as an int64 matrix of ``names`` (timestamps in epoch ms; nulls
    as ``null`` when given), sorted."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    table = ds.dataset(str(directory), format="parquet").to_table(columns=list(names))
    columns = []
    for name in names:
        column = table[name]
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("ms")).cast(pa.int64())
        if null is not None:
            column = pc.fill_null(column, null)
        columns.append(column.to_numpy(zero_copy_only=False).astype(np.int64))
    return sort_rows(np.column_stack(columns) if table.num_rows else np.zeros((0, len(names)), np.int64))


def compare(name: str, got: np.ndarray, want: np.ndarray, want_name: str, columns: tuple[str, ...] = COLUMNS
            ) -> None:
    """Fail the benchmark unless both are the same multiset of rows."""
    if got.shape == want.shape and np.array_equal(got, want):
        return
    as_set = {tuple(r) for r in got.tolist()}, {tuple(r) for r in want.tolist()}
    missing, extra = sorted(as_set[1] - as_set[0]), sorted(as_set[0] - as_set[1])
    raise SystemExit(
        f"OUTPUTS DIFFER: {name} has {len(got)} rows, {want_name} {len(want)}; {len(missing)} distinct rows of "
        f"{want_name} are missing from {name}, e.g. {missing[:3]}, and {len(extra)} are extra, e.g. {extra[:3]} "
        f"(columns {columns}, times in epoch ms)")


def without_marker(rows: np.ndarray, marker_key: int) -> tuple[np.ndarray, int]:
    keep = rows[:, 0] != marker_key
    return rows[keep], int((~keep).sum())


# ------------------------------------------------------------------ a bounded run
def run_sides(case: str, module: str, input_dir: Path, args: argparse.Namespace, work: Path
              ) -> tuple[dict[str, Side], dict[str, Any]]:
    """batchline's side, then its peer's, each a fresh process of ``module`` after an idle
    wait: the sides and what the machine was doing around each."""
    sides: dict[str, Side] = {}
    idle: dict[str, Any] = {}
    for name in ("batchline", "peer"):
        idle[name] = {"skipped": True} if args.no_wait_idle else wait_until_idle(give_up_s=args.idle_give_up)
        print(f"case {case}, {name}: running", flush=True)
        sides[name] = Side(name, work, input_dir, args.files_per_batch, module=module, extra=(case,),
                           label=f"{case}-{name}")
        idle[name].update(busy_during_run=sides[name].busy_during,
                          load_average_before=[round(x, 2) for x in sides[name].load_before])
        print(f"case {case}, {name}: {sides[name].wall_s:.2f} s from process start to exit", flush=True)
    return sides, idle


def bounded_case(case: Case, events: dict[str, np.ndarray], input_dir: Path, args: argparse.Namespace,
                 work: Path) -> dict[str, Any]:
    """Both sides of one case, each a fresh process after an idle wait; outputs compared."""
    batch = batch_of_events(len(events["key"]), args.files, args.files_per_batch)
    real = {k: v[:-1] for k, v in events.items()}
    want = case.expected(real, batch[:-1])
    sides, idle = run_sides(case.name, "benchmarks.windows_run", input_dir, args, work)

    ours, marker_rows = without_marker(read_rows(sides["batchline"].output, case.columns), args.keys)
    theirs, peer_marker_rows = without_marker(read_rows(sides["peer"].output, case.columns), args.keys)
    compare("batchline", ours, want, "the direct computation", case.columns)
    if case.check_peer is None:
        compare("Structured Streaming", theirs, want, "the direct computation", case.columns)
        peer_check: dict[str, Any] = {}
    else:
        peer_check = case.check_peer(theirs, want, real, batch[:-1])
    if (marker_rows, peer_marker_rows) != (case.marker_rows, case.peer_marker_rows):
        raise SystemExit(f"OUTPUTS DIFFER: the marker's rows: batchline emitted {marker_rows} (expected "
                         f"{case.marker_rows}), Structured Streaming {peer_marker_rows} (expected "
                         f"{case.peer_marker_rows})")
    print(f"case {case.name}: outputs as expected, {len(ours)} rows (and the marker's: batchline {marker_rows}, "
          f"Structured Streaming {peer_marker_rows}) {peer_check or ''}", flush=True)

    profile = None
    if args.profile:
        print(f"case {case.name}, batchline: a profiled run (not measured)", flush=True)
        directory = work / f"{case.name}-profile"
        os.environ[windows_profile.ENV] = str(directory)
        try:
            Side("batchline", work, input_dir, args.files_per_batch, module="benchmarks.windows_run",
                 extra=(case.name,), label=f"{case.name}-profiled")
        finally:
            del os.environ[windows_profile.ENV]
        try:
            profile = windows_profile.summarise(directory)
        except Exception as error:  # the measured figures stand without it
            profile = {"failed": repr(error)}

    n = len(events["key"])
    ours_f, peer_f = batchline_figures(sides["batchline"], n), peer_figures(sides["peer"], n)
    ratio = peer_f["wall_s"] / ours_f["wall_s"]
    data_ratio = statistics.median(peer_f["data_batch_processing_s"]) / statistics.median(
        ours_f["data_batch_processing_s"])
    return {
        "case": case.describe,
        "run": run_record(args),
        case.rows_out: len(ours),
        f"marker_{case.rows_out}_batchline": marker_rows,
        **({f"marker_{case.rows_out}_structured_streaming": peer_marker_rows} if case.peer_marker_rows else {}),
        **({"watermark_delay": case.watermark_delay} if case.watermark_delay != "10 seconds" else {}),
        **(case.notes(real, batch[:-1], want) if case.notes else {}),
        "outputs_identical": bool(ours.shape == theirs.shape and np.array_equal(ours, theirs)),
        **({"outputs_as_expected": True, **peer_check} if case.check_peer else {}),
        "batchline": ours_f,
        "structured_streaming": peer_f,
        "ratio": round(ratio, 3),
        "median_data_batch_ratio": round(data_ratio, 3),
        "goal": f">= {GOAL_THROUGHPUT:g}x", "goal_met": ratio >= GOAL_THROUGHPUT,
        "machine_idle": idle,
        **({"batchline_profile": profile} if profile else {}),
    }


# ------------------------------------------------------------------ the results file
def run_record(args: argparse.Namespace) -> dict[str, Any]:
    """When, by which command and on which input an entry of the results was measured."""
    return {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python -m benchmarks.windows", *sys.argv[1:]]),
            "events": args.events, "keys": args.keys, "files": args.files, "files_per_batch": args.files_per_batch}


def merge_results(figures: dict[str, Any], path: Path) -> dict[str, Any]:
    """``figures`` over the results already in ``path``: this run's cases and small batches
    replace theirs, the others stay, each with its own run (entries written before runs were
    recorded get the file's date, command and input)."""
    try:
        old = json.loads(path.read_text())
    except FileNotFoundError:
        return figures
    before = {"date": old.get("date"), "command": old.get("command"),
              **{k: old.get(k) for k in ("events", "keys", "files", "files_per_batch")}}
    entries = {**old.get("cases", {})}
    if "small_batches" in old:
        entries[""] = old["small_batches"]
    kept = {name: entry if "run" in entry else {**entry, "run": before} for name, entry in entries.items()}
    merged = {**figures, "cases": {**{k: v for k, v in kept.items() if k}, **figures["cases"]}}
    if "small_batches" not in figures and "" in kept:
        merged["small_batches"] = kept[""]
    merged["cases"] = dict(sorted(merged["cases"].items()))
    return merged


# ------------------------------------------------------------------ steady small batches
def small_batches(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Case (a) one 7k-event file per 1 s batch against the bare job of the same shape
    (``benchmarks/small_batches.py``'s rounds)."""
    from pyspark.sql import functions as F

    from batchline.spark import local_spark_session
    from benchmarks import small_batches as sb
    from benchmarks import windows_run

    case = windows_run.CASES["a"]
    spark = local_spark_session("local[2]", "batchline-bench-windows-small", shuffle_partitions=sb.PARTITIONS)

    def files(what: str, r: int) -> list[Path]:
        """The round's files: the same events for both sides, one file per batch."""
        first = (r + 1) * 1000
        events = make_events(args.batches * args.small_events, args.keys, seed=first,
                             first_ms=BASE_MS + first * MINUTE_MS * 60, marker=False)
        return write_parquet_files(work / f"{what}-{r}", events, args.batches, first)

    def bare(paths: list[Path], out: Path) -> list[float]:
        samples = []
        for path in paths:
            began = time.perf_counter()
            (spark.read.schema(windows_run.SCHEMA).parquet(str(path))
             .groupBy(F.window("ts", "1 minute").alias("w"), "key")
             .agg(F.count(F.lit(1)).alias("count"), F.max("ts").alias("newest"), F.sum("value").alias("sum_value"),
                  F.max("value").alias("max_value"))
             .select("key", F.col("w.start").alias("window_start"), F.unix_millis(F.col("w.end")).alias("end_ms"),
                     "count", "newest", "sum_value", "max_value")
             .repartition(sb.PARTITIONS, "key", "window_start")
             .write.mode("overwrite").parquet(str(out / path.stem)))
            samples.append(time.perf_counter() - began)
        return samples

    def engine(r: int) -> tuple[list[float], list[Any]]:
        directory = files("engine", r)[0].parent

        def build(ssc: Any) -> None:
            events = ssc.file_stream(str(directory), "parquet", windows_run.SCHEMA, settle=0, max_files_per_batch=1)
            case.batchline(events.with_watermark("ts", windows_run.WATERMARK_DELAY)).write_files(
                str(work / f"engine-out-{r}"), "parquet", name="out")
        return sb.steady_batches(spark, build, work / f"checkpoint-{r}", args.batches)

    try:
        bare(files("warm", -1)[:3], work / "warm-out")
        ours, theirs, infos = sb.alternate_rounds(
            args.rounds, args.warmup, lambda r: bare(files("bare", r), work / f"bare-out-{r}"), engine)
    finally:
        spark.stop()
    records = [info.num_records for info in infos]
    if any(n != args.small_events for n in records):
        raise SystemExit(f"a batch did not count {args.small_events} records: {records}")
    progress = [info.state_operators[windows_run.OPERATOR] for info in infos]
    figures = sb.ratio_figures(ours, theirs)
    return {
        "case": "a, one Parquet file a batch",
        "events_per_batch": args.small_events,
        "rounds": args.rounds, "batches_per_round": args.batches, "warmup_batches_per_round": args.warmup,
        "interval_ms": sb.INTERVAL_MS,
        **figures,
        "goal": f"<= {GOAL_SMALL_BATCH:g}x", "goal_met": figures["ratio"] <= GOAL_SMALL_BATCH,
        "keeps_up_with_1s": figures["engine_median_ms"] < sb.INTERVAL_MS,
        "state_keys_median": statistics.median(p.state_keys for p in progress),
        "keys_called_median": statistics.median(p.keys_called for p in progress),
        "windows_out_total": sum(p.output_rows for p in progress),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--files-per-batch", type=int, default=10)
    parser.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    parser.add_argument("--no-small-batches", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="after each case, a profiled batchline run: Spark's event log and cProfile of the state "
                             "tasks (benchmarks/windows_profile.py)")
    parser.add_argument("--rounds", type=int, default=3, help="small batches: rounds")
    parser.add_argument("--batches", type=int, default=15, help="small batches: batches per round")
    parser.add_argument("--warmup", type=int, default=3, help="small batches: batches of each round not counted")
    parser.add_argument("--small-events", type=int, default=7000, help="small batches: events per batch")
    parser.add_argument("--no-wait-idle", action="store_true", help="measure without waiting for an idle machine")
    parser.add_argument("--idle-give-up", type=float, default=900,
                        help="seconds to wait for an idle machine before measuring anyway (noted in the results)")
    parser.add_argument("--no-write", action="store_true", help="print the figures, write no results file")
    args = parser.parse_args()
    from benchmarks.machine import RESULTS, write_result

    cases = [CASES[name] for name in args.cases.split(",") if name]
    events = make_events(args.events, args.keys)
    input_dir = input_files(events, args.files, args.keys)
    print(f"input: {args.events} events of {args.keys} keys in {args.files} Parquet files under {input_dir}",
          flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-windows-"))
    figures: dict[str, Any] = {
        "events": args.events, "keys": args.keys, "files": args.files, "files_per_batch": args.files_per_batch,
        "master": "local[2]", "state_partitions": 4, "shuffle_partitions": 4, "watermark_delay": "10 seconds",
        "disorder_ms": DISORDER_MS, "output": "parquet", "cases": {},
        "note": "the top level is the latest run's; each case and the small batches carry their own run",
    }
    try:
        for case in cases:
            figures["cases"][case.name] = bounded_case(case, events, input_dir, args, work)
        if not args.no_small_batches:
            idle = {"skipped": True} if args.no_wait_idle else wait_until_idle(give_up_s=args.idle_give_up)
            print("small batches: running", flush=True)
            figures["small_batches"] = {**small_batches(args, work), "run": run_record(args), "machine_idle": idle}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures, indent=1), flush=True)
    for name, case in figures["cases"].items():
        print(f"case {name}: batchline {case['batchline']['events_per_s']} events/s, Structured Streaming "
              f"{case['structured_streaming']['events_per_s']} events/s: {case['ratio']:.2f}x (goal {case['goal']})")
    if "small_batches" in figures:
        s = figures["small_batches"]
        print(f"small batches: {s['engine_median_ms']} ms vs bare {s['bare_pyspark_median_ms']} ms: "
              f"{s['ratio']:.2f}x (goal {s['goal']})")
    if not args.no_write:
        print(f"wrote {write_result('windows', merge_results(figures, RESULTS / 'windows.json'))} (merged)")


if __name__ == "__main__":
    main()
