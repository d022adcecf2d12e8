"""The built-in inputs as ``Source``s keep the shapes their checkpoints and batch logs had
before (a checkpoint written then restarts as it did), and say what the engine needs of
them: counts known at planning, a queue that cannot replay. No Spark: plans are Python."""

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from batchline.errors import ConfigurationError
from batchline.sources.generator import GeneratorSource
from batchline.sources.lists import END, ListSource
from batchline.sources.queue import QueueSource
from batchline.sources.source import BatchTimes, SourceBatch

SCHEMA = StructType([StructField("n", LongType())])
AT = BatchTimes(13_000, 10_000)


def test_the_generator_plans_the_events_due_by_the_batch_time_under_its_limits():
    generator = GeneratorSource(rate=10, max_records_per_batch=15, total=100)
    batch = generator.plan_at({"next_index": 20}, {"next_index": 100}, AT)
    assert (batch.start, batch.end, batch.records) == ({"next_index": 20}, {"next_index": 30}, 10)
    assert generator.plan_at({"next_index": 0}, None, BatchTimes(30_000, 10_000)).records == 15
    assert generator.plan_at({"next_index": 95}, None, BatchTimes(30_000, 10_000)).end == {"next_index": 100}
    assert generator.exhausted({"next_index": 100}, generator.end_of_input())
    assert generator.log_batch(batch) == {"start": 20, "end": 30}
    assert generator.logged_batch({"start": 20, "end": 30}, {"next_index": 20}, AT) == batch
    assert generator.checkpoint_position(batch.end, None) == {"next_index": 30}
    assert generator.restore_position({"next_index": 30}) == ({"next_index": 30}, {"next_index": 100})
    with pytest.raises(ConfigurationError, match="before the pipeline started"):
        generator.plan_at({"next_index": 0}, None, BatchTimes(13_000, None))


def test_the_list_source_takes_an_item_a_batch_and_ends_at_its_end_marker():
    source = ListSource([[{"n": 1}, {"n": 2}], [], END, [{"n": 3}]], SCHEMA, bounded=True)
    first = source.plan_at({"next": 0}, None, AT)
    assert (first.end, first.records, source.log_batch(first)) == ({"next": 1}, 2, {"start": 0, "end": 1})
    empty = source.plan_at(first.end, None, AT)
    assert (empty.end, empty.records, empty.splits) == ({"next": 2}, 0, ())
    assert source.plan_at(empty.end, None, AT).end == {"next": 2}  # END: nothing more
    assert source.exhausted(empty.end, source.end_of_input())
    assert source.checkpoint_position(empty.end, None) == {"next": 2}
    assert source.logged_batch({"start": 0, "end": 1}, None, AT) == SourceBatch(
        {"next": 0}, {"next": 1}, ({"start": 0, "end": 1},), records=2)


def test_a_queue_keeps_nothing_in_the_checkpoint_and_cannot_replay_a_logged_batch():
    queue = QueueSource([], schema=SCHEMA)
    batch = queue.plan({"taken": 0}, None)
    assert (batch.splits, queue.log_batch(batch), batch.info) == ((), {"frames": 0}, {"frames": 0})
    assert queue.checkpoint_position(batch.end, None) == {}
    assert queue.restore_position({}) == (None, None)
    logged = queue.logged_batch({"frames": 2}, {"taken": 0}, AT)
    assert logged.records == 0 and len(logged.splits) == 2 and not queue.can_replay(logged)
    assert not queue.counted
