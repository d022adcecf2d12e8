"""batchline: fault-tolerant, stateful micro-batch stream processing on Apache Spark."""

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
