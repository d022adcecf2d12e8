"""StreamingContext: builds a pipeline's streams, then starts, awaits and stops it."""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from batchline.api.launch import launch_defaults, ship_py_files
from batchline.api.stream import FileStream, InputStream, QueueStream, Stream
from batchline.api.warmup import KeepWorkersWarm, warm_up
from batchline.batch_time import format_batch_time
from batchline.checkpoint.lease import LEASE_FILE
from batchline.checkpoint.manager import (
    DEFAULT_KEEP,
    CheckpointManager,
    CheckpointSettings,
    default_checkpoint_interval_ms,
)
from batchline.checkpoint.model import Checkpoint
from batchline.clock import Clock, SystemClock
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError, ContextStateError
from batchline.observe.control import StopHow, StopOutcome, StopRequest, StopWatcher
from batchline.observe.observers import ObserveSettings, PipelineObservers
from batchline.recovery import BatchCommit
from batchline.scheduler.executors import ExecutorMonitor
from batchline.scheduler.input_info import InputInfoTracker
from batchline.scheduler.job_generator import GeneratorSettings, JobGenerator, default_max_batches_ahead
from batchline.scheduler.job_scheduler import JobScheduler, SchedulerSettings
from batchline.scheduler.lifecycle import DEFAULT_RECENT_PROGRESS, BatchLifecycle
from batchline.scheduler.listener import ListenerBus, StreamingListener
from batchline.scheduler.progress import BatchProgress
from batchline.scheduler.receiver_tracker import ReceiverTracker
from batchline.scheduler.retry import RetryPolicy
from batchline.sources.files import FileSource
from batchline.sources.frames import DataFrameSource
from batchline.sources.generator import GeneratorSource
from batchline.sources.queue import QueueSource
from batchline.sources.receiver import Receiver
from batchline.sources.redis_streams import DEFAULT_SPLIT_SIZE, RedisStreamSource
from batchline.sources.seen_files import DEFAULT_MAX_FILE_AGE
from batchline.sources.socket import ReceiverSource, SocketReceiver
from batchline.sources.source import Source
from batchline.sources.source_input import SourceInput
from batchline.state.store import STATE_DIR
from batchline.streams import PipelineRuntime, RuntimeEnv, StreamGraph, StreamRuntime

__all__ = ["StreamingContext", "ContextState"]

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_INTERVAL = "200ms"
GRACEFUL_STOP_TIMEOUT_INTERVALS = 10
_LISTENER_FLUSH_S = 5.0
"""How long a stop waits for listeners to handle the events of the last batches."""


class _FromLaunch:
    """A port left out: what ``batchline run`` set (``batchline.api.launch``), else off."""

    def __repr__(self) -> str:
        return "FROM_LAUNCH"


