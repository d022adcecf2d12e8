"""Arrow columns as ``COPY ... FROM STDIN`` data for PostgreSQL, in the tasks of ``write_postgres``.

Binary COPY (each value in the server's own wire format) when every column's type has an
encoder here, CSV written by Arrow otherwise. Binary spares both sides the text: formatting
doubles and timestamps as CSV took a third of a task's Python time, and the server spent
most of its own parsing them back. The binary rows are assembled with numpy over whole
columns (a scatter per column, no Python loop per row), except ``numeric``, whose values
psycopg encodes one by one.

A column's encoder is chosen by the table column's type (``information_schema``'s
``data_type``); the Arrow column is cast to it, which ``PostgresSink`` allows only where the
values fit (a Spark ``int`` into ``bigint``, never the other way).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pyarrow as pa

__all__ = ["CopyEncoding", "copy_encoding"]

_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)  # no flags, no header extension
_TRAILER = struct.pack("!h", -1)
_UNIX_TO_2000_US = 946_684_800_000_000  # PostgreSQL counts timestamps from 2000-01-01 ...
_UNIX_TO_2000_DAYS = 10_957  # ... and dates too

# An encoded column: (valid rows or None when all are, then either ("fixed", values as an
# (n, width) uint8 array) or ("var", offsets of n + 1 into data, data as uint8).
_Encoded = tuple[np.ndarray | None, str, np.ndarray, np.ndarray | None]


def _validity(column: pa.Array) -> np.ndarray | None:
    return None if column.null_count == 0 else np.asarray(column.is_valid().to_numpy(zero_copy_only=False))


def _fixed(arrow_type: pa.DataType, wire: str) -> Callable[[pa.Array], _Encoded]:
    def encode(column: pa.Array) -> _Encoded:
        values = column.cast(arrow_type)
        if values.null_count:
            values = values.fill_null(pa.scalar(0, arrow_type) if arrow_type != pa.bool_() else False)
        array = np.asarray(values.to_numpy(zero_copy_only=False), dtype=wire)
        return _validity(column), "fixed", array.view(np.uint8).reshape(len(column), array.itemsize), None
    return encode


def _shifted(arrow_type: pa.DataType, integer: pa.DataType, wire: str, shift: int) -> Callable[[pa.Array], _Encoded]:
    """Timestamps and dates: Arrow's count from 1970 moved to PostgreSQL's from 2000."""
    def encode(column: pa.Array) -> _Encoded:
        values = column.cast(arrow_type).cast(integer)
        if values.null_count:
            values = values.fill_null(0)
        array = (np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64) - shift).astype(wire)
        return _validity(column), "fixed", array.view(np.uint8).reshape(len(column), array.itemsize), None
    return encode


def _timestamp(column: pa.Array) -> _Encoded:
    """An instant: Arrow's UTC count."""
    tz = column.type.tz if pa.types.is_timestamp(column.type) else None
    return _shifted(pa.timestamp("us", tz), pa.int64(), ">i8", _UNIX_TO_2000_US)(column)


def _wall_time(column: pa.Array) -> _Encoded:
    """A column without time zone: the wall time in the Arrow column's zone (Spark's session
    time zone), as CSV carries it and PostgreSQL keeps it (the offset dropped)."""
    if pa.types.is_timestamp(column.type) and column.type.tz is not None:
        import pyarrow.compute as pc

        column = pc.local_timestamp(column)
    return _timestamp(column)


def _text(prefix: bytes = b"") -> Callable[[pa.Array], _Encoded]:
    """UTF-8 as it is in Arrow's buffers (``prefix``: jsonb's version byte before each value)."""
    def encode(column: pa.Array) -> _Encoded:
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            column = column.cast(pa.string())
        offset_type = np.int64 if pa.types.is_large_string(column.type) else np.int32
        _, offsets_buffer, data_buffer = column.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=offset_type)[column.offset:column.offset + len(column) + 1]
        data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
        offsets = offsets.astype(np.int64)
        if prefix:  # each value moved up by the prefixes before it, its own prefix written before it
            moved = offsets - offsets[0] + np.arange(len(offsets)) * len(prefix)
            prefixed = np.empty(int(moved[-1]), dtype=np.uint8)
            for i, byte in enumerate(prefix):
                prefixed[moved[:-1] + i] = byte
            _scatter_var(prefixed, moved[:-1] + len(prefix), offsets, data, None)
            offsets, data = moved, prefixed
        return _validity(column), "var", offsets, data
    return encode


def _numeric(column: pa.Array) -> _Encoded:
    """psycopg's own binary encoding of each value (numeric's base-10000 digits)."""
    from psycopg.types.numeric import DecimalBinaryDumper

    dump = DecimalBinaryDumper(Decimal).dump
    if not pa.types.is_decimal(column.type):  # integers and floats: the digits CSV would carry (-3.0 as -3)
        column = column.cast(pa.string())
    values = [b"" if v is None else bytes(dump(v if isinstance(v, Decimal) else Decimal(v)) or b"")
              for v in column.to_pylist()]
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    return (_validity(column), "var", np.concatenate([[0], np.cumsum(lengths)]),
            np.frombuffer(b"".join(values), dtype=np.uint8))


