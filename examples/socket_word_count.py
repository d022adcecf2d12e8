"""Count words per batch from a TCP socket.

In one terminal:   nc -lk 9999        (then type lines)
In another:        batchline run examples/socket_word_count.py
"""

from pyspark.sql import functions as F

from batchline import StreamingContext
from batchline.spark import local_spark_session

spark = local_spark_session()
ssc = StreamingContext(spark, batch_interval="1s")
lines = ssc.socket_text_stream("127.0.0.1", 9999)
words = lines.select(F.explode(F.split("value", r"\s+")).alias("word")).filter(F.col("word") != "")
counts = words.group_by_key("word").count()
counts.foreach_batch(lambda df, batch_time: print(batch_time, sorted(map(tuple, df.collect()))))
ssc.start()
try:
    ssc.await_termination()
except KeyboardInterrupt:
    ssc.stop(graceful=True)
