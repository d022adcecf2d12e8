"""Line parsing with dead letters (SPEC B6), entirely in Spark SQL expressions.

Every line is parsed twice: once with the declared schema and once with every field as a
string. Comparing the two names the reason a line is bad (malformed, wrong type, missing
required field, too many fields) without a Python UDF.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

__all__ = ["OK", "RAW", "REASON", "SOURCE_FILE", "parse_json_lines", "parse_csv_lines", "DEAD_LETTER_SCHEMA"]

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


def _finish(lines: DataFrame, schema: StructType, typed: Column, reasons: list[Column]) -> DataFrame:
    reason = F.coalesce(*reasons)
    return lines.select(
        *[typed.getField(f.name).alias(f.name) for f in schema.fields],
        reason.isNull().alias(OK),
        F.col("value").alias(RAW),
        reason.alias(REASON),
        F.col(SOURCE_FILE),
    )


def parse_json_lines(lines: DataFrame, schema: StructType) -> DataFrame:
    """``lines(value, _bl_source_file)`` → the schema's columns plus ok/raw/reason/source.

    Blank lines are skipped, as Spark's JSON reader does.
    """
    lines = lines.where(F.trim("value") != "")
    value = F.col("value")
    typed = F.from_json(value, schema)
    strings = F.from_json(value, _as_strings(schema))
    is_object = F.from_json(value, "map<string,string>").isNotNull()
    reasons = [F.when(~is_object, F.lit("malformed JSON: not one JSON object per line"))]
    return _finish(lines, schema, typed, reasons + _field_reasons(schema, typed, strings))


def parse_csv_lines(lines: DataFrame, schema: StructType, sep: str = ",", header: bool = False) -> DataFrame:
    """CSV rows, one per line (no line breaks inside quoted values). With ``header`` a line
    that names the schema's fields is skipped; any other header is reported as bad."""
    if header:
        lines = lines.where(F.col("value") != F.lit(sep.join(f.name for f in schema.fields)))
    lines = lines.where(F.col("value") != "")
    value = F.col("value")
    options = {"sep": sep}
    typed = F.from_csv(value, schema.toDDL(), options)
    extra = "_bl_extra"
    strings = F.from_csv(value, _as_strings(schema, extra).toDDL(), options)
    reasons = [
        F.when(
            strings.getField(extra).isNotNull(),
            F.lit(f"too many fields: expected {len(schema.fields)} separated by {sep!r}"),
        )
    ]
    return _finish(lines, schema, typed, reasons + _field_reasons(schema, typed, strings))
