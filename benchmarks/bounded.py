"""A bounded run (a backfill) of the sessionization, from process start to exit: batchline's
``run_until_finished()`` against Spark Structured Streaming's ``trigger(availableNow=True)``
with ``applyInPandasWithState``, on the same JSON-lines files, in one run (issue 11).

The input: 1M user events ``{id, data, is_last, ts}`` (benchmarks/sessionization.py's shape:
100k users, 5% of events are a user's last, one event per millisecond of event time, so
1M events span 1,000 s), in 100 JSON-lines files of 10k events, written once (deterministic)
and reused. Both sides read 10 files per batch (``max_files_per_batch`` and
``maxFilesPerTrigger``), keep sessions per user with event-time timeouts and a 10 s
watermark, write the closed sessions as parquet files and checkpoint to a fresh directory.
Each side is a fresh Python process (``benchmarks/bounded_run.py``) timed from its start to
its exit: interpreter, imports, the JVM, every batch, the end of the input, the final
checkpoint or commit, and stopping Spark.

The sessions are benchmarks/sessionization.py's, in event time: a user's session ends at an
``is_last`` event or after a minute without events. In event time a gap of more than a
minute between two of the user's events also closes the session in the function itself,
so the output does not depend on where the batches cut the input, nor on the batch in which
a timeout fires. Structured Streaming never moves its watermark past the last event, so its
open sessions would stay in its state at the end of an availableNow run; batchline's fire at
the end (the watermark goes to the end of time). So that both compute the same sessions, the
input's last event is a marker a day later in event time (a user of its own, ``is_last``):
it moves both watermarks past every open session, which then time out. Both outputs are
compared with each other and with a plain Python computation of the sessions, as multisets
of ``(user, started, ended, events, closed_by)``; any difference fails the benchmark.

    python -m benchmarks.bounded [--events 1000000] [--files 100] [--files-per-batch 10] [--no-wait-idle]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BASE_MS = 1_800_000_000_000
MARKER_DELAY_MS = 86_400_000  # the last event: a day after the others
GAP_MS = 60_000
LAST_EVENT_PROBABILITY = 0.05
GOAL = 20.0
BUSY = "pytest|bounded_driver|chaos_driver|pyspark.daemon"
INPUTS = Path(tempfile.gettempdir()) / "batchline-bench-bounded-inputs"


# ------------------------------------------------------------------ the input
def make_events(events: int, users: int) -> dict[str, np.ndarray]:
    """Event ``i``: a random user, ``is_last`` with 5%, at BASE_MS + i ms; the last one is the marker."""
    rng = np.random.default_rng(20261122)
    ids = rng.integers(0, users, events).astype(np.int64)
    is_last = rng.random(events) < LAST_EVENT_PROBABILITY
    ts = BASE_MS + np.arange(events, dtype=np.int64)
    ids[-1], is_last[-1], ts[-1] = users, True, BASE_MS + events + MARKER_DELAY_MS
    return {"id": ids, "is_last": is_last, "ts": ts}


def write_event_files(events: dict[str, np.ndarray], files: int, users: int) -> Path:
    """``files`` JSON-lines files of consecutive events, reused when already written."""
    count = len(events["id"])
    directory = INPUTS / f"{count}-events-{files}-files-{users}-users"
    done = directory / "complete.json"
    if done.exists():
        return directory / "events"
    shutil.rmtree(directory, ignore_errors=True)
    (directory / "events").mkdir(parents=True)
    stamps = np.datetime_as_string(events["ts"].astype("datetime64[ms]"), unit="ms")
    bounds = np.linspace(0, count, files + 1).astype(int)
    for f in range(files):
        path = directory / "events" / f"events-{f:03d}.json"
        with open(path, "w") as out:
            for i in range(bounds[f], bounds[f + 1]):
                data = "end-of-input" if i == count - 1 else f"event-{i}"
                last = "true" if events["is_last"][i] else "false"
                out.write(f'{{"id": {events["id"][i]}, "data": "{data}", "is_last": {last}, "ts": "{stamps[i]}Z"}}\n')
        # Structured Streaming takes files in modification-time order, batchline in name order: make them agree.
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
    done.write_text(json.dumps({"events": count, "files": files, "users": users}))
    return directory / "events"


def expected_sessions(events: dict[str, np.ndarray]) -> collections.Counter[tuple]:
    """The sessions, computed directly: per user in event-time order, a session ends at an
    ``is_last`` event or before a gap of more than GAP_MS; what is open at the end times out."""
    order = np.lexsort((events["ts"], events["id"]))
    ids, is_last, ts = events["id"][order].tolist(), events["is_last"][order].tolist(), events["ts"][order].tolist()
    sessions: collections.Counter[tuple] = collections.Counter()
    user, started, last_seen, n = None, 0, 0, 0
    for uid, last, t in zip(ids, is_last, ts, strict=True):
        if uid != user:
            if user is not None and n:
                sessions[(user, started, last_seen, n, "timeout")] += 1
            user, n = uid, 0
        if n and t - last_seen > GAP_MS:
            sessions[(user, started, last_seen, n, "timeout")] += 1
            n = 0
        if not n:
            started = t
        n, last_seen = n + 1, t
        if last:
            sessions[(user, started, last_seen, n, "last event")] += 1
            n = 0
    if user is not None and n:
        sessions[(user, started, last_seen, n, "timeout")] += 1
    return sessions


def read_sessions(directory: Path) -> collections.Counter[tuple]:
    """A side's parquet output as a multiset of (user, started ms, ended ms, events, closed_by)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    table = ds.dataset(str(directory), format="parquet").to_table(
        columns=["user", "started", "ended", "events", "closed_by"])
    columns = []
    for name in table.column_names:
        column = table[name]
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("ms")).cast(pa.int64())
        columns.append(column.to_pylist())
    return collections.Counter(zip(*columns, strict=True))


