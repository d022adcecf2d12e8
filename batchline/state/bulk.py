"""Timeouts in bulk: a hook for built-in operators whose keys often only time out.

The per-key path calls the state function once per due key, with a ``GroupState`` built for
it and its state decoded into Python values. A built-in operator whose timed-out keys only
drop rows of their state (and emit some of them) can do that for all of a partition's due
keys at once, over the Arrow columns of their entries, by implementing ``TimesOutInBulk``:
the execution engine then hands it every due key that no other call of the batch touched,
as one table, instead of calling it per key. The results must be what the per-key path
would have given for each key, with one simplification: every key it is handed counts as
updated (its state is written, changed or not) unless it is removed.
"""

from __future__ import annotations

import abc
import dataclasses

import pyarrow as pa

__all__ = ["DueKeys", "TimedOut", "TimesOutInBulk"]


@dataclasses.dataclass(frozen=True)
class DueKeys:
    """A partition's due keys of one batch: those whose timer fired and that had no rows and
    no other call in the batch."""

    entries: pa.Table
    """One row per key, in the order the per-key path would call them, in the state files'
    layout (``entries.layout_of``): ``key.*`` columns, ``state.*`` columns, ``__timeout_ms``
    and ``__removed`` (a key that holds a timeout and no state)."""
    watermark_ms: int | None
    """What ``GroupState.current_watermark_ms()`` returns for the batch (None: it raises,
    the pipeline has no watermark)."""
    batch_time: int
    input_ended: bool
    """The inputs have ended: a deadline set now is dropped by the engine, as the per-key
    path drops it."""
    output_schema: pa.Schema
    """The operator's output rows' Arrow schema."""


@dataclasses.dataclass(frozen=True)
class TimedOut:
    """What a bulk timeout did to ``DueKeys``."""

    output: pa.Table
    """The output rows, in ``DueKeys.output_schema``, ordered as the per-key path would emit
    them (key by key, in the due keys' order)."""
    state: pa.Table
    """Per due key, in the same order: the ``state.*`` columns (null where removed),
    ``__timeout_ms`` (the key's new deadline, null: none) and ``__removed``."""


class TimesOutInBulk(abc.ABC):
    """A state function that can time out a partition's due keys at once (``time_out``)."""

    @abc.abstractmethod
    def time_out(self, due: DueKeys) -> TimedOut:
        """The outputs and new entries of every key in ``due``, as the function called per key
        with ``has_timed_out`` and no rows would have left them."""
