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
- ``b``: the same over 5-minute windows sliding every minute.

Bounded run (each case): each side is a fresh Python process (``benchmarks/windows_run.py``,
timed as ``benchmarks/bounded.py`` times its sides, from process start to exit), reading 10
files per batch (``max_files_per_batch``, ``maxFilesPerTrigger``), 4 state partitions and 4
shuffle partitions, checkpoint to a fresh directory, parquet out; the machine is waited idle
before each side. Both outputs are compared with each other and with a direct computation
(numpy) as multisets of ``(key, window_start, window_end, count, sum, max)``; any difference
fails the benchmark.

Steady small batches (case ``a``): as ``benchmarks/small_batches.py``, in one process on one
SparkSession, rounds alternating: batchline's pipeline reading one 7k-event Parquet file per
1 s batch (manual clock, as fast as batches complete) against a bare PySpark job of the same
shape per file (read the Parquet file, the same partial ``groupBy(window, key)``, a shuffle
into 4 partitions by key and window, write parquet).

    python -m benchmarks.windows [--events 1000000] [--keys 100000] [--cases a,b] [--no-small-batches]
                                 [--rounds 3] [--batches 15] [--small-events 7000] [--profile] [--no-wait-idle]
                                 [--idle-give-up 900] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
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


def sort_rows(rows: np.ndarray) -> np.ndarray:
    return rows[np.lexsort(rows.T[::-1])] if len(rows) else rows


@dataclasses.dataclass(frozen=True)
class Case:
    """A case of the benchmark: what it computes (its pipelines are ``windows_run.CASES``)."""

    name: str
    describe: str
    expected: Callable[[dict[str, np.ndarray]], np.ndarray]
    """The rows out without the marker's, sorted, as ``read_rows`` reads a side's output."""
    marker_rows: int
    """Rows batchline emits for the marker alone (its windows close at the end of time)."""


CASES: dict[str, Case] = {
    "a": Case("a", "1-minute tumbling windows, count + sum + max, append",
              lambda e: window_rows(e, MINUTE_MS, MINUTE_MS), 1),
    "b": Case("b", "5-minute windows sliding every minute, count + sum + max, append",
              lambda e: window_rows(e, 5 * MINUTE_MS, MINUTE_MS), 5),
}


# ------------------------------------------------------------------ the outputs
def read_rows(directory: Path) -> np.ndarray:
    """A side's parquet output as an int64 matrix of COLUMNS (timestamps in epoch ms), sorted."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    table = ds.dataset(str(directory), format="parquet").to_table(columns=list(COLUMNS))
    columns = []
    for name in COLUMNS:
        column = table[name]
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("ms")).cast(pa.int64())
        columns.append(column.to_numpy(zero_copy_only=False).astype(np.int64))
    return sort_rows(np.column_stack(columns) if columns[0].size else np.zeros((0, len(COLUMNS)), np.int64))


def compare(name: str, got: np.ndarray, want: np.ndarray, want_name: str) -> None:
    """Fail the benchmark unless both are the same multiset of rows."""
    if got.shape == want.shape and np.array_equal(got, want):
        return
    as_set = {tuple(r) for r in got.tolist()}, {tuple(r) for r in want.tolist()}
    missing, extra = sorted(as_set[1] - as_set[0]), sorted(as_set[0] - as_set[1])
    raise SystemExit(
        f"OUTPUTS DIFFER: {name} has {len(got)} rows, {want_name} {len(want)}; {len(missing)} distinct rows of "
        f"{want_name} are missing from {name}, e.g. {missing[:3]}, and {len(extra)} are extra, e.g. {extra[:3]} "
        f"(columns {COLUMNS}, times in epoch ms)")


def without_marker(rows: np.ndarray, marker_key: int) -> tuple[np.ndarray, int]:
    keep = rows[:, 0] != marker_key
    return rows[keep], int((~keep).sum())


# ------------------------------------------------------------------ a bounded run
def bounded_case(case: Case, events: dict[str, np.ndarray], input_dir: Path, args: argparse.Namespace,
                 work: Path) -> dict[str, Any]:
    """Both sides of one case, each a fresh process after an idle wait; outputs compared."""
    want = case.expected({k: v[:-1] for k, v in events.items()})
    sides: dict[str, Side] = {}
    idle: dict[str, Any] = {}
    for name in ("batchline", "peer"):
        idle[name] = {"skipped": True} if args.no_wait_idle else wait_until_idle(give_up_s=args.idle_give_up)
        print(f"case {case.name}, {name}: running", flush=True)
        sides[name] = Side(name, work, input_dir, args.files_per_batch, module="benchmarks.windows_run",
                           extra=(case.name,), label=f"{case.name}-{name}")
        idle[name].update(busy_during_run=sides[name].busy_during,
                          load_average_before=[round(x, 2) for x in sides[name].load_before])
        print(f"case {case.name}, {name}: {sides[name].wall_s:.2f} s from process start to exit", flush=True)

    ours, marker_rows = without_marker(read_rows(sides["batchline"].output), args.keys)
    theirs, peer_marker_rows = without_marker(read_rows(sides["peer"].output), args.keys)
    compare("batchline", ours, want, "the direct computation")
    compare("Structured Streaming", theirs, want, "the direct computation")
    if (marker_rows, peer_marker_rows) != (case.marker_rows, 0):
        raise SystemExit(f"OUTPUTS DIFFER: the marker's windows: batchline emitted {marker_rows} (expected "
                         f"{case.marker_rows}), Structured Streaming {peer_marker_rows} (expected 0)")
    print(f"case {case.name}: outputs identical, {len(ours)} windows (batchline also the marker's "
          f"{marker_rows})", flush=True)

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
        "windows_out": len(ours),
        "marker_windows_out_batchline": marker_rows,
        "outputs_identical": True,
        "batchline": ours_f,
        "structured_streaming": peer_f,
        "ratio": round(ratio, 3),
        "median_data_batch_ratio": round(data_ratio, 3),
        "goal": f">= {GOAL_THROUGHPUT:g}x", "goal_met": ratio >= GOAL_THROUGHPUT,
        "machine_idle": idle,
        **({"batchline_profile": profile} if profile else {}),
    }


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
    from benchmarks.machine import write_result

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
    }
    try:
        for case in cases:
            figures["cases"][case.name] = bounded_case(case, events, input_dir, args, work)
        if not args.no_small_batches:
            idle = {"skipped": True} if args.no_wait_idle else wait_until_idle(give_up_s=args.idle_give_up)
            print("small batches: running", flush=True)
            figures["small_batches"] = {**small_batches(args, work), "machine_idle": idle}
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
        print(f"wrote {write_result('windows', figures)}")


if __name__ == "__main__":
    main()
