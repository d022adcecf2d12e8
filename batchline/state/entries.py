"""One state partition's keys held as Arrow columns (SPEC E6): what a key's state weighs in a
worker is about what its fields weigh in Arrow, not a Python dict entry and a tuple of
Python objects per key.

Most keys sit untouched most batches, so the bulk of a partition lives in ``base``: an Arrow
table in the state files' own layout (key columns, state columns, removed), sorted by a
lookup key, with the deadlines beside it as one numpy array (the files' timeout column, held
once: the array finds due keys, and the column is rebuilt from it for a snapshot). The keys
a batch changes go to ``recent``, a dict of Python values, which the next lookups see first;
once it holds a small share of the partition it is merged into a new base (``compact``). Lookups of a batch's
keys are one vectorized binary search; due timeouts are one vectorized comparison.

An entry is ``(state tuple or None, deadline ms or None)``: a key may hold a timeout and no
state, as Spark keeps a timeout set after ``remove()``.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchline.state.schema import as_python

__all__ = ["Entry", "StateEntries", "KEY_PREFIX", "STATE_PREFIX", "TIMEOUT_COL", "REMOVED_COL", "as_entries",
           "codable", "decode_keys", "give_memory_back", "key_codes", "layout_of", "rows_table"]

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
_INT64 = np.iinfo(np.int64)


def give_memory_back() -> None:
    """Return the memory freed after building a partition to the system: Arrow's pool keeps
    freed blocks, and glibc keeps the heap that numpy's large temporaries came from. Without
    this a worker's resident size stays at the peak of its last load."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:  # the C library the process already has loaded
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


UNKNOWN = object()
"""``StateEntries.apply``'s stand-in for a key not decoded yet."""


def layout_of(key_fields: Iterable[pa.Field], state: pa.Schema) -> pa.Schema:
    """The state files' layout: the key columns, the state columns, timeout, removed."""
    return pa.schema([*key_fields, *(f.with_name(STATE_PREFIX + f.name) for f in state),
                      pa.field(TIMEOUT_COL, pa.int64()), pa.field(REMOVED_COL, pa.bool_())])


def decode_keys(table: pa.Table, single_key: bool) -> list[Any]:
    """The keys of a table in the files' layout as Python values (tuples for compound keys)."""
    columns = [as_python(table.column(n)) for n in table.column_names if n.startswith(KEY_PREFIX)]
    return columns[0] if single_key else list(zip(*columns, strict=True))


_CODED = (pa.types.is_integer, pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
          pa.types.is_large_binary, pa.types.is_boolean, pa.types.is_date)


def codable(kind: pa.DataType) -> bool:
    """Whether Arrow tells values of this key type apart as the per-key path's Python keys do:
    not floats (NaN, -0.0), nested types, or timestamps in nanoseconds (Python keys hold
    microseconds)."""
    return any(plain(kind) for plain in _CODED) or (pa.types.is_timestamp(kind) and kind.unit != "ns")


def key_codes(columns: list[pa.Array | pa.ChunkedArray]) -> np.ndarray | None:
    """One int64 per row, equal exactly where the rows' keys (``columns`` side by side) are
    equal as the per-key path's Python keys: each column dictionary-encoded by Arrow, the codes
    combined. None for a type that is not ``codable``, or codes that would not fit in 63 bits."""
    codes: np.ndarray | None = None
    distinct = 1
    for column in columns:
        if not codable(column.type):
            return None
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        encoded = pc.dictionary_encode(column, null_encoding="encode")
        values = max(len(encoded.dictionary), 1)
        if distinct > (1 << 62) // values:
            return None
        indices = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        codes = indices if codes is None else codes * values + indices
        distinct *= values
    return codes


