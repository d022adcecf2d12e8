"""The one conversion of every schema argument, without Spark (simple DDL is parsed locally)."""

from dataclasses import dataclass

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from batchline import ConfigurationError
from batchline.state.schema import as_struct


@dataclass
class Event:
    uid: str
    n: int


def test_a_struct_a_ddl_string_and_a_dataclass_give_the_same_columns():
    struct = StructType([StructField("uid", StringType()), StructField("n", LongType())])
    assert as_struct(struct, "schema") is struct
    for declared in ("uid string, n long", Event):
        got = as_struct(declared, "schema")
        assert [(f.name, f.dataType) for f in got.fields] == [(f.name, f.dataType) for f in struct.fields]


@pytest.mark.parametrize("bad", [42, "uid", int, None])
def test_anything_else_is_refused_naming_the_argument_the_value_and_the_forms(bad):
    with pytest.raises(ConfigurationError) as refused:
        as_struct(bad, "the schema of file_stream('in/')")
    message = str(refused.value)
    assert message.startswith(f"the schema of file_stream('in/') must be a StructType, a DDL string like "
                              f"'uid string, ts timestamp', or a dataclass (its fields' types become the columns); "
                              f"got {bad!r}")


def test_json_and_csv_files_name_their_fields_for_the_null_field_warning(tmp_path):
    from batchline.sources.files import FileSource
    from batchline.sources.source import SourceBatch

    (tmp_path / "a.json").write_text('{"user": 1, "ts": "2026-01-01T00:00:00Z"}\n{"user": 2}\n')
    (tmp_path / "a.csv").write_text("user;ts\n1;2026-01-01\n")

    def fields(format, file, **options):
        source = FileSource(str(tmp_path), format, "uid long, ts string", **options)
        return source.reads_fields_by_name, source.record_fields(
            SourceBatch({}, {}, ({"file": str(tmp_path / file)},)))

    assert fields("json", "a.json") == (True, ["user", "ts"])
    assert fields("csv", "a.csv", header=True, sep=";") == (True, ["user", "ts"])
    assert fields("csv", "a.csv") == (False, None)  # no header: the columns are by position
    assert fields("parquet", "a.json")[0] is False
