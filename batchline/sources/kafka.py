"""Records of Kafka topics, read exactly once per batch (SPEC B3), on the Source interface.

A position is the next offset to read of every topic-partition (``{"orders": {"0": 1200}}``).
Planning a batch asks the brokers, from the driver, for each partition's log start and its
last stable offset (what a read_committed consumer may read: records of open transactions
lie beyond it), and takes the range in between, capped by ``max_records_per_batch`` (shared
among partitions by what each has waiting). Ranges longer than ``split_size`` are cut, so a
busy partition is read by several Spark tasks. The ranges go to the batch log before any job
runs; a task assigns its partition, seeks to the range's first offset and reads up to its
end with librdkafka, read_committed (the offsets of control records and of aborted
transactions' records are gaps, not loss). A restart reads exactly the logged ranges.

Records deleted by retention before they were read fail the batch, naming the partition and
the offsets, or, with ``fail_on_data_loss=False``, are skipped, logged at WARN and counted in
the batch's input information (``records_lost``). After a batch commits, the consumer
group's offsets are committed too, so lag tools see how far behind the pipeline is; the
position always comes from the checkpoint, never from the group.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from batchline.errors import ConfigurationError, SourceError
from batchline.kafka_clients import (
    TopicPartitionKey,
    admin_client,
    client_settings,
    kafka_module,
    list_offsets,
    topic_partitions,
)
from batchline.sources.source import DeadLetter, Position, Source, SourceBatch, SourceRun, Split
from batchline.state.schema import as_struct

__all__ = ["KafkaSource", "DEFAULT_SPLIT_SIZE", "KAFKA_COLUMN"]

logger = logging.getLogger(__name__)

DEFAULT_SPLIT_SIZE = 100_000
KAFKA_COLUMN = "kafka"
"""With a schema, the column of each row's Kafka coordinates (topic, partition, offset,
timestamp, key, headers): one struct, so that none of them clashes with a field of the records."""
_CONSUME_AT_ONCE = 10_000
_RECORDS_WORTH_A_TASK = 5_000
"""Fewer records than this in a batch are read by one task: a task's own cost (a consumer, a
Python worker's turn, a fetch) outweighs what a second core would save."""
_FORMATS = ("bytes", "json")

_HEADERS = ArrayType(StructType([StructField("key", StringType(), False), StructField("value", BinaryType(), True)]),
                     False)
_COORDINATES = [StructField("topic", StringType(), False), StructField("partition", IntegerType(), False),
                StructField("offset", LongType(), False), StructField("timestamp", TimestampType(), True)]
_BYTES_SCHEMA = StructType([StructField("key", BinaryType(), True), StructField("value", BinaryType(), True),
                            *_COORDINATES, StructField("headers", _HEADERS, True)])
_KAFKA_STRUCT = StructType([*_COORDINATES, StructField("key", BinaryType(), True),
                            StructField("headers", _HEADERS, True)])


