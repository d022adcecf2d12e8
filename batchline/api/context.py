"""StreamingContext: builds a pipeline's streams, then starts, awaits and stops it."""

from __future__ import annotations

import enum
import logging
import threading
import uuid
from collections.abc import Iterable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from batchline.api.env import PipelineEnv
from batchline.api.graph import StreamGraph
from batchline.api.stream import Stream
from batchline.batch_time import parse_duration_ms
from batchline.checkpoint.lease import LEASE_FILE
from batchline.checkpoint.manager import (
    DEFAULT_KEEP,
    CheckpointManager,
    CheckpointSettings,
    default_checkpoint_interval_ms,
)
from batchline.checkpoint.model import Checkpoint
from batchline.checkpoint.received_blocks import ReceivedBlockLog
from batchline.clock import Clock, SystemClock
from batchline.errors import ConfigurationError, ContextStateError
from batchline.scheduler.job_generator import JobGenerator
from batchline.scheduler.job_scheduler import JobScheduler, SchedulerSettings
from batchline.scheduler.listener import ListenerBus, StreamingListener
from batchline.scheduler.receiver_tracker import ReceiverTracker
from batchline.sources.files import FileInputStream
from batchline.sources.generator import GeneratorInputStream
from batchline.sources.queue import QueueInputStream
from batchline.sources.receiver import BlockGenerator, Receiver
from batchline.sources.socket import ReceiverInputStream, SocketReceiver

__all__ = ["StreamingContext", "ContextState"]

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_INTERVAL = "200ms"
GRACEFUL_STOP_TIMEOUT_INTERVALS = 10


class ContextState(enum.Enum):
    INITIALIZED = "initialized"
    ACTIVE = "active"
    STOPPED = "stopped"


