"""Recovery after a driver crash in the middle of a stateful batch (SPEC F2): how much of the
batch a restart redoes, and how long the re-run batch takes.

One sessionization batch (200k generated events from 100k users, one parquet file read by
the file source; ``examples/sessionization.py``'s ``update_session`` under
``flat_map_groups_with_state`` with 8 state partitions; the closed sessions written with
``write_files``) runs in a driver process of its own, which is killed with SIGKILL:

- **after 6 of 8 partitions finished**: partitions 6 and 7 block (``BLOCK_PARTITIONS=6,7``),
  the driver is killed once the other six recorded their finish in the job event store;
- **before any partition finished**: every partition blocks, the driver is killed as soon as
  the operator's job was submitted (its ``operator-...`` record exists).

Then a new driver process restarts from the checkpoint, unblocked. Measured on the restart,
up to the batch's completion: the state-function calls it made, against the calls of the
whole batch (an uninterrupted run), and the batch's processing time (first job start to
completion, from the listener), plus the wall time from process start.

Two cases (``--case``, default ``sessionization``, or ``both``):

- **sessionization**: the above; the state function costs a few microseconds a key, so the
  batch's time is mostly the read and the shuffle, which a re-run redoes in full today.
- **cpu**: the same batch shape (200k events in one parquet file, keyed by user, 8 state
  partitions, the same kill points), with ``update_session`` followed by a chain of SHA-256
  digests of about 1 ms of CPU per call, so the per-key work dominates. The chain's length is
  calibrated once in the measuring process (``calibrate``, CPU time) and passed to every
  driver, so every run does the same work. It has 30k users instead of 100k, so that one
  batch takes about 20 s on 2 cores: 29,964 of them have events, 1 ms x 30k keys / 2 cores =
  15 s of function time, plus the ~5 s that the read and shuffle of the 200k rows take either
  way. With 100k users (86k keys) one batch would take about 50 s, and a round runs it about
  twice. The cpu case's figures go under ``"cpu"`` in the results file.

Each case's ``recovered_vs_whole`` is the re-run batch's processing time after 6 of 8 against
the re-run of the whole batch (killed before any partition finished; both restarts pay the
same cold start); ``recovered_vs_uninterrupted`` is against the uninterrupted run.

Optionally (``--peer``, sessionization only), Structured Streaming's ``applyInPandasWithState``
on the same file (benchmarks/sessionization.py's version of the function, 8 shuffle
partitions), for context: a restart there re-runs the whole batch, so its re-run costs what
one run of the batch costs.

The results file holds both cases. When one case runs, the other's figures are carried over
from the file as it was, and ``carried_over`` names the date and command they came from.
``--no-write`` prints the figures and leaves the file alone.

    python -m benchmarks.recovery [--rounds 3] [--case sessionization|cpu|both] [--peer] [--no-write]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EVENTS, USERS, PARTITIONS = 200_000, 100_000, 8
CPU_USERS, CPU_SECONDS_PER_KEY = 30_000, 1e-3
CASES = ("sessionization", "cpu")
GOALS = {"sessionization": "<= 0.5", "cpu": "<= 0.35"}
BLOCKED = (6, 7)
KEEP_LINE = "keeping 6 of 8 finished partitions of operator 'sessions'; re-running 2"


# ------------------------------------------------------------------ the driver process
def burn(user: int, iterations: int) -> bytes:
    """CPU work, deterministic: a chain of ``iterations`` SHA-256 digests seeded by the user."""
    digest = user.to_bytes(8, "little", signed=True)
    for _ in range(iterations):
        digest = hashlib.sha256(digest).digest()
    return digest


def calibrate(seconds: float = CPU_SECONDS_PER_KEY, sample: int = 20_000) -> int:
    """Iterations of ``burn`` that take ``seconds`` of CPU here (the fastest of 10 timed samples)."""
    timings = []
    for _ in range(10):
        started = time.process_time()
        burn(0, sample)
        timings.append(time.process_time() - started)
    return max(1, round(sample * seconds / min(timings)))


def make_recorded_session(calls_dir: str, blocked: frozenset[int], burn_iterations: int = 0):
    """``update_session`` (then ``burn(user, burn_iterations)``) that appends ``<partition> <user>
    <µs>`` per call to CALLS/calls-<pid>.txt, and blocks in the ``blocked`` state partitions."""
    from batchline.examples.sessionization import update_session

    handles: dict[int, int] = {}

    def session(user, events, state):
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        if partition in blocked:
            parent, deadline = os.getppid(), time.monotonic() + 900
            while os.getppid() == parent and time.monotonic() < deadline:
                time.sleep(0.2)
            os._exit(1)  # orphaned: the driver is gone
        pid = os.getpid()
        fd = handles.get(pid)
        if fd is None:
            fd = handles[pid] = os.open(os.path.join(calls_dir, f"calls-{pid}.txt"),
                                        os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        started = time.perf_counter()
        closed = list(update_session(user, events, state))
        if burn_iterations:
            burn(user, burn_iterations)
        os.write(fd, f"{partition} {user} {round((time.perf_counter() - started) * 1e6)}\n".encode())
        return closed

    return session


def driver(input_dir: str, checkpoint: str, out: str, calls: str, burn_iterations: str = "0") -> None:
    import logging

    from batchline import StreamingContext, StreamingListener
    from batchline.examples.sessionization import ClosedSession, UserSession
    from batchline.sources.generator import USER_EVENT_SCHEMA
    from batchline.spark import local_spark_session
    from batchline.state import GroupStateTimeout

    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("batchline.recovery").setLevel(logging.INFO)
    logging.getLogger("batchline.state").setLevel(logging.INFO)

    class JobStarts(logging.Handler):
        """``job <name> <batch_time> <epoch s>`` for every job the scheduler starts; the name as the
        results have always had it ("state:sessions", "out"), from ``Job.describe()``'s
        "operator 'sessions'", "output 'out'"."""

        def emit(self, record: logging.LogRecord) -> None:
            args = record.args
            if isinstance(record.msg, str) and record.msg.startswith("Starting job") and isinstance(args, tuple) \
                    and len(args) == 2:
                what, _, name = str(args[0]).rpartition(" ")
                name = name.strip("'")
                # The operator read by one output only runs inside that output's job: its "state"
                # job only publishes the batch's parameters, its "completion" job takes on the reports.
                name = {"operator": f"state:{name}", "input": f"read:{name}",
                        "completion of operator": f"completion:{name}"}.get(what, name)
                print(f"job {name} {args[1]} {record.created:.3f}", flush=True)

    scheduler_log = logging.getLogger("batchline.scheduler.batch_run")
    scheduler_log.setLevel(logging.DEBUG)
    scheduler_log.addHandler(JobStarts())
    scheduler_log.propagate = False
    blocked = frozenset(int(p) for p in os.environ.get("BLOCK_PARTITIONS", "").split(",") if p.strip())
    Path(calls).mkdir(parents=True, exist_ok=True)
    done = threading.Event()

    class Progress(StreamingListener):
        def on_batch_completed(self, info: Any) -> None:
            progress = info.state_operators.get("sessions")
            keys, rows = (progress.keys_called, progress.input_rows) if progress is not None else (0, 0)
            if info.failure is not None:
                print(f"failed {info.batch_time} {info.failure!r}", flush=True)
                return
            print(f"completed {info.batch_time} {keys} {rows} {info.processing_delay_ms} {time.time():.3f}",
                  flush=True)
            if rows > 0:
                done.set()

    spark = local_spark_session("local[2]", "bench-recovery", shuffle_partitions=PARTITIONS)
    ssc = StreamingContext(spark, "1s", checkpoint=checkpoint)
    ssc.add_listener(Progress())
    events = ssc.file_stream(input_dir, "parquet", USER_EVENT_SCHEMA, settle=0, max_files_per_batch=1, name="events")
    sessions = events.group_by_key("id").flat_map_groups_with_state(
        make_recorded_session(os.path.abspath(calls), blocked, int(burn_iterations)), state_schema=UserSession,
        output_schema=ClosedSession, timeout=GroupStateTimeout.PROCESSING_TIME, name="sessions",
        num_partitions=PARTITIONS)
    sessions.write_files(out, format="parquet", name="out")
    ssc.start()
    print("started", flush=True)
    while not done.wait(0.5):
        if ssc.await_termination(0.01):
            sys.exit(1)
    ssc.stop(graceful=True, stop_spark_session=True)


# ------------------------------------------------------------------ the measuring side
def write_events(directory: Path, users: int = USERS) -> Path:
    """One parquet file of 200k user events (USER_EVENT_SCHEMA) from ``users`` users, deterministic."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(20261122)
    index = np.arange(EVENTS)
    base_us = 1_800_000_000_000_000
    table = pa.table({
        "id": pa.array(rng.integers(0, users, EVENTS), pa.int32()),
        "data": pa.array([f"event-{i}" for i in index]),
        "is_last": pa.array(rng.random(EVENTS) < 0.05),
        "ts": pa.array(base_us + index * 1000, pa.timestamp("us", tz="UTC")),
    })
    directory.mkdir(parents=True)
    path = directory / "events-000.parquet"
    pq.write_table(table, path)
    return path