class KafkaSource(Source):
    """The records of ``topics`` (or of every topic matching ``pattern``) at
    ``bootstrap_servers``: ``key``, ``value`` (bytes), ``topic``, ``partition``, ``offset``,
    ``timestamp`` and ``headers``; or, with ``schema``, the columns of each record's value
    parsed as a JSON object and a ``kafka`` column holding the other six (a record whose
    value does not parse goes to the dead letters with the reason)."""

    def __init__(self, bootstrap_servers: str, *, topics: Sequence[str] | None = None, pattern: str | None = None,
                 starting_offsets: str | Mapping[str, Mapping[Any, int]] = "earliest",
                 max_records_per_batch: int | None = None, schema: StructType | str | type | None = None,
                 format: str | None = None, config: Mapping[str, Any] | None = None, bounded: bool = False,
                 fail_on_data_loss: bool = True, group_id: str | None = None,
                 split_size: int = DEFAULT_SPLIT_SIZE, timeout_s: float = 60.0) -> None:
        if (topics is None) == (pattern is None):
            raise ConfigurationError("name the input topics with topics=[...] or with pattern='regex', not both")
        if topics is not None and (isinstance(topics, str) or not topics
                                   or not all(isinstance(t, str) and t for t in topics)):
            raise ConfigurationError(f"topics is a list of topic names, e.g. ['orders']; got {topics!r}")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ConfigurationError(f"pattern {pattern!r} is not a regular expression: {error}") from error
        if max_records_per_batch is not None and max_records_per_batch <= 0:
            raise ConfigurationError(f"max_records_per_batch must be positive; got {max_records_per_batch}")
        if split_size <= 0:
            raise ConfigurationError(f"split_size must be positive; got {split_size}")
        self.value_schema = None if schema is None else as_struct(schema, "the schema of kafka_stream")
        format = format or ("json" if schema is not None else "bytes")
        if format not in _FORMATS:
            raise ConfigurationError(f"format is 'bytes' or 'json'; got {format!r}")
        if format == "json" and self.value_schema is None:
            raise ConfigurationError("format='json' needs the records' schema: kafka_stream(..., schema=...)")
        if format == "bytes" and self.value_schema is not None:
            raise ConfigurationError("a schema parses the records' values as JSON: leave format out, or 'json'")
        if self.value_schema is not None and KAFKA_COLUMN in self.value_schema.fieldNames():
            raise ConfigurationError(f"the schema may not name a column {KAFKA_COLUMN!r}: every row has it for the "
                                     "record's topic, partition, offset, timestamp, key and headers")
        self.starting_offsets = _starting_offsets(starting_offsets)
        self.bootstrap_servers = bootstrap_servers
        self.topics = None if topics is None else list(dict.fromkeys(topics))
        self.pattern = pattern
        self.max_records_per_batch = max_records_per_batch
        self.bounded = bounded
        self.fail_on_data_loss = fail_on_data_loss
        self.group_id = group_id
        self.split_size = split_size
        self.timeout_s = timeout_s
        self.config = dict(config or {})
        client_settings(bootstrap_servers, self.config)  # refuses bad settings now, not in a task
        self._admin: Any = None
        self._committer: Any = None
        self._parallelism = 2
        """Spark's default parallelism (``attach``): how many tasks a small batch is spread over."""
        self._arrow_schema: pa.Schema | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_admin"] = state["_committer"] = None  # clients are opened where they are used
        return state

    def __repr__(self) -> str:
        return f"KafkaSource({self.bootstrap_servers!r}, {self.topics or self.pattern!r})"

    @property
    def _what(self) -> str:
        return f"Kafka input {', '.join(self.topics) if self.topics else repr(self.pattern)}"

    # ---------------------------------------------------------------- the Source interface
    def schema(self) -> StructType:
        if self.value_schema is None:
            return _BYTES_SCHEMA
        return StructType([*self.value_schema.fields, StructField(KAFKA_COLUMN, _KAFKA_STRUCT, False)])

    def initial_position(self) -> Position:
        """``starting_offsets`` of the partitions present now; a partition that appears later is
        read from its first offset."""
        partitions = self._partitions()
        if self.starting_offsets == "earliest":
            offsets = list_offsets(self._admin_client(), partitions, False, self._what)
        elif self.starting_offsets == "latest":
            offsets = list_offsets(self._admin_client(), partitions, True, self._what)
        else:
            offsets = {}
            given: Mapping[str, Mapping[str, int]] = self.starting_offsets  # type: ignore[assignment]
            unknown = [f"{t}/{p}" for t, ps in given.items() for p in ps if (t, int(p)) not in partitions]
            if unknown:
                raise ConfigurationError(f"starting_offsets names partitions the cluster does not have: "
                                         f"{', '.join(unknown)}; it has {_named(partitions)}")
            earliest = list_offsets(self._admin_client(), partitions, False, self._what)
            latest = list_offsets(self._admin_client(), partitions, True, self._what)
            for tp in partitions:
                wanted = given.get(tp[0], {}).get(str(tp[1]), -2)
                offsets[tp] = earliest[tp] if wanted == -2 else latest[tp] if wanted == -1 else int(wanted)
        return {"offsets": _as_position(offsets)}

    def end_of_input(self) -> Position:
        return {"offsets": _as_position(list_offsets(self._admin_client(), self._partitions(), True, self._what))}

    def exhausted(self, position: Position, end_of_input: Position) -> bool:
        at = _offsets(position)
        return all(at.get(tp, 0) >= end for tp, end in _offsets(end_of_input).items())

    def plan(self, start: Position, end_of_input: Position | None) -> SourceBatch:
        admin = self._admin_client()
        at = _offsets(start)
        present = set(self._partitions())
        gone = sorted(tp for tp in at if tp not in present)
        if gone:
            message = (f"{self._what}: partitions {_named(gone)} no longer exist (their topic was deleted or "
                       "recreated); records of them not read yet are lost")
            if self.fail_on_data_loss:
                raise SourceError(message + ". Restore the topic, or pass fail_on_data_loss=False to go on without "
                                  "them")
            logger.warning("%s; going on without them (fail_on_data_loss=False)", message)
            for tp in gone:
                del at[tp]
        wanted = sorted(present if end_of_input is None else present & set(_offsets(end_of_input)))
        earliest = list_offsets(admin, wanted, False, self._what)
        latest = list_offsets(admin, wanted, True, self._what)
        if end_of_input is not None:
            ends = _offsets(end_of_input)
            latest = {tp: min(offset, ends[tp]) for tp, offset in latest.items()}
        new = [tp for tp in wanted if tp not in at]
        if new:
            logger.info("%s: reading new partitions %s from their first offset", self._what, _named(new))
        lost: dict[str, list[int]] = {}
        ranges: dict[TopicPartitionKey, tuple[int, int]] = {}
        for tp in wanted:
            first = at.get(tp, earliest[tp])
            if first < earliest[tp] or first > latest[tp] and end_of_input is None:
                missing = (first, earliest[tp]) if first < earliest[tp] else (latest[tp], first)
                self._lose(tp, missing, "were deleted (retention) before they were read" if first < earliest[tp]
                           else "are gone: the partition now ends before them (the topic was recreated)")
                lost[_name(tp)] = list(missing)
                first = earliest[tp]
            ranges[tp] = (first, max(first, latest[tp]))
        ranges = _capped(ranges, self.max_records_per_batch)
        splits = _splits(ranges, self.split_size, self._parallelism)
        end = {**at, **{tp: until for tp, (_, until) in ranges.items()}}
        info: dict[str, Any] = {}
        if splits:
            info["offsets"] = {_name(tp): [first, until] for tp, (first, until) in sorted(ranges.items())
                               if until > first}
        behind = {_name(tp): latest[tp] - end[tp] for tp in wanted if latest[tp] > end[tp]}
        if behind:
            info["lag_by_partition"] = behind
        if lost:
            info["records_lost"] = sum(b - a for a, b in lost.values())
            info["lost_offsets"] = lost
        return SourceBatch(dict(start), {"offsets": _as_position(end)}, tuple(splits), info,
                           lag=sum(behind.values()))

    def read(self, split: Split) -> Iterator[Any]:
        """The split's offset ranges, read_committed by one consumer, as Arrow batches (dead
        letters one by one)."""
        kafka = kafka_module()
        # A short fetch wait: a range that ends in control records is known read at the end of
        # the partition, which a fetch that waits for more data would hold up (500 ms by default).
        consumer = kafka.Consumer(client_settings(
            self.bootstrap_servers, self.config, group_id=self._group(), enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="error", enable_partition_eof=True,
            fetch_max_bytes=64 << 20, fetch_wait_max_ms=10))
        try:
            for topic, partition, first, until in _ranges(split):
                consumer.assign([kafka.TopicPartition(topic, partition, first)])
                yield from self._records(consumer, topic, partition, first, until)
        finally:
            consumer.close()

    def attach(self, run: SourceRun) -> None:
        self._parallelism = max(1, int(run.spark.sparkContext.defaultParallelism))

    def can_replay(self, batch: SourceBatch) -> bool:
        """Every logged range must still be there: records deleted since (retention) stop the
        restart naming them, or with ``fail_on_data_loss=False`` are skipped when read."""
        ranges = [r for split in batch.splits for r in _ranges(split)]
        earliest = list_offsets(self._admin_client(), sorted({(t, p) for t, p, _, _ in ranges}), False, self._what)
        for topic, partition, first, until in ranges:
            if first < earliest[(topic, partition)]:
                self._lose((topic, partition), (first, min(earliest[(topic, partition)], until)),
                           "were deleted (retention) after this batch was logged, before it ran again")
        return True

    def acknowledge(self, batch: SourceBatch) -> None:
        """The consumer group's offsets where the batch ended, for lag tools (never read back)."""
        kafka = kafka_module()
        ranges = batch.info.get("offsets", {})
        if not ranges:
            return
        if self._committer is None:
            self._committer = kafka.Consumer(client_settings(self.bootstrap_servers, self.config,
                                                             group_id=self._group(), enable_auto_commit=False))
        offsets = [kafka.TopicPartition(*_parse_name(name), int(until)) for name, (_, until) in ranges.items()]
        self._committer.commit(offsets=offsets, asynchronous=False)

    def close(self) -> None:
        if self._committer is not None:
            self._committer.close()
            self._committer = None
        self._admin = None

    # ---------------------------------------------------------------- reading a split
    def _records(self, consumer: Any, topic: str, partition: int, first: int, until: int) -> Iterator[Any]:
        kafka = kafka_module()
        eof = kafka.KafkaError._PARTITION_EOF  # noqa: SLF001 (librdkafka's name for the event)
        next_offset, idle_since = first, time.monotonic()
        while next_offset < until:
            messages = consumer.consume(min(_CONSUME_AT_ONCE, until - next_offset), 1.0)
            good = []
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == eof:
                        if message.offset() >= until:  # the rest of the range were control records
                            next_offset = until
                        continue
                    if error.code() in (kafka.KafkaError._AUTO_OFFSET_RESET,  # noqa: SLF001 (as above)
                                        kafka.KafkaError.OFFSET_OUT_OF_RANGE):
                        next_offset = self._lost_while_reading(consumer, topic, partition, next_offset, until)
                        break
                    if error.fatal() or not error.retriable():
                        raise SourceError(f"reading {topic}/{partition} offsets {first} to {until - 1} failed: "
                                          f"{error.str()}. The batch runs again from its logged offsets")
                    continue
                offset = message.offset()
                if offset >= until:
                    next_offset = until
                    break
                good.append(message)
                next_offset = offset + 1
            if good:
                idle_since = time.monotonic()
                yield from self._rows(good)
            elif next_offset < until:
                position = consumer.position([kafka.TopicPartition(topic, partition)])[0].offset
                if position >= until:  # only control records or aborted ones were left
                    break
                if time.monotonic() - idle_since > self.timeout_s:
                    raise SourceError(
                        f"reading {topic}/{partition}: offsets {next_offset} to {until - 1} were logged for this "
                        f"batch but no record came for {self.timeout_s:g} s. Check that the brokers are up; the "
                        "batch runs again from its logged offsets")

    def _lost_while_reading(self, consumer: Any, topic: str, partition: int, at: int, until: int) -> int:
        """Records of a logged range deleted (retention) since the batch was planned."""
        kafka = kafka_module()
        low, _ = consumer.get_watermark_offsets(kafka.TopicPartition(topic, partition), timeout=30)
        self._lose((topic, partition), (at, min(low, until)), "were deleted (retention) before this batch read them")
        if low < until:
            consumer.assign([kafka.TopicPartition(topic, partition, low)])
        return max(at, min(low, until))

    def _lose(self, tp: TopicPartitionKey, missing: tuple[int, int], how: str) -> None:
        first, end = missing
        message = f"{self._what}: records of {_name(tp)} at offsets {first} to {end - 1} {how}"
        if self.fail_on_data_loss:
            raise SourceError(message + ". Keep records longer (retention.ms) than the pipeline may lag; to go on "
                              "past the loss, pass fail_on_data_loss=False")
        logger.warning("%s; skipping them (fail_on_data_loss=False)", message)

    def _rows(self, messages: list[Any]) -> Iterator[Any]:
        topics = pa.array([m.topic() for m in messages], pa.string())
        partitions = pa.array([m.partition() for m in messages], pa.int32())
        offsets = pa.array([m.offset() for m in messages], pa.int64())
        stamps = [m.timestamp() for m in messages]
        timestamps = pa.array([ms if kind else None for kind, ms in stamps], pa.int64()).cast(
            pa.timestamp("ms", tz="UTC"))
        keys = pa.array([m.key() for m in messages], pa.binary())
        found_headers = [m.headers() for m in messages]
        headers_type = _arrow_type(_HEADERS)
        headers = (pa.array([None if h is None else [{"key": k, "value": v} for k, v in h] for h in found_headers],
                            headers_type)
                   if any(found_headers) else pa.nulls(len(messages), headers_type))
        values = [m.value() for m in messages]
        if self.value_schema is None:
            yield pa.RecordBatch.from_arrays(
                [keys, pa.array(values, pa.binary()), topics, partitions, offsets, timestamps, headers],
                names=_BYTES_SCHEMA.fieldNames())
            return
        coordinates = pa.StructArray.from_arrays([topics, partitions, offsets, timestamps, keys, headers],
                                                 names=_KAFKA_STRUCT.fieldNames())
        yield from self._parsed(values, coordinates)

    def _parsed(self, values: list[bytes | None], coordinates: pa.StructArray) -> Iterator[Any]:
        """The values parsed as JSON objects by Arrow, all at once. When some do not parse, the
        values are halved until every part parses or is one bad value: a few bad records cost
        a few more passes, not a pass per record, and each becomes a dead letter naming its reason."""
        schema = self._value_arrow_schema()
        names = [*schema.names, KAFKA_COLUMN]
        parts = [(0, len(values))]
        while parts:
            low, high = parts.pop()
            parsed = _json_batch(values[low:high], schema)
            if parsed is None and high - low > 1:
                middle = (low + high) // 2
                parts += [(middle, high), (low, middle)]  # the lower half first, to keep the order
                continue
            if parsed is None:
                yield DeadLetter(_raw(coordinates[low].as_py(), values[low]), _why_not(values[low], schema))
                continue
            batch = pa.RecordBatch.from_arrays([*parsed.columns, coordinates.slice(low, high - low)], names=names)
            missing = _rows_missing_required(parsed, schema)
            if missing is None:
                yield batch
                continue
            yield batch.filter(pc.invert(missing))
            for index in pc.indices_nonzero(missing).to_pylist():
                yield DeadLetter(_raw(coordinates[low + index].as_py(), values[low + index]),
                                 str(_missing_required(parsed.slice(index, 1), schema)))

    def _value_arrow_schema(self) -> pa.Schema:
        if self._arrow_schema is None:
            from pyspark.sql.pandas.types import to_arrow_schema

            assert self.value_schema is not None
            self._arrow_schema = to_arrow_schema(self.value_schema, timezone="UTC")
        return self._arrow_schema

    # ---------------------------------------------------------------- the brokers
    def _group(self) -> str:
        return self.group_id or "batchline-" + "-".join(self.topics or [self.pattern or ""])

    def _admin_client(self) -> Any:
        if self._admin is None:
            self._admin = admin_client(self.bootstrap_servers, self.config)
        return self._admin

    def _partitions(self) -> list[TopicPartitionKey]:
        """The partitions of the input's topics as the cluster has them now (a topic named in
        ``topics`` that does not exist yet has none)."""
        found = topic_partitions(self._admin_client(), self._what)
        if self.topics is not None:
            names = [t for t in self.topics if t in found]
        else:
            matcher = re.compile(self.pattern or "")
            names = sorted(t for t in found if matcher.fullmatch(t))
        return [(topic, partition) for topic in names for partition in found[topic]]


