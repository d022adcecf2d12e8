"""An output that writes outside the process needs a checkpoint location: without one a rerun
would write again what the last run wrote, so start() refuses; with one, a rerun goes on."""

import json
import os

import pyarrow.dataset as ds
import pytest

from batchline import ConfigurationError, ContextStateError, StreamingContext
from batchline.testing import BatchRecorder, CollectSink
from tests.helpers import Count, running_count, wait_for

SCHEMA = "id int, name string"


def files_to_parquet(spark, incoming, out, checkpoint=None):
    ssc = StreamingContext(spark, "300ms", checkpoint=checkpoint)
    ssc.file_stream(str(incoming), "json", SCHEMA).write_files(str(out), name="events")
    return ssc


def test_an_output_that_writes_files_without_a_checkpoint_is_refused_at_start(spark, tmp_path):
    ssc = files_to_parquet(spark, tmp_path, tmp_path / "out")  # accepted while the pipeline is built
    ssc.file_stream(str(tmp_path), "json", SCHEMA, name="other").foreach_batch(CollectSink())
    with pytest.raises(ConfigurationError) as refused:
        ssc.start()
    message = str(refused.value)
    assert "output(s) 'events' (FileSink) write outside this process" in message
    assert "foreach_batch" not in message  # the user's function decides where it writes
    assert 'StreamingContext(..., checkpoint="a local path or s3://...")' in message
    assert "a rerun with the same location goes on where the last run stopped and writes nothing twice" in message
    assert not (tmp_path / "out").exists()


def test_a_stateful_operator_without_a_checkpoint_is_refused_at_start_in_the_same_words(spark, tmp_path):
    ssc = StreamingContext(spark, "300ms")
    ssc.file_stream(str(tmp_path), "json", SCHEMA).group_by_key("name").flat_map_groups_with_state(
        running_count, state_schema=Count, output_schema="key string, count long",
        name="counts").console()
    with pytest.raises(ConfigurationError, match=r"stateful operator\(s\) 'counts' keep their state at the "
                                                 r"checkpoint location\. Create the context with"):
        ssc.start()


def test_console_and_foreach_batch_need_no_checkpoint(spark, tmp_path):
    ssc = StreamingContext(spark, "300ms")
    stream = ssc.file_stream(str(tmp_path), "json", SCHEMA)
    stream.console()
    stream.foreach_batch(CollectSink())
    ssc.start()
    ssc.stop()


def test_two_runs_over_the_same_input_with_one_location_write_each_row_once(spark, tmp_path):
    incoming, out, checkpoint = tmp_path / "in", tmp_path / "out", str(tmp_path / "checkpoint")
    incoming.mkdir()
    for name, ids in (("a.json", [1, 2]), ("b.json", [3])):
        (incoming / name).write_text("".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in ids))
        os.utime(incoming / name, (0, 0))

    def written():
        if not out.exists():
            return []
        return sorted(ds.dataset(str(out), format="parquet", partitioning="hive").to_table().column("id").to_pylist())

    first = files_to_parquet(spark, incoming, out, checkpoint)
    first.start()
    wait_for(lambda: written() == [1, 2, 3], "the first run's rows", timeout_s=60)
    first.stop(graceful=True)

    second = files_to_parquet(spark, incoming, out, checkpoint)
    recorder = BatchRecorder()
    second.add_listener(recorder)
    second.start()
    wait_for(lambda: len(recorder.completed) >= 3, "three batches of the second run", timeout_s=60)
    second.stop(graceful=True)
    assert written() == [1, 2, 3]


def test_nothing_is_added_to_a_pipeline_once_it_has_started(spark, tmp_path):
    ssc = StreamingContext(spark, "300ms")
    events = ssc.file_stream(str(tmp_path), "json", SCHEMA)
    events.foreach_batch(CollectSink())
    ssc.start()
    try:
        with pytest.raises(ContextStateError, match="cannot add an input to a pipeline that has started"):
            ssc.file_stream(str(tmp_path), "json", SCHEMA, name="late")
        with pytest.raises(ContextStateError, match="cannot add an output to a pipeline that has started"):
            events.console()
    finally:
        ssc.stop(graceful=False)
