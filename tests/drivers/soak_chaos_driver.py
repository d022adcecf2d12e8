"""The driver of the chaos soak (tests/cluster/soak_chaos.py): JSON files in, numbered per user
with a count kept as state, Parquet out; checkpoint and output on an S3 endpoint.

    python tests/drivers/soak_chaos_driver.py MASTER INCOMING CHECKPOINT_URL OUT_URL STORAGE_OPTIONS_JSON

Each input file holds events ``{event, user, index}`` with indexes after the previous file's;
a batch takes at most 16 files, in the order they came. Each user's events are numbered in index
order (``seq``), one output row ``{event, user, seq}`` per event, so any correct run writes the
same rows: an event lost, a batch applied twice or state lost shows as a missing, repeated or
renumbered row.

Prints ``started``, then per completed batch ``completed <batch ms> <records> <attempts>``.
batchline's log goes to stderr at INFO. Runs until killed (or SIGTERM: a graceful stop).
"""

import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from batchline import StreamingContext, StreamingListener  # noqa: E402
from batchline.scheduler.retry import RetryPolicy  # noqa: E402
from batchline.spark import local_spark_session  # noqa: E402
from harness.cluster import DRIVER_CONF  # noqa: E402
from tests.helpers import exit_with  # noqa: E402


class Progress(StreamingListener):
    def on_batch_started(self, info):
        print("started", flush=True)

    def on_batch_completed(self, info):
        print(f"completed {int(info.batch_time)} {info.num_records} {info.attempts}", flush=True)


def number_events(user, rows, state):
    (count,) = state.get() if state.exists else (0,)
    for row in sorted(rows, key=lambda r: r.index):
        count += 1
        yield (row.event, user[0] if isinstance(user, tuple) else user, count)
    state.update((count,))


def main() -> int:
    master, incoming, checkpoint, out, options_json = sys.argv[1:6]
    options = json.loads(options_json)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("batchline").setLevel(logging.INFO)
    spark = local_spark_session(master, "soak-chaos-driver", shuffle_partitions=2, conf=DRIVER_CONF)
    # Outages of the S3 endpoint last up to 30 s: retries wait 2, 4, 8, 16 and 16 s.
    ssc = StreamingContext(spark, "1s", checkpoint=checkpoint, checkpoint_interval="2s",
                           checkpoint_storage_options=options, metrics_port=None, dashboard_port=None,
                           retry=RetryPolicy(max_attempts=6, initial_backoff="2s", max_backoff="16s"))
    events = ssc.file_stream(incoming, "json", "event string, user int, index long", settle=0.5,
                             max_files_per_batch=16, name="events")
    numbered = events.group_by_key("user").flat_map_groups_with_state(
        number_events, state_schema="count long", output_schema="event string, user int, seq long",
        name="numbering", num_partitions=3)
    numbered.write_files(out, "parquet", storage_options=options, name="out")
    ssc.add_listener(Progress())
    ssc.start()
    ssc.await_termination()
    return 0


if __name__ == "__main__":
    exit_with(main)
