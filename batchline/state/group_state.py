"""The state of one key inside ``map_groups_with_state`` (SPEC D1).

Mirrors Spark's GroupState with snake_case names, durations as text ("1 minute") or numbers
of milliseconds, and an error for every misuse that says what to do instead. Where it
deliberately differs from Spark, the README's "Coming from Structured Streaming" says so.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import enum
import functools
import math
import numbers
from typing import Generic, TypeVar

from batchline.batch_time import END_OF_TIME_MS, format_batch_time
from batchline.durations import parse_duration_ms
from batchline.errors import BatchlineError, ConfigurationError

__all__ = ["AtEnd", "GroupState", "GroupStateTimeout", "NoStateError", "TimeoutNotEnabledError", "NO_TIMESTAMP",
           "last_due"]

S = TypeVar("S")
NO_TIMESTAMP = -1


@functools.lru_cache(maxsize=256)
def _parse_text_duration(text: str, what: str, allow_zero: bool) -> int:
    # Called for every key of every batch, nearly always with the same text.
    return parse_duration_ms(text, what, allow_zero)


class GroupStateTimeout(enum.Enum):
    NO_TIMEOUT = "no_timeout"
    PROCESSING_TIME = "processing_time"
    EVENT_TIME = "event_time"


class AtEnd(enum.Enum):
    """What processing-time timeouts do once every input has ended (event-time ones all fire)."""

    KEEP = "keep"
    """Keep the keys and their timeouts for a later run."""
    TIME_OUT = "time_out"
    """Time every key out before the pipeline finishes."""


def last_due(timeout: GroupStateTimeout, batch_time: int, watermark_ms: int | None, end_of_input: bool) -> int | None:
    """The latest deadline that fires in a batch; None when no timer can fire.

    - Processing time: a deadline at or before the batch time. Batch times sit on the
      interval's grid, and so do deadlines set from them, so the batch at a deadline is the
      first to start once the deadline has passed on the wall clock. Spark fires strictly
      before the trigger's timestamp, which lands a few ms after the grid: the same batch,
      or one interval later when the opening batch's timestamp landed later than this one's.
    - Event time: strictly before the watermark, as in Spark.
    - At the inputs' end (a bounded pipeline's drain): every timer.
    """
    if timeout is GroupStateTimeout.NO_TIMEOUT:
        return None
    if end_of_input:
        return END_OF_TIME_MS
    if timeout is GroupStateTimeout.PROCESSING_TIME:
        return batch_time
    return None if watermark_ms is None else watermark_ms - 1


class NoStateError(BatchlineError, LookupError, ValueError):
    """``get()`` on a key that has no state. A ``ValueError`` too, as PySpark raises one there."""


class TimeoutNotEnabledError(BatchlineError, RuntimeError):
    """A timeout call that the operator's timeout kind does not allow."""


_SPARK_NAMES = {
    "getOption": "get_option()", "hasTimedOut": "has_timed_out (a property)",
    "setTimeoutDuration": "set_timeout_duration(...)", "setTimeoutTimestamp": "set_timeout_timestamp(...)",
    "getCurrentWatermarkMs": "current_watermark_ms()", "getCurrentProcessingTimeMs": "current_processing_time_ms()",
    "getTimeoutTimestampMs": "timeout_timestamp_ms (read by the operator; -1 for none)",
    "isUpdated": "updated", "isRemoved": "removed",
}


def _whole_ms(number: numbers.Real | decimal.Decimal) -> int:
    """Milliseconds as a whole number: a fraction rounds up, so a timeout is never early."""
    return int(number) if isinstance(number, numbers.Integral) else math.ceil(float(number))


