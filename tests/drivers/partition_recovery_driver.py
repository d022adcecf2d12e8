"""A pipeline driver for the partition recovery tests (SPEC F1–F3): one big stateful batch.

    python tests/drivers/partition_recovery_driver.py CHECKPOINT OUT CALLS [--master M]

The input is a replayable list source with one batch of ``EVENTS`` rows from ``USERS``
users, then ``END``. The rows go through ``flat_map_groups_with_state`` (operator
``sessions``, ``PARTITIONS`` state partitions) that keeps a running count and total per
user and yields one row per call, into ``write_files(OUT, "parquet")``.

Every call of the state function appends ``<partition> <user>`` to ``CALLS/calls-<pid>.txt``.
With ``BLOCK_PARTITIONS=6,7`` in the environment, calls in those state partitions block
before doing anything, so those partitions never finish (the test kills the driver then).

Prints ``started`` once the context started and ``completed <batch_time> <keys_called>
<input_rows>`` for every completed batch; batchline's INFO lines (the restart's among them)
go to stdout as ``LEVEL logger: message``. Exits 0 once the big batch completed.
"""

import argparse
import datetime as dt
import logging
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from batchline import StreamingContext, StreamingListener  # noqa: E402
from batchline.spark import local_spark_session  # noqa: E402
from batchline.testing import END, list_stream  # noqa: E402

EVENTS, USERS, PARTITIONS = 40_000, 4_000, 8
SCHEMA = "user long, n long, ts timestamp"
STATE_SCHEMA = "count long, total long"
OUTPUT_SCHEMA = "user long, count long, total long, last_ts timestamp"
BASE = dt.datetime(2026, 11, 22, 6, 0, tzinfo=dt.UTC)


def events() -> list[tuple[int, int, dt.datetime]]:
    """Deterministic: event i belongs to user (i * 7919) % USERS, so every user has 10."""
    return [((i * 7919) % USERS, i, BASE + dt.timedelta(milliseconds=i)) for i in range(EVENTS)]


def blocked_partitions() -> frozenset[int]:
    value = os.environ.get("BLOCK_PARTITIONS", "").strip()
    return frozenset(int(p) for p in value.split(",") if p.strip())


def make_running_total(calls_dir: str, blocked: frozenset[int]):
    """The state function; ``calls_dir`` and ``blocked`` travel in its closure to every executor."""
    handles: dict[int, int] = {}

    def block_forever() -> None:
        parent, deadline = os.getppid(), time.monotonic() + 900
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.2)
        os._exit(1)  # orphaned: the driver is gone

    def record(line: str) -> None:
        pid = os.getpid()
        fd = handles.get(pid)
        if fd is None:
            fd = handles[pid] = os.open(os.path.join(calls_dir, f"calls-{pid}.txt"),
                                        os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, line.encode())  # one write per line, appended atomically

    def running_total(user, rows, state):
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        if partition in blocked:
            block_forever()
        record(f"{partition} {user}\n")
        count, total = state.get() if state.exists else (0, 0)
        last = None
        for row in rows:
            count, total = count + 1, total + row.n
            last = row.ts if last is None else max(last, row.ts)
        state.update((count, total))
        yield (user, count, total, last)

    return running_total


def say(line: str) -> None:
    """One whole line in one write: batchline's log lines share stdout from other threads, and
    print() writes the text and its newline apart, so a log line could land between them."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Progress(StreamingListener):
    def __init__(self) -> None:
        self.done = threading.Event()

    def on_batch_completed(self, info) -> None:
        progress = info.state_operators.get("sessions")
        keys, rows = (progress.keys_called, progress.input_rows) if progress is not None else (0, 0)
        if info.failure is not None:
            say(f"failed {info.batch_time} {info.failure!r}")
            return
        say(f"completed {info.batch_time} {keys} {rows}")
        if rows > 0 or info.num_records > 0:
            self.done.set()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("calls")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("batchline").setLevel(logging.INFO)
    Path(args.calls).mkdir(parents=True, exist_ok=True)

    spark = local_spark_session(args.master, "partition-recovery-driver", shuffle_partitions=2)
    # The big batch takes several intervals on a cold JVM; the empty batches queued behind it
    # get two seconds of the graceful stop, not ten intervals.
    ssc = StreamingContext(spark, "1s", checkpoint=args.checkpoint, graceful_stop_timeout="2s")
    progress = Progress()
    ssc.add_listener(progress)
    stream = list_stream(ssc, [events(), END], SCHEMA, name="events")
    sessions = stream.group_by_key("user").flat_map_groups_with_state(
        make_running_total(os.path.abspath(args.calls), blocked_partitions()),
        state_schema=STATE_SCHEMA, output_schema=OUTPUT_SCHEMA, name="sessions", num_partitions=PARTITIONS)
    sessions.write_files(args.out, format="parquet", name="out")
    ssc.start()
    say("started")
    while not progress.done.wait(0.5):
        if ssc.await_termination(0.01):  # raises the error that stopped it
            say("stopped before the batch completed")
            sys.exit(1)
    ssc.stop(graceful=True, stop_spark_session=True)
    say("exit")


if __name__ == "__main__":
    main()
