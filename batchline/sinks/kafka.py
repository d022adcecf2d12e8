"""Every batch into a Kafka topic, exactly once: one Kafka transaction per batch.

The tasks turn their partitions' rows into records (key, value and headers as bytes, encoded
by Spark in the JVM: the value defaults to the row as a JSON object) and hand them to the
driver; once every job of the batch succeeded, the driver writes all of them in one Kafka
transaction, together with a commit marker (pipeline, output, batch time, fencing token) on a
small compacted topic (``commit_topic``), and commits it. So:

- a consumer with ``isolation.level=read_committed`` sees a batch's records all at once, or
  none of them: a crash before the commit leaves an aborted or open transaction (the next
  driver's ``init_transactions`` aborts it), never part of a batch;
- a batch that runs again (after a crash, a failed job) is found committed by its marker and
  written no second time; after a commit whose outcome is unknown (the brokers did not
  answer), the marker is read again before anything else is written;
- the transactional id is derived from (pipeline, output): a newer driver fences the older
  one's producer, whose commit then fails; and a driver whose checkpoint lease token is older
  than one recorded in a marker refuses to commit (``FencedError``).

The driver writes every record of the batch, which is the cost of a batch visible in one
piece; Spark's own Kafka sink writes from the tasks, at least once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType, StructType

from batchline.checkpoint.lease import FencedError
from batchline.errors import ConfigurationError, SinkError
from batchline.kafka_clients import admin_client, client_settings, kafka_module, list_offsets, topic_partitions
from batchline.sinks.exactly_once import ExactlyOnceSink, WriteAttempt
from batchline.sinks.sink import BatchContext, PendingCommit, SinkContext

__all__ = ["KafkaSink", "COMMIT_TOPIC"]

logger = logging.getLogger(__name__)

COMMIT_TOPIC = "batchline_commits"
DEFAULT_TIMEOUT_S = 60.0


class KafkaSink(ExactlyOnceSink[pa.Table]):
    """Each batch's rows into ``topic`` at ``bootstrap_servers``, in one transaction."""

    def __init__(self, bootstrap_servers: str, topic: str, *, key: str | Column | None = None,
                 value: str | Column | None = None, headers: str | Sequence[str] | None = None,
                 config: Mapping[str, Any] | None = None, commit_topic: str = COMMIT_TOPIC,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not isinstance(topic, str) or not topic:
            raise ConfigurationError(f"topic is the name of the output topic; got {topic!r}")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.key = key
        self.value = value
        self.headers = [headers] if isinstance(headers, str) else None if headers is None else list(headers)
        self.config = dict(config or {})
        if "transactional.id" in self.config:
            raise ConfigurationError("write_kafka derives the transactional.id from the pipeline and the output (so a "
                                     "newer driver fences an older one); leave it out of config")
        self.commit_topic = commit_topic
        if timeout_s <= 0:
            raise ConfigurationError(f"timeout is how long a batch's commit may wait for the brokers; got {timeout_s}")
        self.timeout_s = timeout_s
        client_settings(bootstrap_servers, self.config)
        kafka_module()
        self._context: SinkContext | None = None
        self._producer: Any = None
        self._admin: Any = None
        self._lock = threading.Lock()
        self._committed: int | None = None
        """The newest batch time in a marker of this output (None: none yet)."""
        self._newest_token = 0
        self._uncertain = True
        """Whether the markers must be read again before a batch is known committed or not (at
        the start, and after a commit whose outcome is unknown)."""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_producer"] = state["_admin"] = state["_lock"] = None  # driver-only; tasks only encode rows
        return state

    def __repr__(self) -> str:
        return f"KafkaSink({self.bootstrap_servers!r}, {self.topic!r})"

    # ---------------------------------------------------------------- the Sink interface
    def open(self, context: SinkContext) -> None:
        """Find the output topic, create the commit topic when missing, fence earlier drivers of
        this output (``init_transactions`` aborts what they left open), read the markers."""
        self._context = context
        admin = self._admin_client()
        topics = topic_partitions(admin, f"output {context.output}")
        if self.topic not in topics:
            raise ConfigurationError(
                f"output {context.output}: Kafka topic {self.topic!r} does not exist at {self.bootstrap_servers}; "
                f"create it first (kafka-topics.sh --create --topic {self.topic} --partitions N)")
        if self.commit_topic not in topics:
            self._create_commit_topic(admin)
        self._uncertain = True
        self._read_markers()
        self._new_producer()

    def write(self, df: DataFrame, batch: BatchContext) -> PendingCommit | None:
        return super().write(self._encoded(df), batch)

    def last_commit(self) -> dict[str, Any] | None:
        return {"topic": self.topic, "batch_time": self.newest_commit}

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(min(10.0, self.timeout_s))
            self._producer = None

    # ---------------------------------------------------------------- steps
    def is_committed(self, batch: BatchContext) -> bool:
        if self._uncertain:
            self._read_markers()
        committed = self._committed is not None and int(batch.batch_time) <= self._committed
        if committed:
            self.note_committed(int(batch.batch_time))
        return committed

    def write_partition(self, rows: Iterator[pa.RecordBatch], attempt: WriteAttempt,
                        partition: int) -> pa.Table:
        """The partition's records (key, value, headers), for the driver to write."""
        return pa.Table.from_batches(list(rows))

    def commit(self, messages: list[pa.Table], attempt: WriteAttempt) -> None:
        batch = attempt.batch
        if self._newest_token > batch.fencing_token:
            raise FencedError(
                f"output {batch.output}: this driver's lease token {batch.fencing_token} is older than token "
                f"{self._newest_token}, recorded on {self.commit_topic} by a driver that took the checkpoint "
                f"location over; batch {batch.batch_time} is not written. Run one driver per checkpoint location")
        with self._lock:
            records = self._in_transaction(messages, batch)
        self._committed = int(batch.batch_time)
        logger.debug("Batch %s: %d records into Kafka topic %s", batch.batch_time, records, self.topic)

    # ---------------------------------------------------------------- the transaction
    def _in_transaction(self, messages: list[pa.Table], batch: BatchContext) -> int:
        kafka = kafka_module()
        producer = self._producer or self._new_producer()
        try:
            producer.begin_transaction()
            records = 0
            for table in messages:
                records += _produce(producer, self.topic, table)
            producer.produce(self.commit_topic, key=self._marker_key(),
                             value=json.dumps({"batch_time": int(batch.batch_time), "records": records,
                                               "fencing_token": batch.fencing_token, "topic": self.topic}).encode())
            self._commit_transaction(producer)
            return records
        except kafka.KafkaException as exception:
            error = exception.args[0]
            if error.code() in (kafka.KafkaError._FENCED, kafka.KafkaError.PRODUCER_FENCED,  # noqa: SLF001
                                kafka.KafkaError.INVALID_PRODUCER_EPOCH):
                self._producer = None
                raise FencedError(
                    f"output {batch.output}: another driver took over writing to Kafka topic {self.topic} (its "
                    f"producer fenced this one: {error.str()}); batch {batch.batch_time} is not written. Run one "
                    "driver per checkpoint location") from None
            if error.txn_requires_abort():
                self._abort(producer)
            else:
                self._producer = None  # fatal, or an outcome not known: a new producer next time
                self._uncertain = True
            raise SinkError(f"writing batch {batch.batch_time} to Kafka topic {self.topic} failed: {error.str()}. "
                            "Nothing of the batch is visible to read_committed consumers; it runs again") from None

    def _commit_transaction(self, producer: Any) -> None:
        """Retried while librdkafka says it may be, for up to ``timeout_s``; then the batch
        fails with the outcome unknown, and the markers are read again before its re-run."""
        kafka = kafka_module()
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                producer.commit_transaction(max(0.1, deadline - time.monotonic()))
                return
            except kafka.KafkaException as exception:
                error = exception.args[0]
                if not error.retriable() or time.monotonic() >= deadline:
                    raise
                logger.warning("Committing the Kafka transaction failed (%s); retrying", error.str())
                time.sleep(0.2)

    def _abort(self, producer: Any) -> None:
        try:
            producer.abort_transaction(self.timeout_s)
        except Exception as error:  # noqa: BLE001 (the next init_transactions aborts it)
            logger.warning("Aborting the Kafka transaction failed (%s); a new producer aborts it", error)
            self._producer = None

    def _new_producer(self) -> Any:
        """A transactional producer for this output; ``init_transactions`` aborts what an
        earlier producer of the same id left open and fences it."""
        context = self._opened()
        digest = hashlib.sha256(f"{context.pipeline}\n{context.output}".encode()).hexdigest()[:16]
        producer = kafka_module().Producer(client_settings(
            self.bootstrap_servers, self.config, transactional_id=f"batchline-{context.output}-{digest}",
            enable_idempotence=True, linger_ms=5, partitioner="murmur2_random",
            transaction_timeout_ms=int(max(DEFAULT_TIMEOUT_S, 2 * self.timeout_s) * 1000)))
        producer.init_transactions(self.timeout_s)
        self._producer = producer
        return producer

    # ---------------------------------------------------------------- the markers
    def _marker_key(self) -> bytes:
        context = self._opened()
        return f"{context.pipeline}\n{context.output}".encode()

    def _read_markers(self) -> None:
        """The newest committed marker of this output: every record of the commit topic a
        read_committed consumer sees, up to the end (the topic is compacted: one per output)."""
        kafka = kafka_module()
        admin = self._admin_client()
        what = f"output {self._opened().output}"
        partitions = [(self.commit_topic, p) for p in topic_partitions(admin, what).get(self.commit_topic, [])]
        ends = {tp: end for tp, end in list_offsets(admin, partitions, True, what).items() if end > 0}
        key = self._marker_key()
        consumer = kafka.Consumer(client_settings(
            self.bootstrap_servers, self.config, group_id="batchline-markers", enable_auto_commit=False,
            isolation_level="read_committed", enable_partition_eof=True))
        try:
            consumer.assign([kafka.TopicPartition(t, p, kafka.OFFSET_BEGINNING) for t, p in ends])
            pending, deadline = dict(ends), time.monotonic() + self.timeout_s
            while pending:
                if time.monotonic() > deadline:
                    raise SinkError(f"{what}: reading the commit markers on {self.commit_topic} took longer than "
                                    f"{self.timeout_s:g} s; check that the brokers are up")
                for message in consumer.consume(10_000, 1.0):
                    tp = (message.topic(), message.partition())
                    if message.error() is None and message.key() == key:
                        marker = json.loads(message.value())
                        self._committed = max(self._committed or 0, int(marker["batch_time"]))
                        self._newest_token = max(self._newest_token, int(marker["fencing_token"]))
                    if tp in pending and message.offset() >= pending[tp] - 1:
                        del pending[tp]
                for t, p in list(pending):
                    if consumer.position([kafka.TopicPartition(t, p)])[0].offset >= pending[(t, p)]:
                        del pending[(t, p)]
        finally:
            consumer.close()
        self._uncertain = False

    def _create_commit_topic(self, admin: Any) -> None:
        from confluent_kafka.admin import NewTopic

        brokers = len(admin.list_topics(timeout=self.timeout_s).brokers)
        topic = NewTopic(self.commit_topic, num_partitions=1, replication_factor=min(3, brokers),
                         config={"cleanup.policy": "compact"})
        try:
            admin.create_topics([topic])[self.commit_topic].result()
            logger.info("Created the compacted topic %s for the commit markers of Kafka outputs", self.commit_topic)
        except kafka_module().KafkaException as exception:
            if exception.args[0].code() != kafka_module().KafkaError.TOPIC_ALREADY_EXISTS:
                raise ConfigurationError(
                    f"creating the commit topic {self.commit_topic!r} failed ({exception.args[0].str()}); create it "
                    "yourself (compacted, cleanup.policy=compact), or name another with commit_topic=") from None

    def _admin_client(self) -> Any:
        if self._admin is None:
            self._admin = admin_client(self.bootstrap_servers, self.config)
        return self._admin

    def _opened(self) -> SinkContext:
        if self._context is None:
            raise SinkError("the Kafka output was not opened; this is a bug in batchline")
        return self._context

    # ---------------------------------------------------------------- encoding, in the JVM
    def _encoded(self, df: DataFrame) -> DataFrame:
        """The rows as records: ``key`` and ``value`` as bytes, ``headers`` a list of
        (key, value) structs, all computed by Spark."""
        value = F.to_json(F.struct(*[F.col(c) for c in df.columns])).cast("binary") if self.value is None \
            else _as_bytes(df, self.value, "value")
        key = F.lit(None).cast("binary") if self.key is None else _as_bytes(df, self.key, "key")
        if self.headers is None:
            headers = F.lit(None).cast("array<struct<key:string,value:binary>>")
        else:
            missing = [h for h in self.headers if h not in df.columns]
            if missing:
                raise ConfigurationError(f"headers names columns the stream does not have: {missing}; it has "
                                         f"{df.columns}")
            headers = F.array(*[F.struct(F.lit(h).alias("key"), _as_bytes(df, h, "a header").alias("value"))
                                for h in self.headers])
        return df.select(key.alias("key"), value.alias("value"), headers.alias("headers"))


def _as_bytes(df: DataFrame, column: str | Column, what: str) -> Column:
    """A column as record bytes: binary as it is, text as UTF-8, structs, maps and arrays as JSON,
    anything else as its text."""
    if isinstance(column, str) and column not in df.columns:
        raise ConfigurationError(f"{what} names column {column!r}, which the stream does not have; it has "
                                 f"{df.columns}")
    expr = F.col(column) if isinstance(column, str) else column
    kind = df.select(expr).schema.fields[0].dataType
    if isinstance(kind, BinaryType):
        return expr
    if isinstance(kind, StringType):
        return expr.cast("binary")
    if isinstance(kind, StructType) or kind.typeName() in ("map", "array"):
        return F.to_json(expr).cast("binary")
    return expr.cast("string").cast("binary")


def _produce(producer: Any, topic: str, table: pa.Table) -> int:
    """The table's records into ``topic`` (within the open transaction); waits for room in
    the producer's queue when it is full."""
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    headers = table.column("headers").to_pylist()
    produce, poll = producer.produce, producer.poll
    for index, value in enumerate(values):
        header = headers[index]
        pairs = None if not header else [(h["key"], h["value"]) for h in header]
        while True:
            try:
                produce(topic, value, keys[index], headers=pairs)
                break
            except BufferError:
                poll(0.05)
        if index % 10_000 == 0:
            poll(0)
    return len(values)