def compare(name: str, got: collections.Counter[tuple], want: collections.Counter[tuple], want_name: str) -> None:
    if got == want:
        return
    missing, extra = want - got, got - want
    raise SystemExit(
        f"OUTPUTS DIFFER: {name} has {sum(got.values())} sessions, {want_name} {sum(want.values())}; "
        f"{sum(missing.values())} of {want_name}'s are missing from {name}, e.g. {list(missing)[:5]}, "
        f"and {sum(extra.values())} are extra, e.g. {list(extra)[:5]}")


# ------------------------------------------------------------------ the machine
def busy_processes(exclude_under: int | None = None) -> list[str]:
    """Command lines of Spark or test processes running, other than ``exclude_under``'s
    descendants and those that wait for a lock: a ``flock`` that has not started its command
    yet, and the wrappers above it (a run that holds the machine's Spark lock is not kept
    waiting by the runs queued behind it)."""
    found = subprocess.run(["pgrep", "-f", BUSY], capture_output=True, text=True).stdout.split()
    waiting = _waiting_for_a_lock()
    busy = []
    for pid in (int(p) for p in found):
        if pid == os.getpid() or (exclude_under is not None and _descends_from(pid, exclude_under)):
            continue
        if any(_descends_from(w, pid) for w in waiting):
            continue
        try:
            busy.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160].strip())
        except OSError:
            continue
    return busy


def _waiting_for_a_lock() -> list[int]:
    """``flock`` processes without a child: waiting for their lock."""
    parents: set[int] = set()
    flocks = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        parents.add(int(fields[1]))
        if name == "flock":
            flocks.append(int(entry.name))
    return [pid for pid in flocks if pid not in parents]


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def wait_until_idle(quiet_s: float = 30, every_s: float = 15, give_up_s: float = 2400) -> dict[str, Any]:
    """Wait until no Spark or test process ran for ``quiet_s``; give up after ``give_up_s``."""
    started = time.monotonic()
    quiet_since = None
    seen: list[str] = []
    while True:
        busy = busy_processes()
        now = time.monotonic()
        if busy:
            quiet_since = None
            seen = sorted(set(seen) | set(busy))[:10]
            print(f"  waiting for an idle machine: {len(busy)} busy process(es), e.g. {busy[0][:100]}", flush=True)
        elif quiet_since is None:
            quiet_since = now
        if quiet_since is not None and now - quiet_since >= quiet_s:
            return {"waited_s": round(now - started), "idle": True, "gave_up": False}
        if now - started >= give_up_s:
            print("  gave up waiting for an idle machine; measuring anyway", flush=True)
            return {"waited_s": round(now - started), "idle": False, "gave_up": True, "busy": seen}
        time.sleep(every_s if busy else min(every_s, quiet_s - (now - quiet_since) + 0.1))


