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
    # As Spark counts a month in a delay or a timeout: 31 days; a year: 12 such months.
    "month": 31 * 86_400_000, "months": 31 * 86_400_000,
    "year": 12 * 31 * 86_400_000, "years": 12 * 31 * 86_400_000,
}
# A number may be quoted, as in SQL's interval literals: "interval '3' day".
_PART = re.compile(r"\s*(?:'([+-]?\d+(?:\.\d+)?)'|([+-]?\d+(?:\.\d+)?))\s*([a-z]+)")
_N = r"(\d+)"
_F = r"(\d+(?:\.\d+)?)"
# SQL's ANSI interval literals, "interval '1 2:3:4' day to second": the quoted fields, in order,
# are the units named (Spark's IntervalUtils).
_ANSI = {
    ("year", "month"): (re.compile(rf"([+-]?){_N}-{_N}"), ("year", "month")),
    ("day", "hour"): (re.compile(rf"([+-]?){_N} {_N}"), ("day", "hour")),
    ("day", "minute"): (re.compile(rf"([+-]?){_N} {_N}:{_N}"), ("day", "hour", "minute")),
    ("day", "second"): (re.compile(rf"([+-]?){_N} {_N}:{_N}:{_F}"), ("day", "hour", "minute", "second")),
    ("hour", "minute"): (re.compile(rf"([+-]?){_N}:{_N}"), ("hour", "minute")),
    ("hour", "second"): (re.compile(rf"([+-]?){_N}:{_N}:{_F}"), ("hour", "minute", "second")),
    ("minute", "second"): (re.compile(rf"([+-]?){_N}:{_F}"), ("minute", "second")),
}
_ANSI_FORM = re.compile(r"'([^']*)'\s+([a-z]+)\s+to\s+([a-z]+)")


def _text_ms(text: str, what: str) -> float:
    """"1s", "500 ms", "1 hour 30 minutes", "interval 2 days", "-1 month 31 days 1 second" (the
    parts add up, as in Spark's interval strings), "interval '3' day", and the ANSI forms such
    as "interval '1 2:3:4' day to second" or "interval '1-2' year to month"."""
    body = text.strip().lower()
    if body.startswith("interval") and body[len("interval"):][:1].isspace():
        body = body[len("interval"):].strip()
    ansi = _ANSI_FORM.fullmatch(body)
    total = _ansi_ms(ansi) if ansi else _parts_ms(body)
    if total is None:
        raise ConfigurationError(f"{what} {text!r} is not a duration; write it like '500ms', '1s', '2 minutes', "
                                 "'1 hour 30 minutes', \"interval '1 2:30:00' day to second\"")
    return total


def _parts_ms(body: str) -> float | None:
    """"1 day 2 hours", "'1' day '2' hours": the parts added up, or None if a part is not one."""
    total, position, parts = 0.0, 0, 0
    for match in _PART.finditer(body):
        number, unit = match.group(1) or match.group(2), match.group(3)
        if match.start() != position or unit not in _UNITS_MS:
            return None
        total += float(number) * _UNITS_MS[unit]
        position, parts = match.end(), parts + 1
    return total if parts and not body[position:].strip() else None


def _ansi_ms(form: re.Match[str]) -> float | None:
    """An ANSI interval's milliseconds, or None when its fields do not fit the units it names."""
    fields, start, end = form.groups()
    known = _ANSI.get((start, end))
    if known is None:
        return None
    pattern, units = known
    values = pattern.fullmatch(fields.strip())
    if values is None:
        return None
    sign, *numbers = values.groups()
    total = sum(float(n) * _UNITS_MS[u] for n, u in zip(numbers, units, strict=True))
    return -total if sign == "-" else total


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
