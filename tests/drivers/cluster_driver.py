"""A bounded stateful pipeline driver for the executor-fault tests, on any master, with its
checkpoint and output on an S3 endpoint.

    python tests/drivers/cluster_driver.py MASTER CHECKPOINT_URL OUT_URL STORAGE_OPTIONS_JSON
        [--total N] [--faulty-worker I] [--hold-file PATH] [--hold-at INDEX] [--input-dir DIR]
        [--conf KEY=VALUE ...]

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

``--input-dir DIR``: the events are the JSON lines files in DIR (``harness.numbering.
write_event_files``), two a batch, counted by batchline as Spark reads them. ``--conf``: more
Spark settings for the session.

Prints ``started``, then per completed batch ``completed <batch ms> <records> <attempts>
<excluded executor ids, comma-separated, or ->`` and per progress record ``progress <batch ms>
<status> <records of the inputs>``, and when the pipeline ends ``stages rerun <n>`` (the Spark
stages that ran more than one attempt: a map stage re-run after a fetch failure) and
``finished``. batchline's log goes to stderr at INFO.
"""

import argparse
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from batchline import StreamingListener  # noqa: E402
from batchline.exclusion import ExcludeOnFailure  # noqa: E402
from batchline.spark import local_spark_session  # noqa: E402
from harness.cluster import DRIVER_CONF  # noqa: E402
from harness.numbering import make_numbering, numbering_pipeline  # noqa: E402
from tests.helpers import exit_with, run_until_finished  # noqa: E402


class Progress(StreamingListener):
    def on_batch_completed(self, info):
        excluded = ",".join(e.executor_id for e in info.excluded_executors) or "-"
        print(f"completed {int(info.batch_time)} {info.num_records} {info.attempts} {excluded}", flush=True)

    def on_progress(self, progress):
        records = sum(i.records for i in progress.inputs)
        print(f"progress {progress.batch_time} {progress.status} {records}", flush=True)


def stages_rerun(spark) -> int:
    """How many of the application's stages Spark ran more than once (a later attempt)."""
    tracker = spark.sparkContext.statusTracker()
    rerun, missing, stage = 0, 0, 0
    while missing < 50:  # stage ids are consecutive; a few may be gone from the status store
        info = tracker.getStageInfo(stage)
        missing = missing + 1 if info is None else 0
        rerun += info is not None and info.currentAttemptId > 0
        stage += 1
    return rerun


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
    parser.add_argument("--input-dir")
    parser.add_argument("--conf", action="append", default=[])
    args = parser.parse_args()
    options = json.loads(args.storage_options)

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("batchline").setLevel(logging.INFO)
    conf = {**DRIVER_CONF, **dict(setting.split("=", 1) for setting in args.conf)}
    spark = local_spark_session(args.master, "cluster-driver", shuffle_partitions=2, conf=conf,
                                exclude_on_failure=ExcludeOnFailure())
    if args.input_dir:
        # What Spark's scheduler did (lost executors, fetch failures, stages re-run) in the driver's log.
        jvm = spark.sparkContext._jvm
        for name in ("org.apache.spark.scheduler.DAGScheduler", "org.apache.spark.scheduler.TaskSetManager"):
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
                name, jvm.org.apache.logging.log4j.Level.INFO)
    ssc = numbering_pipeline(spark, args.checkpoint, args.out, options, args.total,
                             make_numbering(args.faulty_worker, args.hold_file, args.hold_at), args.input_dir)
    ssc.add_listener(Progress())
    code = run_until_finished(ssc, timeout=600)
    print(f"stages rerun {stages_rerun(spark)}", flush=True)
    return code


if __name__ == "__main__":
    exit_with(main)