FROM_LAUNCH = _FromLaunch()


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

    ``max_batches_ahead`` is how many batches may be generated and not yet committed at once
    (default ``concurrent_jobs + 1``, at least 2, so a batch is ready whenever one commits).
    After down time every missed batch is due at once, and generating a batch takes its input
    and logs it; generating them all before the first commits would hold back that batch's
    checkpoint, so the rest wait in order and are generated as earlier ones commit. A very large
    number (``10**9``) generates every due batch at once, as Spark Streaming does.

    ``retry`` is how a batch whose job failed runs again (``RetryPolicy``; by default up to 4
    runs, waiting 5 s, 10 s and 20 s; ``RetryPolicy.never()`` stops at the first failure).
    Spark's exclusion of failing executors is set where the session is created:
    ``local_spark_session(..., exclude_on_failure=ExcludeOnFailure(...))``.

    Seeing it run: every finished batch gives a ``BatchProgress`` record (``last_progress``,
    ``recent_progress``, listeners' ``on_progress``); the newest ``progress_records`` (default
    100) are also kept at the checkpoint location for ``batchline status``. ``metrics_port``
    serves Prometheus metrics at ``/metrics`` and ``dashboard_port`` a live dashboard (0: any
    free port; both off by default, both on 127.0.0.1 unless ``metrics_host`` /
    ``dashboard_host`` say otherwise; under ``batchline run`` both default to on, and ``None``
    turns them off). ``name`` names the pipeline there (default: the Spark
    application's name). With a checkpoint location, ``batchline stop LOCATION`` from any
    terminal stops the pipeline; it looks for the request every batch interval (at most 2 s).

    ``keep_workers_warm`` (default True): Spark stops Python workers that ran no task for a
    minute, and the next batch with work (a timer firing after a quiet spell) would fork and
    import anew; so while no batch reads rows or calls a state function, the context runs a
    small warm-up job every 40 s. False runs none, so that dynamic allocation can release
    idle executors.
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
        retry: RetryPolicy | None = None,
        max_batches_ahead: int | None = None,
        name: str | None = None,
        metrics_port: int | None | _FromLaunch = FROM_LAUNCH,
        metrics_host: str = "127.0.0.1",
        dashboard_port: int | None | _FromLaunch = FROM_LAUNCH,
        dashboard_host: str = "127.0.0.1",
        progress_records: int = DEFAULT_RECENT_PROGRESS,
        keep_workers_warm: bool = True,
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
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry is a RetryPolicy, e.g. RetryPolicy(max_attempts=3); got {retry!r}")
        self.retry = retry if retry is not None else RetryPolicy()
        self.checkpoint_settings = _checkpoint_settings(
            self.batch_interval_ms, checkpoint, checkpoint_interval, keep_checkpoints,
            checkpoint_storage_options, lease_ttl,
        )
        self._checkpoints: CheckpointManager | None = None
        self.graph = StreamGraph(self.batch_interval_ms,
                                 parse_duration_ms(remember, "remember duration") if remember is not None else None)
        """The pipeline's description, built by the input and stream methods."""
        self.input_info = InputInfoTracker()
        self.receiver_tracker = ReceiverTracker()
        self.pipeline: PipelineRuntime | None = None
        """The running pipeline, once started."""
        self._listener_bus = ListenerBus()
        self._concurrent_jobs = concurrent_jobs
        self.max_batches_ahead = _max_batches_ahead(max_batches_ahead, concurrent_jobs)
        self._state = ContextState.INITIALIZED
        self._state_lock = threading.Lock()
        self._terminated = threading.Event()
        self._error: BaseException | None = None
        self._scheduler: JobScheduler | None = None
        self._generator: JobGenerator | None = None
        self._adaptive: _AdaptiveExecutionOff | None = None
        self._commit: BatchCommit | None = None
        self._finishing = False
        self._finish_lock = threading.Lock()
        self.name: str = name or spark.sparkContext.appName or "batchline"
        launch = launch_defaults()
        self.observe_settings = ObserveSettings(
            launch.metrics_port if isinstance(metrics_port, _FromLaunch) else metrics_port, metrics_host,
            launch.dashboard_port if isinstance(dashboard_port, _FromLaunch) else dashboard_port, dashboard_host,
            progress_records)
        self._lifecycle = BatchLifecycle(self._listener_bus, self.clock, self.input_info, self.batch_interval_ms,
                                         keep_recent=progress_records)
        self._observers = PipelineObservers(self.name, self.observe_settings, self._listener_bus,
                                            self._dashboard_snapshot)
        self._stop_watcher: StopWatcher | None = None
        self._stop_requests: list[StopRequest] = []
        self._stopped_how: tuple[StopHow, list[int]] | None = None
        """How the stop ended, once the requests it answered are answered."""
        self._stop_requests_lock = threading.Lock()
        self._started_at_ms: int | None = None
        self._keep_workers_warm = keep_workers_warm
        self._keep_warm: KeepWorkersWarm | None = None

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
        bounded: bool = False,
        max_file_age: object = DEFAULT_MAX_FILE_AGE,
    ) -> FileStream:
        """New files under ``path`` (local or any fsspec URL): json (lines), csv, parquet or text.

        Bad json/csv lines go to ``stream.dead_letters`` with the reason and the raw line.
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
        self._check_can_add()
        node = FileSource(
            self.batch_interval_ms, path, format, schema, header=header, sep=sep, settle_s=settle, name=name,
            storage_options=storage_options, max_files_per_batch=max_files_per_batch, bounded=bounded,
            max_file_age=max_file_age,
        )
        return FileStream(self.graph.add_input(node), self.graph)

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
        self._check_can_add()
        block_ms = parse_duration_ms(block_interval, "block interval")
        node = ReceiverSource(self.batch_interval_ms, receiver, block_ms, name or type(receiver).__name__)
        return Stream(self.graph.add_input(node), self.graph)

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
        self._check_can_add()
        node = GeneratorSource(
            self.batch_interval_ms, rate, users=users, seed=seed, last_event_probability=last_event_probability,
            partitions=partitions, name=name, max_records_per_batch=max_records_per_batch, total=total,
        )
        return Stream(self.graph.add_input(node), self.graph)

    def queue_stream(
        self, frames: Iterable[DataFrame], *, schema: StructType | None = None,
        one_at_a_time: bool = True, name: str = "queue",
    ) -> QueueStream:
        """One queued DataFrame per batch (or all queued, with ``one_at_a_time=False``)."""
        self._check_can_add()
        node = QueueSource(self.batch_interval_ms, frames, schema, one_at_a_time, name)
        return QueueStream(self.graph.add_input(node), self.graph)

    def dataframe_stream(self, df: DataFrame, *, max_records_per_batch: int | None = None,
                         name: str = "dataframe") -> Stream:
        """The rows of ``df`` (a DataFrame or ``spark.table(...)``) as a bounded input, in
        batches of at most ``max_records_per_batch`` rows. The rows are written once to the
        checkpoint location at the first start, so a restart gives every batch the same rows."""
        self._check_can_add()
        node = DataFrameSource(self.batch_interval_ms, df, name, max_records_per_batch)
        return Stream(self.graph.add_input(node), self.graph)

    def input(self, source: Source, *, name: str | None = None) -> InputStream:
        """The batches of your own :class:`batchline.Source` (or a built-in one), under ``name``
        (default: the source's class name; keep it stable: the checkpoint finds the input's
        position by it). Records its ``read`` refuses go to ``stream.dead_letters``."""
        self._check_can_add()
        node = SourceInput(source, name or type(source).__name__, self.batch_interval_ms)
        return InputStream(self.graph.add_input(node), self.graph)

    def redis_stream(
        self,
        url: str,
        streams: Sequence[str],
        *,
        name: str | None = None,
        max_records_per_batch: int | None = None,
        schema: StructType | None = None,
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

    def union(self, *streams: Stream) -> Stream:
        if not streams:
            raise ConfigurationError("union needs at least one stream")
        return streams[0].union(*streams[1:])

    # ---------------------------------------------------------------- listeners
    def add_listener(self, listener: StreamingListener) -> None:
        self._listener_bus.add(listener)

    def remove_listener(self, listener: StreamingListener) -> None:
        self._listener_bus.remove(listener)

    # ---------------------------------------------------------------- progress (SPEC I2, I3)
    @property
    def last_progress(self) -> BatchProgress | None:
        """The newest finished batch's progress record (None before the first)."""
        return self._lifecycle.last_progress

    @property
    def recent_progress(self) -> list[BatchProgress]:
        """The newest ``progress_records`` records, oldest first."""
        return self._lifecycle.recent_progress

    @property
    def metrics_url(self) -> str | None:
        """Where Prometheus scrapes this pipeline (None without ``metrics_port`` or before start)."""
        return self._observers.metrics_url

    @property
    def dashboard_url(self) -> str | None:
        """The live dashboard's address (None without ``dashboard_port`` or before start)."""
        return self._observers.dashboard_url

    def _dashboard_snapshot(self) -> dict[str, Any]:
        last = self.last_progress
        finished_inputs = sorted(self._lifecycle.facts.finished_inputs())
        lease = self._checkpoints.lease if self._checkpoints is not None else None
        status = {
            "name": self.name,
            "location": self._checkpoints.storage.url if self._checkpoints is not None else None,
            "state": ("finished" if self._finishing else self._state.value),
            "batch_interval_ms": self.batch_interval_ms,
            "lease_holder": lease.holder if lease is not None and lease.token is not None else None,
            "started_at_ms": self._started_at_ms,
            "backlog": last.backlog if last is not None else 0,
            "excluded_executors": [dataclasses.asdict(e) for e in last.excluded_executors] if last else [],
            "finished_inputs": finished_inputs,
            "finished": self._finishing,
        }
        return {"status": status, "progress": [p.to_json() for p in self.recent_progress]}

    # ---------------------------------------------------------------- lifecycle
    @property
    def state(self) -> ContextState:
        return self._state

    def runtime_of(self, stream: Stream) -> StreamRuntime:
        """What ``stream`` holds in the running pipeline (its generated batches, its position)."""
        if self.pipeline is None:
            raise ContextStateError("the pipeline has no runtime before start(); call start() first")
        return self.pipeline.runtime_of(stream.node)

    @property
    def job_generator(self) -> JobGenerator | None:
        return self._generator

    @property
    def checkpoint_manager(self) -> CheckpointManager | None:
        """The checkpoint location's manager, once a checkpointed context has started."""
        return self._checkpoints

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
            self.graph.validate()
            if self.graph.ordered_batches and self._concurrent_jobs > 1:
                raise ConfigurationError(
                    "stateful operators build each batch on the previous one; use concurrent_jobs=1"
                )
            ship_py_files(self.spark)
            warm_up(self.spark)  # in the background, while the checkpoint is read
            checkpoint = self._open_checkpoints()
            if checkpoint is not None and self._already_finished(checkpoint):
                self._state = ContextState.STOPPED
                self._terminated.set()
                return
            self._adaptive = _AdaptiveExecutionOff(self.spark)
            try:
                self._start_running(checkpoint)
            except BaseException:
                self._adaptive.restore()
                if self._checkpoints is not None:
                    self._checkpoints.close()
                raise
            self._state = ContextState.ACTIVE
            self._started_at_ms = self.clock.now_ms()
            if self._keep_workers_warm:
                self._keep_warm = KeepWorkersWarm.for_session(self.spark)
                self._listener_bus.add(self._keep_warm)
                self._keep_warm.start()
        logger.info("StreamingContext started (batch interval %d ms)", self.batch_interval_ms)

    def _start_running(self, checkpoint: Checkpoint | None) -> None:
        """Turn the description into runtime objects, wire the scheduler, start generating."""
        env = RuntimeEnv(self.spark, self.clock, self.batch_interval_ms, self.input_info, self.receiver_tracker,
                         self._checkpoints, self.graph.consumed(), self.graph.input_readers(),
                         self.graph.read_by_one_output())
        self.pipeline = PipelineRuntime(self.graph, env)
        commit = self._commit = BatchCommit(self.pipeline, self._checkpoints, self.clock, self._pipeline_finished)
        generator: JobGenerator
        self._lifecycle.facts = _Facts(self)
        self._lifecycle.excluded_executors = ExecutorMonitor.of(self.spark, self.clock).excluded

        def commit_batch(batch_time: int) -> None:
            commit.commit(batch_time)
            generator.on_batch_committed(batch_time)

        self._scheduler = JobScheduler(
            SchedulerSettings(self.batch_interval_ms, self._concurrent_jobs, self.graceful_stop_timeout_ms,
                              f"batchline-{uuid.uuid4().hex[:8]}", self.retry,
                              overlap_commits=not self.graph.ordered_batches),
            self.spark, self.clock, self._lifecycle, self._fail, commit_batch,
        )
        generator = self._generator = JobGenerator(
            GeneratorSettings(self.batch_interval_ms, self.graceful_stop_timeout_ms, self.max_batches_ahead), commit,
            self.clock, self.receiver_tracker, self.input_info, self._scheduler.submit_job_set,
            self._scheduler.report_error, self._checkpoints,
        )
        try:
            # The records an earlier run left at the location come first, on the dashboard too.
            self._lifecycle.seed(self._observers.start(self._checkpoints.storage if self._checkpoints else None))
            generator.start(checkpoint)
            self.pipeline.start_inputs()
            if self._checkpoints is not None:
                lease = self._checkpoints.lease
                self._stop_watcher = StopWatcher(self._checkpoints.storage, self.clock, lambda: lease.token,
                                                 self.batch_interval_ms, self._stop_requested)
                self._stop_watcher.start()
        except BaseException:
            # Undo what started, each step on its own: the error that stopped the start is the one raised.
            steps = [lambda: generator.stop(process_received_data=False),
                     lambda: self._scheduler.shutdown(graceful=False) if self._scheduler else None,
                     lambda: self.pipeline.stop_inputs(graceful=False) if self.pipeline else None,
                     lambda: self._stop_watcher.close() if self._stop_watcher else None,
                     self._observers.stop, self._listener_bus.close]
            for step in steps:
                try:
                    step()
                except Exception:
                    logger.exception("Cleaning up after a failed start failed too; going on with the rest")
            raise
        finished = self.pipeline.finished_after()
        if finished is not None:  # finished before a crash, without its final checkpoint
            self._pipeline_finished(finished)

    def _already_finished(self, checkpoint: Checkpoint) -> bool:
        """The location's newest checkpoint is the final one of this same pipeline: nothing to run."""
        finished_inputs = checkpoint.finished_inputs
        if checkpoint.final is None or set(checkpoint.outputs) != {op.name for op in self.graph.outputs} or any(
                node.name not in finished_inputs for node in self.graph.inputs):
            return False
        assert self._checkpoints is not None
        logger.info("The pipeline at %s already finished: its final checkpoint (batch %s) records every input "
                    "ended and every output committed, so there is nothing to run. To run it again from the "
                    "start, use a new checkpoint location", self._checkpoints.storage.url,
                    format_batch_time(checkpoint.time))
        self._checkpoints.close()
        return True

    def _pipeline_finished(self, batch_time: int) -> None:
        """Every output's stream finished as of ``batch_time`` (committed): stop, then write the
        final checkpoint. On a thread of its own: this is called from the batch's commit."""
        with self._finish_lock:  # not the state lock: start() holds it when a restart finds the pipeline finished
            if self._finishing:
                return
            self._finishing = True
        logger.info("Pipeline finished with batch %s: every input ended and every operator drained; stopping "
                    "after a final checkpoint", format_batch_time(batch_time))
        threading.Thread(target=self._stop, kwargs={"graceful": True, "final": True}, name="batchline-finish",
                         daemon=True).start()

    def _open_checkpoints(self) -> Checkpoint | None:
        """Take the location's lease and load its newest checkpoint (None: start fresh)."""
        if self.checkpoint_settings is None:
            return None
        self._checkpoints = CheckpointManager(self.checkpoint_settings, self.clock, self._lifecycle.checkpoint_written)
        checkpoint = self._checkpoints.open()
        storage = self._checkpoints.storage
        if checkpoint is None:
            # Spark's restart without a checkpoint failed (the seed's NPE); here it starts fresh, and says so.
            leftovers = [name for name in storage.list_names("") if name != LEASE_FILE]
            logger.log(logging.WARNING if leftovers else logging.INFO, "No checkpoint in %s; starting fresh",
                       storage.url)
        return checkpoint

    def run_until_finished(self, timeout: float | None = None) -> bool:
        """Start the pipeline (unless started) and wait until it finishes: every input is
        exhausted, every operator has drained (event-time timeouts fire at the end of time) and
        the final checkpoint is written (SPEC G3). True once finished, False on timeout (seconds).

        Every input an output reads from must be bounded (``file_stream(..., bounded=True)``,
        ``generator_stream(..., total=N)``); a pipeline that mixes in unbounded inputs runs with
        ``start()`` and ``await_termination()`` and keeps checkpointing after the bounded ones end.
        """
        consumed = self.graph.consumed()
        unbounded = [node.name for node in self.graph.inputs if node.node_id in consumed and not node.bounded]
        if unbounded:
            raise ConfigurationError(
                f"run_until_finished() would never return: input(s) {unbounded} never end. Make them bounded "
                "(file_stream(..., bounded=True), generator_stream(..., total=N)), or use start() and "
                "await_termination()"
            )
        if self._state is ContextState.INITIALIZED:
            self.start()
        return self.await_termination(timeout)

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait until the pipeline stops; True if it did, False on timeout (seconds). A pipeline
        whose inputs all end stops by itself once it finished.

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
        self._stop(graceful, stop_spark_session)

    def _stop(self, graceful: bool, stop_spark_session: bool = False, final: bool = False) -> None:
        with self._state_lock:
            if self._state is ContextState.STOPPED:
                return
            if self._state is ContextState.INITIALIZED:
                self._state = ContextState.STOPPED
                self._terminated.set()
                return
            self._state = ContextState.STOPPED
        logger.info("Stopping StreamingContext %s", "gracefully" if graceful else "immediately")
        if self._keep_warm is not None:
            self._keep_warm.stop()
        if self.pipeline is None or self._generator is None or self._scheduler is None:
            raise ContextStateError("the context is active but was never fully started; this is a bug in batchline")
        how, unfinished = StopHow.FAILED, []
        try:
            self.pipeline.stop_inputs(graceful)
            drained = self._generator.stop(process_received_data=graceful)
            unfinished = self._scheduler.shutdown(graceful)
            if final:
                self._write_final_checkpoint()
            self.pipeline.close_outputs()
            how = (StopHow.FAILED if self._error is not None else StopHow.FINISHED if final
                   else StopHow.IMMEDIATE if not graceful
                   else StopHow.GRACEFUL if drained and not unfinished else StopHow.GRACEFUL_TIMED_OUT)
        finally:
            # Listeners (the progress kept at the location among them) and whoever asked for the
            # stop hear of it while this driver still holds the lease.
            self._listener_bus.flush(_LISTENER_FLUSH_S)
            self._answer_stop_requests(how, unfinished)
            try:
                if self._checkpoints is not None:
                    self._checkpoints.close()
            finally:
                if self._adaptive is not None:
                    self._adaptive.restore()
                self._observers.stop()
                self._listener_bus.close()
                self._terminated.set()
                if stop_spark_session:
                    self.spark.stop()
        logger.info("StreamingContext stopped")

    def _stop_requested(self, request: StopRequest) -> None:
        """``batchline stop`` asked this driver to stop (from the stop watcher's thread). Whichever
        stop runs (this one, or one already under way) answers it."""
        with self._stop_requests_lock:
            answered = self._stopped_how
            if answered is None:
                self._stop_requests.append(request)
        if answered is not None:
            self._report_stop(request, *answered)
            return
        threading.Thread(target=self._stop, kwargs={"graceful": not request.immediate},
                         name="batchline-stop-request", daemon=True).start()

    def _answer_stop_requests(self, how: StopHow, unfinished: list[int]) -> None:
        with self._stop_requests_lock:
            self._stopped_how = (how, unfinished)
            requests, self._stop_requests = self._stop_requests, []
        for request in requests:
            self._report_stop(request, how, unfinished)
        if self._stop_watcher is not None:
            self._stop_watcher.close()

    def _report_stop(self, request: StopRequest, how: StopHow, unfinished: list[int]) -> None:
        if self._stop_watcher is None or self._checkpoints is None:
            return
        self._stop_watcher.report(StopOutcome(
            request.request_id, self._checkpoints.lease.holder, how.value, self.clock.now_ms(),
            self._commit.last_committed if self._commit is not None else None, unfinished))

    def _write_final_checkpoint(self) -> None:
        if self._checkpoints is None or self._commit is None:
            logger.info("Pipeline finished (no checkpoint location, so no final checkpoint)")
            return
        writer = self._checkpoints.checkpoint_writer()
        writer.stop()  # what is queued first: the final checkpoint is the newest
        final = self._commit.final_checkpoint()
        writer.write_now(final)
        assert final.final is not None
        logger.info("Final checkpoint written for batch %s with the outputs' commits %s; the pipeline is finished",
                    format_batch_time(final.time), final.final.output_commits)

    def _fail(self, error: BaseException) -> None:
        """A batch or the generator failed: remember the error and stop without waiting."""
        if self._error is None:
            self._error = error
        threading.Thread(target=self.stop, kwargs={"graceful": False}, name="batchline-stop-on-error",
                         daemon=True).start()