class Run:
    """One driver process; its stdout lines, and when it started."""

    def __init__(self, work: Path, name: str, input_dir: Path, checkpoint: Path, block: tuple[int, ...] = (),
                 burn_iterations: int = 0):
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        env.pop("BLOCK_PARTITIONS", None)
        if block:
            env["BLOCK_PARTITIONS"] = ",".join(map(str, block))
        self.calls = work / f"calls-{name}"
        self.stderr = open(work / f"{name}.stderr", "w")  # noqa: SIM115 - closed in finish()
        self.started = time.time()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.recovery", "driver", str(input_dir), str(checkpoint),
             str(checkpoint) + "-out", str(self.calls), str(burn_iterations)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(line.rstrip() for line in self.process.stdout),
                                       daemon=True)
        self.reader.start()

    def finish(self, timeout: float = 600) -> None:
        code = self.process.wait(timeout)
        self.reader.join(10)
        self.stderr.close()
        if code != 0:
            raise RuntimeError(f"driver exited {code}:\n" + "\n".join(self.lines[-30:]))

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.reader.join(10)
        self.stderr.close()

    def big_batch(self) -> dict[str, Any]:
        for line in self.lines:
            if line.startswith("completed "):
                _, batch_time, keys, rows, processing_ms, at = line.split()
                if int(rows) > 0:
                    return {"batch_time": int(batch_time), "keys_called": int(keys), "input_rows": int(rows),
                            "processing_s": int(processing_ms) / 1000,
                            "wall_s": float(at) - self.started,
                            "jobs_s": self.job_seconds(int(batch_time), float(at))}
        raise RuntimeError("no completed batch with input:\n" + "\n".join(self.lines[-30:]))

    def job_seconds(self, batch_time: int, completed_at: float) -> dict[str, float]:
        """Each job of the batch, from its start to the next one's (the last: to completion)."""
        starts = [(line.split()[1], float(line.split()[3])) for line in self.lines
                  if line.startswith("job ") and int(line.split()[2]) == batch_time]
        ends = [at for _, at in starts[1:]] + [completed_at]
        return {name: round(end - at, 2) for (name, at), end in zip(starts, ends, strict=True)}

    def calls_made(self) -> tuple[int, float]:
        """The state-function calls recorded, and the seconds spent in them."""
        lines = [line.split() for p in self.calls.glob("calls-*.txt") for line in p.read_text().splitlines()]
        return len(lines), round(sum(int(fields[2]) for fields in lines) / 1e6, 2)


