"""The inputs of a pipeline: the methods of ``StreamingContext`` that add one, each building
its source's description node on the context's graph. A mixin, so that the context's own
module holds only its front door."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from batchline.api.stream import FileStream, InputStream, QueueStream, Stream
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError
from batchline.sources.files import FileSource
from batchline.sources.frames import DataFrameSource
from batchline.sources.generator import GeneratorSource
from batchline.sources.kafka import DEFAULT_SPLIT_SIZE as KAFKA_SPLIT_SIZE
from batchline.sources.kafka import KafkaSource
from batchline.sources.queue import QueueSource
from batchline.sources.receiver import Receiver, ReceiverSource
from batchline.sources.redis_streams import DEFAULT_SPLIT_SIZE, RedisStreamSource
from batchline.sources.seen_files import DEFAULT_MAX_FILE_AGE
from batchline.sources.socket import SocketReceiver
from batchline.sources.source import Source
from batchline.sources.source_input import SourceInput
from batchline.streams import StreamGraph

__all__ = ["InputMethods", "DEFAULT_BLOCK_INTERVAL"]

DEFAULT_BLOCK_INTERVAL = "200ms"


class InputMethods:
    """``ssc.file_stream(...)``, ``ssc.input(source)`` and the other inputs of a context."""

    batch_interval_ms: int
    graph: StreamGraph

    def file_stream(
        self,
        path: str,
        format: str = "json",
        schema: StructType | str | type | None = None,
        *,
        header: bool = False,
        sep: str = ",",
        settle: float = 1.0,
        name: str | None = None,
        storage_options: dict[str, Any] | None = None,
        max_files_per_batch: int | None = None,
        bounded: bool = False,
        max_file_age: object = DEFAULT_MAX_FILE_AGE,
    ) -> FileStream:
        """New files under ``path`` (local or any fsspec URL): json (lines), csv, parquet or text.

        ``schema`` (every format but text needs one) is a ``StructType``, a DDL string
        (``"uid string, ts timestamp"``) or a dataclass, as every schema argument of batchline.

        Bad json/csv lines go to ``stream.dead_letters`` with the reason and the raw line.
        A schema field that json lines (or csv with ``header=True``) never fill, null in every row
        of a batch and in no row with a value before, is named once at WARN with the fields the
        files do have: they probably spell it otherwise.
        A file is taken once it was last modified ``settle`` seconds ago or more; files are
        taken oldest first. ``max_files_per_batch`` spreads a backlog (after down time) over
        several batches. ``bounded``: read the files present when the pipeline first starts,
        then end (a backfill; see ``run_until_finished``).

        ``max_file_age`` (default ``"7 days"``, as Structured Streaming's ``maxFileAge``): the
        source remembers the files it read by the newest modification time among them and the
        names of those modified within ``max_file_age`` of it, so its checkpoint does not grow
        with the pipeline's age. A file last modified more than ``max_file_age`` before the
        newest file read is **not read**: one that appears that old (copied with its time kept,
        or held back that long) is named in a WARN line. Raise ``max_file_age`` to read such
        files (from then on), or ``touch`` the file. A bounded source reads every file present.
        """
        source = FileSource(
            path, format, schema, header=header, sep=sep, settle_s=settle, storage_options=storage_options,
            max_files_per_batch=max_files_per_batch, bounded=bounded, max_file_age=max_file_age,
        )
        return FileStream(self._add_input(source, name or f"files:{path}"), self.graph)

    def text_file_stream(self, path: str, **kwargs: Any) -> FileStream:
        return self.file_stream(path, "text", **kwargs)

    def socket_text_stream(
        self, host: str, port: int, *, block_interval: object = DEFAULT_BLOCK_INTERVAL, name: str | None = None,
        bounded: bool = False,
    ) -> Stream:
        """Lines received over TCP from ``host:port``, as rows with one column ``value``."""
        return self.receiver_stream(SocketReceiver(host, port), block_interval=block_interval,
                                    name=name or f"socket:{host}:{port}", bounded=bounded)

    def receiver_stream(
        self, receiver: Receiver, *, block_interval: object = DEFAULT_BLOCK_INTERVAL, name: str | None = None,
        bounded: bool = False,
    ) -> Stream:
        """Records stored by your own :class:`Receiver`, as rows with one column ``value``."""
        if bounded:
            raise ConfigurationError(
                f"{name or type(receiver).__name__} cannot be bounded: a receiver gets records as they are pushed "
                "and never knows that no more will come. Land the data in files and read them with "
                "file_stream(path, bounded=True), or use a generator with total=N"
            )
        block_ms = parse_duration_ms(block_interval, "block interval")
        return Stream(self._add_input(ReceiverSource(receiver, block_ms), name or type(receiver).__name__), self.graph)

    def generator_stream(
        self,
        rate: float,
        *,
        users: int = 1000,
        seed: int = 0,
        last_event_probability: float = 0.05,
        partitions: int | None = None,
        name: str = "generator",
        max_records_per_batch: int | None = None,
        total: int | None = None,
    ) -> Stream:
        """Deterministic user events ``{id, data, is_last, ts}`` at ``rate`` events per second;
        ``max_records_per_batch`` spreads a backlog (after down time) over several batches;
        ``total`` bounds the input: it ends after that many events."""
        source = GeneratorSource(
            rate, users=users, seed=seed, last_event_probability=last_event_probability, partitions=partitions,
            max_records_per_batch=max_records_per_batch, total=total,
        )
        return Stream(self._add_input(source, name), self.graph)

    def queue_stream(
        self, frames: Iterable[DataFrame], *, schema: StructType | str | type | None = None,
        one_at_a_time: bool = True, name: str = "queue",
    ) -> QueueStream:
        """One queued DataFrame per batch (or all queued, with ``one_at_a_time=False``)."""
        return QueueStream(self._add_input(QueueSource(frames, schema, one_at_a_time), name), self.graph)

    def dataframe_stream(self, df: DataFrame, *, max_records_per_batch: int | None = None,
                         name: str = "dataframe") -> Stream:
        """The rows of ``df`` (a DataFrame or ``spark.table(...)``) as a bounded input, in
        batches of at most ``max_records_per_batch`` rows. The rows are written once to the
        checkpoint location at the first start, so a restart gives every batch the same rows."""
        return Stream(self._add_input(DataFrameSource(df, max_records_per_batch), name), self.graph)

    def input(self, source: Source, *, name: str | None = None) -> InputStream:
        """The batches of your own :class:`batchline.Source` (or a built-in one), under ``name``
        (default: the source's class name; keep it stable: the checkpoint finds the input's
        position by it). Records its ``read`` refuses go to ``stream.dead_letters``."""
        return InputStream(self._add_input(source, name or type(source).__name__), self.graph)

    def _add_input(self, source: Source, name: str) -> SourceInput:
        node = SourceInput(source, name, self.batch_interval_ms)
        self.graph.add_input(node)
        return node

    def redis_stream(
        self,
        url: str,
        streams: Sequence[str],
        *,
        name: str | None = None,
        max_records_per_batch: int | None = None,
        schema: StructType | str | type | None = None,
        bounded: bool = False,
        start: str = "earliest",
        split_size: int = DEFAULT_SPLIT_SIZE,
    ) -> InputStream:
        """Entries of the Redis streams ``streams`` at ``url`` (``redis://host:port/db``): columns
        ``stream``, ``id`` and ``fields`` (a map), or with ``schema`` the entry's fields parsed
        into those columns (bad entries go to ``dead_letters`` with the reason). Each batch's
        entry ids are logged, so a restart reads exactly the same entries again; a stream
        trimmed past them fails the batch naming the missing ids. ``start``: "earliest" (the
        whole stream) or "latest" (entries added after the first start). ``bounded``: read up
        to the last entry present at the first start, then end. Batches are read in Spark tasks
        of at most ``split_size`` entries each."""
        source = RedisStreamSource(url, streams, max_records_per_batch=max_records_per_batch, schema=schema,
                                   bounded=bounded, start=start, split_size=split_size)
        return self.input(source, name=name or f"redis:{','.join(streams)}")

    def kafka_stream(
        self,
        bootstrap_servers: str,
        *,
        topics: Sequence[str] | None = None,
        pattern: str | None = None,
        name: str | None = None,
        starting_offsets: str | Mapping[str, Mapping[Any, int]] = "earliest",
        max_records_per_batch: int | None = None,
        schema: StructType | str | type | None = None,
        format: str | None = None,
        config: Mapping[str, Any] | None = None,
        bounded: bool = False,
        fail_on_data_loss: bool = True,
        group_id: str | None = None,
        split_size: int = KAFKA_SPLIT_SIZE,
    ) -> InputStream:
        """Records of Kafka ``topics`` (or of every topic matching the regular expression
        ``pattern``, new ones included) at ``bootstrap_servers``, read by librdkafka in the
        tasks, read_committed. Columns ``key``, ``value`` (bytes), ``topic``, ``partition``,
        ``offset``, ``timestamp``, ``headers``; or with ``schema`` the value parsed as a JSON
        object into those columns, plus a ``kafka`` struct of the others (bad records go to
        ``dead_letters`` with the reason).

        Each batch's offset ranges are logged before it runs, so a restart reads exactly the
        same records again. ``starting_offsets``: "earliest", "latest" or ``{topic: {partition:
        offset}}`` (-2 earliest, -1 latest), for partitions present at the first start; later
        ones are read from their first offset. ``max_records_per_batch`` caps a batch, shared
        among partitions; ranges longer than ``split_size`` are read by several tasks. Records
        deleted by retention before they were read fail the batch naming them, or with
        ``fail_on_data_loss=False`` are skipped and counted. After each batch commits, the
        consumer group ``group_id`` (default ``batchline-<topics>``) gets the batch's end
        offsets, for lag tools; positions come from the checkpoint only. ``bounded``: read up
        to the offsets present at the first start, then end. ``config``: librdkafka settings
        (security, SASL, timeouts)."""
        source = KafkaSource(bootstrap_servers, topics=topics, pattern=pattern, starting_offsets=starting_offsets,
                             max_records_per_batch=max_records_per_batch, schema=schema, format=format,
                             config=config, bounded=bounded, fail_on_data_loss=fail_on_data_loss, group_id=group_id,
                             split_size=split_size)
        return self.input(source, name=name or f"kafka:{','.join(topics) if topics else pattern}")
