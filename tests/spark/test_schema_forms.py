"""Every schema argument takes a StructType, a DDL string or a dataclass alike, and refuses
anything else where it is given, naming the argument, the value and the three forms."""

import json
import os
from dataclasses import dataclass

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from batchline import ConfigurationError, StreamingContext
from batchline.sources.lists import END, ListSource
from batchline.sources.redis_streams import RedisStreamSource
from batchline.testing import BatchHarness, CollectSink, list_stream


@dataclass
class Event:
    uid: str
    n: int


FORMS = {
    "ddl": "uid string, n long",
    "struct": StructType([StructField("uid", StringType()), StructField("n", LongType())]),
    "dataclass": Event,
}
ROWS = [{"uid": "a", "n": 1}, {"uid": "b", "n": 2}]


class DeclaredSource(ListSource):
    """A user's source whose schema() returns the schema in any of the forms."""

    def __init__(self, items, declared):
        super().__init__(items, FORMS["struct"], bounded=True)
        self.declared = declared

    def schema(self):
        return self.declared


def test_each_input_gives_the_same_rows_for_a_schema_in_each_form(spark, tmp_path):
    (tmp_path / "a.json").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    os.utime(tmp_path / "a.json", (0, 0))
    ssc = StreamingContext(spark, "200ms")
    sinks = {}
    for form, schema in FORMS.items():
        inputs = {
            "files": ssc.file_stream(str(tmp_path), "json", schema, bounded=True, name=f"files-{form}"),
            "list": list_stream(ssc, [[("a", 1), ("b", 2)], END], schema, name=f"list-{form}", bounded=True),
            "source": ssc.input(DeclaredSource([[("a", 1), ("b", 2)], END], schema), name=f"source-{form}"),
        }
        for kind, stream in inputs.items():
            sinks[kind, form] = CollectSink()
            stream.foreach_batch(sinks[kind, form], name=f"{kind}-{form}-out")
    assert ssc.run_until_finished(120)
    for (kind, form), sink in sinks.items():
        assert sorted(sink.all_rows(), key=lambda r: r["uid"]) == ROWS, (kind, form)


def test_queue_redis_and_harness_schemas_take_each_form(spark):
    from batchline.sources.queue import QueueSource

    names = [("uid", "string"), ("n", "bigint")]
    for schema in FORMS.values():
        assert [(f.name, f.dataType.simpleString()) for f in QueueSource([], schema).schema().fields] == names
        redis = RedisStreamSource("redis://localhost:6379/0", ["orders"], schema=schema)
        assert [(f.name, f.dataType.simpleString()) for f in redis.fields_schema.fields] == names
    harness = BatchHarness(spark, lambda s: s, Event)
    try:
        assert harness.schema.fieldNames() == ["uid", "n"]
    finally:
        harness.ssc.stop()


@pytest.mark.parametrize("bad", [42, "uid strin g,, n", object])
def test_a_bad_schema_is_refused_at_the_call_naming_the_argument_and_the_forms(spark, tmp_path, bad):
    ssc = StreamingContext(spark, "1s")
    calls = {
        "the schema of file_stream": lambda: ssc.file_stream(str(tmp_path), "json", bad),
        "the schema of list_stream": lambda: list_stream(ssc, [END], bad),
        "the schema of queue_stream": lambda: ssc.queue_stream([], schema=bad),
        "the schema of redis_stream": lambda: ssc.redis_stream("redis://localhost:6379/0", ["o"], schema=bad),
        "what DeclaredSource.schema() returns": lambda: ssc.input(DeclaredSource([END], bad)),
    }
    for argument, call in calls.items():
        with pytest.raises(ConfigurationError) as refused:
            call()
        message = str(refused.value)
        assert argument in message and repr(bad) in message, message
        assert "a StructType, a DDL string like 'uid string, ts timestamp', or a dataclass" in message