@functools.cache
def _arrow_type(kind: Any) -> pa.DataType:
    """A Spark type as Arrow carries it (timestamps in UTC), worked out once per type."""
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(kind, timezone="UTC")


# ------------------------------------------------------------------------------ positions
def _starting_offsets(value: str | Mapping[str, Mapping[Any, int]]) -> str | dict[str, dict[str, int]]:
    if value in ("earliest", "latest"):
        return str(value)
    if not isinstance(value, Mapping) or not all(isinstance(ps, Mapping) for ps in value.values()):
        raise ConfigurationError("starting_offsets is 'earliest', 'latest' or {topic: {partition: offset}} (-2: "
                                 f"earliest, -1: latest); got {value!r}")
    try:
        return {str(t): {str(int(p)): int(o) for p, o in ps.items()} for t, ps in value.items()}
    except (TypeError, ValueError) as error:
        raise ConfigurationError(f"starting_offsets: partitions and offsets are integers; got {value!r}") from error


def _name(tp: TopicPartitionKey) -> str:
    return f"{tp[0]}/{tp[1]}"


def _parse_name(name: str) -> TopicPartitionKey:
    topic, _, partition = name.rpartition("/")
    return topic, int(partition)


def _named(partitions: Sequence[TopicPartitionKey] | set[TopicPartitionKey] | Mapping[TopicPartitionKey, Any]) \
        -> str:
    names = [_name(tp) for tp in sorted(partitions)]
    return ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "") if names else "none"


