"""Count words per batch from a TCP socket.

In one terminal:   nc -lk 9999        (then type lines)
In another:        batchline run examples/socket_word_count.py -- [PORT [SECONDS [CHECKPOINT]]]

Connects to 127.0.0.1:PORT (default 9999) and prints, for every one-second batch, its time and
each word with its count in that batch, e.g. ``2026-11-23T10:00:01.000Z [('hello', 2),
('world', 1)]``. It runs for SECONDS, or until Ctrl-C, which stops it gracefully. The
checkpoint is kept in CHECKPOINT (default: ``batchline-socket-word-count`` in the system's
temporary folder): received lines are written ahead there before they make a batch.
"""

import sys
import tempfile

from pyspark.sql import functions as F

from batchline import StreamingContext
from batchline.batch_time import format_batch_time
from batchline.spark import local_spark_session

args = [a for a in sys.argv[1:] if a != "--"]
port = int(args[0]) if args else 9999
seconds = float(args[1]) if len(args) > 1 else None
checkpoint = args[2] if len(args) > 2 else f"{tempfile.gettempdir()}/batchline-socket-word-count"


def show(df, batch_time):
    print(format_batch_time(batch_time), sorted(map(tuple, df.collect())), flush=True)


spark = local_spark_session()
ssc = StreamingContext(spark, batch_interval="1s", checkpoint=checkpoint)
lines = ssc.socket_text_stream("127.0.0.1", port)
words = lines.select(F.explode(F.split("value", r"\s+")).alias("word")).filter(F.col("word") != "")
words.group_by_key("word").count().foreach_batch(show)
ssc.start()
if not ssc.await_termination(seconds):  # SECONDS passed; Ctrl-C stops it gracefully before that
    ssc.stop(graceful=True)
