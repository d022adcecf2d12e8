"""One exception root for batchline; every message says what to do next."""

from __future__ import annotations

from typing import ClassVar

from batchline.batch_time import format_batch_time

__all__ = [
    "BatchlineError",
    "ConfigurationError",
    "NoOutputOperationError",
    "ContextStateError",
    "BatchFailedError",
    "short_cause",
    "SourceError",
    "SinkError",
    "JavaNotFoundError",
    "CheckpointFormatError",
]


class BatchlineError(Exception):
    """Root of every error batchline raises on purpose."""

    retryable: ClassVar[bool] = True
    """Whether running a failed batch again may succeed. False for errors that the same input
    raises the same way every time (a bad setting, a bug in a state function): the scheduler
    stops at once instead of retrying (``batchline.scheduler.retry``)."""


class ConfigurationError(BatchlineError, ValueError):
    """A setting is malformed or inconsistent (interval, path, format, ...)."""

    retryable = False


class NoOutputOperationError(ConfigurationError):
    """The pipeline has no output operation, so nothing would ever run."""


class ContextStateError(BatchlineError, RuntimeError):
    """An operation does not fit the streaming context's lifecycle state."""

    retryable = False


class SourceError(BatchlineError):
    """A source could not list, read or receive its input."""


class JavaNotFoundError(ConfigurationError):
    """Spark cannot start: no Java runtime, or one older than Spark needs."""


class CheckpointFormatError(ConfigurationError):
    """A checkpoint was written in a format this release cannot read (a newer release wrote it)."""


class SinkError(BatchlineError):
    """An output could not commit a batch."""


class BatchFailedError(BatchlineError):
    """A job of a batch failed (after ``attempts`` runs of the batch); the pipeline stops and
    the batch is not marked processed, so the next start runs it again."""

    def __init__(self, batch_time: int, job_name: str, cause: BaseException, attempts: int = 1,
                 what: str | None = None) -> None:
        self.batch_time = batch_time
        self.job_name = job_name
        """The name of the input, operator or output whose job failed ("commit" for the commit)."""
        self.cause = cause
        self.attempts = attempts
        detail = short_cause(cause)
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(
            f"batch {format_batch_time(batch_time)} ({batch_time} ms) failed in {what or repr(job_name)}{tries}: "
            f"{detail}. Fix the cause and start the pipeline again: a batch that was not committed runs again."
        )


def short_cause(cause: BaseException) -> str:
    """The useful first line of an error, without the JVM stack trace that Py4J appends."""
    text = str(cause).strip() or type(cause).__name__
    if isinstance(cause, BatchlineError):
        return f"{type(cause).__name__}: {text}"  # written for people, with any Python traceback it carries
    first = text.splitlines()[0]
    return f"{type(cause).__name__}: {first}"
