"""COPY data from Arrow columns, against a real PostgreSQL server: binary COPY lands the same
values as CSV for every column type write_postgres takes (NULLs, empty and multi-byte
strings, sliced and large-string arrays, jsonb, numeric, time zones), and a table with a
type binary has no encoder for is written as CSV."""

import datetime as dt
import uuid
from decimal import Decimal

import psycopg
import pyarrow as pa
import pytest

from batchline.sinks.pg_copy import CopyEncoding, copy_encoding


def utc(*parts):
    return dt.datetime(*parts, tzinfo=dt.UTC)


def wall(*parts):
    return utc(*parts).replace(tzinfo=None)


COLUMNS = [  # (name, PostgreSQL type, information_schema's data_type, Arrow column)
    ("s", "text", "text", pa.array(['a "q", b\nc', "", None, "ünï €", "x" * 300, "z"])),
    ("v", "varchar(20)", "character varying", pa.array(["a", None, "", "bb", "ccc", "d"], pa.large_string())),
    ("i8", "smallint", "smallint", pa.array([1, -2, None, 127, -128, 0], pa.int8())),
    ("i16", "smallint", "smallint", pa.array([1, -2, None, 32767, -32768, 0], pa.int16())),
    ("i32", "integer", "integer", pa.array([1, None, -(2**31), 2**31 - 1, 7, 0], pa.int32())),
    ("i64", "bigint", "bigint", pa.array([2**62, -1, 0, None, 2**63 - 1, 5], pa.int64())),
    ("widened", "bigint", "bigint", pa.array([1, 2, None, 4, 5, 6], pa.int32())),
    ("f32", "real", "real", pa.array([1.5, None, -0.25, float("inf"), 3.0, 0.0], pa.float32())),
    ("f32_wide", "double precision", "double precision",  # a Spark float: its shortest form, as CSV
     pa.array([0.1, None, -2.5, 3.4e38, 1e-7, 0.0], pa.float32())),
    ("f64", "double precision", "double precision",
     pa.array([0.1, 1e300, None, float("-inf"), -0.0, 2.5], pa.float64())),
    ("b", "boolean", "boolean", pa.array([True, False, None, True, False, True])),
    ("ts", "timestamptz", "timestamp with time zone",
     pa.array([utc(2026, 11, 23, 12, 30, 45, 123456), utc(1970, 1, 1), None,
               utc(1999, 12, 31, 23, 59, 59, 999999), utc(2000, 1, 1), utc(1900, 5, 6)],
              pa.timestamp("us", "Europe/Berlin"))),
    ("naive", "timestamp", "timestamp without time zone",
     pa.array([wall(2026, 1, 2, 3, 4, 5), None, wall(1960, 1, 1), wall(2000, 1, 1),
               wall(2100, 1, 1), wall(2026, 1, 2)], pa.timestamp("us"))),
    ("zoned_wall", "timestamp", "timestamp without time zone",  # an instant: its wall time in its zone
     pa.array([utc(2026, 1, 2, 3, 4, 5), None, utc(1960, 1, 1), utc(2000, 1, 1),
               utc(2100, 1, 1), utc(2026, 1, 2)], pa.timestamp("us", "America/New_York"))),
    ("day", "date", "date", pa.array([dt.date(2026, 1, 2), dt.date(1999, 12, 31), None, dt.date(2000, 1, 1),
                                      dt.date(1900, 1, 1), dt.date(2400, 2, 29)])),
    ("n", "numeric(12,3)", "numeric", pa.array([Decimal("12.345"), Decimal("-0.001"), None, Decimal("0"),
                                                 Decimal("123456789.5"), Decimal("1")], pa.decimal128(12, 3))),
    ("nf", "numeric", "numeric", pa.array([0.1, None, 1e-7, -3.0, 2.5, 1e20], pa.float64())),
    ("j", "jsonb", "jsonb", pa.array(['{"k": 1}', None, "[]", '"ü"', "null", '{"a": [1, 2]}'])),
    ("js", "json", "json", pa.array(['{"k":  1}', "1", None, "[]", '"x"', "{}"])),
]