class StreamingContext:
    """The entry point of a pipeline.

    ``batch_interval`` is a duration ("1s", "500ms", a timedelta, or seconds as a number).
    ``graceful_stop_timeout`` defaults to ten batch intervals. ``concurrent_jobs`` is how many
    batches may run at once (1 keeps batches strictly in order). ``clock`` is for tests.

    ``checkpoint`` is a local path or fsspec URL (``s3://...``); with it, a restarted script
    resumes where the last run stopped. ``checkpoint_interval`` must be a multiple of the
    batch interval; it defaults to the smallest multiple that is at least 10 seconds.
    ``keep_checkpoints`` (default 10) are retained; ``checkpoint_storage_options`` go to fsspec.
    """

    def __init__(
        self,
        spark: SparkSession,
        batch_interval: object,
        *,
        concurrent_jobs: int = 1,
        graceful_stop_timeout: object | None = None,
        remember: object | None = None,
        clock: Clock | None = None,
        checkpoint: str | None = None,
        checkpoint_interval: object | None = None,
        keep_checkpoints: int = DEFAULT_KEEP,
        checkpoint_storage_options: dict[str, Any] | None = None,
        lease_ttl: object = "15s",
    ) -> None:
        self.spark = spark
        self.batch_interval_ms = parse_duration_ms(batch_interval, "batch interval")
        if concurrent_jobs < 1:
            raise ConfigurationError(f"concurrent_jobs must be at least 1; got {concurrent_jobs}")
        self.graceful_stop_timeout_ms = (
            parse_duration_ms(graceful_stop_timeout, "graceful stop timeout")
            if graceful_stop_timeout is not None
            else GRACEFUL_STOP_TIMEOUT_INTERVALS * self.batch_interval_ms
        )
        self.clock = clock or SystemClock()
        self.checkpoint_settings = _checkpoint_settings(
            self.batch_interval_ms, checkpoint, checkpoint_interval, keep_checkpoints,
            checkpoint_storage_options, lease_ttl,
        )
        self._checkpoints: CheckpointManager | None = None
        graph = StreamGraph(self.batch_interval_ms)
        if remember is not None:
            graph.remember_ms = parse_duration_ms(remember, "remember duration")
        self.env = PipelineEnv(spark, self.clock, self.batch_interval_ms, graph)
        self._listener_bus = ListenerBus()
        self._concurrent_jobs = concurrent_jobs
        self._state = ContextState.INITIALIZED
        self._state_lock = threading.Lock()
        self._terminated = threading.Event()
        self._error: BaseException | None = None
        self._scheduler: JobScheduler | None = None
        self._generator: JobGenerator | None = None
        self._receivers: list[ReceiverInputStream] = []

    # ---------------------------------------------------------------- inputs
    def file_stream(
        self,
        path: str,
        format: str = "json",
        schema: StructType | None = None,
        *,
        header: bool = False,
        sep: str = ",",
        settle: float = 1.0,
        name: str | None = None,
        storage_options: dict[str, Any] | None = None,
        max_files_per_batch: int | None = None,
    ) -> FileInputStream:
        """New files under ``path`` (local or any fsspec URL): json (lines), csv, parquet or text.

        Bad json/csv lines go to ``stream.dead_letters`` with the reason and the raw line.
        A file is taken once it was last modified ``settle`` seconds ago or more.
        ``max_files_per_batch`` spreads a backlog (after down time) over several batches.
        """
        self._check_can_add()
        return FileInputStream(
            self.env, path, format, schema, header=header, sep=sep, settle_s=settle, name=name,
            storage_options=storage_options, max_files_per_batch=max_files_per_batch,
        )

    def text_file_stream(self, path: str, **kwargs: Any) -> FileInputStream:
        return self.file_stream(path, "text", **kwargs)

    def socket_text_stream(
        self, host: str, port: int, *, block_interval: object = DEFAULT_BLOCK_INTERVAL, name: str | None = None
    ) -> Stream:
        """Lines received over TCP from ``host:port``, as rows with one column ``value``."""
        return self.receiver_stream(SocketReceiver(host, port), block_interval=block_interval,
                                    name=name or f"socket:{host}:{port}")

    def receiver_stream(
        self, receiver: Receiver, *, block_interval: object = DEFAULT_BLOCK_INTERVAL, name: str | None = None
    ) -> Stream:
        """Records stored by your own :class:`Receiver`, as rows with one column ``value``."""
        self._check_can_add()
        block_ms = parse_duration_ms(block_interval, "block interval")
        stream = ReceiverInputStream(self.env, receiver, block_ms, name or type(receiver).__name__)
        self._receivers.append(stream)
        return stream

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
    ) -> GeneratorInputStream:
        """Deterministic user events ``{id, data, is_last, ts}`` at ``rate`` events per second;
        ``max_records_per_batch`` spreads a backlog (after down time) over several batches."""
        self._check_can_add()
        return GeneratorInputStream(
            self.env, rate, users=users, seed=seed, last_event_probability=last_event_probability,
            partitions=partitions, name=name, max_records_per_batch=max_records_per_batch,
        )

    def queue_stream(
        self, frames: Iterable[DataFrame], *, schema: StructType | None = None,
        one_at_a_time: bool = True, name: str = "queue",
    ) -> QueueInputStream:
        """One queued DataFrame per batch (or all queued, with ``one_at_a_time=False``)."""
        self._check_can_add()
        return QueueInputStream(self.env, frames, schema, one_at_a_time, name)

    def union(self, *streams: Stream) -> Stream:
        if not streams:
            raise ConfigurationError("union needs at least one stream")
        return streams[0].union(*streams[1:])

    # ---------------------------------------------------------------- listeners
    def add_listener(self, listener: StreamingListener) -> None:
        self._listener_bus.add(listener)

    def remove_listener(self, listener: StreamingListener) -> None:
        self._listener_bus.remove(listener)

    # ---------------------------------------------------------------- lifecycle
    @property
    def state(self) -> ContextState:
        return self._state

    @property
    def graph(self) -> StreamGraph:
        return self.env.graph

    @property
    def job_generator(self) -> JobGenerator | None:
        return self._generator

    @property
    def checkpoint_manager(self) -> CheckpointManager | None:
        """The checkpoint location's manager, once a checkpointed context has started."""
        return self._checkpoints

    @property
    def receiver_tracker(self) -> ReceiverTracker | None:
        return self.env.receiver_tracker

    def _check_can_add(self) -> None:
        if self._state is not ContextState.INITIALIZED:
            raise ContextStateError(
                f"cannot add inputs to a {self._state.value} streaming context; build the whole "
                "pipeline before start()"
            )

    def start(self) -> None:
        """Validate the pipeline and start generating batches on the next interval boundary."""
        with self._state_lock:
            if self._state is not ContextState.INITIALIZED:
                raise ContextStateError(
                    f"start() called on a {self._state.value} streaming context; a context starts "
                    "once, so create a new one to run again"
                )
            self.env.graph.validate()
            if self.env.graph.stateful and self._concurrent_jobs > 1:
                raise ConfigurationError(
                    "stateful operators build each batch on the previous one; use concurrent_jobs=1"
                )
            if self.env.graph.stateful and self.checkpoint_settings is None:
                self.env.graph.open_state(None, 0)  # raises: state needs a checkpoint location
            tracker = ReceiverTracker([s.input_id for s in self._receivers])
            self.env.receiver_tracker = tracker
            settings = SchedulerSettings(
                batch_interval_ms=self.batch_interval_ms,
                concurrent_jobs=self._concurrent_jobs,
                graceful_stop_timeout_ms=self.graceful_stop_timeout_ms,
                job_group_prefix=f"batchline-{uuid.uuid4().hex[:8]}",
            )
            self._scheduler = JobScheduler(
                settings, self.spark, self.clock, self.env.input_info, self._listener_bus, self._fail
            )
            checkpoint = self._open_checkpoints()
            self._generator = JobGenerator(
                self._scheduler, self.env.graph, self.clock, tracker, self.env.input_info, self._checkpoints
            )
            self._scheduler.job_generator = self._generator
            try:
                self._generator.start(checkpoint)
            except BaseException:
                self._generator.stop(process_received_data=False)
                self._scheduler.shutdown(graceful=False)
                if self._checkpoints is not None:
                    self._checkpoints.close()
                raise
            for stream in self._receivers:
                stream.receiver._start(  # noqa: SLF001 - the context supervises its receivers
                    BlockGenerator(stream.input_id, self.clock, stream.block_interval_ms, stream.store_block,
                                   stream.next_block_id)
                )
            self._state = ContextState.ACTIVE
        logger.info("StreamingContext started (batch interval %d ms)", self.batch_interval_ms)

    def _open_checkpoints(self) -> Checkpoint | None:
        """Take the location's lease and load its newest checkpoint (None: start fresh)."""
        if self.checkpoint_settings is None:
            return None
        self._checkpoints = CheckpointManager(self.checkpoint_settings, self.clock)
        checkpoint = self._checkpoints.open()
        storage = self._checkpoints.storage
        if checkpoint is None:
            # Spark's restart without a checkpoint failed (the seed's NPE); here it starts fresh, and says so.
            leftovers = [name for name in storage.list_names("") if name != LEASE_FILE]
            logger.log(logging.WARNING if leftovers else logging.INFO, "No checkpoint in %s; starting fresh",
                       storage.url)
        for stream in self._receivers:
            stream.block_log = ReceivedBlockLog(storage, stream.name, stream.input_id)
        return checkpoint

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait until the pipeline stops; True if it did, False on timeout (seconds).

        Raises the error that stopped the pipeline, e.g. a failed batch's BatchFailedError.
        """
        if self._state is ContextState.INITIALIZED:
            raise ContextStateError("await_termination() before start(); call start() first")
        stopped = self._terminated.wait(timeout)
        if self._error is not None:
            raise self._error
        return stopped

    def stop(self, graceful: bool = False, stop_spark_session: bool = False) -> None:
        """Stop the pipeline.

        Graceful: stop receiving, let every received record into a batch, finish generated
        batches (each wait bounded by the graceful-stop timeout). Immediate: stop the timer
        and cancel the Spark jobs of running batches.
        """
        with self._state_lock:
            if self._state is ContextState.STOPPED:
                return
            if self._state is ContextState.INITIALIZED:
                self._state = ContextState.STOPPED
                self._terminated.set()
                return
            self._state = ContextState.STOPPED
        logger.info("Stopping StreamingContext %s", "gracefully" if graceful else "immediately")
        assert self._generator is not None and self._scheduler is not None
        try:
            for stream in self._receivers:
                stream.receiver._stop(graceful)  # noqa: SLF001 - the context supervises its receivers
            self._generator.stop(process_received_data=graceful)
            self._scheduler.shutdown(graceful)
            if self._checkpoints is not None:
                self._checkpoints.close()
        finally:
            self._terminated.set()
            if stop_spark_session:
                self.spark.stop()
        logger.info("StreamingContext stopped")

    def _fail(self, error: BaseException) -> None:
        """A batch or the generator failed: remember the error and stop without waiting."""
        if self._error is None:
            self._error = error
        threading.Thread(target=self.stop, kwargs={"graceful": False}, name="batchline-stop-on-error",
                         daemon=True).start()


def _checkpoint_settings(
    batch_interval_ms: int,
    location: str | None,
    interval: object | None,
    keep: int,
    storage_options: dict[str, Any] | None,
    lease_ttl: object,
) -> CheckpointSettings | None:
    if location is None:
        if interval is not None:
            raise ConfigurationError("checkpoint_interval was given without a checkpoint location; add checkpoint=...")
        return None
    interval_ms = (
        parse_duration_ms(interval, "checkpoint interval")
        if interval is not None
        else default_checkpoint_interval_ms(batch_interval_ms)
    )
    if interval_ms % batch_interval_ms:
        raise ConfigurationError(
            f"the checkpoint interval ({interval_ms} ms) must be a positive multiple of the batch interval "
            f"({batch_interval_ms} ms), e.g. {default_checkpoint_interval_ms(batch_interval_ms)} ms"
        )
    if keep < 1:
        raise ConfigurationError(f"keep_checkpoints must be at least 1; got {keep}")
    return CheckpointSettings(location, interval_ms, keep, parse_duration_ms(lease_ttl, "lease ttl"),
                              dict(storage_options or {}))