_ENCODERS: dict[str, Callable[[pa.Array], _Encoded]] = {
    "smallint": _fixed(pa.int16(), ">i2"),
    "integer": _fixed(pa.int32(), ">i4"),
    "bigint": _fixed(pa.int64(), ">i8"),
    "real": _fixed(pa.float32(), ">f4"),
    "double precision": _fixed(pa.float64(), ">f8"),
    "boolean": _fixed(pa.bool_(), "u1"),
    "timestamp with time zone": _timestamp,
    "timestamp without time zone": _wall_time,
    "date": _shifted(pa.date32(), pa.int32(), ">i4", _UNIX_TO_2000_DAYS),
    "text": _text(),
    "character varying": _text(),
    "character": _text(),
    "json": _text(),
    "jsonb": _text(b"\x01"),
    "numeric": _numeric,
}
"""Encoders by the table column's type. A type missing here (uuid, arrays, enums) makes the
whole COPY CSV."""


@dataclass(frozen=True)
class CopyEncoding:
    """How a task writes Arrow columns for ``COPY`` into columns of ``column_types``
    (PostgreSQL's ``data_type`` of each, in COPY order): binary, or CSV."""

    column_types: tuple[str, ...]
    binary: bool

    def __post_init__(self) -> None:
        if self.binary and not all(kind in _ENCODERS for kind in self.column_types):
            raise ValueError(f"no binary COPY encoder for {[k for k in self.column_types if k not in _ENCODERS]}")

    @property
    def option(self) -> str:
        """The ``COPY ... FROM STDIN (...)`` option."""
        return "FORMAT binary" if self.binary else "FORMAT csv"

    def start(self) -> bytes:
        return _SIGNATURE if self.binary else b""

    def end(self) -> bytes:
        return _TRAILER if self.binary else b""

    def rows(self, columns: Sequence[pa.Array], names: Sequence[str]) -> bytes:
        """``columns`` (equal lengths) as COPY data: whole rows, nothing before or after."""
        if not self.binary:
            import pyarrow.csv as csv

            buffer = io.BytesIO()
            csv.write_csv(pa.RecordBatch.from_arrays(list(columns), names=list(names)), buffer,
                          csv.WriteOptions(include_header=False))
            return buffer.getvalue()
        return _binary_rows([_ENCODERS[kind](column) for kind, column in zip(self.column_types, columns,
                                                                               strict=True)])


def copy_encoding(column_types: Sequence[str]) -> CopyEncoding:
    """Binary when every type has an encoder, else CSV."""
    return CopyEncoding(tuple(column_types), all(kind in _ENCODERS for kind in column_types))


def _binary_rows(encoded: list[_Encoded]) -> bytes:
    """Each row: its field count, then per field its length (-1: NULL) and its bytes. Every
    row's length is known from the columns, so each field is scattered to its place at once."""
    rows = len(encoded[0][2]) - (1 if encoded[0][1] == "var" else 0)
    if rows == 0:
        return b""
    sizes = []
    for valid, kind, values, _ in encoded:
        size = np.full(rows, values.shape[1], np.int64) if kind == "fixed" else np.diff(values)
        sizes.append(size if valid is None else np.where(valid, size, 0))
    row_length = 2 + 4 * len(encoded) + np.sum(sizes, axis=0)
    ends = np.cumsum(row_length)
    place = ends - row_length
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    count = np.array([len(encoded)], dtype=">i2").view(np.uint8)
    out[place], out[place + 1] = count[0], count[1]
    place = place + 2
    for (valid, kind, values, data), size in zip(encoded, sizes, strict=True):
        length = size if valid is None else np.where(valid, size, -1)
        out[place[:, None] + np.arange(4)] = length.astype(">i4").view(np.uint8).reshape(rows, 4)
        place = place + 4
        if kind == "fixed":
            width = values.shape[1]
            if valid is None:
                out[place[:, None] + np.arange(width)] = values
            else:
                out[place[valid][:, None] + np.arange(width)] = values[valid]
        else:
            assert data is not None
            _scatter_var(out, place, values, data, valid)
        place = place + size
    return out.tobytes()


def _scatter_var(out: np.ndarray, place: np.ndarray, offsets: np.ndarray, data: np.ndarray,
                 valid: np.ndarray | None) -> None:
    """Copy each row's bytes ``data[offsets[r]:offsets[r + 1]]`` to ``out[place[r]:]``."""
    lengths = np.diff(offsets)
    source = np.arange(offsets[0], offsets[-1])
    target = source + np.repeat(place - offsets[:-1], lengths)
    if valid is not None and lengths[~valid].any():  # Arrow lets a NULL slot keep bytes: leave them out
        keep = np.repeat(valid, lengths)
        source, target = source[keep], target[keep]
    out[target] = data[source]

