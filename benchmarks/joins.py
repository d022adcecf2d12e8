"""Stream-stream joins: batchline's ``Stream.join`` against Spark Structured Streaming's
stream-stream join, on the same Parquet files, in one run.

The input: 1M impressions ``{impression_id, ad_id, shown_at}`` (ids 0..n-1, ``ad_id`` of
1,000 ads), one per millisecond of event time (``--gap-ms``) plus up to 2 s of disorder, and
200k clicks ``{impression_id, clicked_at}``: 20% of the impressions clicked once, 90% of the
clicks 0-9 minutes after their impression, 10% between 10 and 15 minutes after (outside the
join's 10 minutes, so the time bound matters: in the left outer join those impressions come
out with a null ``clicked_at``). Each stream is cut into 100 Parquet files by arrival: the
impressions in order, 10k a file; a click arrives up to 2 s after its ``clicked_at`` and goes
into the file whose span of event time (the impressions' file of the same number) holds its
arrival, so both streams advance together in event time. Only impressions whose click would
arrive within the impressions' span are drawn for clicks (the last minutes' impressions get
fewer). Written once (deterministic) and reused. Each stream's last row is a marker a day later
in event time (an impression and its click a minute after, both of id n): Structured
Streaming never moves its watermark past its inputs' last event, so without it the impressions
of the last 10 minutes would stay in its state and a left outer join would never emit their
null rows; with it both sides emit every row (batchline also emits everything at the end of
bounded inputs). The marker pair comes out once on both sides, in both cases, and is left out
of the comparison (checked and counted).

Both streams have a 1-minute watermark (``shown_at``, ``clicked_at``): the disorder is 2 s, so
no row is late (the direct computation checks it, batch by batch, with the global watermark:
the lower of the two streams'). The join: ``impression_id`` equal and ``clicked_at`` in
``[shown_at, shown_at + 10 minutes]``, i.e. ``within=("shown_at", "clicked_at", "0 seconds",
"10 minutes")``. Cases (``CASES``): ``inner`` and ``left`` (left outer).

Bounded run (each case): each side is a fresh Python process (``benchmarks/joins_run.py``,
timed as ``benchmarks/bounded.py`` times its sides, from process start to exit), reading 10
files of each stream per batch (``max_files_per_batch``, ``maxFilesPerTrigger``), 4 state
partitions and 4 shuffle partitions, checkpoint to a fresh directory, parquet out; the machine
is waited idle before each side. Both outputs are compared with a direct computation (numpy)
as multisets of ``(impression_id, ad_id, shown_at, clicked_at)`` (a null ``clicked_at`` as
-1); any difference fails the benchmark. Throughput: input rows (impressions + clicks, the
markers included) per second of the side's process; goal >= 1.0x Structured Streaming's.

State size: the largest ``state_bytes`` of batchline's progress records (its own estimate of
the state in Arrow: each partition's keys times the mean Arrow size of a row of its latest
state delta) against the Arrow bytes of the input rows the join holds after that batch
(impressions: three int64 columns, clicks: two; ``pyarrow``'s ``nbytes`` of those rows). The
rows held are computed directly, batch by batch: a batch's watermark is the lower of the two
streams' (newest event time of the batches before it minus the delay); an impression goes once
``shown_at + 10 minutes`` lies before it (``shown_at <= watermark - 10 minutes - 1 ms``), a
click once ``clicked_at <= watermark - 1 ms`` (``batchline/state/join.py``'s eviction). The
computation is checked against batchline's ``state_keys`` batch by batch (the keys of the rows
held); a batch where they differ is counted and the figure marked estimated. Goal: state
bytes within 1.5x of the rows' Arrow bytes. After the run the state at that batch is also read
back (``read_state``, in a process of its own, not measured) and its Arrow bytes (keys, both
sides' buffered rows, timeouts) reported beside the estimate (``state.read_back``). Structured
Streaming's largest ``numRowsTotal`` and ``memoryUsedBytes`` are reported beside it (its state
stores' JVM memory, not Arrow bytes).

    python -m benchmarks.joins [--impressions 1000000] [--gap-ms 1] [--files 100] [--files-per-batch 10]
                               [--cases inner,left] [--profile] [--no-wait-idle] [--idle-give-up 900]
                               [--no-write]

Validate small with ``--impressions 20000 --gap-ms 50`` (the same 1,000 s of event time, so
the same watermarks, evictions and null rows as the full run). The results merge into
``benchmarks/results/joins.json``: each case replaces its own entry and keeps the others; each
entry carries its run (date, command, input size).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import joins_run, windows_profile
from benchmarks.bounded import Side, SideProcess, batchline_figures, peer_figures
from benchmarks.windows import compare, read_rows, run_sides, sort_rows, without_marker

BASE_MS = 1_800_000_000_000  # a whole minute
MARKER_DELAY_MS = 86_400_000  # the markers: a day after the others
MINUTE_MS = 60_000
DISORDER_MS = 2_000
ADS = 1_000
CLICK_SHARE = 0.2
BEYOND_SHARE = 0.1  # of the clicks: 10-15 minutes after the impression, outside the join's range
LOWER_MS, UPPER_MS = 0, 10 * MINUTE_MS  # joins_run.WITHIN
DELAY_MS = MINUTE_MS  # joins_run.WATERMARK_DELAY
NULL = -1  # a null clicked_at, in the compared rows
GOAL_THROUGHPUT = 1.0  # batchline / Structured Streaming, input rows/s
GOAL_STATE = 1.5  # batchline's state_bytes / Arrow bytes of the rows held
COLUMNS = joins_run.COLUMNS
INPUTS = Path(tempfile.gettempdir()) / "batchline-bench-joins-inputs"


# ------------------------------------------------------------------ the input
@dataclasses.dataclass(frozen=True)
class Inputs:
    """Both streams in arrival order, each row's file, and the markers' id (``n``, each stream's last row)."""

    impressions: dict[str, np.ndarray]
    clicks: dict[str, np.ndarray]
    impression_file: np.ndarray
    click_file: np.ndarray
    marker_id: int

    @property
    def rows(self) -> int:
        return len(self.impression_file) + len(self.click_file)


def make_inputs(impressions: int, gap_ms: int, files: int, seed: int = 20261126) -> Inputs:
    """See the module's docstring."""
    rng = np.random.default_rng(seed)
    n = impressions
    ids = np.arange(n, dtype=np.int64)
    ad = rng.integers(0, ADS, n).astype(np.int64)
    shown = BASE_MS + ids * gap_ms + rng.integers(0, DISORDER_MS, n)
    bounds = np.linspace(0, n, files + 1).astype(int)
    file_start_ms = BASE_MS + bounds * gap_ms  # the arrival clock at which each file's span starts
    end_ms = int(file_start_ms[-1])
    beyond = rng.random(n) < BEYOND_SHARE
    delay = np.where(beyond, rng.integers(UPPER_MS + 1, UPPER_MS * 3 // 2 + 1, n),
                     rng.integers(0, 9 * MINUTE_MS + 1, n))
    clicked = shown + delay
    arrival = clicked + rng.integers(0, DISORDER_MS, n)
    eligible = np.flatnonzero(arrival < end_ms)
    count = round(n * CLICK_SHARE)
    if len(eligible) < count:
        raise SystemExit(f"only {len(eligible)} impressions have a click within the {n * gap_ms / 1000:g} s of event "
                         f"time the impressions span; {count} needed: raise --gap-ms")
    chosen = rng.choice(eligible, count, replace=False)
    chosen = chosen[np.argsort(arrival[chosen], kind="stable")]
    click_file = np.searchsorted(file_start_ms[1:-1], arrival[chosen], side="right")
    impression_file = np.searchsorted(bounds[1:-1], ids, side="right")
    marker_ms = end_ms + MARKER_DELAY_MS
    return Inputs(
        impressions={"impression_id": np.append(ids, n), "ad_id": np.append(ad, 0),
                     "shown_at": np.append(shown, marker_ms)},
        clicks={"impression_id": np.append(ids[chosen], n),
                "clicked_at": np.append(clicked[chosen], marker_ms + MINUTE_MS)},
        impression_file=np.append(impression_file, files - 1), click_file=np.append(click_file, files - 1),
        marker_id=n)


def write_parquet_files(directory: Path, prefix: str, columns: dict[str, np.ndarray], file_of: np.ndarray,
                        files: int) -> None:
    """``files`` Parquet files (``file_of`` says each row's), named and modified in order;
    ``*_at`` columns as timestamps."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        rows = file_of == f
        table = pa.table({name: pa.array(values[rows] * 1000, pa.timestamp("us", tz="UTC")) if name.endswith("_at")
                          else values[rows] for name, values in columns.items()})
        path = directory / f"{prefix}-{f:05d}.parquet"
        pq.write_table(table, path)
        # Structured Streaming takes files in modification-time order, batchline in name order: make them agree.
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))


def input_files(inputs: Inputs, gap_ms: int, files: int) -> Path:
    """The bounded runs' input (``impressions/`` and ``clicks/``), reused when already written."""
    n = inputs.marker_id
    directory = INPUTS / f"{n}-impressions-{gap_ms}-ms-{files}-files"
    done = directory / "complete.json"
    if not done.exists():
        shutil.rmtree(directory, ignore_errors=True)
        write_parquet_files(directory / "impressions", "impressions", inputs.impressions, inputs.impression_file, files)
        write_parquet_files(directory / "clicks", "clicks", inputs.clicks, inputs.click_file, files)
        done.write_text(json.dumps({"impressions": n, "clicks": len(inputs.click_file) - 1, "gap_ms": gap_ms,
                                    "files": files}))
    return directory


# ------------------------------------------------------------------ the expected rows
def expected_rows(inputs: Inputs, how: str) -> np.ndarray:
    """``(impression_id, ad_id, shown_at, clicked_at)`` of the join without the markers, sorted:
    every impression and click of the same id with ``clicked_at`` in ``[shown_at + lower,
    shown_at + upper]``; ``left``: also every impression without one, ``clicked_at`` NULL."""
    imp, clk = ({k: v[:-1] for k, v in side.items()} for side in (inputs.impressions, inputs.clicks))
    order = np.argsort(imp["impression_id"], kind="stable")
    if len(np.unique(imp["impression_id"])) != len(order):
        raise SystemExit("the direct computation takes each impression_id once")
    at = np.minimum(np.searchsorted(imp["impression_id"], clk["impression_id"], sorter=order), len(order) - 1)
    idx = order[at]
    found = imp["impression_id"][idx] == clk["impression_id"]
    shown, clicked = imp["shown_at"][idx], clk["clicked_at"]
    meets = found & (clicked >= shown + LOWER_MS) & (clicked <= shown + UPPER_MS)
    rows = [np.column_stack([clk["impression_id"][meets], imp["ad_id"][idx[meets]], shown[meets], clicked[meets]])]
    if how == "left":
        alone = np.ones(len(order), bool)
        alone[idx[meets]] = False
        rows.append(np.column_stack([imp["impression_id"][alone], imp["ad_id"][alone], imp["shown_at"][alone],
                                     np.full(int(alone.sum()), NULL, np.int64)]))
    return sort_rows(np.concatenate(rows).astype(np.int64))


@dataclasses.dataclass(frozen=True)
class Held:
    """What the join holds after each batch (the markers included), computed directly."""

    watermark_ms: list[int | None]
    late: list[int]
    impressions: list[np.ndarray]
    """Per batch, the indices of the impressions held."""
    clicks: list[np.ndarray]
    keys: list[int]

    def arrow_bytes(self, inputs: Inputs, batch: int) -> int:
        """Arrow bytes of the input rows held after ``batch``: the impressions' columns and the clicks'."""
        import pyarrow as pa

        tables = [pa.table({name: values[rows] for name, values in columns.items()})
                  for columns, rows in ((inputs.impressions, self.impressions[batch]),
                                        (inputs.clicks, self.clicks[batch]))]
        return sum(t.nbytes for t in tables)


def held_rows(inputs: Inputs, files_per_batch: int) -> Held:
    """Batch by batch (``files_per_batch`` files of each stream): the watermark (the lower of the
    two streams' newest event time of the batches before, minus the delay), the rows at or before
    it (late), and the rows held after the batch: an impression until ``shown_at <= watermark -
    upper - 1``, a click until ``clicked_at <= watermark - (1 - lower)`` (``join.py``'s eviction)."""
    imp_batch, clk_batch = inputs.impression_file // files_per_batch, inputs.click_file // files_per_batch
    shown, clicked = inputs.impressions["shown_at"], inputs.clicks["clicked_at"]
    batches = int(max(imp_batch.max(), clk_batch.max())) + 1
    held = Held([], [], [], [], [])
    newest: list[int | None] = [None, None]
    for b in range(batches):
        seen = [m for m in newest if m is not None]
        watermark = min(seen) - DELAY_MS if seen else None
        arrived_imp, arrived_clk = np.flatnonzero(imp_batch <= b), np.flatnonzero(clk_batch <= b)
        now_imp, now_clk = imp_batch == b, clk_batch == b
        if watermark is None:
            late = 0
            keep_imp, keep_clk = arrived_imp, arrived_clk
        else:
            late = int((shown[now_imp] <= watermark).sum() + (clicked[now_clk] <= watermark).sum())
            keep_imp = arrived_imp[shown[arrived_imp] > watermark - UPPER_MS - 1]
            keep_clk = arrived_clk[clicked[arrived_clk] > watermark - (1 - LOWER_MS)]
        held.watermark_ms.append(watermark)
        held.late.append(late)
        held.impressions.append(keep_imp)
        held.clicks.append(keep_clk)
        held.keys.append(len(np.union1d(inputs.impressions["impression_id"][keep_imp],
                                        inputs.clicks["impression_id"][keep_clk])))
        for i, (times, now) in enumerate(((shown, now_imp), (clicked, now_clk))):
            if now.any():
                top = int(times[now].max())
                newest[i] = top if newest[i] is None else max(newest[i], top)
    return held


# ------------------------------------------------------------------ the state
def state_figures(side: Side, inputs: Inputs, held: Held) -> dict[str, Any]:
    """batchline's largest ``state_bytes`` against the Arrow bytes of the rows held then, and
    the rows held against its ``state_keys`` batch by batch."""
    # state <batch_time> <records> <state_keys> <state_bytes> [<watermark_ms>]
    lines = [line.split()[1:] for line in side.lines if line.startswith("state ")]
    data = [(int(f[0]), int(f[2]), int(f[3]), int(f[4]) if len(f) > 4 else None) for f in lines if int(f[1]) > 0]
    if len(data) != len(held.keys):
        return {"failed": f"{len(data)} batchline batches with input rows, {len(held.keys)} computed: the rows "
                          "held cannot be lined up with the batches"}
    keys_differ = [b for b, (_, keys, _, _) in enumerate(data) if keys != held.keys[b]]
    watermarks_differ = [b for b, (_, _, _, wm) in enumerate(data) if wm != held.watermark_ms[b]]
    peak = max(range(len(data)), key=lambda b: data[b][2])
    arrow = held.arrow_bytes(inputs, peak)
    most = max(range(len(data)), key=lambda b: len(held.impressions[b]) + len(held.clicks[b]))
    ratio = data[peak][2] / arrow if arrow else None
    return {
        "state_bytes_max": data[peak][2],
        "at_data_batch": peak,
        "at_batch_time": data[peak][0],
        "state_keys_then": data[peak][1],
        "impressions_held_then": len(held.impressions[peak]),
        "clicks_held_then": len(held.clicks[peak]),
        "held_rows_arrow_bytes_then": arrow,
        "ratio": round(ratio, 3) if ratio is not None else None,
        "goal": f"<= {GOAL_STATE:g}x", "goal_met": ratio is not None and ratio <= GOAL_STATE,
        "held_rows_exact": not keys_differ,
        "batches_where_state_keys_differ_from_the_rows_held": keys_differ,
        "batches_where_the_watermark_differs_from_the_computed": watermarks_differ,
        "most_rows_held": {"data_batch": most, "impressions": len(held.impressions[most]),
                           "clicks": len(held.clicks[most]), "arrow_bytes": held.arrow_bytes(inputs, most),
                           "state_bytes": data[most][2]},
        "state_bytes_per_batch": [d[2] for d in data],
        "state_keys_per_batch": [d[1] for d in data],
    }


def read_back_state(work: Path, checkpoint: Path, version: int, inputs: Inputs, held: Held, batch: int
                    ) -> dict[str, Any]:
    """The state at ``version`` read back as Arrow (``joins_run state``, a process of its own,
    not measured) against the Arrow bytes of the rows held."""
    command = [sys.executable, "-m", "benchmarks.joins_run", "state", str(checkpoint), str(version)]
    try:
        process = SideProcess("state", command, work / f"state-{version}.stderr")
    except SystemExit as error:
        return {"failed": str(error)[-500:]}
    # statebytes <version> <keys> <Arrow bytes> <left rows> <right rows>
    found = [[int(x) for x in line.split()[1:]] for line in process.lines if line.startswith("statebytes ")]
    if not found:
        return {"failed": "no statebytes line"}
    _, keys, nbytes, left, right = found[0]
    arrow = held.arrow_bytes(inputs, batch)
    return {"keys": keys, "arrow_bytes": nbytes, "impressions": left, "clicks": right,
            "rows_as_computed": (left, right) == (len(held.impressions[batch]), len(held.clicks[batch])),
            "ratio_to_the_rows_arrow_bytes": round(nbytes / arrow, 3) if arrow else None}


def peer_state(side: Side) -> dict[str, Any]:
    # peerstate <batch_id> <numRowsTotal> <memoryUsedBytes>
    lines = [[int(x) for x in line.split()[1:]] for line in side.lines if line.startswith("peerstate ")]
    if not lines:
        return {}
    return {"state_rows_max": max(r[1] for r in lines), "memory_used_bytes_max": max(r[2] for r in lines)}


# ------------------------------------------------------------------ a bounded run
def bounded_case(how: str, inputs: Inputs, held: Held, input_dir: Path, args: argparse.Namespace, work: Path
                 ) -> dict[str, Any]:
    """Both sides of one case, each a fresh process after an idle wait; outputs compared."""
    want = expected_rows(inputs, how)
    sides, idle = run_sides(how, "benchmarks.joins_run", input_dir, args, work)

    ours, marker_rows = without_marker(read_rows(sides["batchline"].output, COLUMNS, NULL), inputs.marker_id)
    theirs, peer_marker_rows = without_marker(read_rows(sides["peer"].output, COLUMNS, NULL), inputs.marker_id)
    compare("batchline", ours, want, "the direct computation", COLUMNS)
    compare("Structured Streaming", theirs, want, "the direct computation", COLUMNS)
    if (marker_rows, peer_marker_rows) != (1, 1):
        raise SystemExit(f"OUTPUTS DIFFER: the markers' pair: batchline emitted {marker_rows} rows, Structured "
                         f"Streaming {peer_marker_rows} (expected 1 each)")
    nulls = int((ours[:, 3] == NULL).sum())
    print(f"case {how}: outputs as expected, {len(ours)} rows ({nulls} with a null click; and the markers' pair "
          "once on each side)", flush=True)

    profile = None
    if args.profile:
        print(f"case {how}, batchline: a profiled run (not measured)", flush=True)
        directory = work / f"{how}-profile"
        os.environ[windows_profile.ENV] = str(directory)
        try:
            Side("batchline", work, input_dir, args.files_per_batch, module="benchmarks.joins_run", extra=(how,),
                 label=f"{how}-profiled")
        finally:
            del os.environ[windows_profile.ENV]
        try:
            profile = windows_profile.summarise(directory)
        except Exception as error:  # the measured figures stand without it
            profile = {"failed": repr(error)}

    state = state_figures(sides["batchline"], inputs, held)
    if "at_batch_time" in state:
        print(f"case {how}: reading batchline's state back at its largest (not measured)", flush=True)
        state["read_back"] = read_back_state(work, sides["batchline"].checkpoint, state["at_batch_time"], inputs,
                                             held, state["at_data_batch"])
    ours_f = side_figures(batchline_figures, sides["batchline"], inputs.rows)
    peer_f = side_figures(peer_figures, sides["peer"], inputs.rows)
    ratio = peer_f["wall_s"] / ours_f["wall_s"]
    data = "data_batch_processing_s"
    data_ratio = (statistics.median(peer_f[data]) / statistics.median(ours_f[data])
                  if data in ours_f and data in peer_f else None)
    return {
        "case": {"inner": "inner join within 10 minutes",
                 "left": "left outer join within 10 minutes"}[how],
        "run": run_record(args),
        "rows_out": len(ours),
        "rows_out_with_a_null_click": nulls,
        "marker_rows_per_side": 1,
        "late_rows_expected": sum(held.late),
        "outputs_identical": bool(ours.shape == theirs.shape and np.array_equal(ours, theirs)),
        "batchline": ours_f,
        "structured_streaming": peer_f,
        "ratio": round(ratio, 3),
        "median_data_batch_ratio": round(data_ratio, 3) if data_ratio else None,
        "goal": f">= {GOAL_THROUGHPUT:g}x", "goal_met": ratio >= GOAL_THROUGHPUT,
        "state": state,
        "structured_streaming_state": peer_state(sides["peer"]),
        "machine_idle": idle,
        **({"batchline_profile": profile} if profile else {}),
    }


def side_figures(figures: Callable[[Side, int], dict[str, Any]], side: Side, rows: int) -> dict[str, Any]:
    """``bounded``'s figures of a side; its wall time alone if they cannot be read from its lines
    (the outputs were checked: the run stands)."""
    try:
        return figures(side, rows)
    except (KeyError, IndexError, ValueError, SystemExit, statistics.StatisticsError) as error:
        return {"wall_s": round(side.wall_s, 2), "events_per_s": round(rows / side.wall_s),
                "figures_failed": repr(error)[:300]}


# ------------------------------------------------------------------ the results file
def run_record(args: argparse.Namespace) -> dict[str, Any]:
    """When, by which command and on which input an entry of the results was measured."""
    return {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python -m benchmarks.joins", *sys.argv[1:]]),
            "impressions": args.impressions, "gap_ms": args.gap_ms, "files": args.files,
            "files_per_batch": args.files_per_batch}


def merge_results(figures: dict[str, Any], path: Path) -> dict[str, Any]:
    """``figures`` over the results already in ``path``: this run's cases replace theirs, the others stay."""
    try:
        old = json.loads(path.read_text())
    except FileNotFoundError:
        return figures
    merged = {**figures, "cases": {**old.get("cases", {}), **figures["cases"]}}
    merged["cases"] = dict(sorted(merged["cases"].items()))
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impressions", type=int, default=1_000_000)
    parser.add_argument("--gap-ms", type=int, default=1, help="event time between two impressions")
    parser.add_argument("--files", type=int, default=100, help="Parquet files of each stream")
    parser.add_argument("--files-per-batch", type=int, default=10, help="of each stream")
    parser.add_argument("--cases", default=",".join(joins_run.CASES), help=f"of {', '.join(joins_run.CASES)}")
    parser.add_argument("--profile", action="store_true",
                        help="after each case, a profiled batchline run: Spark's event log and cProfile of the state "
                             "tasks (benchmarks/windows_profile.py)")
    parser.add_argument("--no-wait-idle", action="store_true", help="measure without waiting for an idle machine")
    parser.add_argument("--idle-give-up", type=float, default=900,
                        help="seconds to wait for an idle machine before measuring anyway (noted in the results)")
    parser.add_argument("--no-write", action="store_true", help="print the figures, write no results file")
    args = parser.parse_args()
    from benchmarks.machine import RESULTS, write_result

    cases = [name for name in args.cases.split(",") if name]
    unknown = [name for name in cases if name not in joins_run.CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; the cases are {', '.join(joins_run.CASES)}")
    inputs = make_inputs(args.impressions, args.gap_ms, args.files)
    input_dir = input_files(inputs, args.gap_ms, args.files)
    held = held_rows(inputs, args.files_per_batch)
    if sum(held.late):
        raise SystemExit(f"{sum(held.late)} rows would be late; the benchmark needs none")
    clicks = len(inputs.click_file) - 1
    most = max(len(i) + len(c) for i, c in zip(held.impressions, held.clicks, strict=True))
    print(f"input: {args.impressions} impressions and {clicks} clicks (and a marker each) in {args.files} Parquet "
          f"files each under {input_dir}; at most {most} rows held", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-joins-"))
    figures: dict[str, Any] = {
        "impressions": args.impressions, "clicks": clicks, "input_rows": inputs.rows, "gap_ms": args.gap_ms,
        "files": args.files, "files_per_batch": args.files_per_batch, "master": "local[2]", "state_partitions": 4,
        "shuffle_partitions": 4, "watermark_delay": joins_run.WATERMARK_DELAY, "within": list(joins_run.WITHIN),
        "disorder_ms": DISORDER_MS, "output": "parquet", "cases": {},
        "note": "the top level is the latest run's; each case carries its own run",
    }
    try:
        for how in cases:
            figures["cases"][how] = bounded_case(how, inputs, held, input_dir, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures, indent=1), flush=True)
    for name, case in figures["cases"].items():
        state = case["state"]
        print(f"case {name}: batchline {case['batchline']['events_per_s']} rows/s, Structured Streaming "
              f"{case['structured_streaming']['events_per_s']} rows/s: {case['ratio']:.2f}x (goal {case['goal']}); "
              f"state {state.get('state_bytes_max')} bytes vs {state.get('held_rows_arrow_bytes_then')} Arrow bytes "
              f"held: {state.get('ratio')}x (goal {state.get('goal')})")
    if not args.no_write:
        print(f"wrote {write_result('joins', merge_results(figures, RESULTS / 'joins.json'))} (merged)")


if __name__ == "__main__":
    main()
