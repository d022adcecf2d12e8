"""A bounded stateful pipeline driver for the executor-fault tests, on any master, with its
checkpoint and output on an S3 endpoint.

    python tests/cluster_driver.py MASTER CHECKPOINT_URL OUT_URL STORAGE_OPTIONS_JSON
        [--total N] [--faulty-worker I] [--hold-file PATH] [--hold-at INDEX]

Reads ``N`` generator events (``data`` is ``event-<index>``), groups them by user and numbers
each user's events in index order with a count kept as state: one output row
``{event, user, seq}`` per event. The numbering does not depend on where batches begin and
end, so any correct run writes the same rows; an event lost, a batch applied twice or state
lost shows as a missing, repeated or renumbered row.

``--faulty-worker I``: the state function fails whenever it runs under the standalone test
cluster's worker ``I`` (its ``BATCHLINE_TEST_WORKER``). ``--hold-file PATH --hold-at INDEX``:
once (the file is created exclusively), the task that numbers event ``INDEX`` writes its
executor JVM's pid to PATH after it has numbered the keys before, then waits until that JVM
is gone, for a test to SIGKILL it.

Prints ``started``, then per completed batch ``completed <batch ms> <records> <attempts>
<excluded executor ids, comma-separated, or ->``, and ``finished`` when the pipeline ends.
batchline's log goes to stderr at INFO.
"""

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from batchline import StreamingContext, StreamingListener  # noqa: E402
from batchline.exclusion import ExcludeOnFailure  # noqa: E402
from batchline.scheduler.retry import RetryPolicy  # noqa: E402
from batchline.spark import local_spark_session  # noqa: E402
from tests.cluster import DRIVER_CONF  # noqa: E402
from tests.helpers import exit_with, run_until_finished  # noqa: E402

USERS, SEED = 40, 7
WORKER_ENV = "BATCHLINE_TEST_WORKER"


class Progress(StreamingListener):
    def on_batch_completed(self, info):
        excluded = ",".join(e.executor_id for e in info.excluded_executors) or "-"
        print(f"completed {int(info.batch_time)} {info.num_records} {info.attempts} {excluded}", flush=True)


def executor_jvm_pid() -> int:
    """The executor JVM above this Python worker (a worker forked by the daemon, or the daemon)."""
    pid = os.getpid()
    while pid > 1:
        if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("this Python worker does not run under an executor JVM")


def make_numbering(faulty_worker, hold_file, hold_at):
    def number_events(user, rows, state):
        if faulty_worker is not None and os.environ.get(WORKER_ENV) == faulty_worker:
            raise RuntimeError(f"injected fault: tasks fail on test worker {faulty_worker}")
        (count,) = state.get() if state.exists else (0,)
        for row in sorted(rows, key=lambda r: int(r.data.split("-")[1])):
            index = int(row.data.split("-")[1])
            if hold_file and index == hold_at:
                hold(hold_file)
            count += 1
            yield (row.data, user, count)
        state.update((count,))

    return number_events


def hold(hold_file: str) -> None:
    try:
        fd = os.open(hold_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    jvm = executor_jvm_pid()
    os.write(fd, str(jvm).encode())
    os.close(fd)
    deadline = time.monotonic() + 120
    while Path(f"/proc/{jvm}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(1)  # the executor is gone: nothing reads this worker's answers any more


def numbering_pipeline(spark, checkpoint: str, out: str, options: dict, total: int,
                       number_events) -> StreamingContext:
    """The pipeline the cluster tests (and ``benchmarks.cluster``) run: 400-event batches of the
    generator every 500 ms, numbered per user by ``number_events`` with state in 3 partitions,
    written as JSON; checkpoint and output at ``options``' endpoint."""
    ssc = StreamingContext(spark, "500ms", checkpoint=checkpoint, checkpoint_interval="1s",
                           checkpoint_storage_options=options,
                           retry=RetryPolicy(max_attempts=4, initial_backoff="1s", max_backoff="4s"))
    events = ssc.generator_stream(4000, users=USERS, seed=SEED, partitions=2, max_records_per_batch=400,
                                  total=total)
    numbered = events.group_by_key("id").flat_map_groups_with_state(
        number_events, state_schema="count long", output_schema="event string, user int, seq long",
        name="numbering", num_partitions=3)
    numbered.write_files(out, "json", storage_options=options)
    return ssc


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("master")
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("storage_options")
    parser.add_argument("--total", type=int, default=2400)
    parser.add_argument("--faulty-worker")
    parser.add_argument("--hold-file")
    parser.add_argument("--hold-at", type=int)
    args = parser.parse_args()
    options = json.loads(args.storage_options)

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("batchline").setLevel(logging.INFO)
    spark = local_spark_session(args.master, "cluster-driver", shuffle_partitions=2, conf=DRIVER_CONF,
                                exclude_on_failure=ExcludeOnFailure())
    ssc = numbering_pipeline(spark, args.checkpoint, args.out, options, args.total,
                             make_numbering(args.faulty_worker, args.hold_file, args.hold_at))
    ssc.add_listener(Progress())
    return run_until_finished(ssc, timeout=600)


if __name__ == "__main__":
    exit_with(main)
