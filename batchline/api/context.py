"""StreamingContext: the front door. It builds a pipeline's description (its inputs here,
from ``batchline.api.inputs``; its streams through ``Stream``), then starts, awaits and stops
one run of it (``batchline.api.run``)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from batchline.api.inputs import DEFAULT_BLOCK_INTERVAL, InputMethods
from batchline.api.run import ContextState, PipelineRun
from batchline.api.settings import FROM_LAUNCH, ContextSettings, FromLaunch
from batchline.api.stream import Stream
from batchline.checkpoint.manager import DEFAULT_KEEP, CheckpointManager, CheckpointSettings
from batchline.clock import Clock, SystemClock
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError, ContextStateError
from batchline.observe.observers import ObserveSettings
from batchline.scheduler.input_info import InputInfoTracker
from batchline.scheduler.job_generator import JobGenerator
from batchline.scheduler.lifecycle import DEFAULT_RECENT_PROGRESS
from batchline.scheduler.listener import StreamingListener
from batchline.scheduler.progress import BatchProgress
from batchline.scheduler.receiver_tracker import ReceiverTracker
from batchline.scheduler.retry import RetryPolicy
from batchline.streams import PipelineRuntime, StreamGraph, StreamRuntime

__all__ = ["StreamingContext", "ContextState", "DEFAULT_BLOCK_INTERVAL"]


class StreamingContext(InputMethods):
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
    ``dashboard_host`` say otherwise; under ``batchline run`` both default to on, on its
    ``--host``, and ``None`` turns them off). Bound to any address but loopback, each requires an access token: the
    one given as ``access_token`` (which is then required on loopback too), else one made at
    start, the same for both, that the start line shows in the address to open and
    ``access_token`` (the property) tells. Requests carry it as ``Authorization: Bearer TOKEN``
    or ``?token=TOKEN``; those without get 401. ``name`` names the pipeline there (default:
    the Spark application's name). With a checkpoint location, ``batchline stop LOCATION`` from any
    terminal stops the pipeline; it looks for the request every batch interval (at most 2 s).

    What it logs (logger ``batchline``): at ``start()`` one INFO line saying what runs and
    where (the name, the checkpoint location, whether it starts fresh or resumes and how the
    last run there ended, the dashboard and metrics addresses), then one INFO line per finished
    batch (``log_batches=False`` turns these off; a failed batch's line is a WARNING), restart
    messages, the stop line and warnings; the scheduler's detail is at DEBUG. When neither the
    ``batchline`` logger nor the root logger has a handler (a script that configured no
    logging), ``start()`` gives ``batchline`` one handler to stderr at INFO, so these lines show;
    configure logging first to route them elsewhere.

    Stopping: ``await_termination()`` and ``run_until_finished()``, called on the main thread,
    turn SIGINT (Ctrl-C) and SIGTERM into a graceful stop while they wait: the first signal
    logs ``Stopping gracefully on SIGTERM: ...`` and stops gracefully, a second one stops at
    once (running batches cancelled; they run again at the next start), and the call returns
    True once stopped, so the code after it runs. A handler the script installed itself for
    either signal is left as it is (only Python's defaults and the one a SparkContext installs,
    which cancels every job and raises KeyboardInterrupt, count as not installed; an ignored
    signal stays ignored); the previous handlers come back when the wait returns.

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
        metrics_port: int | None | FromLaunch = FROM_LAUNCH,
        metrics_host: str | FromLaunch = FROM_LAUNCH,
        dashboard_port: int | None | FromLaunch = FROM_LAUNCH,
        dashboard_host: str | FromLaunch = FROM_LAUNCH,
        progress_records: int = DEFAULT_RECENT_PROGRESS,
        keep_workers_warm: bool = True,
        log_batches: bool = True,
        access_token: str | None | FromLaunch = FROM_LAUNCH,
    ) -> None:
        self.spark = spark
        self.settings = ContextSettings.of(
            batch_interval, concurrent_jobs=concurrent_jobs, graceful_stop_timeout=graceful_stop_timeout,
            checkpoint=checkpoint, checkpoint_interval=checkpoint_interval, keep_checkpoints=keep_checkpoints,
            checkpoint_storage_options=checkpoint_storage_options, lease_ttl=lease_ttl, retry=retry,
            max_batches_ahead=max_batches_ahead, metrics_port=metrics_port, metrics_host=metrics_host,
            dashboard_port=dashboard_port, dashboard_host=dashboard_host, progress_records=progress_records,
            keep_workers_warm=keep_workers_warm, log_batches=log_batches, access_token=access_token)
        self.batch_interval_ms = self.settings.batch_interval_ms
        self.clock = clock or SystemClock()
        self.graph = StreamGraph(self.batch_interval_ms,
                                 parse_duration_ms(remember, "remember duration") if remember is not None else None,
                                 checkpointed=self.settings.checkpoint is not None)
        """The pipeline's description, built by the input and stream methods."""
        self.name: str = name or spark.sparkContext.appName or "batchline"
        self._run = PipelineRun(spark, self.settings, self.graph, self.clock, self.name)

    # ---------------------------------------------------------------- settings
    @property
    def graceful_stop_timeout_ms(self) -> int:
        return self.settings.graceful_stop_timeout_ms

    @property
    def retry(self) -> RetryPolicy:
        return self.settings.retry

    @property
    def checkpoint_settings(self) -> CheckpointSettings | None:
        return self.settings.checkpoint

    @property
    def max_batches_ahead(self) -> int:
        return self.settings.max_batches_ahead

    @property
    def observe_settings(self) -> ObserveSettings:
        return self.settings.observe

    # ---------------------------------------------------------------- inputs (the rest in InputMethods)
    def union(self, *streams: Stream) -> Stream:
        if not streams:
            raise ConfigurationError("union needs at least one stream")
        return streams[0].union(*streams[1:])

    # ---------------------------------------------------------------- listeners
    def add_listener(self, listener: StreamingListener) -> None:
        self._run.listener_bus.add(listener)

    def remove_listener(self, listener: StreamingListener) -> None:
        self._run.listener_bus.remove(listener)

    # ---------------------------------------------------------------- progress
    @property
    def last_progress(self) -> BatchProgress | None:
        """The newest finished batch's progress record (None before the first)."""
        return self._run.lifecycle.last_progress

    @property
    def recent_progress(self) -> list[BatchProgress]:
        """The newest ``progress_records`` records, oldest first."""
        return self._run.lifecycle.recent_progress

    @property
    def metrics_url(self) -> str | None:
        """Where Prometheus scrapes this pipeline (None without ``metrics_port`` or before start)."""
        return self._run.observers.metrics_url

    @property
    def dashboard_url(self) -> str | None:
        """The live dashboard's address (None without ``dashboard_port`` or before start)."""
        return self._run.observers.dashboard_url

    @property
    def access_token(self) -> str | None:
        """The token the dashboard and the metrics require (the one given, or the one made at
        start for those bound off loopback); None when neither requires one or before start."""
        return self._run.observers.access_token

    # ---------------------------------------------------------------- the running pipeline
    @property
    def state(self) -> ContextState:
        return self._run.state

    @property
    def pipeline(self) -> PipelineRuntime | None:
        """The running pipeline, once started."""
        return self._run.pipeline

    def runtime_of(self, stream: Stream) -> StreamRuntime:
        """What ``stream`` holds in the running pipeline (its generated batches, its position)."""
        if self._run.pipeline is None:
            raise ContextStateError("the pipeline has no runtime before start(); call start() first")
        return self._run.pipeline.runtime_of(stream.node)

    @property
    def input_info(self) -> InputInfoTracker:
        return self._run.input_info

    @property
    def receiver_tracker(self) -> ReceiverTracker:
        return self._run.receiver_tracker

    @property
    def job_generator(self) -> JobGenerator | None:
        return self._run.generator

    @property
    def job_group_prefix(self) -> str | None:
        """The prefix of the Spark job groups of this run's batches (``<prefix>-<batch ms>``),
        once started."""
        return self._run.scheduler.settings.job_group_prefix if self._run.scheduler is not None else None

    @property
    def checkpoint_manager(self) -> CheckpointManager | None:
        """The checkpoint location's manager, once a checkpointed context has started."""
        return self._run.checkpoints

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Validate the pipeline and start generating batches on the next interval boundary."""
        self._run.start()

    def run_until_finished(self, timeout: float | None = None) -> bool:
        """Start the pipeline (unless started) and wait until it finishes: every input is
        exhausted, every operator has drained (event-time timeouts fire at the end of time) and
        the final checkpoint is written. True once finished, False on timeout (seconds).

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
        if self.state is ContextState.INITIALIZED:
            self.start()
        return self.await_termination(timeout)

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait until the pipeline stops; True if it did, False on timeout (seconds). A pipeline
        whose inputs all end stops by itself once it finished.

        Raises the error that stopped the pipeline, e.g. a failed batch's BatchFailedError.
        """
        return self._run.await_termination(timeout)

    def stop(self, graceful: bool = False, stop_spark_session: bool = False) -> None:
        """Stop the pipeline.

        Graceful: stop receiving, let every received record into a batch, finish generated
        batches (each wait bounded by the graceful-stop timeout). Immediate: stop the timer
        and cancel the Spark jobs of running batches.

        When a stop is already under way (the one a failed batch or a signal started), this
        waits for it to end: once it returns, nothing of this pipeline writes to the checkpoint
        location any more.
        """
        self._run.stop(graceful, stop_spark_session, wait=True)
