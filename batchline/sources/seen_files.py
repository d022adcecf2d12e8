"""The files a file source has read, remembered by a watermark on modification time (SPEC E6).

Structured Streaming's ``SeenFilesMap`` (``FileStreamSource.scala``), with the same rules:

- the *watermark* is the newest modification time among the files read;
- after every batch the *horizon* moves to ``watermark - max_file_age`` (never back);
- a file is new when its name was not read before and it was last modified at or after the
  horizon; a file last modified before the horizon is ignored, whether or not it was read;
- names of files modified before the horizon are forgotten: they can never be new again.

So what is remembered is bounded by the files that arrive within ``max_file_age`` of the
newest one, not by the age of the pipeline. Times are whole milliseconds throughout (the
listing's times are floored the same way), so a remembered time and a listed one compare
exactly and a file is never forgotten while it can still be new.

The horizon is kept in the checkpoint: raising ``max_file_age`` later does not bring back
files already forgotten, so none is read twice; it widens what is remembered from then on.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from batchline.errors import ConfigurationError

__all__ = ["SeenFiles", "mtime_ms", "DEFAULT_MAX_FILE_AGE"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_FILE_AGE = "7 days"
"""As Structured Streaming's ``maxFileAge``."""


def mtime_ms(info: dict[str, Any]) -> int:
    """A listing entry's modification time in whole milliseconds (floored), 0 when unknown."""
    for key in ("mtime", "LastModified", "last_modified", "modified", "created"):
        value = info.get(key)
        if value is not None:
            seconds = value.timestamp() if hasattr(value, "timestamp") else float(value)
            return math.floor(seconds * 1000)
    return 0


@dataclass
class SeenFiles:
    """Names read and their modification times, for those at or after the horizon."""

    max_age_ms: int
    files: dict[str, int] = field(default_factory=dict)
    """Name to modification time (ms) of every remembered file (the reader's names: a file's
    base name, which keeps the checkpoint small)."""
    watermark_ms: int | None = None
    """The newest modification time among the files read; None before the first."""
    horizon_ms: int | None = None
    """Files modified before it are ignored; None until the first purge."""
    _expiry: list[tuple[int, str]] = field(default_factory=list, repr=False)
    """A min-heap of (time, name), so a purge pops what expired instead of scanning every name."""

    def __post_init__(self) -> None:
        if self.max_age_ms < 0:
            raise ConfigurationError(f"max_file_age must be zero or more; got {self.max_age_ms} ms")
        self._expiry = [(t, name) for name, t in self.files.items()]
        heapq.heapify(self._expiry)

    def __contains__(self, name: object) -> bool:
        return name in self.files

    def __len__(self) -> int:
        return len(self.files)

    def too_old(self, modified_ms: int) -> bool:
        """Whether a file modified then is ignored: before the horizon."""
        return self.horizon_ms is not None and modified_ms < self.horizon_ms

    def is_new(self, name: str, modified_ms: int) -> bool:
        return name not in self.files and not self.too_old(modified_ms)

    def add(self, name: str, modified_ms: int) -> None:
        """Remember a file read (again after a restart: its time stays the larger one)."""
        known = self.files.get(name)
        if known is not None and known >= modified_ms:
            return
        self.files[name] = modified_ms
        heapq.heappush(self._expiry, (modified_ms, name))
        if self.watermark_ms is None or modified_ms > self.watermark_ms:
            self.watermark_ms = modified_ms

    def purge(self) -> list[str]:
        """Move the horizon to ``watermark - max_age`` (never back) and forget the names of
        files modified before it; returns those names."""
        if self.watermark_ms is None:
            return []
        horizon = self.watermark_ms - self.max_age_ms
        if self.horizon_ms is not None and horizon <= self.horizon_ms:
            return []
        return self.start_at(horizon)

    def start_at(self, horizon_ms: int) -> list[str]:
        """Put the horizon at ``horizon_ms`` and forget the names of files modified before it
        (a checkpoint converted from an older layout may keep a lower one until its first batch)."""
        self.horizon_ms = horizon = horizon_ms
        forgotten: list[str] = []
        while self._expiry and self._expiry[0][0] < horizon:
            modified, name = heapq.heappop(self._expiry)
            if self.files.get(name) == modified:  # else a stale entry of a name re-added later
                del self.files[name]
                forgotten.append(name)
        return forgotten

    # ---------------------------------------------------------------- checkpoint
    def to_json(self) -> dict[str, Any]:
        return {"watermark_ms": self.watermark_ms, "horizon_ms": self.horizon_ms, "files": dict(self.files)}

    @classmethod
    def from_json(cls, payload: dict[str, Any], max_age_ms: int, purge: bool = True) -> SeenFiles:
        """The files remembered in ``payload``; without ``purge`` its horizon is kept as it is
        until the next batch (one converted from an older checkpoint chose it)."""
        files = {str(name): int(t) for name, t in dict(payload.get("files", {})).items()}
        seen = cls(max_age_ms, files, _optional_int(payload.get("watermark_ms")),
                   _optional_int(payload.get("horizon_ms")))
        if purge:
            seen.purge()  # a smaller max_file_age than the last run's takes effect at once
        return seen


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
