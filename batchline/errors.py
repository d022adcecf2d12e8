"""One exception root for batchline; every message says what to do next."""

from __future__ import annotations

from batchline.batch_time import format_batch_time

__all__ = [
    "BatchlineError",
    "ConfigurationError",
    "NoOutputOperationError",
    "ContextStateError",
    "BatchFailedError",
    "SourceError",
    "SinkError",
    "JavaNotFoundError",
]


class BatchlineError(Exception):
    """Root of every error batchline raises on purpose."""


class ConfigurationError(BatchlineError, ValueError):
    """A setting is malformed or inconsistent (interval, path, format, ...)."""


class NoOutputOperationError(ConfigurationError):
    """The pipeline has no output operation, so nothing would ever run."""


class ContextStateError(BatchlineError, RuntimeError):
    """An operation does not fit the streaming context's lifecycle state."""


class SourceError(BatchlineError):
    """A source could not list, read or receive its input."""


class JavaNotFoundError(ConfigurationError):
    """Spark cannot start: no Java runtime, or one older than Spark needs."""


class SinkError(BatchlineError):
    """An output could not commit a batch."""


class BatchFailedError(BatchlineError):
    """A job of a batch failed; the pipeline stops and the batch is not marked processed."""

    def __init__(self, batch_time: int, job_name: str, cause: BaseException) -> None:
        self.batch_time = batch_time
        self.job_name = job_name
        self.cause = cause
        detail = _short_cause(cause)
        super().__init__(
            f"batch {format_batch_time(batch_time)} ({batch_time} ms) failed in output "
            f"'{job_name}': {detail}. Fix the cause and start the pipeline again."
        )


def _short_cause(cause: BaseException) -> str:
    """The useful first line of an error, without the JVM stack trace that Py4J appends."""
    text = str(cause).strip() or type(cause).__name__
    if isinstance(cause, BatchlineError):
        return f"{type(cause).__name__}: {text}"  # written for people, with any Python traceback it carries
    first = text.splitlines()[0]
    return f"{type(cause).__name__}: {first}"
