"""Durations: "1s", "500 ms", "1 hour 30 minutes", a timedelta or seconds, read as integer milliseconds."""

from __future__ import annotations

import datetime as _dt
import re

from batchline.errors import ConfigurationError

__all__ = ["parse_duration_ms"]

_UNITS_MS = {
    "ms": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
    "week": 604_800_000, "weeks": 604_800_000,
    "month": 31 * 86_400_000, "months": 31 * 86_400_000,  # as Spark counts a month in a timeout: 31 days
}
_PART = re.compile(r"\s*([+-]?\d+(?:\.\d+)?)\s*([a-z]+)")


def _text_ms(text: str, what: str) -> float:
    """"1s", "500 ms", "1 hour 30 minutes", "interval 2 days", "-1 month 31 days 1 second" (the
    parts add up, as in Spark's interval strings)."""
    body = text.strip().lower()
    if body.startswith("interval "):
        body = body[len("interval "):]
    total, position, parts = 0.0, 0, 0
    for match in _PART.finditer(body):
        if match.start() != position or match.group(2) not in _UNITS_MS:
            break
        total += float(match.group(1)) * _UNITS_MS[match.group(2)]
        position, parts = match.end(), parts + 1
    if parts == 0 or body[position:].strip():
        raise ConfigurationError(f"{what} {text!r} is not a duration; write it like '500ms', '1s', '2 minutes', "
                                 "'1 hour 30 minutes'")
    return total


def parse_duration_ms(value: object, what: str = "duration", allow_zero: bool = False) -> int:
    """Read "1s", "500 ms", "1 minute", "1 hour 30 minutes", a timedelta, or a number of seconds
    as milliseconds.

    Raises ConfigurationError for anything else and for values that are not positive (with
    ``allow_zero``: negative).
    """
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be a duration such as '1s'; got {value!r}")
    if isinstance(value, _dt.timedelta):
        ms = value / _dt.timedelta(milliseconds=1)
    elif isinstance(value, (int, float)):
        ms = value * 1000
    elif isinstance(value, str):
        ms = _text_ms(value, what)
    else:
        raise ConfigurationError(
            f"{what} must be a string like '1s', a timedelta or seconds; got {type(value).__name__}"
        )
    if ms != int(ms):
        raise ConfigurationError(f"{what} {value!r} must be a whole number of milliseconds")
    if ms < 0 or (ms == 0 and not allow_zero):
        raise ConfigurationError(f"{what} must be {'zero or more' if allow_zero else 'positive'}; got {value!r}")
    return int(ms)
