"""Line parsing with dead letters (SPEC B6), entirely in Spark SQL expressions.

A JSON line is parsed once on the fast path: with the declared schema plus a corrupt-record
column, which Spark fills for a line that is not an object or has a value of the wrong type;
a good line is one without it whose required fields are present. Only the lines that fail
the fast path are parsed again, with every field as a string, to name the reason (malformed,
wrong type, missing required field) without a Python UDF. CSV lines are parsed both ways.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

__all__ = ["DEAD_LETTER_SCHEMA", "OK", "RAW", "REASON", "SOURCE_FILE", "LineParser", "csv_parser", "json_parser",
           "parquet_parser", "text_parser"]

OK = "_bl_ok"
RAW = "_bl_raw"
REASON = "_bl_reason"
SOURCE_FILE = "_bl_source_file"

DEAD_LETTER_SCHEMA = StructType(
    [
        StructField("raw_record", StringType(), True),
        StructField("reason", StringType(), True),
        StructField("source", StringType(), True),
        StructField("batch_time", StringType(), False),
    ]
)


def _as_strings(schema: StructType, extra: str | None = None) -> StructType:
    fields = [StructField(f.name, StringType(), True) for f in schema.fields]
    if extra:
        fields.append(StructField(extra, StringType(), True))
    return StructType(fields)


def _field_reasons(schema: StructType, typed: Column, strings: Column) -> list[Column]:
    reasons = []
    for f in schema.fields:
        got, raw = typed.getField(f.name), strings.getField(f.name)
        type_name = f.dataType.simpleString()
        reasons.append(
            F.when(
                raw.isNotNull() & got.isNull(),
                F.concat(F.lit(f"field '{f.name}': expected {type_name}, got "), F.substring(raw, 1, 80)),
            )
        )
        if not f.nullable:
            reasons.append(F.when(got.isNull(), F.lit(f"field '{f.name}' is required but missing or null")))
    return reasons


@dataclass(frozen=True)
class LineParser:
    """How a source's lines become rows: built once per source, applied to every batch.

    Its columns are plain expressions over ``value`` and the file's path, so a batch costs a
    filter and a select, not the dozens of driver-to-JVM calls that building them takes.
    """

    keep: Column
    """Which lines are records (blank lines, a CSV header, are not)."""
    columns: tuple[Column, ...]
    """The schema's columns, then ok / raw / reason / source file."""

    def parse(self, lines: DataFrame) -> DataFrame:
        """``lines`` (Spark's text reader: ``value`` and ``_metadata``) parsed."""
        return lines.where(self.keep).select(*self.columns)


def _source_file() -> Column:
    return F.col("_metadata.file_path").alias(SOURCE_FILE)


def _parser(schema: StructType, keep: Column, typed: Column, ok: Column, reason: Column) -> LineParser:
    return LineParser(keep, (
        *[typed.getField(f.name).alias(f.name) for f in schema.fields],
        ok.alias(OK),
        F.col("value").alias(RAW),
        reason.alias(REASON),
        _source_file(),
    ))


_CORRUPT = "_bl_corrupt"
_NOT_AN_OBJECT = "malformed JSON: not one JSON object per line"


def json_parser(schema: StructType) -> LineParser:
    """JSON objects, one per line; blank lines are skipped, as Spark's JSON reader does."""
    value = F.col("value")
    fast = F.from_json(value, StructType([*schema.fields, StructField(_CORRUPT, StringType(), True)]),
                       {"columnNameOfCorruptRecord": _CORRUPT})
    ok = fast.getField(_CORRUPT).isNull()
    for f in schema.fields:
        if not f.nullable:
            ok = ok & fast.getField(f.name).isNotNull()
    # The reason, computed only for the lines that failed the fast path (a CASE branch).
    typed = F.from_json(value, schema)
    strings = F.from_json(value, _as_strings(schema))
    is_object = F.from_json(value, "map<string,string>").isNotNull()
    reasons = [F.when(~is_object, F.lit(_NOT_AN_OBJECT)), *_field_reasons(schema, typed, strings)]
    reason = F.when(~ok, F.coalesce(*reasons, F.lit(_NOT_AN_OBJECT)))
    return _parser(schema, F.trim(value) != "", fast, ok, reason)


def csv_parser(schema: StructType, sep: str = ",", header: bool = False) -> LineParser:
    """CSV rows, one per line (no line breaks inside quoted values). With ``header`` a line
    that names the schema's fields is skipped; any other header is reported as bad."""
    value = F.col("value")
    keep = value != ""
    if header:
        keep = keep & (value != F.lit(sep.join(f.name for f in schema.fields)))
    options = {"sep": sep}
    typed = F.from_csv(value, schema.toDDL(), options)
    extra = "_bl_extra"
    strings = F.from_csv(value, _as_strings(schema, extra).toDDL(), options)
    reasons = [
        F.when(
            strings.getField(extra).isNotNull(),
            F.lit(f"too many fields: expected {len(schema.fields)} separated by {sep!r}"),
        ),
        *_field_reasons(schema, typed, strings),
    ]
    reason = F.coalesce(*reasons)
    return _parser(schema, keep, typed, reason.isNull(), reason)


def parquet_parser(schema: StructType) -> LineParser:
    """Parquet rows, typed by the reader: every row is good (its columns are applied to the
    reader's frame, with no lines to keep)."""
    return LineParser(F.lit(True), (*[F.col(f.name) for f in schema.fields], F.lit(True).alias(OK),
                                    F.lit(None).cast("string").alias(RAW), F.lit(None).cast("string").alias(REASON),
                                    _source_file()))


def text_parser() -> LineParser:
    """Every line as it is, in ``value``."""
    value = F.col("value")
    return LineParser(F.lit(True), (value, F.lit(True).alias(OK), value.alias(RAW),
                                    F.lit(None).cast("string").alias(REASON), _source_file()))
