"""Batch times: epoch milliseconds, printed as ISO time (durations are in ``durations``)."""

from __future__ import annotations

import datetime as _dt

__all__ = ["BatchTime", "END_OF_TIME_MS", "epoch_ms", "format_batch_time"]

END_OF_TIME_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: the watermark once every input has ended, so every event-time
timeout fires (Flink's final watermark); still a printable date and a valid Arrow timestamp."""


_EPOCH = _dt.datetime(1970, 1, 1)  # noqa: DTZ001 - batchline hands timestamps out as naive UTC
_MS = _dt.timedelta(milliseconds=1)


def epoch_ms(value: _dt.datetime) -> int:
    """A datetime as epoch milliseconds (rounded down); a naive one is UTC, as batchline hands
    timestamps out."""
    if value.tzinfo is not None:
        value = value.astimezone(_dt.UTC).replace(tzinfo=None)
    return (value - _EPOCH) // _MS


def format_batch_time(ms: int) -> str:
    stamp = _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class BatchTime(int):
    """A batch's time in epoch milliseconds: also its stable id, the same after a restart."""

    @property
    def datetime(self) -> _dt.datetime:
        return _dt.datetime.fromtimestamp(self / 1000, tz=_dt.UTC)

    def __repr__(self) -> str:
        return f"BatchTime({int(self)} = {format_batch_time(self)})"

    def __str__(self) -> str:
        return format_batch_time(self)
