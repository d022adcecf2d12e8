"""kill -9 a bounded pipeline (SPEC F4, G1-G3) at random moments, from start-up to its final
checkpoint; restarted on the same checkpoint each time, it must finish by itself with the
output an uninterrupted run writes, which is the sessions computed directly from the files:
nothing lost, nothing duplicated. A run on the finished checkpoint does nothing.

The driver is ``bounded_driver.py``: event-time sessions (30 s gap, 10 s watermark delay) over
24 JSON-lines files, two per batch. Event time only grows from file to file, so no event is
late except a few planted far behind the watermark: every run drops them, and a restart that
ran a batch with a lower watermark than the uninterrupted run would let them into a session.
Each batch's watermark is also compared with the uninterrupted run's directly.
"""

import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.json

from tests.helpers import DRIVERS, poll_until

DRIVER = DRIVERS / "bounded_driver.py"
FILES = 24
FILE_SPAN_S = 20  # file i holds the events of [i * 20 s, (i + 1) * 20 s): event time only grows from file to file
KEYS = 16
GAP_S = 30  # the driver's session gap
DELAY_S = 10  # the driver's watermark delay
FILES_PER_BATCH = 2  # the driver's max_files_per_batch
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LAST_FILE = f"events-{FILES - 1:02d}.json"
START_TIMEOUT = 90
RUN_TIMEOUT = 150


# ---------------------------------------------------------------- the input and what it must give

def make_events(seed=20260301):
    """Each key's events as (key, value, ms after T0): mostly gaps of at most 20 s, now and then
    one of 45 s to 150 s (the session closes mid-run); some keys stop early (their last session
    closes on the watermark), others keep going to the end (closed by the final watermark).
    No gap comes near the 30 s boundary, so the split never depends on rounding."""
    rng = random.Random(seed)
    events = []
    for k in range(KEYS):
        key = f"user-{k:02d}"
        t = rng.uniform(0, 60_000)
        stop = FILES * FILE_SPAN_S * 1000 if k % 3 else rng.uniform(150_000, 400_000)
        while t < stop:
            events.append((key, rng.randint(1, 100), int(t)))
            t += rng.uniform(45_000, 150_000) if rng.random() < 0.15 else rng.uniform(200, 20_000)
    return events


