"""Where a stream's batches go (SPEC C2): the plug-in interface and the built-in outputs.

- ``sink``: the interface every output implements (``Sink``, with ``SinkContext``,
  ``BatchContext`` and ``PendingCommit``); ``ForeachBatchSink`` wraps a plain function.
- ``exactly_once``: ``ExactlyOnceSink``, the helper for the usual exactly-once shape: tasks
  stage their partitions and return a small message, the driver commits each batch's messages
  once (Spark's ``DataSourceStreamWriter``, with the batch time, output name and fencing token).
- ``files`` (``write_files``) and ``postgres`` (``write_postgres``, its ``COPY`` encoding in
  ``pg_copy``) are built on it; ``console`` prints.

This room sits below the stream model: a sink is handed a DataFrame and a ``BatchContext``
and knows nothing of streams, sources or state (``streams.output`` calls it).
"""

from batchline.sinks.exactly_once import ExactlyOnceSink, WriteAttempt
from batchline.sinks.sink import NO_FENCING_TOKEN, BatchContext, ForeachBatchSink, PendingCommit, Sink, SinkContext

__all__ = [
    "NO_FENCING_TOKEN",
    "BatchContext",
    "ExactlyOnceSink",
    "ForeachBatchSink",
    "PendingCommit",
    "Sink",
    "SinkContext",
    "WriteAttempt",
]
