"""A driver on ``local[2,2]`` (Spark retries a failed task once) for ``test_one_pass``: a file
source whose first batch's reading task fails once after its rows went through the counting,
so Spark runs the task again. Writes ``result.json``: the failed attempts, each batch's counts
and rows. Usage: task_retry_driver.py INCOMING WORKDIR"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pyspark import TaskContext
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

from batchline import StreamingContext
from batchline.clock import ManualClock
from batchline.spark import local_spark_session
from batchline.testing import BatchRecorder, CollectSink
from tests.spark.test_one_pass import INTERVAL, SCHEMA, START


def main() -> int:
    incoming, work = Path(sys.argv[1]), Path(sys.argv[2])
    marker = work / "failed-once"
    spark = local_spark_session("local[2,2]", "batchline-task-retry", shuffle_partitions=2)

    @F.udf(BooleanType())
    def fails_once(value: int) -> bool:
        if TaskContext.get().attemptNumber() == 0:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return True
            raise RuntimeError("injected: the first attempt of this task fails")
        return True

    clock = ManualClock(START)
    ssc = StreamingContext(spark, INTERVAL / 1000, clock=clock)
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    sink = CollectSink()
    stream = ssc.file_stream(str(incoming), "json", SCHEMA, settle=0, max_files_per_batch=1)
    stream.transform(lambda df: df.where(fails_once("value"))).foreach_batch(sink)
    ssc.start()
    infos = []
    try:
        for i in (1, 2):
            clock.advance(INTERVAL)
            infos.append(recorder.wait_for_batch(START + i * INTERVAL, 120))
    finally:
        ssc.stop()
    assert all(info.failure is None for info in infos), [info.failure for info in infos]
    (work / "result.json").write_text(json.dumps({
        "failed_attempts": int(marker.exists()),
        "counts": [[info.num_records, info.dead_letters] for info in infos],
        "rows": [len(sink.batches.get(info.batch_time, [])) for info in infos],
    }))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