def _batch_dirs(checkpoint: Path) -> list[Path]:
    events = checkpoint / "events"
    return sorted(p for p in events.iterdir() if p.name.isdigit()) if events.is_dir() else []


def wait_until(run: Run, condition: Any, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if run.process.poll() is not None or time.monotonic() > deadline:
            run.kill()
            raise RuntimeError(f"gave up waiting for {what}:\n" + "\n".join(run.lines[-30:]))
        time.sleep(0.1)


def crash_and_restart(work: Path, name: str, input_dir: Path, finished_before_kill: int,
                      burn_iterations: int = 0) -> dict[str, Any]:
    checkpoint = work / f"checkpoint-{name}"
    if finished_before_kill:
        block = tuple(p for p in range(PARTITIONS) if p >= finished_before_kill)
    else:
        block = tuple(range(PARTITIONS))
    first = Run(work, f"{name}-first", input_dir, checkpoint, block, burn_iterations)

    def finished() -> int:
        dirs = _batch_dirs(checkpoint)
        return len(list(dirs[0].glob("finished-sessions-*.json"))) if dirs else 0

    if finished_before_kill:
        wait_until(first, lambda: finished() >= finished_before_kill, f"{finished_before_kill} finished partitions")
    else:
        wait_until(first, lambda: any(list(d.glob("operator-sessions-*.json")) for d in _batch_dirs(checkpoint)),
                   "the operator's job")
    first.kill()
    recorded = finished()
    restart = Run(work, f"{name}-restart", input_dir, checkpoint, burn_iterations=burn_iterations)
    restart.finish()
    calls, function_s = restart.calls_made()
    figures = {**restart.big_batch(), "finished_before_kill": recorded, "calls": calls, "function_s": function_s,
               "keep_line": next((line for line in restart.lines if "finished partitions of operator" in line), None)}
    shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.rmtree(str(checkpoint) + "-out", ignore_errors=True)
    print(f"  {name}: {figures}", flush=True)
    return figures


def run_peer(input_dir: Path, work: Path) -> float:
    from batchline.spark import local_spark_session
    from benchmarks import sessionization

    spark = local_spark_session("local[2]", "bench-recovery-peer", shuffle_partitions=PARTITIONS)
    try:
        [seconds] = sessionization.run_peer(spark, input_dir, 1, work / "peer-checkpoint")
    finally:
        spark.stop()
    return seconds


def measure(case: str, work: Path, rounds: int, burn_iterations: int) -> dict[str, Any]:
    """One case's figures: an uninterrupted run, then ``rounds`` crashes after 6 of 8 and before any."""
    users = CPU_USERS if case == "cpu" else USERS
    input_dir = work / f"events-{case}"
    write_events(input_dir, users)
    whole = Run(work, f"{case}-uninterrupted", input_dir, work / f"checkpoint-{case}-uninterrupted",
                burn_iterations=burn_iterations)
    whole.finish()
    calls, function_s = whole.calls_made()
    uninterrupted = {**whole.big_batch(), "calls": calls, "function_s": function_s}
    print(f"  {case} uninterrupted: {uninterrupted}", flush=True)

    partial, none = [], []
    for n in range(rounds):
        partial.append(crash_and_restart(work, f"{case}-after-6-of-8-{n}", input_dir, PARTITIONS - len(BLOCKED),
                                         burn_iterations))
        none.append(crash_and_restart(work, f"{case}-before-any-{n}", input_dir, 0, burn_iterations))
    missing_line = [f for f in partial if not f["keep_line"] or KEEP_LINE not in f["keep_line"]]
    if missing_line:
        print(f"WARNING: {len(missing_line)} restart(s) after 6 of 8 did not log {KEEP_LINE!r}", flush=True)

    median = statistics.median
    whole_calls = uninterrupted["calls"]
    figures: dict[str, Any] = {
        "events": EVENTS, "users": users, "state_partitions": PARTITIONS, "master": "local[2]",
        "rounds": rounds,
        "uninterrupted": {"calls": whole_calls, "processing_s": uninterrupted["processing_s"],
                          "wall_s": round(uninterrupted["wall_s"], 2), "jobs_s": uninterrupted["jobs_s"],
                          "function_s": uninterrupted["function_s"]},
        "restart_after_6_of_8": {
            "calls": [f["calls"] for f in partial],
            "processing_s": [f["processing_s"] for f in partial],
            "wall_s": [round(f["wall_s"], 2) for f in partial],
            "keys_called": [f["keys_called"] for f in partial],
            "jobs_s": [f["jobs_s"] for f in partial],
            "function_s": [f["function_s"] for f in partial],
            "log_line": partial[0]["keep_line"],
        },
        "restart_after_kill_before_any_finish": {
            "calls": [f["calls"] for f in none],
            "processing_s": [f["processing_s"] for f in none],
            "wall_s": [round(f["wall_s"], 2) for f in none],
            "keys_called": [f["keys_called"] for f in none],
            "jobs_s": [f["jobs_s"] for f in none],
            "function_s": [f["function_s"] for f in none],
        },
    }
    if burn_iterations:
        figures["burn_iterations"] = burn_iterations
        figures["function_ms_per_call"] = round(1000 * uninterrupted["function_s"] / whole_calls, 3)
    recovered_s = median(f["processing_s"] for f in partial)
    figures["redone_share"] = round(median(f["calls"] for f in partial) / whole_calls, 4)
    figures["redone_share_before_any_finish"] = round(median(f["calls"] for f in none) / whole_calls, 4)
    figures["recovered_vs_whole"] = round(recovered_s / median(f["processing_s"] for f in none), 3)
    figures["recovered_vs_uninterrupted"] = round(recovered_s / uninterrupted["processing_s"], 3)
    figures["recovered_vs_whole_wall"] = round(median(f["wall_s"] for f in partial)
                                               / median(f["wall_s"] for f in none), 3)
    state_job = [f["jobs_s"].get("state:sessions") for f in partial + none]
    if all(state_job):
        figures["state_job_recovered_vs_whole"] = round(
            median(state_job[: len(partial)]) / median(state_job[len(partial):]), 3)
    figures["goals"] = {"redone_share": "<= 0.25", "recovered_vs_whole": GOALS[case]}
    print({k: v for k, v in figures.items() if not isinstance(v, dict)}, flush=True)
    return figures


def carried_over(path: Path, case: str) -> tuple[dict[str, Any], str] | None:
    """The figures of ``case`` in the results file at ``path``, and the date and command they came from."""
    if not path.exists():
        return None
    old = json.loads(path.read_text())
    origin = old.get("carried_over", {}).get(case) or f"{old['date']} {old['command']}"
    if case == "cpu":
        return ({"cpu": old["cpu"]}, origin) if "cpu" in old else None
    meta = {"benchmark", "date", "command", "machine", "cpu", "carried_over"}
    kept = {k: v for k, v in old.items() if k not in meta}
    return (kept, origin) if "uninterrupted" in kept else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--case", choices=[*CASES, "both"], default="sessionization")
    parser.add_argument("--peer", action="store_true", help="also time Structured Streaming's run of the batch")
    parser.add_argument("--no-write", action="store_true", help="print the figures, leave the results file alone")
    args = parser.parse_args()
    cases = CASES if args.case == "both" else (args.case,)
    if args.peer and "sessionization" not in cases:
        parser.error("--peer runs on the sessionization case's file")
    from benchmarks.machine import RESULTS, write_result

    work = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    try:
        figures: dict[str, Any] = {}
        if "sessionization" in cases:
            figures.update(measure("sessionization", work, args.rounds, 0))
            if args.peer:
                figures["structured_streaming_batch_s"] = round(run_peer(work / "events-sessionization", work), 2)
        if "cpu" in cases:
            iterations = calibrate()
            print(f"  cpu: {iterations} SHA-256 iterations = {CPU_SECONDS_PER_KEY * 1000:g} ms of CPU", flush=True)
            figures["cpu"] = measure("cpu", work, args.rounds, iterations)
        if args.no_write:
            print(json.dumps(figures, indent=2))
            return
        for other in set(CASES) - set(cases):
            found = carried_over(RESULTS / "recovery.json", other)
            if found:
                figures = {**found[0], **figures}
                figures.setdefault("carried_over", {})[other] = found[1]
        print(f"wrote {write_result('recovery', figures)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "driver":
        sys.path.insert(0, str(ROOT))
        driver(*sys.argv[2:7])
    else:
        main()
