"""How a failed batch is retried: exponential backoff on the injected clock (SPEC H3).

A batch whose job fails is run again, whole, after a wait that grows by ``multiplier`` from
``initial_backoff`` up to ``max_backoff``, until ``max_attempts`` runs in all; then the
pipeline stops with ``BatchFailedError`` and the batch stays uncommitted, so the next start
runs it again. Re-running is safe because every job of a batch is idempotent per batch time:
outputs commit a batch exactly once, state deltas of an uncommitted batch are rewritten.

Which failures are worth a retry: a lost executor or Python worker, a fetch failure, a sink
whose store was briefly unreachable, an output function whose database timed out. Which are
not: a failure that the same input produces the same way every time, where waiting only delays
the stop. :func:`is_deterministic` knows batchline's own errors that say so
(``retryable = False``: bad settings, a state function that raised for a key, a driver that
lost its checkpoint lease) and Spark's ``AnalysisException`` (a query that cannot be planned);
``no_retry_on`` adds your own exception types. A failed commit (after every job succeeded) is
never retried by the scheduler: its marker may already be written, and a fenced driver must
stop; the next start finishes what it left.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.errors import AnalysisException

from batchline.checkpoint.lease import FencedError
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError, error_chain

__all__ = ["RetryPolicy", "is_deterministic"]

_DETERMINISTIC: tuple[type[BaseException], ...] = (AnalysisException, FencedError)
"""Errors from outside ``batchline.errors`` that a retry would only repeat: a query Spark
cannot analyse, and a driver whose lease another driver took (it must not commit anything)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and after which waits a failed batch runs again.

    ``max_attempts`` counts every run of the batch, the first one included (1: never retry).
    The wait after the k-th failed run is ``initial_backoff * multiplier ** (k - 1)``, at most
    ``max_backoff``; durations are written like ``"5s"``, a timedelta, or seconds. The default
    runs a batch up to 4 times, waiting 5 s, 10 s and 20 s: 35 s of waiting in all.
    ``no_retry_on``: exception types (yours) that stop the pipeline at the first failure.
    """

    max_attempts: int = 4
    initial_backoff: object = "5s"
    multiplier: float = 2.0
    max_backoff: object = "30s"
    no_retry_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigurationError(
                f"max_attempts counts every run of a failed batch, the first included, so it is a whole number of "
                f"at least 1 (1 never retries); got {self.max_attempts!r}")
        if isinstance(self.multiplier, bool) or not isinstance(self.multiplier, (int, float)) or self.multiplier < 1:
            raise ConfigurationError(
                f"the backoff multiplier must be a number of at least 1 (1 waits the same every time, 2 doubles "
                f"the wait); got {self.multiplier!r}")
        if self.max_backoff_ms < self.initial_backoff_ms:
            raise ConfigurationError(
                f"max_backoff ({self.max_backoff!r}) is shorter than initial_backoff ({self.initial_backoff!r}); "
                "make it at least as long")
        if not isinstance(self.no_retry_on, tuple) or not all(
                isinstance(t, type) and issubclass(t, BaseException) for t in self.no_retry_on):
            raise ConfigurationError(
                f"no_retry_on is a tuple of exception classes, e.g. (MyValidationError,); got {self.no_retry_on!r}")

    @classmethod
    def never(cls) -> RetryPolicy:
        """No retry: the first failure stops the pipeline."""
        return cls(max_attempts=1)

    @property
    def initial_backoff_ms(self) -> int:
        return parse_duration_ms(self.initial_backoff, "initial backoff")

    @property
    def max_backoff_ms(self) -> int:
        return parse_duration_ms(self.max_backoff, "max backoff")

    def backoff_ms(self, failed_attempt: int) -> int:
        """The wait after run number ``failed_attempt`` (1-based) failed."""
        if failed_attempt < 1:
            raise ValueError(f"attempts are counted from 1; got {failed_attempt}")
        wait = self.initial_backoff_ms * self.multiplier ** (failed_attempt - 1)
        return int(min(wait, self.max_backoff_ms))

    def backoffs_ms(self) -> list[int]:
        """Every wait, in order, of a batch that fails all ``max_attempts`` runs."""
        return [self.backoff_ms(k) for k in range(1, self.max_attempts)]

    def should_retry(self, error: BaseException, failed_attempt: int) -> bool:
        """Whether run number ``failed_attempt`` failing with ``error`` earns another run."""
        if failed_attempt >= self.max_attempts or not isinstance(error, Exception) or is_deterministic(error):
            return False  # not an Exception: KeyboardInterrupt, SystemExit, ... stop at once
        return not any(isinstance(e, self.no_retry_on) for e in error_chain(error))


def is_deterministic(error: BaseException) -> bool:
    """True when ``error`` or an error it was raised from says a retry would fail the same way."""
    return any(isinstance(e, _DETERMINISTIC) or getattr(e, "retryable", True) is False for e in error_chain(error))
