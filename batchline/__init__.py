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
)
from batchline.scheduler.listener import BatchInfo, StreamingListener
from batchline.sources.receiver import Receiver

__all__ = [
    "BatchFailedError",
    "BatchInfo",
    "BatchTime",
    "BatchlineError",
    "Clock",
    "ConfigurationError",
    "ContextState",
    "ContextStateError",
    "KeyedStream",
    "ManualClock",
    "NoOutputOperationError",
    "Receiver",
    "Stream",
    "StreamingContext",
    "StreamingListener",
    "SystemClock",
]

__version__ = "0.1.0"