def table(dsn, columns, encoding, data):
    name = f"copy_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn) as conn:
        conn.execute(f"CREATE TABLE {name} (row_no int, {', '.join(f'{c} {t}' for c, t, *_ in columns)})")
        with conn.cursor().copy(f"COPY {name} (row_no, {', '.join(c for c, *_ in columns)}) FROM STDIN "
                                f"({encoding.option})") as copy:
            copy.write(encoding.start())
            for chunk in data:
                copy.write(chunk)
            copy.write(encoding.end())
    return name


def rows(dsn, name, columns):
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        return conn.execute(f"SELECT {', '.join(c + '::text' for c, *_ in columns)} FROM {name} "
                            "ORDER BY row_no").fetchall()


def encoded(encoding, arrays, names, cut=None):
    number = pa.array(range(len(arrays[0])), pa.int32())
    columns = [number, *arrays]
    if cut is None:
        return [encoding.rows(columns, ["row_no", *names])]
    return [encoding.rows([c.slice(a, b - a) for c in columns], ["row_no", *names]) for a, b in cut]


@pytest.mark.parametrize("cut", [None, [(0, 2), (2, 3), (3, 6)]], ids=["whole", "sliced"])
def test_binary_copy_lands_the_same_values_as_csv_for_every_type(postgres_server, cut):
    names, arrays = [c[0] for c in COLUMNS], [c[3] for c in COLUMNS]
    types = ["integer", *(c[2] for c in COLUMNS)]
    binary, csv = copy_encoding(types), CopyEncoding(tuple(types), binary=False)
    assert binary.option == "FORMAT binary" and csv.option == "FORMAT csv"
    as_binary = table(postgres_server.dsn, COLUMNS, binary, encoded(binary, arrays, names, cut))
    as_csv = table(postgres_server.dsn, COLUMNS, csv, encoded(csv, arrays, names, cut))
    found = rows(postgres_server.dsn, as_binary, COLUMNS)
    assert found == rows(postgres_server.dsn, as_csv, COLUMNS)
    assert len(found) == 6
    first = dict(zip(names, found[0], strict=True))
    assert first["s"] == 'a "q", b\nc' and first["ts"] == "2026-11-23 12:30:45.123456+00"  # Arrow holds UTC
    assert first["naive"] == "2026-01-02 03:04:05" and first["zoned_wall"] == "2026-01-01 22:04:05"
    assert first["n"] == "12.345" and first["nf"] == "0.1"
    assert first["j"] == '{"k": 1}' and first["js"] == '{"k":  1}' and first["f64"] == first["f32_wide"] == "0.1"
    assert [r[names.index("s")] for r in found] == ['a "q", b\nc', "", None, "ünï €", "x" * 300, "z"]


def test_a_batch_without_rows_writes_nothing_and_a_null_only_column_is_written(postgres_server):
    binary = copy_encoding(["integer", "text", "double precision"])
    assert binary.rows([pa.array([], pa.int32()), pa.array([], pa.string()), pa.array([], pa.float64())],
                       ["row_no", "s", "d"]) == b""
    columns = [("s", "text", "text", pa.array([None, None], pa.string())),
               ("d", "double precision", "double precision", pa.array([None, None], pa.float64()))]
    name = table(postgres_server.dsn, columns, binary, encoded(binary, [c[3] for c in columns], ["s", "d"]))
    assert rows(postgres_server.dsn, name, columns) == [(None, None), (None, None)]


def test_a_type_without_a_binary_encoder_makes_the_copy_csv():
    assert copy_encoding(["text", "uuid"]).option == "FORMAT csv"
    assert copy_encoding(["text", "bigint"]).option == "FORMAT binary"
    with pytest.raises(ValueError, match="uuid"):
        CopyEncoding(("text", "uuid"), binary=True)
