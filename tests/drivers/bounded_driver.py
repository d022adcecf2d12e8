"""A bounded pipeline driver for the crash tests: sessions over a fixed set of JSON files.

    python tests/drivers/bounded_driver.py IN OUT CHECKPOINT

Reads the JSON-lines files present under IN at the pipeline's first start (``key``,
``value``, ``ts``), two per batch; groups them into sessions per key with event-time
timeouts (a session closes once its key has had no event for 30 s of event time; sessions
still open when the input ends are closed by the final watermark) and writes one row
``{key, start, end, count, total}`` per closed session to OUT as JSON files. Runs until the
pipeline finished (``run_until_finished``), then prints ``finished`` and exits 0; a restart
on the same CHECKPOINT resumes where a crash left it.

Prints ``started`` once the context started and, per completed batch, ``completed <batch time
ms> <records> <last input file of the batch, or -> <the watermark the operator ran the batch
with, ms, or ->`` (``failed <batch time ms> <why>`` for a batch that failed). batchline's log
goes to stderr at INFO.
"""

import logging
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType  # noqa: E402

from batchline import StreamingContext, StreamingListener  # noqa: E402
from batchline.spark import local_spark_session  # noqa: E402
from batchline.state import GroupStateTimeout  # noqa: E402
from tests.helpers import exit_with, run_until_finished  # noqa: E402

SCHEMA = StructType([StructField("key", StringType()), StructField("value", LongType()),
                     StructField("ts", TimestampType())])
SESSION_GAP = timedelta(seconds=30)
OUTPUT_SCHEMA = "key string, start timestamp, end timestamp, count long, total long"


@dataclass
class Session:
    start: datetime
    end: datetime
    count: int
    total: int


def closed(key, session):
    return {"key": key, "start": session.start, "end": session.end, "count": session.count, "total": session.total}


def sessionize(key, rows, state):
    """One row per session: a gap of more than 30 s of event time between two events of the
    key closes it, whether the gap shows within the data or as the watermark passing it."""
    if state.has_timed_out:
        session = state.get()
        state.remove()
        yield closed(key, session)
        return
    session = state.get_option()
    for row in sorted(rows, key=lambda r: (r.ts, r.value)):  # a batch's rows come in any order
        if session is not None and row.ts - session.end > SESSION_GAP:
            yield closed(key, session)
            session = None
        if session is None:
            session = Session(row.ts, row.ts, 0, 0)
        session = Session(session.start, max(session.end, row.ts), session.count + 1, session.total + row.value)
    state.update(session)
    state.set_timeout_timestamp(session.end + SESSION_GAP)


class Progress(StreamingListener):
    def on_batch_completed(self, info):
        if info.failure is not None:
            print(f"failed {int(info.batch_time)} {info.failure}", flush=True)
            return
        files = [f for i in info.input_infos.values() for f in i.metadata.get("files", ())]
        last = max((f.rsplit("/", 1)[-1] for f in files), default="-")
        progress = info.state_operators.get("sessions")
        watermark = progress.watermark_ms if progress is not None and progress.watermark_ms is not None else "-"
        print(f"completed {int(info.batch_time)} {info.num_records} {last} {watermark}", flush=True)


def main() -> int:
    incoming, out, checkpoint = sys.argv[1:4]
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("batchline").setLevel(logging.INFO)
    spark = local_spark_session("local[2]", "bounded-driver", shuffle_partitions=2)
    ssc = StreamingContext(spark, "200ms", checkpoint=checkpoint, checkpoint_interval="1s")
    ssc.add_listener(Progress())
    events = ssc.file_stream(incoming, "json", SCHEMA, bounded=True, max_files_per_batch=2)
    sessions = (events.with_watermark("ts", "10s").group_by_key("key")
                .flat_map_groups_with_state(sessionize, state_schema=Session, output_schema=OUTPUT_SCHEMA,
                                            timeout=GroupStateTimeout.EVENT_TIME, name="sessions", num_partitions=4))
    sessions.write_files(out, "json")
    return run_until_finished(ssc)


if __name__ == "__main__":
    exit_with(main)
