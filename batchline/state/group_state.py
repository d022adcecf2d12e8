"""The state of one key inside ``map_groups_with_state`` (SPEC D1).

Mirrors Spark's GroupState with snake_case names, durations as text ("1 minute"), and an
error for every misuse that says what to do instead.
"""

from __future__ import annotations

import datetime as _dt
import enum
import functools
from typing import Generic, TypeVar

from batchline.batch_time import format_batch_time
from batchline.durations import parse_duration_ms
from batchline.errors import BatchlineError, ConfigurationError

__all__ = ["GroupState", "GroupStateTimeout", "NoStateError", "TimeoutNotEnabledError", "NO_TIMESTAMP"]

S = TypeVar("S")
NO_TIMESTAMP = -1


@functools.lru_cache(maxsize=256)
def _parse_text_duration(text: str) -> int:
    # Called for every key of every batch, nearly always with the same text.
    return parse_duration_ms(text, "timeout duration")


class GroupStateTimeout(enum.Enum):
    NO_TIMEOUT = "no_timeout"
    PROCESSING_TIME = "processing_time"
    EVENT_TIME = "event_time"


class NoStateError(BatchlineError, LookupError):
    """``get()`` on a key that has no state."""


class TimeoutNotEnabledError(BatchlineError, RuntimeError):
    """A timeout call that the operator's timeout kind does not allow."""


class GroupState(Generic[S]):
    """What a state function sees of its key's state.

    ``processing_time_ms`` is the batch's time, the same for every key and every retry of
    the batch; ``watermark_ms`` is the event-time watermark, or None without one.
    """

    def __init__(
        self,
        value: S | None,
        timeout: GroupStateTimeout,
        processing_time_ms: int,
        watermark_ms: int | None = None,
        has_timed_out: bool = False,
        timeout_timestamp_ms: int = NO_TIMESTAMP,
    ) -> None:
        self._value = value
        self._timeout = timeout
        self._processing_time_ms = processing_time_ms
        self._watermark_ms = watermark_ms
        self._has_timed_out = has_timed_out
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
        """Drop the key's state, and its timeout with it."""
        self._value = None
        self.updated, self.removed = False, True
        self.timeout_timestamp_ms = NO_TIMESTAMP

    # ---------------------------------------------------------------- timeouts
    @property
    def has_timed_out(self) -> bool:
        """True when the function is called because the key's timeout passed (no new data)."""
        return self._has_timed_out

    def set_timeout_duration(self, duration: object) -> None:
        """Time the key out ``duration`` ("1 minute", a timedelta, or milliseconds as an int)
        after this batch's processing time, unless it gets data first."""
        if self._timeout is not GroupStateTimeout.PROCESSING_TIME:
            raise TimeoutNotEnabledError(
                "set_timeout_duration needs timeout=GroupStateTimeout.PROCESSING_TIME on the operator; "
                f"this one has {self._timeout.name}"
                + (", use set_timeout_timestamp for event time" if self._timeout is GroupStateTimeout.EVENT_TIME
                   else "")
            )
        duration_ms = duration if isinstance(duration, int) and not isinstance(duration, bool) else None
        if duration_ms is None:
            duration_ms = (_parse_text_duration(duration) if isinstance(duration, str)
                           else parse_duration_ms(duration, "timeout duration"))
        elif duration_ms <= 0:
            raise ConfigurationError(f"timeout duration must be positive; got {duration} ms")
        self.timeout_timestamp_ms = self._processing_time_ms + duration_ms

    def set_timeout_timestamp(self, timestamp: int | _dt.datetime, additional_duration: object | None = None) -> None:
        """Time the key out once the event-time watermark passes ``timestamp`` (epoch ms or an
        datetime; a naive one is UTC, as batchline hands timestamps out) plus ``additional_duration``;
        it cannot lie before the current watermark."""
        if self._timeout is not GroupStateTimeout.EVENT_TIME:
            raise TimeoutNotEnabledError(
                "set_timeout_timestamp needs timeout=GroupStateTimeout.EVENT_TIME on the operator; "
                f"this one has {self._timeout.name}"
                + (", use set_timeout_duration for processing time"
                   if self._timeout is GroupStateTimeout.PROCESSING_TIME else "")
            )
        if isinstance(timestamp, _dt.datetime):
            if timestamp.tzinfo is None:
                timestamp = timestamp.replace(tzinfo=_dt.UTC)
            timestamp_ms = int(timestamp.timestamp() * 1000)
        else:
            timestamp_ms = int(timestamp)
        if additional_duration is not None:
            timestamp_ms += parse_duration_ms(additional_duration, "additional duration")
        if timestamp_ms <= 0:
            raise ConfigurationError(f"timeout timestamp must be a positive epoch time in ms; got {timestamp_ms}")
        if self._watermark_ms is not None and timestamp_ms < self._watermark_ms:
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
        if self._watermark_ms is None:
            raise TimeoutNotEnabledError(
                "there is no event-time watermark; call stream.with_watermark(column, delay) before grouping"
            )
        return self._watermark_ms

    def __repr__(self) -> str:
        return f"GroupState({self._value!r})" if self.exists else "GroupState(<no state>)"