# ------------------------------------------------------------------ one side
class SideProcess:
    """One side's process, run to its end: its stdout lines (each also handed to ``on_line``),
    its wall time from start to exit, and the other busy processes seen meanwhile."""

    def __init__(self, side: str, command: list[str], stderr_path: Path,
                 on_line: Callable[[str], None] | None = None) -> None:
        self.side = side
        self.stderr_path = stderr_path
        self.lines: list[str] = []
        self.busy_during: list[str] = []
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        self.load_before = [round(x, 2) for x in os.getloadavg()]
        with open(stderr_path, "w") as stderr:
            self.started = time.time()
            clock = time.perf_counter()
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
            watcher = threading.Thread(target=self._watch, args=(process,), daemon=True)
            watcher.start()
            assert process.stdout is not None
            for line in process.stdout:
                self.lines.append(line.rstrip())
                if on_line is not None:
                    on_line(line.rstrip())
            code = process.wait()
            self.wall_s = time.perf_counter() - clock
            self.exited = self.started + self.wall_s
        watcher.join(10)
        if code != 0:
            tail = stderr_path.read_text().splitlines()[-30:]
            raise SystemExit(f"{side} exited with {code}:\n" + "\n".join(self.lines[-20:] + tail))

    def _watch(self, process: subprocess.Popen[str]) -> None:
        """Note other Spark or test processes that run while this side is measured."""
        while process.poll() is None:
            busy = busy_processes(exclude_under=process.pid)
            self.busy_during = sorted(set(self.busy_during) | set(busy))[:10]
            time.sleep(5)

    def marks(self) -> dict[str, float]:
        return {line.split()[1]: float(line.split()[2]) for line in self.lines if line.startswith("mark ")}

    def since_start(self, at: float) -> float:
        return round(at - self.started, 2)


class Side(SideProcess):
    """A side of this benchmark: files in, Parquet out."""

    def __init__(self, side: str, work: Path, input_dir: Path, files_per_batch: int,
                 module: str = "benchmarks.bounded_run", extra: tuple[str, ...] = (), label: str | None = None
                 ) -> None:
        """Run ``python -m module side INPUT OUTPUT CHECKPOINT FILES_PER_BATCH *extra``; ``label``
        (default: ``side``) names its output, checkpoint and stderr under ``work``."""
        label = label or side
        self.output = work / f"{label}-out"
        self.checkpoint = work / f"{label}-checkpoint"
        super().__init__(side, [sys.executable, "-m", module, side, str(input_dir), str(self.output),
                                str(self.checkpoint), str(files_per_batch), *extra], work / f"{label}.stderr")

    def batches(self) -> list[list[str]]:
        return [line.split()[1:] for line in self.lines if line.startswith("batch ")]

    def log(self, prefix: str) -> float:
        """When the first batchline log line starting with ``prefix`` was written."""
        times = [float(line.split()[1]) for line in self.lines
                 if line.startswith("log ") and line.split(" ", 2)[2].startswith(prefix)]
        if not times:
            raise SystemExit(f"{self.side}: no log line starting with {prefix!r}:\n" + "\n".join(self.lines[-20:]))
        return times[0]

    def generation_s(self) -> dict[int, float]:
        """Seconds the job generator spent building each batch's jobs (batchline's debug log)."""
        started: dict[int, float] = {}
        spent: dict[int, float] = {}
        for line in self.lines:
            fields = line.split()
            if line.startswith("log ") and fields[2] == "Generating":
                started[int(fields[6])] = float(fields[1])
            elif line.startswith("log ") and fields[2] == "Generated":
                spent[int(fields[7])] = float(fields[1]) - started[int(fields[7])]
        return spent

    def job_seconds(self) -> dict[int, dict[str, float]]:
        """Each batch's jobs, from a job's start to the next one's (the last: to the batch's completion)."""
        completed = {int(line.split()[1]): int(line.split()[4]) / 1000 for line in self.lines
                     if line.startswith("batch ")}
        starts: dict[int, list[tuple[str, float]]] = collections.defaultdict(list)
        for line in self.lines:
            fields = line.split()
            if line.startswith("log ") and fields[2:4] == ["Starting", "job"]:
                # "Starting job <Job.describe()> of batch <time>": "operator 'sessions'", "output 'out'",
                # "completion of operator 'sessions'"
                starts[int(fields[-1])].append((" ".join(fields[4:-3]), float(fields[1])))
        jobs = {}
        for batch_time, started in starts.items():
            ends = [at for _, at in started[1:]] + [completed.get(batch_time, started[-1][1])]
            jobs[batch_time] = {name: end - at for (name, at), end in zip(started, ends, strict=True)}
        return jobs


