"""Directory source and file output end to end on a real SparkSession and real time."""

import json
import logging
import os

import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from batchline import StreamingContext
from batchline.testing import BatchRecorder, CollectSink
from tests.helpers import LogWatcher

SCHEMA = StructType([StructField("id", IntegerType(), False), StructField("name", StringType(), True)])


def write_atomically(path, text):
    hidden = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(hidden, "w") as handle:
        handle.write(text)
    os.rename(hidden, path)


def json_lines(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.fixture
def pipeline(spark):
    contexts = []

    def make(**kwargs):
        ssc = StreamingContext(spark, "500ms", **kwargs)
        recorder = BatchRecorder()
        ssc.add_listener(recorder)
        contexts.append(ssc)
        return ssc, recorder

    yield make
    for ssc in contexts:
        ssc.stop()


def test_each_new_file_lands_whole_in_one_batch_and_hidden_files_are_ignored(pipeline, tmp_path):
    incoming = tmp_path / "in"
    incoming.mkdir()
    ignored = [{"id": 666, "name": "never"}]
    for name in (".hidden.json", "_meta.json", "upload.json.tmp", "copy.json._COPYING_"):
        (incoming / name).write_text(json_lines(ignored))
    ssc, recorder = pipeline()
    stream = ssc.file_stream(str(incoming), "json", SCHEMA, settle=0.3)
    sink = CollectSink()
    stream.foreach_batch(sink)
    ssc.start()

    files = {
        "a.json": [{"id": 1, "name": "ann"}, {"id": 2, "name": "bob"}],
        "b.json": [{"id": 3, "name": None}],
        "c.json": [{"id": 4, "name": "cy"}, {"id": 5, "name": "di"}, {"id": 6, "name": "ed"}],
    }
    for name, rows in files.items():
        write_atomically(str(incoming / name), json_lines(rows))
        sink.wait_for_rows(lambda got, rows=rows: all(r in got for r in rows))
    ssc.stop(graceful=True)

    non_empty = [rows for _, rows in sorted(sink.batches.items()) if rows]
    assert non_empty == [sorted(rows, key=lambda r: tuple(str(v) for v in r.values())) for rows in files.values()]
    assert all(r["id"] != 666 for r in sink.all_rows())
    counted = [i.num_records for i in recorder.completed if i.num_records]
    assert counted == [2, 1, 3]


def test_a_file_still_being_written_is_not_taken_until_it_settles(pipeline, tmp_path):
    ssc, recorder = pipeline()
    stream = ssc.text_file_stream(str(tmp_path), settle=2.0)
    sink = CollectSink(sort=False)
    stream.foreach_batch(sink)
    ssc.start()
    with open(tmp_path / "slow.txt", "w") as handle:
        handle.write("first half\n")
        handle.flush()
        seen = len(recorder.wait_for_completed(1))
        recorder.wait_for_completed(seen + 2)  # a second of batches while the file is open
        assert sink.all_rows() == []
        handle.write("second half\n")
    sink.wait_for_rows(lambda got: len(got) >= 2)
    ssc.stop(graceful=True)
    assert [rows for rows in sink.batches.values() if rows] == [[{"value": "first half"}, {"value": "second half"}]]


def test_bad_json_lines_become_dead_letters_with_reasons(pipeline, tmp_path):
    lines = [
        '{"id": 1, "name": "ok"}',
        "{not json",
        '{"id": "seven", "name": "x"}',
        '{"name": "no id"}',
        "",
        '{"id": 2}',
        "[1, 2, 3]",
    ]
    (tmp_path / "mixed.json").write_text("\n".join(lines) + "\n")
    os.utime(tmp_path / "mixed.json", (0, 0))
    ssc, recorder = pipeline()
    stream = ssc.file_stream(str(tmp_path), "json", SCHEMA)
    good, bad = CollectSink(), CollectSink()
    stream.foreach_batch(good)
    stream.dead_letters.foreach_batch(bad)
    ssc.start()
    bad.wait_for_rows(lambda got: len(got) >= 4)
    ssc.stop(graceful=True)
    assert good.all_rows() == [{"id": 1, "name": "ok"}, {"id": 2, "name": None}]
    reasons = {row["raw_record"]: row["reason"] for row in bad.all_rows()}
    assert reasons == {
        "{not json": "malformed JSON: not one JSON object per line",
        '{"id": "seven", "name": "x"}': "field 'id': expected int, got seven",
        '{"name": "no id"}': "field 'id' is required but missing or null",
        "[1, 2, 3]": "malformed JSON: not one JSON object per line",
    }
    assert all(row["source"].endswith("mixed.json") for row in bad.all_rows())
    batch = next(i for i in recorder.completed if i.num_records)
    assert (batch.num_records, batch.dead_letters) == (2, 4)


def test_dead_letters_without_an_output_are_logged_not_lost(pipeline, tmp_path):
    (tmp_path / "bad.json").write_text('{"id": 1}\n{"id": true}\n')
    os.utime(tmp_path / "bad.json", (0, 0))
    ssc, recorder = pipeline()
    ssc.file_stream(str(tmp_path), "json", SCHEMA).foreach_batch(CollectSink())
    with LogWatcher() as logs:
        ssc.start()
        logs.wait_for("Dead letter from")
        ssc.stop(graceful=True)
    warnings = logs.messages(level=logging.WARNING)
    assert any("1 bad records" in m and "attach an output to stream.dead_letters" in m for m in warnings)
    assert any("field 'id': expected int, got true" in m and '{"id": true}' in m for m in warnings)


def test_csv_with_header_and_bad_rows(pipeline, tmp_path):
    (tmp_path / "people.csv").write_text("id,name\n1,ann\nx,bob\n3,cy,extra\n4,\n")
    os.utime(tmp_path / "people.csv", (0, 0))
    ssc, _ = pipeline()
    stream = ssc.file_stream(str(tmp_path), "csv", SCHEMA, header=True)
    good, bad = CollectSink(), CollectSink()
    stream.foreach_batch(good)
    stream.dead_letters.foreach_batch(bad)
    ssc.start()
    bad.wait_for_rows(lambda got: len(got) >= 2)
    ssc.stop(graceful=True)
    assert good.all_rows() == [{"id": 1, "name": "ann"}, {"id": 4, "name": None}]
    assert {r["raw_record"]: r["reason"] for r in bad.all_rows()} == {
        "x,bob": "field 'id': expected int, got x",
        "3,cy,extra": "too many fields: expected 2 separated by ','",
    }


def test_parquet_input_and_both_file_outputs_are_clean_for_plain_readers(pipeline, tmp_path):
    incoming = tmp_path / "in"
    incoming.mkdir()
    frame = pd.DataFrame({"id": pd.array(range(50), dtype="int32"), "name": [f"n{i}" for i in range(50)]})
    frame.to_parquet(incoming / "part.parquet", index=False)
    os.utime(incoming / "part.parquet", (0, 0))
    out_parquet, out_json = tmp_path / "out-parquet", tmp_path / "out-json"
    ssc, recorder = pipeline(checkpoint=str(tmp_path / "checkpoint"))
    stream = ssc.file_stream(str(incoming), "parquet", SCHEMA)
    repartitioned = stream.transform(lambda df: df.repartition(4))
    repartitioned.write_files(str(out_parquet))
    repartitioned.write_files(str(out_json), format="json")
    ssc.start()
    recorder.wait_for_completed(3)  # the batch with the file, then empty batches
    ssc.stop(graceful=True)

    for out in (out_parquet, out_json):
        visible = [p for p in out.rglob("*") if p.is_file() and not any(
            part.startswith(("_", ".")) for part in p.relative_to(out).parts)]
        assert visible, f"nothing written to {out}"
        assert all(p.stat().st_size > 0 for p in visible), "a reader would see an empty file"
        assert len({p.parent for p in visible}) == 1, "exactly one batch had rows"
        assert visible[0].parent.name.startswith("batch_time=")

    table = ds.dataset(str(out_parquet), format="parquet", partitioning="hive").to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(50))
    for path in out_parquet.rglob("*.parquet"):
        if "_staging" not in str(path):
            assert pq.ParquetFile(path).metadata.num_rows > 0
    rows = [json.loads(line) for p in out_json.rglob("part-*") if "_staging" not in str(p)
            for line in p.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == list(range(50))
    assert pd.read_parquet(out_parquet)["id"].sort_values().tolist() == list(range(50))


def test_unknown_formats_and_missing_schemas_are_refused(spark, tmp_path):
    from batchline import ConfigurationError

    ssc = StreamingContext(spark, "1s")
    with pytest.raises(ConfigurationError, match="use one of json, csv, parquet, text"):
        ssc.file_stream(str(tmp_path), "xml", SCHEMA)
    with pytest.raises(ConfigurationError, match="needs a schema"):
        ssc.file_stream(str(tmp_path), "json")
    stream = ssc.text_file_stream(str(tmp_path))
    with pytest.raises(ConfigurationError, match="use one of parquet, json"):
        stream.write_files(str(tmp_path / "o"), format="csv")