class _Facts:
    """What progress records tell of the running pipeline beyond the batch (``PipelineFacts``)."""

    def __init__(self, context: StreamingContext) -> None:
        self._context = context

    def finished_inputs(self) -> dict[str, int]:
        pipeline = self._context.pipeline
        return {s.name: t for s in pipeline.inputs if (t := s.finished_after()) is not None} if pipeline else {}

    def upstream_inputs(self, operator: str) -> tuple[str, ...]:
        pipeline = self._context.pipeline
        if pipeline is None:
            return ()
        for runtime in pipeline.runtimes:
            if runtime.node.checkpoint_claim() == (STATE_DIR, operator):
                ancestors = runtime.node.ancestors()
                return tuple(s.name for s in pipeline.inputs if s.node.node_id in ancestors)
        return ()

    def lease(self) -> tuple[str, int] | None:
        checkpoints = self._context.checkpoint_manager
        if checkpoints is None or checkpoints.lease.token is None:
            return None
        return checkpoints.lease.holder, checkpoints.lease.token

    def backlog_after(self, batch_time: int) -> int:
        generator = self._context.job_generator
        return generator.due_after(batch_time) if generator is not None else 0


def _max_batches_ahead(value: object, concurrent_jobs: int) -> int:
    if value is None:
        return default_max_batches_ahead(concurrent_jobs)
    if isinstance(value, bool) or not isinstance(value, int) or value < concurrent_jobs:
        raise ConfigurationError(
            f"max_batches_ahead must be a whole number of batches, at least concurrent_jobs ({concurrent_jobs}) so "
            f"that as many can run at once; got {value!r}. Leave it out for the default "
            f"({default_max_batches_ahead(concurrent_jobs)}), or pass e.g. 10**9 for no limit"
        )
    return value


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
                              dict(storage_options or {}), batch_interval_ms)


class _AdaptiveExecutionOff:
    """Adaptive query execution off while the context runs, as Structured Streaming runs its
    micro-batches: it would cut each batch's plan into query stages run as jobs of their own
    (a stateful batch ran 7 Spark jobs instead of 3), and it must never coalesce the state
    shuffle. The session's own setting comes back when the context stops."""

    KEY = "spark.sql.adaptive.enabled"

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._before = spark.conf.get(self.KEY, None)
        if self._before != "false":
            spark.conf.set(self.KEY, "false")
            logger.info("Adaptive query execution is off while the pipeline runs: each batch's jobs run as planned, "
                        "as in Structured Streaming")

    def restore(self) -> None:
        if self._before == "false":
            return
        if self._before is None:
            self._spark.conf.unset(self.KEY)
        else:
            self._spark.conf.set(self.KEY, self._before)