def batchline_figures(side: Side, events: int) -> dict[str, Any]:
    marks = side.marks()
    # batch_time records start end keys_called timed_out output_rows late_rows state_keys completed_at
    batches = [[int(b[0]), int(b[1]), int(b[2]), int(b[3]), *map(int, b[4:9])] for b in side.batches()]
    with_data = [b for b in batches if b[1] > 0]
    first_job = side.log("Starting job")
    last_data_end = max(b[3] for b in with_data) / 1000
    finished_line = side.log("Pipeline finished")
    final_checkpoint = side.log("Final checkpoint written")
    generation = side.generation_s()
    jobs = side.job_seconds()
    exhausted = side.log("Input ")
    phases = {
        "interpreter_and_imports": marks["imported"] - side.started,
        "spark_session": marks["spark"] - marks["imported"],
        "to_first_job": first_job - marks["spark"],
        "batches_with_data": last_data_end - first_job,
        "drain_to_pipeline_finished": finished_line - last_data_end,
        "final_checkpoint_and_stop": marks["finished"] - finished_line,
        "spark_stop_and_exit": side.exited - marks["finished"],
    }
    return {
        "wall_s": round(side.wall_s, 2),
        "events_per_s": round(events / side.wall_s),
        "batches": len(batches),
        "batches_with_data": len(with_data),
        "phases_s": {k: round(v, 2) for k, v in phases.items()},
        "data_batch_processing_s": [round((b[3] - b[2]) / 1000, 2) for b in with_data],
        "batches_after_data": _after_data([((b[3] - b[2]) / 1000, b[5], b[6]) for b in batches
                                           if b[0] > with_data[-1][0]]),
        "jobs_s": {
            "first_batch": {name: round(v, 2) for name, v in jobs[with_data[0][0]].items()},
            "median_of_other_batches_with_data": {
                name: round(statistics.median(jobs[b[0]][name] for b in with_data[1:]), 2)
                for name in jobs[with_data[0][0]]} if len(with_data) > 1 else None,
        },
        "job_generation_s": {
            "first_batch": round(generation[batches[0][0]], 2),
            "other_batches_with_data": round(sum(generation[b[0]] for b in with_data[1:]), 2),
            "batches_after_the_input_ended": sum(1 for t in generation if t > with_data[-1][0]),
            "after_the_input_ended_total": round(sum(s for t, s in generation.items() if t > with_data[-1][0]), 2),
        },
        "input_exhausted_at_s": side.since_start(exhausted),
        "timed_out_in_batches": sum(b[5] for b in batches),
        "late_rows": sum(b[7] for b in batches),
        "final_checkpoint_at_s": side.since_start(final_checkpoint),
        "timeline_s": {"first_job": side.since_start(first_job),
                       "last_data_batch_done": side.since_start(last_data_end),
                       "pipeline_finished": side.since_start(finished_line),
                       "final_checkpoint": side.since_start(final_checkpoint),
                       "exit": round(side.wall_s, 2)},
    }


def _after_data(batches: list[tuple[float, int, int]]) -> dict[str, Any]:
    """The batches after the last one with input: the first drains the operator (its timeouts
    fire), the rest were generated by the timer while earlier batches ran, or while stopping."""
    if not batches:
        return {"count": 0}
    (drain_s, timed_out, output_rows), rest = batches[0], batches[1:]
    return {"count": len(batches), "first_processing_s": round(drain_s, 2), "first_timed_out": timed_out,
            "first_output_rows": output_rows, "others_processing_s_total": round(sum(b[0] for b in rest), 3)}


