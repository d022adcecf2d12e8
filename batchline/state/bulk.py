"""Calls in bulk: hooks for built-in operators whose work on a key is a few Arrow operations.

The per-key path calls the state function once per key, with a ``GroupState`` built for it
and its rows and state decoded into Python values. A built-in operator can instead take all
of a partition's keys of a batch at once, over Arrow columns:

- ``TimesOutInBulk``: its timed-out keys only drop rows of their state (and emit some of
  them); the engine hands it every due key that no other call of the batch touched, as one
  table.
- ``MergesInBulk``: it folds a batch's rows into the keys' state (a built-in aggregation's
  partials, a deduplication's first rows); the engine hands it the batch's rows and the
  entries of every key among them, as tables.

The results must be what the per-key path would have given for each key.
"""

from __future__ import annotations

import abc
import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchline.state.entries import REMOVED_COL, STATE_PREFIX, TIMEOUT_COL

__all__ = ["BulkResult", "DueKeys", "KeyedRows", "MergesInBulk", "TimesOutInBulk", "epoch_ms_column",
           "micros_column", "removing_all", "state_columns"]


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
class KeyedRows:
    """A partition's rows of one batch (late rows dropped) and the entries of their keys."""

    rows: pa.Table
    """The operator's input rows, in the order they came."""
    key_of_row: np.ndarray
    """Per row, the index (int64) of its key in ``entries``."""
    entries: pa.Table
    """One row per key, in the order of the keys' first rows, in the state files' layout; a
    key that holds no state has null ``state.*`` columns and ``__removed`` true."""
    watermark_ms: int | None
    """As ``DueKeys.watermark_ms``."""
    batch_time: int
    """The batch's processing time, as ``GroupState.current_processing_time_ms()``."""
    output_schema: pa.Schema


@dataclasses.dataclass(frozen=True)
class BulkResult:
    """What a call in bulk did to its keys."""

    output: pa.Table
    """The output rows, in the operator's output schema, ordered as the per-key path would
    emit them (key by key, in the order the keys were handed over)."""
    state: pa.Table
    """Per key, in the same order: the ``state.*`` columns (null where removed),
    ``__timeout_ms`` (the key's new deadline, null: none) and ``__removed``."""
    updated: np.ndarray | None = None
    """Per key, whether its state was updated (``GroupState.update``); a key neither updated
    nor removed keeps its stored state (its deadline may change). None: every key not removed
    was updated."""


class TimesOutInBulk(abc.ABC):
    """A state function that can time out a partition's due keys at once (``time_out``)."""

    @abc.abstractmethod
    def time_out(self, due: DueKeys) -> BulkResult:
        """The outputs and new entries of every key in ``due``, as the function called per key
        with ``has_timed_out`` and no rows would have left them."""


class MergesInBulk(abc.ABC):
    """A state function that can take a partition's rows of a batch at once (``merge``)."""

    @property
    def merges_in_bulk(self) -> bool:
        """Whether it can, for this operator (an aggregation of lists, say, cannot)."""
        return True

    @abc.abstractmethod
    def merge(self, keyed: KeyedRows) -> BulkResult:
        """The outputs and new entries of every key in ``keyed``, as the function called per
        key with its rows (and not timed out) would have left them."""


def state_columns(fields: list[pa.Field], stored: list[pa.Array], timeouts: pa.Array,
                  removed: bool | np.ndarray) -> pa.Table:
    """``BulkResult.state``: the ``state.*`` columns ``fields`` from ``stored``, the deadlines
    and whether each key is removed (one answer for all, or one per key)."""
    flags = np.full(len(timeouts), removed) if isinstance(removed, bool) else removed
    columns = [*(c.cast(f.type) for c, f in zip(stored, fields, strict=True)), timeouts, pa.array(flags)]
    return pa.Table.from_arrays(columns, names=[*(f.name for f in fields), TIMEOUT_COL, REMOVED_COL])


def micros_column(times: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Timestamps (of any unit or zone) as epoch microseconds; nulls stay null."""
    return pc.cast(times.cast(pa.timestamp("us", tz="UTC")), pa.int64())


def epoch_ms_column(times: pa.Array) -> pa.Array:
    """Timestamps as epoch milliseconds, rounded down (as ``batch_time.epoch_ms``); nulls stay null."""
    micros = micros_column(times)
    return pa.array(np.floor_divide(micros.fill_null(0).to_numpy(), 1000),
                    mask=micros.is_null().to_numpy(zero_copy_only=False))


def removing_all(entries: pa.Table) -> pa.Table:
    """``BulkResult.state`` that removes every key of ``entries`` (state, deadline and all)."""
    fields = [f for f in entries.schema if f.name.startswith(STATE_PREFIX)]
    keys = entries.num_rows
    return state_columns(fields, [pa.nulls(keys, f.type) for f in fields], pa.nulls(keys, pa.int64()), removed=True)
