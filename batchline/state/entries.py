"""One state partition's keys held as Arrow columns (SPEC E6): what a key's state weighs in a
worker is about what its fields weigh in Arrow, not a Python dict entry and a tuple of
Python objects per key.

Most keys sit untouched most batches, so the bulk of a partition lives in ``base``: an Arrow
table in the state files' own layout (key columns, state columns, timeout, removed), sorted
by a lookup key, with the deadlines beside it as one numpy array. The keys a batch changes go
to ``recent``, a dict of Python values, which the next lookups see first; once it holds a
small share of the partition it is merged into a new base (``compact``). Lookups of a batch's
keys are one vectorized binary search; due timeouts are one vectorized comparison.

An entry is ``(state tuple or None, deadline ms or None)``: a key may hold a timeout and no
state, as Spark keeps a timeout set after ``remove()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchline.state.schema import as_python

__all__ = ["Entry", "StateEntries", "KEY_PREFIX", "STATE_PREFIX", "TIMEOUT_COL", "REMOVED_COL", "rows_table"]

KEY_PREFIX, STATE_PREFIX = "key.", "state."
TIMEOUT_COL, REMOVED_COL = "__timeout_ms", "__removed"

Entry = tuple[tuple[Any, ...] | None, int | None]

_NO_DEADLINE = np.iinfo(np.int64).max
_MIN_RECENT = 1024
_RECENT_SHARE = 32
"""``recent`` is merged into the base once it holds more than 1/32 of the base's keys (and at
least ``_MIN_RECENT``): its Python objects then weigh a few bytes per key of the partition,
and a merge (a copy of the partition) comes every 32nd-of-the-partition changed keys."""
_INTEGER_KEY = (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32())


def rows_table(schema: pa.Schema, rows: Iterable[tuple[Any, tuple[Any, ...] | None, int | None]],
               single_key: bool) -> pa.Table:
    """A table in the state files' layout (``schema``) from (key, state tuple or None, timeout)
    rows: a row without state is marked removed, and keeps its timeout if it has one."""
    keys: list[Any] = []
    states: list[tuple[Any, ...] | None] = []
    timeouts: list[int | None] = []
    for key, value, timeout in rows:
        keys.append(key)
        states.append(value)
        timeouts.append(timeout)
    key_fields = [f for f in schema if f.name.startswith(KEY_PREFIX)]
    state_fields = [f for f in schema if f.name.startswith(STATE_PREFIX)]
    key_columns = [keys] if single_key else (list(map(list, zip(*keys, strict=True))) if keys else
                                             [[] for _ in key_fields])
    width = len(state_fields)
    filled = [s if s is not None else (None,) * width for s in states]
    state_columns = list(map(list, zip(*filled, strict=True))) if filled else [[] for _ in range(width)]
    columns = [pa.array(values, type=field.type)
               for field, values in zip([*key_fields, *state_fields], [*key_columns, *state_columns], strict=True)]
    columns.append(pa.array(timeouts, type=pa.int64()))
    columns.append(pa.array([s is None for s in states], type=pa.bool_()))
    return pa.Table.from_arrays(columns, schema=schema)


class StateEntries:
    """key -> ``Entry`` for one partition: ``get``, ``get_many``, ``update``, ``due``, ``len``."""

    def __init__(self, single_key: bool, schema: pa.Schema | None = None) -> None:
        self._single_key = single_key
        self._schema = schema
        """The files' layout; learnt from the first table when not given."""
        self._base: pa.Table | None = None
        self._order: np.ndarray = np.empty(0, dtype=np.int64)
        """Per base row, its lookup key (the integer key itself, or the key's hash), ascending."""
        self._by_value = False
        """Whether ``_order`` holds the keys themselves (one integer key column, no nulls)."""
        self._order_is_view = False
        """Whether ``_order`` is the base's key column itself (64-bit integer keys)."""
        self._deadlines: np.ndarray | None = None
        """Per base row, its deadline (``_NO_DEADLINE`` for none, or when ``recent`` holds the key)."""
        self._recent: dict[Any, tuple[Entry | None, int]] = {}
        """Changed keys: (entry, or None when removed; the base row it replaces, or -1)."""
        self._base_live = 0
        self._recent_live = 0

    # ---------------------------------------------------------------- reading
    def __len__(self) -> int:
        return self._base_live + self._recent_live

    @property
    def blank(self) -> bool:
        """Whether no key was ever put in (as opposed to every key removed)."""
        return self._base is None and not self._recent

    def get(self, key: Any) -> Entry | None:
        return self.get_many([key]).get(key)

    def get_many(self, keys: Iterable[Any]) -> dict[Any, Entry]:
        """The entries of the keys that have one."""
        found: dict[Any, Entry] = {}
        unseen: list[Any] = []
        for key in keys:
            held = self._recent.get(key)
            if held is None:
                unseen.append(key)
            elif held[0] is not None:
                found[key] = held[0]
        rows = self._rows_of(unseen)
        hit = [(key, row) for key, row in zip(unseen, rows, strict=True) if row >= 0]
        if hit:
            entries = self._entries_at(np.array([row for _, row in hit], dtype=np.int64))
            found.update(zip((key for key, _ in hit), entries, strict=True))
        return found

    def items(self) -> Iterator[tuple[Any, Entry]]:
        """Every key and its entry: the base's in its order, then the recent ones."""
        if self._base is not None and self._base_live:
            live = self._live_rows()
            for start in range(0, len(live), 65_536):
                rows = live[start:start + 65_536]
                yield from zip(self._keys_at(rows), self._entries_at(rows), strict=True)
        for key, (entry, _) in self._recent.items():
            if entry is not None:
                yield key, entry

    def next_deadline(self) -> int | None:
        earliest = _NO_DEADLINE
        if self._deadlines is not None and len(self._deadlines):
            earliest = int(self._deadlines.min())
        for entry, _ in self._recent.values():
            if entry is not None and entry[1] is not None and entry[1] < earliest:
                earliest = entry[1]
        return None if earliest == _NO_DEADLINE else earliest

    def due(self, at_ms: int) -> list[tuple[Any, int]]:
        """The keys whose deadline is at or before ``at_ms``, earliest first (keys sharing a
        deadline in the order of their ``repr``, the same in every process)."""
        due: list[tuple[Any, int]] = []
        if self._deadlines is not None:
            rows = np.flatnonzero(self._deadlines <= at_ms)
            if len(rows):
                due += zip(self._keys_at(rows), self._deadlines[rows].tolist(), strict=True)
        for key, (entry, _) in self._recent.items():
            if entry is not None and entry[1] is not None and entry[1] <= at_ms:
                due.append((key, entry[1]))
        due.sort(key=lambda item: (item[1], repr(item[0])))
        return due

    def table(self) -> pa.Table:
        """Every entry in the files' layout (a snapshot's table). Merges ``recent`` first; the
        table is immutable, so it stays a consistent view while later batches change the keys."""
        self.compact()
        if self._base is None:
            raise ValueError("a partition that never held a key has no table; this is a bug in batchline")
        return self._complete(self._base)

    @property
    def nbytes(self) -> int:
        """Bytes of the base's columns and lookup arrays (``recent``'s Python objects not counted)."""
        held = (0 if self._order_is_view else self._order.nbytes) + (
            self._deadlines.nbytes if self._deadlines is not None else 0)
        return held + (self._base.nbytes if self._base is not None else 0)

    # ---------------------------------------------------------------- changing
    def update(self, changes: Mapping[Any, Entry | None], layout: pa.Schema | None = None) -> None:
        """Apply a batch's changes: an entry, or None (or ``(None, None)``) to remove the key.
        ``layout``: the files' layout, for entries that were never loaded from a table."""
        if self._schema is None and layout is not None:
            self._schema = layout.remove_metadata()
        unseen = [key for key in changes if key not in self._recent]
        for key, row in zip(unseen, self._rows_of(unseen), strict=True):
            self._recent[key] = (None, row)
            if row >= 0:  # the base's row no longer speaks for the key
                self._base_live -= 1
                if self._deadlines is not None:
                    self._deadlines[row] = _NO_DEADLINE
        for key, entry in changes.items():
            if entry is not None and entry[0] is None and entry[1] is None:
                entry = None
            before, row = self._recent[key]
            self._recent_live += (entry is not None) - (before is not None)
            if entry is None and row < 0:
                del self._recent[key]
            else:
                self._recent[key] = (entry, row)
        if len(self._recent) > max(_MIN_RECENT, self._base_live // _RECENT_SHARE):
            self.compact()

    def merge(self, tables: list[pa.Table], into_base: bool = False) -> None:
        """Apply tables in the files' current layout (deltas read from the files, oldest
        first). A large run (or any, ``into_base``) is merged into the base as Arrow, its
        values never made Python objects; a small one goes to ``recent`` like a batch's changes."""
        if not tables:
            return
        if self._schema is None:
            self._schema = tables[0].schema.remove_metadata()
        if self.blank:  # the first table (a snapshot, or the first delta) is the base as it was read
            first = tables[0].replace_schema_metadata(None).cast(self._schema)
            keep = pc.invert(pc.and_(first.column(REMOVED_COL), pc.is_null(first.column(TIMEOUT_COL))))
            self._set_base(first.filter(keep))
            tables = tables[1:]
            if not tables:
                return
        run = pa.concat_tables([t.replace_schema_metadata(None).cast(self._schema) for t in tables])
        keys = self._decode_keys(run)
        newest = {key: row for row, key in enumerate(keys)}  # a key's last row speaks for it
        if len(newest) < run.num_rows:
            run = run.take(pa.array(sorted(newest.values()), type=pa.int64()))
            keys = self._decode_keys(run)
        if into_base or len(newest) > max(_MIN_RECENT, self._base_live // _RECENT_SHARE):
            self.compact()
            keep = pc.invert(pc.and_(run.column(REMOVED_COL), pc.is_null(run.column(TIMEOUT_COL))))
            parts = [run.filter(keep)]
            if self._base is not None:
                replaced = [row for row in self._rows_of(keys) if row >= 0]
                live = np.ones(self._base.num_rows, dtype=bool)
                live[replaced] = False
                parts.insert(0, self._complete(self._base.filter(pa.array(live))))
            self._set_base(pa.concat_tables(parts) if len(parts) > 1 else parts[0])
            return
        states = [as_python(run.column(n)) for n in run.column_names if n.startswith(STATE_PREFIX)]
        values: Iterable[tuple[Any, ...]] = zip(*states, strict=True) if states else ((),) * run.num_rows
        timeouts = run.column(TIMEOUT_COL).to_pylist()
        removed = run.column(REMOVED_COL).to_pylist()
        self.update({key: None if gone and timeout is None else (None if gone else value, timeout)
                     for key, value, timeout, gone in zip(keys, values, timeouts, removed, strict=True)})

    def compact(self) -> None:
        """Merge ``recent`` into a new base."""
        if not self._recent:
            return
        if self._schema is None:
            raise ValueError("state entries without a layout; this is a bug in batchline")
        fresh = [(key, entry) for key, (entry, _) in self._recent.items() if entry is not None]
        added = rows_table(self._schema, ((key, value, deadline) for key, (value, deadline) in fresh),
                           self._single_key)
        parts = [added]
        if self._base is not None:
            kept = self._live_rows()
            base = self._base if len(kept) == self._base.num_rows else self._base.take(pa.array(kept))
            parts.insert(0, self._complete(base))
        merged = pa.concat_tables(parts) if len(parts) > 1 else added
        self._recent, self._recent_live = {}, 0
        self._set_base(merged)

    # ---------------------------------------------------------------- the base
    def _set_base(self, table: pa.Table) -> None:
        keys = [table.column(name) for name in table.column_names if name.startswith(KEY_PREFIX)]
        self._by_value = (self._single_key and keys[0].type in _INTEGER_KEY and keys[0].null_count == 0)
        order = self._lookup_keys(table)
        sort = np.argsort(order, kind="stable")
        if not np.array_equal(sort, np.arange(len(sort))):
            table, order = table.take(pa.array(sort)), order[sort]
        table = table.combine_chunks()
        timeouts = table.column(TIMEOUT_COL)
        self._deadlines = (None if timeouts.null_count == len(timeouts)
                           else pc.fill_null(timeouts, _NO_DEADLINE).to_numpy().copy())
        # A column with nothing in it (no timeouts; no key holding a timeout without state)
        # is not kept: it would weigh as much as a key's state.
        if self._deadlines is None:
            table = table.drop_columns([TIMEOUT_COL])
        if not pc.any(table.column(REMOVED_COL)).as_py():
            table = table.drop_columns([REMOVED_COL])
        self._base = table
        self._order_is_view = self._by_value and keys[0].type == pa.int64() and table.num_rows > 0
        if self._order_is_view:  # the sorted key column itself: no second copy of the keys
            key_name = next(n for n in table.column_names if n.startswith(KEY_PREFIX))
            order = table.column(key_name).chunk(0).to_numpy()
        self._order = np.ascontiguousarray(order, dtype=np.int64)
        self._base_live = table.num_rows

    def _complete(self, table: pa.Table) -> pa.Table:
        """``table`` with the columns the base leaves out when empty, in the files' layout."""
        if TIMEOUT_COL not in table.column_names:
            table = table.append_column(pa.field(TIMEOUT_COL, pa.int64()), pa.nulls(table.num_rows, pa.int64()))
        if REMOVED_COL not in table.column_names:
            table = table.append_column(pa.field(REMOVED_COL, pa.bool_()),
                                        pa.array(np.zeros(table.num_rows, dtype=bool)))
        assert self._schema is not None
        return table.select(self._schema.names).cast(self._schema)

    def _lookup_keys(self, table: pa.Table) -> np.ndarray:
        if self._by_value:
            column = table.column(next(n for n in table.column_names if n.startswith(KEY_PREFIX)))
            return pc.cast(column, pa.int64()).to_numpy()
        return np.fromiter((hash(key) for key in self._decode_keys(table)), dtype=np.int64, count=table.num_rows)

    def _rows_of(self, keys: list[Any]) -> list[int]:
        """Each key's row in the base, or -1. Rows ``recent`` speaks for are found too: the
        caller asks only for keys not in ``recent``."""
        if not keys or self._base is None or not len(self._order):
            return [-1] * len(keys)
        if self._by_value:
            if not all(type(key) is int for key in keys):
                return [self._scan(key, hash(key)) if isinstance(key, int) else -1 for key in keys]
            probe = np.array(keys, dtype=np.int64)
        else:
            probe = np.fromiter((hash(key) for key in keys), dtype=np.int64, count=len(keys))
        at = np.searchsorted(self._order, probe)
        inside = at < len(self._order)
        matched = np.zeros(len(keys), dtype=bool)
        matched[inside] = self._order[at[inside]] == probe[inside]
        rows = np.where(matched, at, -1)
        if self._by_value:
            return rows.tolist()
        # Equal hashes are not equal keys: check the key at each row found, and look further
        # along the run of equal hashes when it is another key.
        found = rows.tolist()
        candidates = np.flatnonzero(matched)
        if len(candidates):
            stored = self._keys_at(rows[candidates])
            for index, key in zip(candidates.tolist(), stored, strict=True):
                if key != keys[index]:
                    found[index] = self._scan(keys[index], int(probe[index]))
        return found

    def _scan(self, key: Any, lookup: int) -> int:
        start = int(np.searchsorted(self._order, lookup, side="left"))
        end = int(np.searchsorted(self._order, lookup, side="right"))
        if self._by_value:
            return start if start < end else -1
        for row, stored in zip(range(start, end), self._keys_at(np.arange(start, end)), strict=True):
            if stored == key:
                return row
        return -1

    def _live_rows(self) -> np.ndarray:
        """The base rows ``recent`` does not speak for."""
        assert self._base is not None
        replaced = [row for _, row in self._recent.values() if row >= 0]
        live = np.ones(self._base.num_rows, dtype=bool)
        live[replaced] = False
        return np.flatnonzero(live)

    def _keys_at(self, rows: np.ndarray) -> list[Any]:
        assert self._base is not None
        return self._decode_keys(self._base.take(pa.array(rows, type=pa.int64())))

    def _decode_keys(self, table: pa.Table) -> list[Any]:
        columns = [as_python(table.column(n)) for n in table.column_names if n.startswith(KEY_PREFIX)]
        return columns[0] if self._single_key else list(zip(*columns, strict=True))

    def _entries_at(self, rows: np.ndarray) -> list[Entry]:
        assert self._base is not None
        taken = self._base.take(pa.array(rows, type=pa.int64()))
        states = [as_python(taken.column(n)) for n in taken.column_names if n.startswith(STATE_PREFIX)]
        values: Iterable[tuple[Any, ...]] = zip(*states, strict=True) if states else ((),) * len(rows)
        count = len(rows)
        timeouts = taken.column(TIMEOUT_COL).to_pylist() if self._deadlines is not None else [None] * count
        removed = (taken.column(REMOVED_COL).to_pylist() if REMOVED_COL in taken.column_names
                   else [False] * count)
        return [(None if gone else value, timeout)
                for value, timeout, gone in zip(values, timeouts, removed, strict=True)]
