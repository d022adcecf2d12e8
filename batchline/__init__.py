"""batchline: fault-tolerant, stateful micro-batch stream processing on Apache Spark.

Names are imported when first used (``batchline.lazy_names``): a Spark worker that unpickles
a task of batchline's imports only what the task needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from batchline.lazy_names import lazy_names

if TYPE_CHECKING:
    from batchline.api.context import ContextState, StreamingContext
    from batchline.api.stream import KeyedStream, Stream
    from batchline.batch_time import BatchTime
    from batchline.clock import Clock, ManualClock, SystemClock
    from batchline.errors import (
        BatchFailedError,
        BatchlineError,
        ConfigurationError,
        ContextStateError,
        NoOutputOperationError,
        SparkGoneError,
    )
    from batchline.scheduler.listener import BatchInfo, StreamingListener
    from batchline.scheduler.progress import BatchProgress
    from batchline.scheduler.retry import RetryPolicy
    from batchline.sinks.exactly_once import ExactlyOnceSink, WriteAttempt
    from batchline.sinks.sink import BatchContext, PendingCommit, Sink, SinkContext
    from batchline.sources.receiver import Receiver
    from batchline.sources.source import DeadLetter, Source, SourceBatch
    from batchline.state import aggregates
    from batchline.state.aggregation import OutputMode, SessionWindow, TimeWindow, session_window, window
    from batchline.state.join import JoinType, Within

_WHERE = {
    "ContextState": ("batchline.api.context", "ContextState"),
    "StreamingContext": ("batchline.api.context", "StreamingContext"),
    "KeyedStream": ("batchline.api.stream", "KeyedStream"),
    "Stream": ("batchline.api.stream", "Stream"),
    "BatchTime": ("batchline.batch_time", "BatchTime"),
    "Clock": ("batchline.clock", "Clock"),
    "ManualClock": ("batchline.clock", "ManualClock"),
    "SystemClock": ("batchline.clock", "SystemClock"),
    "BatchFailedError": ("batchline.errors", "BatchFailedError"),
    "BatchlineError": ("batchline.errors", "BatchlineError"),
    "ConfigurationError": ("batchline.errors", "ConfigurationError"),
    "ContextStateError": ("batchline.errors", "ContextStateError"),
    "NoOutputOperationError": ("batchline.errors", "NoOutputOperationError"),
    "SparkGoneError": ("batchline.errors", "SparkGoneError"),
    "BatchInfo": ("batchline.scheduler.listener", "BatchInfo"),
    "StreamingListener": ("batchline.scheduler.listener", "StreamingListener"),
    "BatchProgress": ("batchline.scheduler.progress", "BatchProgress"),
    "RetryPolicy": ("batchline.scheduler.retry", "RetryPolicy"),
    "ExactlyOnceSink": ("batchline.sinks.exactly_once", "ExactlyOnceSink"),
    "WriteAttempt": ("batchline.sinks.exactly_once", "WriteAttempt"),
    "BatchContext": ("batchline.sinks.sink", "BatchContext"),
    "PendingCommit": ("batchline.sinks.sink", "PendingCommit"),
    "Sink": ("batchline.sinks.sink", "Sink"),
    "SinkContext": ("batchline.sinks.sink", "SinkContext"),
    "Receiver": ("batchline.sources.receiver", "Receiver"),
    "DeadLetter": ("batchline.sources.source", "DeadLetter"),
    "Source": ("batchline.sources.source", "Source"),
    "SourceBatch": ("batchline.sources.source", "SourceBatch"),
    "aggregates": ("batchline.state.aggregates", ""),
    "OutputMode": ("batchline.state.aggregation", "OutputMode"),
    "SessionWindow": ("batchline.state.aggregation", "SessionWindow"),
    "TimeWindow": ("batchline.state.aggregation", "TimeWindow"),
    "session_window": ("batchline.state.aggregation", "session_window"),
    "window": ("batchline.state.aggregation", "window"),
    "JoinType": ("batchline.state.join", "JoinType"),
    "Within": ("batchline.state.join", "Within"),
}
"""Each public name: the module that defines it, and its name there."""

__all__ = [
    "BatchContext",
    "BatchFailedError",
    "BatchInfo",
    "BatchProgress",
    "BatchTime",
    "BatchlineError",
    "Clock",
    "ConfigurationError",
    "ContextState",
    "ContextStateError",
    "DeadLetter",
    "ExactlyOnceSink",
    "JoinType",
    "KeyedStream",
    "ManualClock",
    "NoOutputOperationError",
    "OutputMode",
    "PendingCommit",
    "Receiver",
    "RetryPolicy",
    "Sink",
    "SessionWindow",
    "SinkContext",
    "Source",
    "SourceBatch",
    "SparkGoneError",
    "Stream",
    "StreamingContext",
    "StreamingListener",
    "SystemClock",
    "TimeWindow",
    "Within",
    "WriteAttempt",
    "aggregates",
    "session_window",
    "window",
]

__version__ = "0.1.0"


__getattr__, __dir__ = lazy_names(__name__, _WHERE, __all__)