def _offsets(position: Position) -> dict[TopicPartitionKey, int]:
    return {(topic, int(partition)): int(offset)
            for topic, partitions in position.get("offsets", {}).items() for partition, offset in partitions.items()}


def _as_position(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    position: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        position.setdefault(topic, {})[str(partition)] = int(offset)
    return position


def _splits(ranges: Mapping[TopicPartitionKey, tuple[int, int]], split_size: int, parallelism: int) \
        -> list[dict[str, Any]]:
    """The batch's offset ranges in as few tasks as keep every core busy: ranges of several
    partitions share a task (a task costs tens of ms however few records it reads), one longer
    than its share is cut, and no task reads more than ``split_size`` records."""
    parts = [(tp, first, until) for tp, (first, until) in sorted(ranges.items()) if until > first]
    total = sum(until - first for _, first, until in parts)
    if not total:
        return []
    count = max(-(-total // split_size), min(parallelism, -(-total // _RECORDS_WORTH_A_TASK)), 1)
    share = -(-total // count)
    splits: list[dict[str, Any]] = []
    current: list[list[Any]] = []
    room = share
    for (topic, partition), first, until in parts:
        while first < until:
            take = min(until - first, room)
            current.append([topic, partition, first, first + take])
            first, room = first + take, room - take
            if room == 0:
                splits.append({"ranges": current})
                current, room = [], share
    if current:
        splits.append({"ranges": current})
    return splits


def _ranges(split: Split) -> Iterator[tuple[str, int, int, int]]:
    """A split's (topic, partition, first offset, end offset) ranges."""
    for topic, partition, first, until in split["ranges"]:
        yield str(topic), int(partition), int(first), int(until)


def _capped(ranges: dict[TopicPartitionKey, tuple[int, int]], cap: int | None) \
        -> dict[TopicPartitionKey, tuple[int, int]]:
    """At most ``cap`` records in all, shared among partitions by what each has waiting (as
    Spark's ``maxOffsetsPerTrigger``); every partition with records waiting moves on."""
    waiting = sum(until - first for first, until in ranges.values())
    if cap is None or waiting <= cap:
        return ranges
    capped = {}
    for tp, (first, until) in ranges.items():
        share = (until - first) * cap // waiting
        capped[tp] = (first, min(until, first + max(share, 1 if until > first else 0)))
    return capped


# ------------------------------------------------------------------------------ JSON values
def _json_batch(values: Sequence[bytes | None], schema: pa.Schema) -> pa.RecordBatch | None:
    """The values as one batch of ``schema`` (fields it does not name ignored), or None when
    some value is not a JSON object of those types."""
    import pyarrow.json as pj

    objects = [v for v in values if v is not None and (v[:1] == b"{" or v.lstrip()[:1] == b"{")]
    if not values or len(objects) != len(values):  # pyarrow would skip a blank one, or take a non-object
        return None
    text = b"\n".join(objects)
    if text.count(b"\n") != len(objects) - 1:  # newlines in a value: whitespace between tokens in JSON
        text = b"\n".join(v.replace(b"\r\n", b" ").replace(b"\n", b" ") for v in objects)
    try:
        # every field nullable: Arrow refuses a block with a required field missing, and the
        # rows without it are dead letters of their own (``_rows_missing_required``)
        table = pj.read_json(io.BytesIO(text), parse_options=pj.ParseOptions(
            explicit_schema=pa.schema([field.with_nullable(True) for field in schema]),
            unexpected_field_behavior="ignore"),
            read_options=pj.ReadOptions(block_size=max(1 << 20, len(text) + 1)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != len(values):
        return None
    return pa.RecordBatch.from_arrays([column.combine_chunks() for column in table.columns], schema=table.schema)


def _rows_missing_required(batch: pa.RecordBatch, schema: pa.Schema) -> pa.Array | None:
    """Which rows lack a required field (a boolean mask), or None when none does."""
    missing = None
    for field in schema:
        column = batch.column(field.name)
        if not field.nullable and column.null_count:
            nulls = pc.is_null(column)
            missing = nulls if missing is None else pc.or_(missing, nulls)
    return missing


def _missing_required(batch: pa.RecordBatch, schema: pa.Schema) -> str | None:
    for field in schema:
        if not field.nullable and batch.column(field.name).null_count:
            return f"field {field.name!r} is required but missing or null"
    return None


def _why_not(value: bytes | None, schema: pa.Schema) -> str:
    """Why a single value did not parse, for people."""
    if value is None:
        return "the record has no value (a tombstone)"
    try:
        parsed = json.loads(value)
    except (ValueError, UnicodeDecodeError) as error:
        return f"malformed JSON: {error}"
    if not isinstance(parsed, dict):
        return f"malformed JSON: not an object but {type(parsed).__name__}"
    for field in schema:
        if field.name in parsed and parsed[field.name] is not None:
            if _json_batch([json.dumps({field.name: parsed[field.name]}).encode()], pa.schema([field])) is None:
                return f"field {field.name!r}: expected {field.type}, got {json.dumps(parsed[field.name])[:80]}"
    return "the value does not parse as the schema's JSON object"


def _raw(coordinates: Mapping[str, Any], value: bytes | None) -> str:
    return json.dumps({"topic": coordinates["topic"], "partition": coordinates["partition"],
                       "offset": coordinates["offset"],
                       "value": None if value is None else value.decode("utf-8", errors="replace")},
                      ensure_ascii=False)

