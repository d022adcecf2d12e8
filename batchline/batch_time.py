"""Batch times: epoch milliseconds, printed as ISO time (durations are in ``durations``)."""

from __future__ import annotations

import datetime as _dt

__all__ = ["BatchTime", "format_batch_time"]

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
