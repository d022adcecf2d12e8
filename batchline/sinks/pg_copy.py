"""Arrow columns as ``COPY ... FROM STDIN`` data for PostgreSQL, in the tasks of ``write_postgres``.

Binary COPY (each value in the server's own wire format) when every column's type has an
encoder here, CSV written by Arrow otherwise. Binary spares both sides the text: formatting
doubles and timestamps as CSV took a third of a task's Python time, and the server spent
most of its own parsing them back. Each column becomes two binary columns, every row's
field length and its bytes (numpy turns fixed-width values big-endian; text is Arrow's own
bytes), and Arrow joins all of them row by row into the COPY data: no Python loop per row,
except for ``numeric``, whose values psycopg encodes one by one.

A column's encoder is chosen by the table column's type (``information_schema``'s
``data_type``); the Arrow column is cast to it, which ``PostgresSink`` allows only where the
values fit (a Spark ``int`` into ``bigint``, never the other way). A value goes in as the
CSV path would write it: a Spark ``float`` into ``double precision`` by its shortest
decimal form (0.1, not 0.10000000149011612), a timestamp into a column without time zone as
its wall time in the Arrow column's zone (Spark's session time zone).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["CopyEncoding", "copy_encoding"]

_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)  # no flags, no header extension
_TRAILER = struct.pack("!h", -1)
_UNIX_TO_2000_US = 946_684_800_000_000  # PostgreSQL counts timestamps from 2000-01-01 ...
_UNIX_TO_2000_DAYS = 10_957  # ... and dates too

_Encoded = tuple[pa.Array, pa.Array]
"""A column as COPY fields: every row's length (4 bytes, -1 for NULL) and its bytes (empty for NULL)."""


def _binary(values: np.ndarray) -> pa.Array:
    """Each row of a (rows, width) array of bytes, or each item of a 1-d array, as one binary value."""
    rows = len(values)
    width = values.itemsize if values.ndim == 1 else values.shape[1] * values.itemsize
    data = pa.py_buffer(np.ascontiguousarray(values).tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), rows, [None, data]).cast(pa.large_binary())


def _lengths(column: pa.Array, sizes: np.ndarray | int) -> pa.Array:
    """The field lengths: ``sizes`` for values, -1 for NULLs."""
    lengths = np.broadcast_to(np.asarray(sizes, dtype=">i4"), (len(column),))
    if column.null_count:
        lengths = np.where(column.is_valid().to_numpy(zero_copy_only=False), lengths, -1)
    return _binary(lengths.astype(">i4"))


def _fixed(arrow_type: pa.DataType, wire: str, to_wire: Callable[[pa.Array], pa.Array] | None = None,
           shift: int = 0) -> Callable[[pa.Array], _Encoded]:
    """A fixed-width type: the column cast to ``arrow_type`` (after ``to_wire``), less ``shift``
    (timestamps and dates count from 2000), as ``wire`` (a big-endian numpy type)."""
    def encode(column: pa.Array) -> _Encoded:
        values = (to_wire(column) if to_wire else column).cast(arrow_type)
        if values.null_count:
            values = values.fill_null(pa.scalar(False if arrow_type == pa.bool_() else 0, values.type))
        array = np.asarray(values.to_numpy(zero_copy_only=False))
        if shift:
            array = array.astype(np.int64) - shift
        values_bytes = _binary(array.astype(wire))
        if column.null_count:  # a NULL's bytes are left out
            values_bytes = pc.if_else(column.is_valid(), values_bytes, pa.scalar(b"", pa.large_binary()))
        return _lengths(column, np.dtype(wire).itemsize), values_bytes
    return encode


def _shortest(column: pa.Array) -> pa.Array:
    """A Spark ``float`` into ``double precision`` through its shortest decimal form, as CSV writes it."""
    return column.cast(pa.string()).cast(pa.float64()) if pa.types.is_float32(column.type) else column


def _timestamp(column: pa.Array) -> _Encoded:
    """An instant: Arrow's UTC count."""
    tz = column.type.tz if pa.types.is_timestamp(column.type) else None
    return _fixed(pa.int64(), ">i8", lambda c: c.cast(pa.timestamp("us", tz)).cast(pa.int64()),
                  _UNIX_TO_2000_US)(column)


def _wall_time(column: pa.Array) -> _Encoded:
    """A column without time zone: the wall time in the Arrow column's zone (Spark's session
    time zone), as CSV carries it and PostgreSQL keeps it (the offset dropped)."""
    if pa.types.is_timestamp(column.type) and column.type.tz is not None:
        column = pc.local_timestamp(column)
    return _timestamp(column)


def _text(prefix: bytes = b"") -> Callable[[pa.Array], _Encoded]:
    """UTF-8 as it is in Arrow's buffers (``prefix``: jsonb's version byte before each value)."""
    def encode(column: pa.Array) -> _Encoded:
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            column = column.cast(pa.string())
        values = column.cast(pa.large_binary())
        if prefix:
            values = pc.binary_join_element_wise(pa.scalar(prefix, pa.large_binary()), values,
                                                 pa.scalar(b"", pa.large_binary()))
        sizes = pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False)
        return _lengths(column, sizes), values.fill_null(pa.scalar(b"", pa.large_binary()))
    return encode


def _numeric(column: pa.Array) -> _Encoded:
    """psycopg's own binary encoding of each value (numeric's base-10000 digits)."""
    from psycopg.types.numeric import DecimalBinaryDumper

    dump = DecimalBinaryDumper(Decimal).dump
    if not pa.types.is_decimal(column.type):  # integers and floats: the digits CSV would carry (-3.0 as -3)
        column = column.cast(pa.string())
    values = pa.array([b"" if v is None else bytes(dump(v if isinstance(v, Decimal) else Decimal(v)) or b"")
                       for v in column.to_pylist()], pa.large_binary())
    return _lengths(column, pc.binary_length(values).to_numpy(zero_copy_only=False)), values


_ENCODERS: dict[str, Callable[[pa.Array], _Encoded]] = {
    "smallint": _fixed(pa.int16(), ">i2"),
    "integer": _fixed(pa.int32(), ">i4"),
    "bigint": _fixed(pa.int64(), ">i8"),
    "real": _fixed(pa.float32(), ">f4"),
    "double precision": _fixed(pa.float64(), ">f8", _shortest),
    "boolean": _fixed(pa.bool_(), "u1"),
    "timestamp with time zone": _timestamp,
    "timestamp without time zone": _wall_time,
    "date": _fixed(pa.int32(), ">i4", lambda c: c.cast(pa.date32()).cast(pa.int32()), _UNIX_TO_2000_DAYS),
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
        if self.binary and _unencodable(self.column_types):
            raise ValueError(f"no binary COPY encoder for {_unencodable(self.column_types)}")

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
    return CopyEncoding(tuple(column_types), not _unencodable(column_types))


def _unencodable(column_types: Sequence[str]) -> list[str]:
    return [kind for kind in column_types if kind not in _ENCODERS]


def _binary_rows(encoded: list[_Encoded]) -> bytes:
    """Each row: its field count, then per field its length and its bytes, joined by Arrow."""
    rows = len(encoded[0][0])
    if rows == 0:
        return b""
    parts = [_binary(np.full(rows, len(encoded), dtype=">i2"))]
    for lengths, values in encoded:
        parts += [lengths, values]
    joined = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.large_binary()))
    _, offsets, data = joined.buffers()
    start, end = np.frombuffer(offsets, dtype=np.int64)[[joined.offset, joined.offset + rows]]
    return data.slice(int(start), int(end - start)).to_pybytes()