def as_entries(keys: list[Any], values: Iterable[tuple[Any, ...]], table: pa.Table) -> dict[Any, Entry | None]:
    """The rows of a table in the files' layout as changes: an entry, or None (removed, no timeout)."""
    timeouts = table.column(TIMEOUT_COL).to_pylist()
    removed = table.column(REMOVED_COL).to_pylist()
    return {key: None if gone and timeout is None else (None if gone else value, timeout)
            for key, value, timeout, gone in zip(keys, values, timeouts, removed, strict=True)}


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

    def __init__(self, single_key: bool) -> None:
        self._single_key = single_key
        self._schema: pa.Schema | None = None
        """The files' layout, learnt from the first table or change."""
        self._base: pa.Table | None = None
        self._order: np.ndarray = np.empty(0, dtype=np.int64)
        """Per base row, its lookup key (the integer key itself, or the key's hash), ascending."""
        self._by_value = False
        """Whether ``_order`` holds the keys themselves (one integer key column, no nulls)."""
        self._order_is_view = False
        """Whether ``_order`` is the base's key column itself (integer keys, of its own width)."""
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
        if not self._recent:
            unseen = list(keys)
        else:
            for key in keys:
                held = self._recent.get(key)
                if held is None:
                    unseen.append(key)
                elif held[0] is not None:
                    found[key] = held[0]
        rows = self._base_rows(unseen)
        present = rows >= 0
        if present.any():
            entries = self._entries_at(rows[present])
            found.update(zip(itertools.compress(unseen, present.tolist()), entries, strict=True))
        return found

    def locate(self, keys: list[Any]) -> np.ndarray:
        """Each key's base row (int64), or -1: no entry, or one ``recent`` holds."""
        if not self._recent:
            return self._base_rows(keys)
        rows = np.full(len(keys), -1, dtype=np.int64)
        unseen = [at for at, key in enumerate(keys) if key not in self._recent]
        if unseen:
            rows[unseen] = self._base_rows([keys[at] for at in unseen])
        return rows

    def table_of(self, keys: list[Any], rows: np.ndarray | None = None, missing_ok: bool = False,
                 layout: pa.Schema | None = None, key_columns: pa.Table | None = None) -> pa.Table:
        """The entries of ``keys`` in the files' layout, in that order, without decoding the
        base's rows into Python values (the input of a call in bulk); ``rows``: their base
        rows, when located already (``locate``). A key without an entry raises ``KeyError``,
        or with ``missing_ok`` gets a row without state (``__removed``), its key columns
        taken from ``key_columns`` (the keys as Arrow, one row each, in order) when given.
        ``layout``: the files' layout, for entries that never held a key."""
        schema = self._schema or (None if layout is None else layout.remove_metadata())
        if schema is None:
            raise ValueError("state entries without a layout; this is a bug in batchline")
        rows = self.locate(keys) if rows is None else rows
        held: list[tuple[Any, tuple[Any, ...] | None, int | None]] = []
        held_at: list[int] = []
        missing_at: list[int] = []
        for at in np.flatnonzero(rows < 0).tolist():
            key = keys[at]
            found = self._recent.get(key)
            if found is not None and found[0] is not None:
                held.append((key, *found[0]))
                held_at.append(at)
            elif not missing_ok:
                raise KeyError(key)
            else:
                missing_at.append(at)
        if key_columns is None:  # the missing keys without state, encoded from Python
            held += [(keys[at], None, None) for at in missing_at]
            held_at, missing_at = held_at + missing_at, []
        parts, order = [], []
        in_base = np.flatnonzero(rows >= 0)
        if len(in_base):
            assert self._base is not None
            taken = rows[in_base]
            deadlines = None if self._deadlines is None else self._deadlines[taken]
            parts.append(_complete(_with_timeouts(self._base.take(pa.array(taken)), deadlines), schema))
            order.append(in_base)
        if held or not (parts or missing_at):
            parts.append(rows_table(schema, held, self._single_key))
            order.append(np.array(held_at, dtype=np.int64))
        if missing_at:
            assert key_columns is not None
            parts.append(_without_state(key_columns.take(pa.array(missing_at)), schema))
            order.append(np.array(missing_at, dtype=np.int64))
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        asked = np.concatenate(order)
        if (np.diff(asked) < 0).any():  # back in the order asked for
            table = table.take(pa.array(np.argsort(asked, kind="stable")))
        return table

    def due_in_bulk(self, at_ms: int, skip_rows: np.ndarray, skip_keys: Container[Any]
                    ) -> tuple[pa.Table, np.ndarray, list[Any]] | None:
        """The due entries (deadline at or before ``at_ms``) but those of base rows
        ``skip_rows`` and of ``recent`` keys in ``skip_keys``, as a table in the files' layout,
        the base's earliest deadline first, then ``recent``'s, without decoding keys (the input
        of a bulk timeout); with each entry's base row (-1: held by ``recent``) and the keys of
        those ``recent`` holds, in their order. None: nothing is due."""
        rows = np.empty(0, dtype=np.int64)
        if self._deadlines is not None:
            rows = np.flatnonzero(self._deadlines <= at_ms)
            if len(skip_rows) and len(rows):
                rows = rows[~np.isin(rows, skip_rows)]
            rows = rows[np.argsort(self._deadlines[rows], kind="stable")]
        fresh = [(key, entry) for key, (entry, _) in self._recent.items()
                 if entry is not None and entry[1] is not None and entry[1] <= at_ms and key not in skip_keys]
        if not len(rows) and not fresh:
            return None
        assert self._schema is not None, "an entry is due, so the entries have a layout"
        fresh.sort(key=lambda item: cast(int, item[1][1]))
        parts = []
        if len(rows):
            assert self._base is not None and self._deadlines is not None
            parts.append(_complete(_with_timeouts(self._base.take(pa.array(rows)), self._deadlines[rows]),
                                   self._schema))
        if fresh:
            parts.append(rows_table(self._schema, ((key, *entry) for key, entry in fresh), self._single_key))
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        return table, np.concatenate([rows, np.full(len(fresh), -1, dtype=np.int64)]), [key for key, _ in fresh]

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

    def due(self, at_ms: int, skip: Container[Any] = ()) -> list[tuple[Any, int]]:
        """The keys whose deadline is at or before ``at_ms``, earliest first (keys sharing a
        deadline in the order of their ``repr``, the same in every process), but those in
        ``skip`` (the batch's keys with rows: most of them are due, and the order costs a
        ``repr`` each)."""
        due: list[tuple[Any, int]] = []
        if self._deadlines is not None:
            rows = np.flatnonzero(self._deadlines <= at_ms)
            if len(rows):
                due += [(key, deadline) for key, deadline in zip(self._keys_at(rows), self._deadlines[rows].tolist(),
                                                                 strict=True) if key not in skip]
        for key, (entry, _) in self._recent.items():
            if entry is not None and entry[1] is not None and entry[1] <= at_ms and key not in skip:
                due.append((key, entry[1]))
        due.sort(key=lambda item: (item[1], repr(item[0])))
        return due

    def frozen(self) -> Callable[[], pa.Table]:
        """What ``table()`` returns now, built when called (by a snapshot's thread, off the
        task's path): the base is immutable and ``recent`` is copied, so later changes do not
        show in it."""
        schema, single_key, base = self._schema, self._single_key, self._base
        if schema is None:
            raise ValueError("a partition that never held a key has no table; this is a bug in batchline")
        live = self._live_rows() if base is not None and self._base_live < base.num_rows else None
        # Copied now: a later change of a key marks its row's deadline in place.
        deadlines = None if self._deadlines is None else (
            self._deadlines.copy() if live is None else self._deadlines[live])
        fresh = [(key, entry) for key, (entry, _) in self._recent.items() if entry is not None]

        def build() -> pa.Table:
            parts = [rows_table(schema, ((key, value, deadline) for key, (value, deadline) in fresh), single_key)]
            if base is not None:
                rows = base if live is None else base.take(pa.array(live))
                parts.insert(0, _complete(_with_timeouts(rows, deadlines), schema))
            return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

        return build

    def table(self) -> pa.Table:
        """Every entry in the files' layout (a snapshot's table)."""
        return self.frozen()()

    @property
    def nbytes(self) -> int:
        """Bytes of the base's columns and lookup arrays (``recent``'s Python objects not counted)."""
        held = (0 if self._order_is_view else self._order.nbytes) + (
            self._deadlines.nbytes if self._deadlines is not None else 0)
        return held + (self._base.nbytes if self._base is not None else 0)

    # ---------------------------------------------------------------- changing
    def update(self, changes: Mapping[Any, Entry | None], layout: pa.Schema | None = None,
               encoded: pa.Table | None = None) -> None:
        """Apply a batch's changes: an entry, or None (or ``(None, None)``) to remove the key.
        ``layout``: the files' layout, for entries that were never loaded from a table.
        ``encoded``: the same changes in the files' layout, in their order (the delta written):
        many go into the base from it, rather than through ``recent`` and encoded once more."""
        if self._schema is None and layout is not None:
            self._schema = layout.remove_metadata()
        if encoded is not None and self._too_many(len(changes)):
            keys = list(changes)
            self.apply(encoded, self.locate(keys), keys)
            return
        self._change(changes)
        if self._too_many(len(self._recent)):
            self.compact()

    def merge(self, tables: list[pa.Table], into_base: bool = False) -> None:
        """Apply tables in the files' current layout (deltas read from the files, oldest
        first). A large run (or any, ``into_base``) is merged into the base as Arrow, its
        values never made Python objects; a small one goes to ``recent`` like a batch's changes."""
        if not tables:
            return
        if self._schema is None:
            self._schema = tables[0].schema.remove_metadata()
        run = pa.concat_tables([t.replace_schema_metadata(None).cast(self._schema) for t in tables])
        if self.blank and len(tables) == 1:  # a snapshot (or a first delta) holds each key once
            self._rebase(run.filter(_kept(run)), None, [])
            return
        numbers = self._integer_keys(run)
        if numbers is not None:  # one integer key: found and deduplicated as numbers, not Python objects
            newest = np.sort(len(numbers) - 1 - np.unique(numbers[::-1], return_index=True)[1])
        elif (codes := key_codes([run.column(n) for n in run.column_names if n.startswith(KEY_PREFIX)])) is not None:
            newest = np.sort(len(codes) - 1 - np.unique(codes[::-1], return_index=True)[1])
        else:
            decoded = {key: row for row, key in enumerate(self._decode_keys(run))}
            newest = np.fromiter(sorted(decoded.values()), dtype=np.int64, count=len(decoded))
        if len(newest) < run.num_rows:  # a key's last row speaks for it
            run = run.take(pa.array(newest))
            numbers = numbers[newest] if numbers is not None else None
        if self.blank or into_base or self._too_many(run.num_rows):
            kept = _kept(run)
            if numbers is not None and not self._recent and (self._base is None or self._by_value):
                at, found = _search(self._order, numbers)
                self._rebase(run.filter(kept), None, at[found].tolist())
                return
            # What the base and recent held for these keys goes.
            keys = self._decode_keys(run)
            dropped = [row for row in self._rows_of([key for key in keys if key not in self._recent]) if row >= 0]
            self._change(dict.fromkeys(key for key in keys if key in self._recent))
            self._rebase(run.filter(kept), [key for key, keep in zip(keys, kept.to_pylist(), strict=True) if keep],
                         dropped)
            return
        keys = self._decode_keys(run)
        states = [as_python(run.column(n)) for n in run.column_names if n.startswith(STATE_PREFIX)]
        self.update(as_entries(keys, zip(*states, strict=True) if states else ((),) * run.num_rows, run))

    def apply(self, changes: pa.Table, rows: np.ndarray, keys: list[Any]) -> None:
        """Apply changes (in the files' layout) of distinct keys located before (``locate``):
        each replaces the key's base row ``rows[i]`` (-1: none: ``recent`` holds the key, or it
        is new). ``keys[i]`` is the key, or ``UNKNOWN`` for a base row's key (decoded when needed).
        Many changes go into the base as Arrow, without a lookup; few, into ``recent``."""
        if not changes.num_rows:
            return
        if self._schema is None:
            self._schema = changes.schema.remove_metadata()
        changes = changes.replace_schema_metadata(None).cast(self._schema)
        small = not (self.blank or self._too_many(changes.num_rows))
        kept = None if small else _kept(changes).to_numpy(zero_copy_only=False)
        # Keys are needed only for what stays: removed ones of base rows go by their rows.
        needed = np.arange(changes.num_rows) if kept is None else np.flatnonzero(kept)
        keys = [keys[at] for at in needed.tolist()]
        unknown = [at for at, key in enumerate(keys) if key is UNKNOWN]
        if unknown:
            for at, key in zip(unknown, self._keys_at(rows[needed[unknown]]), strict=True):
                keys[at] = key
        if kept is None:
            states = [as_python(changes.column(n)) for n in changes.column_names if n.startswith(STATE_PREFIX)]
            self.update(as_entries(keys, zip(*states, strict=True) if states else ((),) * changes.num_rows,
                                   changes))
            return
        if self._recent:  # what ``recent`` held for these keys goes
            self._change(dict.fromkeys(key for key in self._decode_keys(changes.filter(pa.array(rows < 0)))
                                       if key in self._recent))
        self._rebase(changes.filter(pa.array(kept)), keys, rows[rows >= 0].tolist())

    def _integer_keys(self, table: pa.Table) -> np.ndarray | None:
        """The single integer key column as int64, when it holds no null."""
        if not self._single_key:
            return None
        column = table.column(next(n for n in table.column_names if n.startswith(KEY_PREFIX)))
        if column.type not in _INTEGER_KEY or column.null_count:
            return None
        return pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)

    def compact(self) -> None:
        """Merge ``recent`` into a new base."""
        if self._recent:
            self._rebase(None, [], [])

    def _too_many(self, recent: int) -> bool:
        return recent > max(_MIN_RECENT, self._base_live // _RECENT_SHARE)

    def _change(self, changes: Mapping[Any, Entry | None]) -> None:
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

    # ---------------------------------------------------------------- the base
    def _rebase(self, extra: pa.Table | None, extra_keys: list[Any] | None, dropped: list[int]) -> None:
        """A new base of the live base rows (but ``dropped``), ``recent``'s entries and
        ``extra`` (rows in the files' layout for keys neither speaks for; ``extra_keys``, their
        keys if decoded), sorted for lookup with one copy. Lookup keys already known are kept: only the added
        rows' keys are hashed."""
        schema = self._schema
        if schema is None:
            raise ValueError("state entries without a layout; this is a bug in batchline")
        fresh = [(key, entry) for key, (entry, _) in self._recent.items() if entry is not None]
        recent = rows_table(schema, ((key, value, deadline) for key, (value, deadline) in fresh), self._single_key)
        parts: list[tuple[pa.Table, list[Any] | None]] = [(recent, [key for key, _ in fresh])]
        if extra is not None:
            parts.append((extra, extra_keys))
        key_name = next(n for n in schema.names if n.startswith(KEY_PREFIX))
        live = self._live_rows(dropped) if self._base is not None else np.empty(0, dtype=np.int64)
        base_has_null = (self._base is not None and not self._by_value
                         and self._base.column(key_name).take(pa.array(live)).null_count > 0)
        by_value = (self._single_key and schema.field(key_name).type in _INTEGER_KEY and not base_has_null
                    and all(part.column(key_name).null_count == 0 for part, _ in parts))
        # The columns the new base keeps: timeout and removed only when some row needs them.
        keep = {TIMEOUT_COL: self._deadlines is not None, REMOVED_COL: self._base is not None
                and REMOVED_COL in self._base.column_names}
        for part, _ in parts:
            keep[TIMEOUT_COL] = keep[TIMEOUT_COL] or part.column(TIMEOUT_COL).null_count < part.num_rows
            keep[REMOVED_COL] = keep[REMOVED_COL] or bool(pc.any(part.column(REMOVED_COL)).as_py())
        layout = pa.schema([f for f in schema if keep.get(f.name, True)])
        tables, index, orders = [], [], []
        if self._base is not None:
            tables.append(_complete(_with_timeouts(self._base, self._deadlines), layout))
            index.append(live)
            orders.append(self._order[live] if by_value == self._by_value
                          else self._lookup(self._base.take(pa.array(live)), by_value, None))
        offset = self._base.num_rows if self._base is not None else 0
        for part, keys in parts:
            tables.append(part.select(layout.names))
            index.append(np.arange(part.num_rows, dtype=np.int64) + offset)
            orders.append(self._lookup(part, by_value, keys))
            offset += part.num_rows
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        order = np.concatenate(orders)
        sort = np.argsort(order, kind="stable")
        # The base lives long: in the system allocator, whose freed pages ``give_memory_back``
        # returns, not Arrow's pool, which keeps what it once held.
        pool = pa.system_memory_pool()
        rows = pa.array(np.concatenate(index)[sort])
        self._install(pc.take(table, rows, memory_pool=pool).combine_chunks(memory_pool=pool), order[sort], by_value)
        self._recent, self._recent_live = {}, 0

    def _install(self, table: pa.Table, order: np.ndarray, by_value: bool) -> None:
        # The deadlines are held once, as the array; a removed column with nothing in it (no key
        # holding a timeout without state) is not kept: it would weigh as much as a key's state.
        deadlines = None
        if TIMEOUT_COL in table.column_names:
            timeouts = table.column(TIMEOUT_COL)
            if timeouts.null_count < len(timeouts):
                deadlines = pc.fill_null(timeouts, _NO_DEADLINE).to_numpy().copy()
            table = table.drop_columns([TIMEOUT_COL])
        if REMOVED_COL in table.column_names and not pc.any(table.column(REMOVED_COL)).as_py():
            table = table.drop_columns([REMOVED_COL])
        key_name = next(n for n in table.column_names if n.startswith(KEY_PREFIX))
        self._order_is_view = by_value and table.num_rows > 0
        if self._order_is_view:  # the sorted key column itself: no second copy of the keys
            order = table.column(key_name).chunk(0).to_numpy()
        self._base, self._order, self._by_value, self._deadlines = table, order, by_value, deadlines
        self._base_live = table.num_rows

    def _lookup(self, table: pa.Table, by_value: bool, keys: list[Any] | None) -> np.ndarray:
        """The lookup keys of a table's rows (``keys``: the rows' keys, when already decoded)."""
        if by_value:
            numbers = self._integer_keys(table)
            assert numbers is not None
            return numbers
        keys = self._decode_keys(table) if keys is None else keys
        return np.fromiter((hash(key) for key in keys), dtype=np.int64, count=len(keys))

    def _rows_of(self, keys: list[Any]) -> list[int]:
        """Each key's row in the base, or -1. Rows ``recent`` speaks for are found too: the
        caller asks only for keys not in ``recent``."""
        return self._base_rows(keys).tolist()

    def _base_rows(self, keys: list[Any]) -> np.ndarray:
        """``_rows_of`` as an int64 array."""
        if not keys or self._base is None or not len(self._order):
            return np.full(len(keys), -1, dtype=np.int64)
        if self._by_value:
            probe, valid = _int64_probe(keys)
        else:
            probe, valid = np.fromiter((hash(key) for key in keys), dtype=np.int64, count=len(keys)), None
        at, matched = _search(self._order, probe)
        if valid is not None:
            matched &= valid
        rows = np.where(matched, at, -1)
        if self._by_value:
            return rows
        # Equal hashes are not equal keys: check the key at each row found, and look further
        # along the run of equal hashes when it is another key.
        candidates = np.flatnonzero(matched)
        if len(candidates):
            stored = self._keys_at(rows[candidates])
            for index, key in zip(candidates.tolist(), stored, strict=True):
                if key != keys[index]:
                    rows[index] = self._scan(keys[index], int(probe[index]))
        return rows

    def _scan(self, key: Any, lookup: int) -> int:
        """The row of ``key`` among the base rows whose hash is ``lookup``, or -1."""
        start = int(np.searchsorted(self._order, lookup, side="left"))
        end = int(np.searchsorted(self._order, lookup, side="right"))
        for row, stored in zip(range(start, end), self._keys_at(np.arange(start, end)), strict=True):
            if stored == key:
                return row
        return -1

    def _live_rows(self, dropped: list[int] | None = None) -> np.ndarray:
        """The base rows ``recent`` does not speak for (nor ``dropped``)."""
        assert self._base is not None
        live = np.ones(self._base.num_rows, dtype=bool)
        live[[row for _, row in self._recent.values() if row >= 0]] = False
        if dropped:
            live[dropped] = False
        return np.flatnonzero(live)

    def _keys_at(self, rows: np.ndarray) -> list[Any]:
        assert self._base is not None
        return self._decode_keys(self._base.take(pa.array(rows, type=pa.int64())))

    def _decode_keys(self, table: pa.Table) -> list[Any]:
        return decode_keys(table, self._single_key)

    def _entries_at(self, rows: np.ndarray) -> list[Entry]:
        assert self._base is not None
        taken = self._base.take(pa.array(rows, type=pa.int64()))
        states = [as_python(taken.column(n)) for n in taken.column_names if n.startswith(STATE_PREFIX)]
        values: Iterable[tuple[Any, ...]] = zip(*states, strict=True) if states else ((),) * len(rows)
        count = len(rows)
        timeouts = (_timeouts(self._deadlines[rows]).to_pylist() if self._deadlines is not None
                    else [None] * count)
        if REMOVED_COL not in taken.column_names:
            return list(zip(values, timeouts, strict=True))
        removed = taken.column(REMOVED_COL).to_pylist()
        return [(None if gone else value, timeout)
                for value, timeout, gone in zip(values, timeouts, removed, strict=True)]


def _kept(table: pa.Table) -> pa.ChunkedArray:
    """Which rows hold an entry: not removed, or removed with a timeout left."""
    return pc.invert(pc.and_(table.column(REMOVED_COL), pc.is_null(table.column(TIMEOUT_COL))))


def _search(order: np.ndarray, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each int64 ``probe`` is in the sorted ``order`` and whether it is there. ``order``
    may be a narrower integer key column: the probes are narrowed to it (those out of its
    range match nothing), as numpy would otherwise widen a copy of the whole column per call."""
    fits = None
    if order.dtype != probe.dtype:
        limits = np.iinfo(order.dtype)
        fits = (probe >= limits.min) & (probe <= limits.max)
        probe = np.where(fits, probe, 0).astype(order.dtype)
    at = np.searchsorted(order, probe)
    matched = at < len(order)
    matched[matched] = order[at[matched]] == probe[matched]
    if fits is not None:
        matched &= fits
    return at, matched


def _timeouts(deadlines: np.ndarray) -> pa.Array:
    """The timeout column of rows whose deadlines are ``deadlines`` (none: null)."""
    return pa.array(deadlines, type=pa.int64(), mask=deadlines == _NO_DEADLINE)


def _with_timeouts(table: pa.Table, deadlines: np.ndarray | None) -> pa.Table:
    """A base table (or rows taken from it) with its timeout column, rebuilt from the deadlines."""
    if deadlines is None:
        return table
    return table.append_column(pa.field(TIMEOUT_COL, pa.int64()), _timeouts(deadlines))


def _complete(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in the layout ``schema``, with the columns the base leaves out when empty."""
    if TIMEOUT_COL in schema.names and TIMEOUT_COL not in table.column_names:
        table = table.append_column(pa.field(TIMEOUT_COL, pa.int64()), pa.nulls(table.num_rows, pa.int64()))
    if REMOVED_COL in schema.names and REMOVED_COL not in table.column_names:
        table = table.append_column(pa.field(REMOVED_COL, pa.bool_()), pa.array(np.zeros(table.num_rows, dtype=bool)))
    return table.select(schema.names).cast(schema)


def _without_state(keys: pa.Table, schema: pa.Schema) -> pa.Table:
    """Entries in the layout ``schema`` of keys (their columns, in the layout's order) that
    hold no state."""
    count = keys.num_rows
    columns = [keys.column(at) for at in range(keys.num_columns)]
    columns += [pa.nulls(count, f.type) for f in schema if f.name.startswith(STATE_PREFIX)]
    columns += [pa.nulls(count, pa.int64()), pa.array(np.ones(count, dtype=bool))]
    return pa.Table.from_arrays([c.cast(f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)


def _int64_probe(keys: list[Any]) -> tuple[np.ndarray, np.ndarray | None]:
    """Keys as the int64 values to look up, and which of them can match (None: all). A key
    matches the integer it equals, as in a dict (``True``, ``3.0``); a null, a string or an
    integer beyond int64 matches none."""
    if all(type(key) is int for key in keys):
        try:
            return np.array(keys, dtype=np.int64), None
        except OverflowError:
            pass
    values = [_as_int64(key) for key in keys]
    return (np.array([v if v is not None else 0 for v in values], dtype=np.int64),
            np.array([v is not None for v in values], dtype=bool))


def _as_int64(key: Any) -> int | None:
    if isinstance(key, (int, np.integer)) or (isinstance(key, float) and key.is_integer()):
        value = int(key)
        return value if _INT64.min <= value <= _INT64.max else None
    return None
