"""The Kafka source's logic that needs no broker: a batch's cap shared among partitions, the
starting offsets a user may give, and JSON values parsed by Arrow with each bad one a dead
letter naming its reason (however many good ones surround it)."""

import json

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from batchline.errors import ConfigurationError
from batchline.sources.kafka import KafkaSource, _arrow_type, _capped, _splits, _starting_offsets
from batchline.sources.source import DeadLetter


def test_a_cap_is_shared_by_what_each_partition_has_waiting_and_every_waiting_partition_moves():
    ranges = {("t", 0): (0, 900), ("t", 1): (50, 150), ("t", 2): (7, 7), ("u", 0): (0, 1)}
    capped = _capped(ranges, 100)
    assert capped[("t", 0)] == (0, 89)  # 900 of the 1001 waiting
    assert capped[("t", 1)] == (50, 59)
    assert sum(until - first for first, until in capped.values()) <= 100
    assert capped[("t", 2)] == (7, 7)
    assert capped[("u", 0)] == (0, 1)  # its share rounds to 0, but it moves on
    assert _capped(ranges, None) == ranges
    assert _capped(ranges, 10_000) == ranges


def test_starting_offsets_are_earliest_latest_or_offsets_per_partition():
    assert _starting_offsets("latest") == "latest"
    assert _starting_offsets({"t": {0: 5, "1": -2}}) == {"t": {"0": 5, "1": -2}}
    with pytest.raises(ConfigurationError, match="earliest"):
        _starting_offsets("oldest")
    with pytest.raises(ConfigurationError, match="integers"):
        _starting_offsets({"t": {"zero": 5}})


def test_a_source_names_its_topics_one_way():
    with pytest.raises(ConfigurationError, match="not both"):
        KafkaSource("b:9092", topics=["t"], pattern="t.*")
    with pytest.raises(ConfigurationError, match="list of topic names"):
        KafkaSource("b:9092", topics="t")
    with pytest.raises(ConfigurationError, match="not in config"):
        KafkaSource("b:9092", topics=["t"], config={"bootstrap.servers": "x"})
    with pytest.raises(ConfigurationError, match="may not name a column 'kafka'"):
        KafkaSource("b:9092", topics=["t"], schema="kafka string")


def coordinates(count):
    schema = _arrow_type(KafkaSource("b:9092", topics=["t"], schema="n long").schema()["kafka"].dataType)
    rows = [{"topic": "t", "partition": 0, "offset": i, "timestamp": None, "key": None, "headers": None}
            for i in range(count)]
    return pa.array(rows, schema)


def test_json_values_parse_at_once_and_bad_ones_become_dead_letters_in_their_place():
    schema = StructType([StructField("n", LongType(), False), StructField("user", StringType(), True)])
    source = KafkaSource("b:9092", topics=["t"], schema=schema)
    values = [json.dumps({"n": i, "user": f"u{i}"}).encode() for i in range(1000)]
    values[3] = b"{broken"
    values[500] = b'{"user": "no n"}'
    values[998] = b'{"n": "x"}'
    values[999] = None
    out = list(source._parsed(values, coordinates(len(values))))
    batches = [o for o in out if isinstance(o, pa.RecordBatch)]
    dead = {json.loads(o.raw)["offset"]: o.reason for o in out if isinstance(o, DeadLetter)}
    assert set(dead) == {3, 500, 998, 999}
    assert dead[3].startswith("malformed JSON")
    assert dead[500] == "field 'n' is required but missing or null"
    assert dead[998].startswith("field 'n': expected int64")
    assert "tombstone" in dead[999]
    good = pa.Table.from_batches(batches)
    assert good.column("n").to_pylist() == [i for i in range(1000) if i not in (3, 500, 998, 999)]
    assert [o["offset"] for o in good.column("kafka").to_pylist()] == good.column("n").to_pylist()
    assert len(batches) < 30  # a few passes, not one per record


def test_values_with_newlines_inside_still_parse():
    source = KafkaSource("b:9092", topics=["t"], schema="n long")
    out = list(source._parsed([b'{\n  "n": 1\n}', b'{"n": 2}'], coordinates(2)))
    assert [b.column("n").to_pylist() for b in out] == [[1, 2]]


def test_small_ranges_share_a_task_and_long_ones_are_cut_to_keep_the_cores_busy():
    small = {("t", p): (100 * p, 100 * p + 50) for p in range(6)}  # 300 records in 6 partitions
    assert _splits(small, 100_000, 2) == [{"ranges": [["t", p, 100 * p, 100 * p + 50] for p in range(6)]}]
    busy = {("t", 0): (0, 30_000), ("t", 1): (0, 2_000), ("t", 2): (5, 5)}
    splits = _splits(busy, 100_000, 2)  # 32k records: two tasks of 16k
    assert splits == [{"ranges": [["t", 0, 0, 16_000]]},
                      {"ranges": [["t", 0, 16_000, 30_000], ["t", 1, 0, 2_000]]}]
    capped = _splits({("t", 0): (0, 250)}, 100, 2)  # never more than split_size a task
    assert [r for s in capped for r in s["ranges"]] == [["t", 0, 0, 84], ["t", 0, 84, 168], ["t", 0, 168, 250]]
    assert _splits({("t", 0): (7, 7)}, 100, 2) == []