def peer_figures(side: Side, events: int) -> dict[str, Any]:
    marks = side.marks()
    # batch_id input_rows start_ms end_ms state_rows dropped_by_watermark watermark
    batches = side.batches()
    with_data = [b for b in batches if int(b[1]) > 0]
    first_start = min(int(b[2]) for b in batches) / 1000
    last_data_end = max(int(b[3]) for b in with_data) / 1000
    phases = {
        "interpreter_and_imports": marks["imported"] - side.started,
        "spark_session": marks["spark"] - marks["imported"],
        "to_first_batch": first_start - marks["spark"],
        "batches_with_data": last_data_end - first_start,
        "no_data_batch_to_finish": marks["finished"] - last_data_end,
        "spark_stop_and_exit": side.exited - marks["finished"],
    }
    return {
        "wall_s": round(side.wall_s, 2),
        "events_per_s": round(events / side.wall_s),
        "batches": len(batches),
        "batches_with_data": len(with_data),
        "phases_s": {k: round(v, 2) for k, v in phases.items()},
        "data_batch_processing_s": [round((int(b[3]) - int(b[2])) / 1000, 2) for b in with_data],
        "batches_after_data": [{"processing_s": round((int(b[3]) - int(b[2])) / 1000, 2)}
                               for b in batches if int(b[0]) > int(with_data[-1][0])],
        "rows_dropped_by_watermark": sum(int(b[5]) for b in batches),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--files-per-batch", type=int, default=10)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--no-wait-idle", action="store_true", help="measure without waiting for an idle machine")
    parser.add_argument("--no-write", action="store_true", help="print the figures, write no results file")
    args = parser.parse_args()
    from benchmarks.machine import write_result

    events = make_events(args.events, args.users)
    input_dir = write_event_files(events, args.files, args.users)
    expected = expected_sessions(events)
    print(f"input: {args.events} events in {args.files} files under {input_dir}; "
          f"{sum(expected.values())} sessions expected", flush=True)

    work = Path(tempfile.mkdtemp(prefix="bench-bounded-"))
    try:
        sides: dict[str, Any] = {}
        idle: dict[str, Any] = {}
        for name in ("batchline", "peer"):
            idle[name] = {"skipped": True} if args.no_wait_idle else wait_until_idle()
            print(f"{name}: running", flush=True)
            sides[name] = Side(name, work, input_dir, args.files_per_batch)
            idle[name].update(busy_during_run=sides[name].busy_during,
                              load_average_before=[round(x, 2) for x in sides[name].load_before])
            print(f"{name}: {sides[name].wall_s:.2f} s from process start to exit", flush=True)

        ours, theirs = read_sessions(sides["batchline"].output), read_sessions(sides["peer"].output)
        compare("batchline", ours, expected, "the direct computation")
        compare("Structured Streaming", theirs, expected, "the direct computation")
        by = collections.Counter()
        for (_, _, _, _, closed_by), n in ours.items():
            by[closed_by] += n
        print(f"outputs identical: {sum(ours.values())} sessions ({dict(by)})", flush=True)

        batchline, peer = batchline_figures(sides["batchline"], args.events), peer_figures(sides["peer"], args.events)
        ratio = peer["wall_s"] / batchline["wall_s"]
        data_ratio = (statistics.median(peer["data_batch_processing_s"])
                      / statistics.median(batchline["data_batch_processing_s"]))
        figures: dict[str, Any] = {
            "events": args.events, "files": args.files, "events_per_file": args.events // args.files,
            "files_per_batch": args.files_per_batch, "users": args.users, "master": "local[2]",
            "state_partitions": 4, "shuffle_partitions": 4, "batch_interval": "1s",
            "watermark_delay": "10 seconds", "session_gap": "1 minute", "output": "parquet",
            "sessions": {"total": sum(ours.values()), **dict(by)},
            "outputs_identical": True,
            "batchline": batchline,
            "structured_streaming": peer,
            "ratio": round(ratio, 1),
            "median_data_batch_ratio": round(data_ratio, 1),
            "goal": f">= {GOAL:g}x", "goal_met": ratio >= GOAL,
            "machine_idle": idle,
        }
        print(json.dumps(figures, indent=1), flush=True)
        if not args.no_write:
            print(f"wrote {write_result('bounded', figures)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
