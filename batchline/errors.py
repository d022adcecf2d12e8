"""One exception root for batchline; every message says what to do next."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, ClassVar, Self

from batchline.batch_time import format_batch_time

__all__ = [
    "BatchlineError",
    "ConfigurationError",
    "NoOutputOperationError",
    "ContextStateError",
    "BatchFailedError",
    "SparkGoneError",
    "short_cause",
    "error_text",
    "error_chain",
    "SourceError",
    "SinkError",
    "JavaNotFoundError",
    "CheckpointFormatError",
    "CarriedError",
    "DamagedFileError",
    "carried_error_in",
    "MissingBatchParamsError",
    "DuplicateStateKeyError",
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


_CARRIED_START, _CARRIED_END = "<<batchline-error ", " end-batchline-error>>"
_CARRIED = re.compile(re.escape(_CARRIED_START) + r"(\{.*?\})" + re.escape(_CARRIED_END))


def _rebuild(cls: type[CarriedError], attributes: dict[str, Any], carry: bool) -> CarriedError:
    return cls(**attributes, carry=carry)


_CARRIED_TYPES: dict[str, type[CarriedError]] = {}
"""Every CarriedError subclass by name, so that an error carried in any task's failure is found."""


class CarriedError(BatchlineError):
    """An error a Spark task raises that the driver must recognise by its type and attributes.

    Spark hands the driver only the text of a task's error (inside a Py4J error of its own),
    so the message of an error raised with ``carry=True`` ends with its type's name and its
    ``attributes`` as JSON between markers; ``carried_in`` finds them in any error and builds
    the error again, with ``carry=False`` (its message without them). No error is recognised
    by what its message says."""

    attributes: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _CARRIED_TYPES[cls.__name__] = cls

    def __init__(self, message: str, carry: bool) -> None:
        self.carry = carry
        if carry:
            payload = {"type": type(self).__name__, "attributes": self.attribute_values()}
            body = json.dumps(payload, ensure_ascii=True, sort_keys=True)
            body = body.replace("<", "\\u003c").replace(">", "\\u003e")  # the markers never occur inside
            message = f"{message} {_CARRIED_START}{body}{_CARRIED_END}"
        super().__init__(message)

    def attribute_values(self) -> dict[str, Any]:
        """What the error carries across to the driver: JSON values by attribute name."""
        return {name: getattr(self, name) for name in self.attributes}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.attribute_values(), self.carry))

    @classmethod
    def carried_in(cls, error: BaseException) -> Self | None:
        """This type's error as ``error`` is it or carries it in its text (without the
        attributes in its message); else None."""
        if isinstance(error, cls):
            return error if not error.carry else cls(**error.attribute_values(), carry=False)
        for found in _CARRIED.finditer(error_text(error)):
            try:
                payload = json.loads(found.group(1))
            except ValueError:
                continue
            if payload.get("type") == cls.__name__:
                return cls(**payload["attributes"], carry=False)
        return None


class DamagedFileError(CarriedError):
    """A file batchline wrote whose bytes are not those written: its checksum does not match,
    it is cut short, or it is empty. Going on would give a wrong answer, so nothing goes on:
    not retryable (the file stays damaged), and raised in a task with ``carry=True`` so that
    the driver names the file. Subclasses say which file and what going on would have cost."""

    retryable = False
    attributes = ("path", "problem")
    kind: ClassVar[str] = "file"
    consequence: ClassVar[str] = "batchline stops rather than go on with what it cannot verify"
    remedy: ClassVar[str] = "start from a new checkpoint location"

    def __init__(self, path: str, problem: str, carry: bool = True) -> None:
        self.path = path
        self.problem = problem
        super().__init__(
            f"{self.kind} {path} is damaged: {problem}. {self.consequence}. Restore the file from a copy of the "
            f"checkpoint location and start the pipeline again; without a copy, {self.remedy}", carry)


def carried_error_in(error: BaseException) -> CarriedError | None:
    """The first batchline error of any type that ``error`` is or carries in its text (see
    ``CarriedError``), or None: what a failed batch reports instead of Spark's wrapper, whose
    first line says only that a Python worker raised."""
    if isinstance(error, CarriedError):
        return error if not error.carry else type(error)(**error.attribute_values(), carry=False)
    for found in _CARRIED.finditer(str(error)):
        try:
            payload = json.loads(found.group(1))
        except ValueError:
            continue
        cls = _CARRIED_TYPES.get(payload.get("type"))
        if cls is not None:
            return cls(**payload["attributes"], carry=False)
    return None


class MissingBatchParamsError(CarriedError, ConfigurationError):
    """A task of a stateful operator ran without the batch's parameters: its DataFrame was
    evaluated outside the batch's jobs."""

    attributes = ("operator",)

    def __init__(self, operator: str, carry: bool = True) -> None:
        self.operator = operator
        super().__init__(
            f"the job has no batch parameters for stateful operator {operator!r}; its DataFrame was evaluated "
            "outside the batch's jobs, or on a thread other than the one that called the output. Read a stateful "
            "operator's output only from an output operation (foreach_batch and the like), on the thread that "
            "called it; to use a thread of your own there, start it as pyspark.InheritableThread, which carries "
            "the batch's parameters", carry)


class DuplicateStateKeyError(CarriedError, ConfigurationError):
    """A state DataFrame holds a key more than once (the state holds one row per key)."""

    attributes = ("key_repr",)

    def __init__(self, key_repr: str, carry: bool = True) -> None:
        self.key_repr = key_repr
        super().__init__(f"the state DataFrame has key {key_repr} more than once; keep one row for each key", carry)


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


class SparkGoneError(BatchlineError):
    """The Spark the pipeline runs on went away under it (its JVM killed or exited, the
    connection to it refused, its SparkContext stopped): nothing can run or commit any more.
    What was committed stays committed; a new start resumes from the checkpoint."""

    retryable = False

    def __init__(self, why: str, last_committed: int | None, checkpointed: bool) -> None:
        self.why = why
        self.last_committed = last_committed
        done = (f"nothing after batch {format_batch_time(last_committed)} was committed" if last_committed is not None
                else "no batch of this run was committed")
        again = ("start the pipeline again: it resumes from its checkpoint" if checkpointed
                 else "start the pipeline again (it has no checkpoint location, so it starts fresh)")
        super().__init__(f"the Spark JVM is gone ({why}); {done}; {again}")


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then what it was raised from or while handling, once each."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def error_text(error: BaseException) -> str:
    """``str(error)``, or its type's name when that fails or is empty. A Py4J error asks the
    JVM for its text each time it is turned into a string: once the JVM is gone, ``str()``
    raises (connection refused), so nothing on the way to a stop may call it unguarded."""
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 (the JVM that held the text is gone; the type still says what failed)
        text = ""
    return text or type(error).__name__


def short_cause(cause: BaseException) -> str:
    """The useful first line of an error, without the JVM stack trace that Py4J appends."""
    text = error_text(cause).strip() or type(cause).__name__
    if isinstance(cause, BatchlineError):
        return f"{type(cause).__name__}: {text}"  # written for people, with any Python traceback it carries
    first = text.splitlines()[0]
    return f"{type(cause).__name__}: {first}"