def make_late_events(events, seed=7):
    """Events far behind the watermark of the batch that reads them: dropped (each batch drops
    them, also after a restart, or their sessions show up in the output). Behind even the
    watermark of the batch before, so the margin does not hang on when the watermark moves."""
    rng = random.Random(seed)
    newest = collections.defaultdict(int)  # file -> its newest event
    for _, _, ms in events:
        newest[ms // (FILE_SPAN_S * 1000)] = max(newest[ms // (FILE_SPAN_S * 1000)], ms)
    late = []
    for file in range(3 * FILES_PER_BATCH, FILES, 3):
        batch = file // FILES_PER_BATCH
        watermark_before = max(newest[f] for f in range((batch - 1) * FILES_PER_BATCH)) - DELAY_S * 1000
        ms = file * FILE_SPAN_S * 1000 - rng.randint(100_000, 140_000)
        assert ms < watermark_before - 5_000
        late.append((file, (f"user-{rng.randrange(KEYS):02d}", 10_000 + file, ms)))
    return late


def iso(ms):
    return (T0 + timedelta(milliseconds=ms)).isoformat()


def write_inputs(incoming, events, late):
    incoming.mkdir()
    rng = random.Random(11)
    by_file = collections.defaultdict(list)
    for key, value, ms in events:
        by_file[ms // (FILE_SPAN_S * 1000)].append((key, value, ms))
    for file, event in late:
        by_file[file].append(event)
    for file in range(FILES):
        rows = by_file[file]
        rng.shuffle(rows)  # the state function sorts each key's rows
        lines = [json.dumps({"key": key, "value": value, "ts": iso(ms)}) + "\n" for key, value, ms in rows]
        (incoming / f"events-{file:02d}.json").write_text("".join(lines))


def expected_sessions(events):
    """The sessions, straight from the events: split each key's events where two lie more than
    30 s apart; as (key, start ms, end ms, count, total)."""
    by_key = collections.defaultdict(list)
    for key, value, ms in events:
        by_key[key].append((ms, value))
    sessions = []
    for key, items in by_key.items():
        items.sort()
        current = None
        for ms, value in items:
            if current is not None and ms - current[2] > GAP_S * 1000:
                sessions.append(tuple(current))
                current = None
            if current is None:
                current = [key, ms, ms, 0, 0]
            current[2], current[3], current[4] = ms, current[3] + 1, current[4] + value
        sessions.append(tuple(current))
    return collections.Counter(sessions)


# ---------------------------------------------------------------- reading the output

def visible_files(out):
    """What a plain reader sees: every part file outside hidden (``_``, ``.``) directories."""
    found = []
    for directory, subdirs, files in os.walk(out):
        subdirs[:] = [d for d in subdirs if not d.startswith(("_", "."))]
        found += [Path(directory, name) for name in files if name.startswith("part-") and name.endswith(".json")]
    return sorted(found)


def batch_dirs(out):
    return sorted(p.name for p in Path(out).iterdir() if p.name.startswith("batch_time=")) if Path(out).exists() else []


def to_ms(text):
    return round((datetime.fromisoformat(text.replace("Z", "+00:00")) - T0).total_seconds() * 1000)


def output_sessions(out):
    sessions = []
    for path in visible_files(out):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                sessions.append((row["key"], to_ms(row["start"]), to_ms(row["end"]), row["count"], row["total"]))
    return collections.Counter(sessions)


def check_readable(out):
    """Every visible file parses with pyarrow's JSON reader (no torn or partial file)."""
    for path in visible_files(out):
        table = pyarrow.json.read_json(path)
        assert table.num_rows > 0, f"{path} is empty"


def describe_difference(got, expected):
    missing, extra = expected - got, got - expected
    return f"missing {sorted(missing.elements())[:5]} ({sum(missing.values())}), " \
           f"unexpected {sorted(extra.elements())[:5]} ({sum(extra.values())})"


# ---------------------------------------------------------------- the driver process

class Driver:
    """One driver process (in a session of its own); its stdout and stderr lines are kept with
    the time they came, in seconds since the start, and copied to ``log``."""

    def __init__(self, incoming, out, checkpoint, log):
        self.began = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, str(DRIVER), str(incoming), str(out), str(checkpoint)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        self.log = open(log, "w")  # noqa: SIM115 (closed in wait())
        self.lines = []  # (seconds since start, "out" or "err", line)
        self.exited_at = None
        self.changed = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(stream, name), daemon=True)
                        for stream, name in ((self.process.stdout, "out"), (self.process.stderr, "err"))]
        for reader in self.readers:
            reader.start()

    def _read(self, stream, name):
        for line in stream:
            with self.changed:
                self.lines.append((self.now(), name, line.rstrip("\n")))
                if not self.log.closed:
                    self.log.write(f"{self.lines[-1][0]:8.3f} {name} {line}")
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def now(self):
        return time.monotonic() - self.began

    def when(self, predicate):
        """When (seconds since start) the first line satisfying ``predicate(stream, line)`` came, or None."""
        with self.changed:
            return next((t for t, name, line in self.lines if predicate(name, line)), None)

    def wait_for(self, predicate, timeout):
        """Wait until a line satisfies ``predicate(stream, line)``; False if the process ended
        (and its output was read) or ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while self.when(predicate) is None:
                if (self.process.poll() is not None and not any(r.is_alive() for r in self.readers)) \
                        or time.monotonic() > deadline:
                    return False
                self.changed.wait(0.05)
        return True

    def completed(self):
        """This run's completed batches as (time ms, records, last input file or '-', watermark or '-')."""
        with self.changed:
            return [(int(b), int(n), last, watermark) for _, name, line in self.lines
                    if name == "out" and line.startswith("completed ") and len(line.split()) == 5
                    for _, b, n, last, watermark in [line.split()]]

    def output(self):
        with self.changed:
            return "\n".join(line for _, _, line in self.lines)

    def kill(self):
        """SIGKILL the driver (its JVM and Python workers follow once their parent is gone);
        True if it was still running."""
        alive = self.process.poll() is None
        self.process.kill()
        self.wait(30)
        return alive

    def wait(self, timeout):
        """The exit code; then waits for the driver's other processes too (the JVM ends a
        moment after its driver), so that runs never overlap."""
        code = self.process.wait(timeout)
        if self.exited_at is None:
            self.exited_at = self.now()
        poll_until(lambda: not session_processes(self.process.pid), 20, 0.1)
        for pid in session_processes(self.process.pid):  # only processes this driver started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for reader in self.readers:
            reader.join(10)
        with self.changed:
            self.log.close()
        return code