def timeout_duration_ms(duration: object, what: str, allow_zero: bool = False) -> int:
    """A timeout duration as whole milliseconds: a number is milliseconds (as PySpark reads it),
    a string a duration such as "2 seconds" or "1 hour 30 minutes" (as Spark's interval strings,
    a month 31 days), a timedelta as it is; anything else is refused. Positive, or with
    ``allow_zero`` at least zero."""
    if type(duration) is str:  # the usual case, first: the number checks below go through ABCs
        return _parse_text_duration(duration, what, allow_zero)
    least = "zero or more" if allow_zero else "positive"
    if isinstance(duration, bool):
        raise ConfigurationError(f"{what} is milliseconds (a number) or a duration such as '2 seconds'; got "
                                 f"{duration!r}")
    if isinstance(duration, (numbers.Real, decimal.Decimal)):  # Decimal is a number, not a numbers.Real
        value = float(duration)
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise ConfigurationError(f"{what} must be a {least}, finite number of milliseconds; got {duration!r}")
        return _whole_ms(duration)
    if isinstance(duration, str):
        return _parse_text_duration(duration, what, allow_zero)
    if isinstance(duration, _dt.timedelta):
        return parse_duration_ms(duration, what, allow_zero)
    raise ConfigurationError(f"{what} is milliseconds (a number) or a duration such as '2 seconds'; got "
                             f"{type(duration).__name__} {duration!r}")


