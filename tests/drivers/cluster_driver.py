"""A bounded stateful pipeline driver for the executor-fault tests, on any master, with its
checkpoint and output on an S3 endpoint.

    python tests/drivers/cluster_driver.py MASTER CHECKPOINT_URL OUT_URL STORAGE_OPTIONS_JSON
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