def session_processes(sid):
    """The live processes of session ``sid`` (a driver started with a session of its own)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(entry.name))
    return pids


def input_done(name, line):
    """The batch with the last file, or a later one (no records), completed."""
    fields = line.split()
    return (name == "out" and len(fields) == 5 and fields[0] == "completed"
            and (fields[3] == LAST_FILE or fields[2] == "0"))


def is_line(stream, fragment):
    return lambda name, line: name == stream and fragment in line


LEASE = is_line("err", "checkpoint lease")
STARTED = is_line("out", "started")
FINISHING = is_line("err", "Pipeline finished with batch")
FINAL_CHECKPOINT = is_line("err", "Final checkpoint written")


def reach(driver, predicate, timeout):
    """Wait for a line; False if the driver exited first, a failure if it hangs."""
    if driver.wait_for(predicate, timeout):
        return True
    assert driver.process.poll() is not None, f"nothing happened within {timeout} s:\n{driver.output()[-3000:]}"
    return False


def run_uninterrupted(incoming, out, checkpoint, log, timeout=RUN_TIMEOUT):
    driver = Driver(incoming, out, checkpoint, log)
    try:
        code = driver.wait(timeout)
    except subprocess.TimeoutExpired:
        driver.kill()
        raise AssertionError(
            f"the driver did not finish within {timeout} s; its output:\n{driver.output()[-3000:]}") from None
    assert code == 0, f"the driver exited with {code}:\n{driver.output()[-3000:]}"
    assert driver.when(is_line("out", "finished")) is not None, driver.output()[-3000:]
    return driver


# ---------------------------------------------------------------- the test

def kill_phase(driver, input_committed):
    """Where the pipeline was when the driver was killed, from what it printed and logged."""
    if driver.when(FINAL_CHECKPOINT) is not None:
        return "after the final checkpoint"  # stopping Spark, exiting
    if driver.when(FINISHING) is not None:
        return "final checkpoint"  # stopping gracefully, writing the final checkpoint
    if driver.when(LEASE) is None:
        return "start-up"  # the JVM and the Spark session
    if driver.when(STARTED) is None:
        return "recovery"  # inside start(): lease, checkpoint, batch log, restart plan
    if input_committed or driver.when(input_done) is not None:
        return "drain"  # the batch that fires every timeout at the end of time, or its re-run
    return "input batches"


def test_kill_9s_from_start_up_to_the_final_checkpoint_change_nothing_in_the_output(tmp_path):
    events = make_events()
    late = make_late_events(events)
    incoming = tmp_path / "in"
    write_inputs(incoming, events, late)
    expected = expected_sessions(events)
    newest = max(ms for _, _, ms in events)
    closed_mid_run = [s for s in expected if s[2] + (GAP_S + DELAY_S) * 1000 < newest]
    open_at_end = [s for s in expected if s[2] + (GAP_S + DELAY_S) * 1000 >= newest]
    sessions_per_key = collections.Counter(s[0] for s in expected)
    assert len(closed_mid_run) >= 20 and len(open_at_end) >= 5
    assert sum(n > 1 for n in sessions_per_key.values()) >= KEYS // 2  # keys with gaps of more than 30 s
    logs = tmp_path / "logs"
    logs.mkdir()

    # An uninterrupted run: finishes by itself, with the sessions computed from the files.
    reference_out = tmp_path / "reference-out"
    reference = run_uninterrupted(incoming, reference_out, tmp_path / "reference-checkpoint", logs / "reference.log")
    got = output_sessions(reference_out)
    assert got == expected, describe_difference(got, expected)
    check_readable(reference_out)
    started = reference.when(STARTED)
    input_end = reference.when(input_done)
    finishing = reference.when(FINISHING)
    final = reference.when(FINAL_CHECKPOINT)
    assert None not in (started, input_end, finishing, final), reference.output()[-3000:]
    timings = {"started": started, "last input batch": input_end, "finishing": finishing,
               "final checkpoint": final, "exit": reference.exited_at}
    print(f"\nreference run: {', '.join(f'{k} {v:.1f} s' for k, v in timings.items())}")
    # A batch's watermark follows from the batches before it (two files each, in name order),
    # so every run of the batch with the same files, before or after a crash, has the same one.
    watermarks = {last: watermark for _, _, last, watermark in reference.completed() if last != "-"}
    assert len(watermarks) == FILES // FILES_PER_BATCH, reference.output()[-3000:]
    runs = []

    # Kills: during the JVM's start-up, in the recovery inside start() (the lease is taken, the
    # checkpoint and the batch log are read), at random moments after `started` (drawn from the
    # reference run's timeline, but never past the moment the pipeline starts finishing, which
    # a run that recovers far along reaches sooner), and in the finishing phase: the batch that
    # drains the timeouts, the graceful stop and the final checkpoint.
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    rng = random.Random(20261122)
    plan = ["start-up", "running", "recovery", "running", "running", "start-up", "running", "recovery",
            "late", "drain", "final"]
    phases = collections.Counter()
    input_committed = finishing_reached = finished = False  # as some earlier run saw it
    for attempt, kind in enumerate(plan):
        if finished:
            kind = "start-up"  # a kill that landed after the final checkpoint: only start-ups are left to kill
        elif kind == "drain" and finishing_reached:
            kind = "final"
        driver = Driver(incoming, out, checkpoint, logs / f"attempt-{attempt:02d}-{kind}.log")
        runs.append((f"attempt {attempt}", driver))
        if kind == "start-up":
            driver.wait_for(LEASE, rng.uniform(0.1, 0.6) * started)
        elif kind == "recovery":
            reach(driver, LEASE, START_TIMEOUT)
        elif kind == "final":
            if reach(driver, FINISHING, RUN_TIMEOUT):
                time.sleep(rng.uniform(0, final - finishing))
        else:
            reach(driver, STARTED, START_TIMEOUT)
            if kind == "running":
                driver.wait_for(FINISHING, rng.uniform(0, input_end - started))
            elif kind == "late":
                driver.wait_for(FINISHING, rng.uniform(input_end - started, reference.exited_at - started))
            elif input_committed or reach(driver, input_done, RUN_TIMEOUT):  # drain
                driver.wait_for(FINISHING, rng.uniform(0, finishing - input_end))
        phase = kill_phase(driver, input_committed)
        at = driver.now()
        if driver.kill():
            phases[phase] += 1
            print(f"attempt {attempt} ({kind}): killed at {at:.1f} s in phase {phase!r} after "
                  f"{len(driver.completed())} completed batches")
        else:
            phases["exited by itself"] += 1
            print(f"attempt {attempt} ({kind}): exited by itself with {driver.process.returncode} before the kill")
        assert "failed " not in driver.output(), driver.output()[-3000:]
        input_committed = input_committed or driver.when(input_done) is not None
        finishing_reached = finishing_reached or driver.when(FINISHING) is not None
        finished = finished or driver.when(FINAL_CHECKPOINT) is not None

    # Once more, without a kill: it finishes by itself, with the reference's output exactly.
    last = run_uninterrupted(incoming, out, checkpoint, logs / "final-run.log")
    runs.append(("the last run", last))
    print(f"kills by phase: {dict(phases)}; the last run took {last.exited_at:.1f} s")
    wrong = [f"{name}: batch {time_ms} (up to {file}) ran with watermark {watermark}, not {watermarks[file]}"
             for name, run in runs for time_ms, _, file, watermark in run.completed()
             if file != "-" and watermark != watermarks[file]]
    assert not wrong, "a restart changed the watermark of a batch:\n" + "\n".join(wrong)
    check_readable(out)
    got = output_sessions(out)
    assert got == expected, describe_difference(got, expected)
    assert sum(phases.values()) - phases["exited by itself"] >= 10, phases
    assert phases["start-up"] + phases["recovery"] >= 2, phases
    assert phases["drain"] + phases["final checkpoint"] + phases["after the final checkpoint"] >= 2, phases

    # A finished pipeline: a run does nothing, says so, and exits at once.
    dirs, before = batch_dirs(out), sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    again = run_uninterrupted(incoming, out, checkpoint, logs / "finished-run.log", timeout=START_TIMEOUT)
    assert again.when(is_line("err", "already finished")) is not None, again.output()[-3000:]
    assert again.exited_at - again.when(STARTED) < 5, again.output()[-3000:]
    assert not again.completed()
    assert batch_dirs(out) == dirs
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before  # nothing at all changed
    assert output_sessions(out) == expected