class GroupState(Generic[S]):
    """What a state function sees of its key's state.

    ``processing_time_ms`` is the batch's time, the same for every key and every retry of
    the batch; ``watermark_ms`` is the event-time watermark (0 before any event time was
    seen), or None in a pipeline without ``with_watermark``. ``input_ended``: the batch that
    times every key out once the inputs have ended (SPEC G3); a timeout set then is dropped,
    as no later batch could fire it.
    """

    def __init__(
        self,
        value: S | None,
        timeout: GroupStateTimeout,
        processing_time_ms: int,
        watermark_ms: int | None = None,
        has_timed_out: bool = False,
        timeout_timestamp_ms: int = NO_TIMESTAMP,
        input_ended: bool = False,
    ) -> None:
        # As Spark's GroupStateImpl.createForStreaming refuses them (SPARK-35800), for functions
        # unit-tested with a GroupState built by hand.
        if processing_time_ms < 0 or (watermark_ms is not None and watermark_ms < 0):
            raise ConfigurationError(f"processing time ({processing_time_ms} ms) and watermark ({watermark_ms} ms) "
                                     "are epoch milliseconds, 0 or more")
        if has_timed_out and timeout is GroupStateTimeout.NO_TIMEOUT:
            raise TimeoutNotEnabledError("a key cannot have timed out under NO_TIMEOUT; give the GroupState "
                                         "the operator's timeout kind")
        self._value = value
        self._timeout = timeout
        self._processing_time_ms = processing_time_ms
        self._watermark_ms = watermark_ms
        self._has_timed_out = has_timed_out
        self._input_ended = input_ended
        """The batch that drains the operator after its inputs ended: a timeout set now is dropped."""
        self.timeout_timestamp_ms = timeout_timestamp_ms
        """The key's deadline (epoch ms), or NO_TIMESTAMP; read by the operator after the call."""
        self.updated = False
        self.removed = False

    # ---------------------------------------------------------------- value
    @property
    def exists(self) -> bool:
        return self._value is not None

    def get(self) -> S:
        if self._value is None:
            raise NoStateError(
                "this key has no state; check state.exists first, or use state.get_option()"
            )
        return self._value

    def get_option(self) -> S | None:
        return self._value

    def update(self, value: S) -> None:
        if value is None:
            raise ValueError("state.update(None) is not allowed; call state.remove() to drop the key's state")
        self._value = value
        self.updated, self.removed = True, False

    def remove(self) -> None:
        """Drop the key's state. A timeout set in this call stays, as in Spark: the key is
        called again when it passes, with ``has_timed_out`` true and no state."""
        self._value = None
        self.updated, self.removed = False, True

    # ---------------------------------------------------------------- timeouts
    @property
    def has_timed_out(self) -> bool:
        """True when the function is called because the key's timeout passed (no new data)."""
        return self._has_timed_out

    def set_timeout_duration(self, duration: object) -> None:
        """Time the key out ``duration`` after this batch's processing time, unless it gets data
        first. A number is milliseconds, as in PySpark (``1500`` and ``1500.0`` alike; a
        fraction rounds up to the next millisecond); a string is a duration ("1 minute",
        "500 ms"); a ``timedelta`` is taken as it is. The key need not have state: a timeout
        without state calls the function again with ``has_timed_out`` true and no state."""
        if self._timeout is not GroupStateTimeout.PROCESSING_TIME:
            raise TimeoutNotEnabledError(
                "set_timeout_duration needs timeout=GroupStateTimeout.PROCESSING_TIME on the operator; "
                f"this one has {self._timeout.name}"
                + (", use set_timeout_timestamp for event time" if self._timeout is GroupStateTimeout.EVENT_TIME
                   else "")
            )
        self.timeout_timestamp_ms = self._processing_time_ms + timeout_duration_ms(duration, "timeout duration")

    def set_timeout_timestamp(self, timestamp: float | _dt.datetime, additional_duration: object | None = None) -> None:
        """Time the key out once the event-time watermark passes ``timestamp`` (epoch ms or a
        datetime; a naive one is UTC, as batchline hands timestamps out) plus ``additional_duration``
        (read as ``set_timeout_duration`` reads durations); it cannot lie before the current
        watermark. The key need not have state, as in Spark."""
        if self._timeout is not GroupStateTimeout.EVENT_TIME:
            raise TimeoutNotEnabledError(
                "set_timeout_timestamp needs timeout=GroupStateTimeout.EVENT_TIME on the operator; "
                f"this one has {self._timeout.name}"
                + (", use set_timeout_duration for processing time"
                   if self._timeout is GroupStateTimeout.PROCESSING_TIME else "")
            )
        if type(timestamp) is int:  # the usual case, first: the checks below cost more than the call
            timestamp_ms = timestamp
        elif isinstance(timestamp, _dt.datetime):
            if timestamp.tzinfo is None:
                timestamp = timestamp.replace(tzinfo=_dt.UTC)
            timestamp_ms = int(timestamp.timestamp() * 1000)
        elif isinstance(timestamp, numbers.Real) and not isinstance(timestamp, bool) and math.isfinite(timestamp):
            timestamp_ms = _whole_ms(timestamp)
        else:
            raise ConfigurationError(f"timeout timestamp is epoch milliseconds (a number) or a datetime; got "
                                     f"{type(timestamp).__name__} {timestamp!r}")
        if additional_duration is not None:
            timestamp_ms += timeout_duration_ms(additional_duration, "additional duration", allow_zero=True)
        if timestamp_ms <= 0:
            raise ConfigurationError(f"timeout timestamp must be a positive epoch time in ms; got {timestamp_ms}")
        if self._watermark_ms is not None and timestamp_ms < self._watermark_ms and not self._input_ended:
            raise ConfigurationError(
                f"event-time timeout {format_batch_time(timestamp_ms)} ({timestamp_ms} ms) lies before the current "
                f"watermark {format_batch_time(self._watermark_ms)} ({self._watermark_ms} ms); a key can only time "
                "out at or after the watermark"
            )
        self.timeout_timestamp_ms = timestamp_ms

    # ---------------------------------------------------------------- time
    def current_processing_time_ms(self) -> int:
        """The batch's processing time: the same for every key and every retry of the batch."""
        return self._processing_time_ms

    def current_watermark_ms(self) -> int:
        """The event-time watermark of this batch (epoch ms): 0 until the stream's first event
        time has been seen, as Spark returns in its first micro-batch."""
        if self._watermark_ms is None:
            raise TimeoutNotEnabledError(
                "this pipeline has no event-time watermark; call stream.with_watermark(column, delay) before "
                "grouping to read one"
            )
        return self._watermark_ms

    def __getattr__(self, name: str) -> object:
        # Functions ported from Spark call camelCase names; say which name to use instead.
        ours = _SPARK_NAMES.get(name)
        if ours is None:
            raise AttributeError(f"GroupState has no attribute {name!r}")
        raise AttributeError(f"GroupState has no {name!r}: batchline names it {ours} (snake_case, as listed in "
                             "the README's \"Coming from Structured Streaming\")")

    def __repr__(self) -> str:
        return f"GroupState({self._value!r})" if self.exists else "GroupState(<no state>)"
