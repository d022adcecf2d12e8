"""One run of a pipeline, from ``start()`` to its stop: the checkpoint location opened, the
description turned into runtimes, the scheduler and the job generator wired to the batch
commit, and every way a run ends (``stop()``, ``batchline stop``, a failed batch, every input
finished) going through one ``stop``."""

from __future__ import annotations

import dataclasses
import enum
import logging
import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from pyspark.sql import SparkSession

from batchline.api.launch import ship_py_files
from batchline.api.settings import ContextSettings
from batchline.api.warmup import KeepWorkersWarm, StartupWarmUp, warm_up
from batchline.batch_time import format_batch_time
from batchline.checkpoint.lease import LEASE_FILE
from batchline.checkpoint.manager import CheckpointManager
from batchline.checkpoint.model import Checkpoint
from batchline.clock import Clock
from batchline.errors import ConfigurationError, ContextStateError, SparkGoneError, error_text
from batchline.observe.control import (
    StopHow,
    StopOutcome,
    StopRequest,
    StopWatcher,
    read_stop_outcome,
    record_stop_outcome,
)
from batchline.observe.observers import PipelineObservers
from batchline.observe.status import last_run_ended
from batchline.observe.summary import BatchSummaryLogger
from batchline.recovery import BatchCommit
from batchline.scheduler.executors import ExecutorMonitor
from batchline.scheduler.input_info import InputInfoTracker
from batchline.scheduler.job_generator import GeneratorSettings, JobGenerator
from batchline.scheduler.job_scheduler import JobScheduler, SchedulerSettings
from batchline.scheduler.lifecycle import BatchLifecycle
from batchline.scheduler.listener import ListenerBus
from batchline.scheduler.receiver_tracker import ReceiverTracker
from batchline.spark import SparkWatch, spark_gone
from batchline.state.store import STATE_DIR
from batchline.streams import PipelineRuntime, RuntimeEnv, StreamGraph

__all__ = ["ContextState", "PipelineRun"]

logger = logging.getLogger(__name__)

_LISTENER_FLUSH_S = 5.0
"""How long a stop waits for listeners to handle the events of the last batches."""
_SPARK_GONE_STOP_S = 15.0
"""How long the stop after Spark went away may take before the wait for it ends regardless:
nothing can commit any more, so nothing is lost by not waiting longer."""

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _not_the_scripts_own(handler: object) -> bool:
    """Python's default handling, or the handler a SparkContext installs on the main thread
    (it cancels every Spark job and raises KeyboardInterrupt): nothing the script chose."""
    if handler in (signal.SIG_DFL, signal.default_int_handler):
        return True
    return getattr(handler, "__module__", "").startswith("pyspark.") and \
        getattr(handler, "__name__", "") == "signal_handler"


def _make_logs_visible() -> None:
    """A script that configured no logging would see none of the pipeline's lines (Python
    prints only warnings then): give the ``batchline`` logger one stderr handler at INFO. Any
    handler on it or on the root logger means logging is configured, and it is left alone."""
    package = logging.getLogger("batchline")
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    package.addHandler(handler)
    if package.level == logging.NOTSET:
        package.setLevel(logging.INFO)


class ContextState(enum.Enum):
    INITIALIZED = "initialized"
    ACTIVE = "active"
    STOPPED = "stopped"


class PipelineRun:
    """What a context runs: created with the context, started once, stopped once."""

    def __init__(self, spark: SparkSession, settings: ContextSettings, graph: StreamGraph, clock: Clock,
                 name: str) -> None:
        self.spark = spark
        self.settings = settings
        self.graph = graph
        self.clock = clock
        self.name = name
        self.input_info = InputInfoTracker()
        self.receiver_tracker = ReceiverTracker()
        self.listener_bus = ListenerBus()
        self.lifecycle = BatchLifecycle(self.listener_bus, clock, self.input_info, settings.batch_interval_ms,
                                        keep_recent=settings.observe.progress_records)
        self.observers = PipelineObservers(name, settings.observe, self.listener_bus, self.dashboard_snapshot)
        self.state = ContextState.INITIALIZED
        self._state_lock = threading.Lock()
        self._terminated = threading.Event()
        self.error: BaseException | None = None
        """What stopped the run (a failed batch's ``BatchFailedError``), raised from ``await_termination``."""
        self.checkpoints: CheckpointManager | None = None
        self.pipeline: PipelineRuntime | None = None
        self.scheduler: JobScheduler | None = None
        self.generator: JobGenerator | None = None
        self.commit: BatchCommit | None = None
        self._adaptive: _AdaptiveExecutionOff | None = None
        self._finishing = False
        self._finish_lock = threading.Lock()
        self._stop_watcher: StopWatcher | None = None
        self._stop_requests: list[StopRequest] = []
        self._stopped_how: tuple[StopHow, list[int]] | None = None
        """How the stop ended, once the requests it answered are answered."""
        self._stop_requests_lock = threading.Lock()
        self._started_at_ms: int | None = None
        self._keep_warm: KeepWorkersWarm | None = None
        self._warming: StartupWarmUp | None = None
        """The start-up warm-up, cancelled by a stop that comes while it runs."""
        self._where = "no checkpoint location: it starts fresh every run"
        """Where it runs, for the start line: the location, and whether it resumes or starts fresh."""
        self._at_once = threading.Event()
        """A second signal (or ``stop_at_once``) cut a graceful stop short."""
        self._signals = 0
        self._spark_watch: SparkWatch | None = None
        self._gone: SparkGoneError | None = None
        """Spark went away under the running pipeline: why, and what was committed before."""
        self._gone_lock = threading.Lock()
        if settings.log_batches:
            self.listener_bus.add(BatchSummaryLogger())

    # ---------------------------------------------------------------- starting
    def start(self) -> None:
        with self._state_lock:
            if self.state is not ContextState.INITIALIZED:
                raise ContextStateError(
                    f"start() called on a {self.state.value} streaming context; a context starts "
                    "once, so create a new one to run again"
                )
            self.graph.validate()
            if self.graph.ordered_batches and self.settings.concurrent_jobs > 1:
                raise ConfigurationError(
                    "stateful operators build each batch on the previous one; use concurrent_jobs=1"
                )
            _make_logs_visible()
            ship_py_files(self.spark)
            self._warming = warm_up(self.spark)  # in the background, while the checkpoint is read
            try:
                checkpoint = self._open_checkpoints()
            except BaseException as error:
                self._start_refused(error)
                raise
            if checkpoint is not None and self._already_finished(checkpoint):
                self._stop_warming()
                self.state = ContextState.STOPPED
                self._terminated.set()
                return
            self._adaptive = _AdaptiveExecutionOff(self.spark)
            try:
                self._start_running(checkpoint)
            except BaseException as error:
                self._adaptive.restore()
                self._start_refused(error)
                raise
            self.state = ContextState.ACTIVE
            self._started_at_ms = self.clock.now_ms()
            self._spark_watch = SparkWatch(self.spark, self._spark_went_away)
            self._spark_watch.start()
            if self.settings.keep_workers_warm:
                self._keep_warm = KeepWorkersWarm.for_session(self.spark)
                self.listener_bus.add(self._keep_warm)
                self._keep_warm.start()
        logger.info("%s", self._start_line())

    def _start_line(self) -> str:
        parts = [f"Pipeline {self.name} started, batches every {self.settings.batch_interval_ms} ms",
                 self._where]
        parts.extend(self.observers.addresses())
        return "; ".join(parts)

    def _stop_warming(self) -> None:
        """Cancel the start-up warm-up if it still runs, and wait for it: the caller may stop
        the Spark session next, and a job of ours cut off by that logs errors."""
        if self._warming is not None:
            self._warming.stop()

    def _start_refused(self, error: BaseException) -> None:
        """The start failed while holding the lease (a refused state-schema change, a changed
        partition count, an unreadable checkpoint): record it at the location, as a stop is,
        so that ``batchline status`` names it; then give the lease up."""
        self._stop_warming()
        if self.checkpoints is None:
            return
        lease = self.checkpoints.lease
        if lease.token is not None:
            record_stop_outcome(self.checkpoints.storage, StopOutcome(
                "", lease.holder, StopHow.FAILED, self.clock.now_ms(), None, [],
                f"start refused: {error_text(error)}"))
        self.checkpoints.close()

    def _open_checkpoints(self) -> Checkpoint | None:
        """Take the location's lease and load its newest checkpoint (None: start fresh)."""
        if self.settings.checkpoint is None:
            return None
        self.checkpoints = CheckpointManager(self.settings.checkpoint, self.clock, self.lifecycle.checkpoint_written)
        storage = self.checkpoints.storage
        # How the last run ended, read before this driver's lease and stop record replace it.
        ended = last_run_ended(self.checkpoints.lease.read(), read_stop_outcome(storage))
        checkpoint = self.checkpoints.open()
        if checkpoint is None:
            # Spark's restart without a checkpoint failed; here it starts fresh, and says so.
            leftovers = [name for name in storage.list_names("") if name != LEASE_FILE]
            logger.log(logging.WARNING if leftovers else logging.DEBUG, "No checkpoint in %s; starting fresh",
                       storage.url)
        where = (f"resuming from batch {format_batch_time(checkpoint.time)}" if checkpoint is not None
                 else "starting fresh")
        self._where = f"checkpoint {storage.url}: {where}" + (f"; the last run {ended}" if ended else "")
        return checkpoint

    def _already_finished(self, checkpoint: Checkpoint) -> bool:
        """The location's newest checkpoint is the final one of this same pipeline: nothing to run."""
        finished_inputs = checkpoint.finished_inputs
        if checkpoint.final is None or set(checkpoint.outputs) != {op.name for op in self.graph.outputs} or any(
                node.name not in finished_inputs for node in self.graph.inputs):
            return False
        assert self.checkpoints is not None
        logger.info("The pipeline at %s already finished: its final checkpoint (batch %s) records every input "
                    "ended and every output committed, so there is nothing to run. To run it again from the "
                    "start, use a new checkpoint location", self.checkpoints.storage.url,
                    format_batch_time(checkpoint.time))
        self.checkpoints.close()
        return True

    def _start_running(self, checkpoint: Checkpoint | None) -> None:
        """Turn the description into runtime objects, wire the scheduler, start generating."""
        settings = self.settings
        env = RuntimeEnv(self.spark, self.clock, settings.batch_interval_ms, self.input_info, self.receiver_tracker,
                         self.checkpoints, self.graph.consumed(), self.graph.input_readers(),
                         self.graph.read_by_one_output(), self.graph.read_in_one_pass())
        self.pipeline = PipelineRuntime(self.graph, env)
        commit = self.commit = BatchCommit(self.pipeline, self.checkpoints, self.clock, self._pipeline_finished)
        self.lifecycle.facts = _Facts(self)
        self.lifecycle.excluded_executors = ExecutorMonitor.of(self.spark, self.clock).excluded
        self.scheduler = JobScheduler(
            SchedulerSettings(settings.batch_interval_ms, settings.concurrent_jobs, settings.graceful_stop_timeout_ms,
                              f"batchline-{uuid.uuid4().hex[:8]}", settings.retry,
                              overlap_commits=not self.graph.ordered_batches),
            self.spark, self.clock, self.lifecycle, self._fail,
        )
        # Each batch the generator makes is a BatchRun that commits itself through ``commit``.
        generator = self.generator = JobGenerator(
            GeneratorSettings(settings.batch_interval_ms, settings.graceful_stop_timeout_ms,
                              settings.max_batches_ahead),
            commit, self.clock, self.receiver_tracker, self.input_info, self.scheduler.submit,
            self.scheduler.report_error, self.checkpoints,
        )
        try:
            # The records an earlier run left at the location come first, on the dashboard too.
            self.lifecycle.seed(self.observers.start(self.checkpoints.storage if self.checkpoints else None))
            generator.start(checkpoint)
            self.pipeline.start_inputs()
            if self.checkpoints is not None:
                lease = self.checkpoints.lease
                self._stop_watcher = StopWatcher(self.checkpoints.storage, self.clock, lambda: lease.token,
                                                 settings.batch_interval_ms, self._stop_requested)
                self._stop_watcher.start()
        except BaseException:
            # Undo what started, each step on its own: the error that stopped the start is the one raised.
            steps = [lambda: generator.stop(process_received_data=False),
                     lambda: self.scheduler.shutdown(graceful=False) if self.scheduler else None,
                     lambda: self.pipeline.stop_inputs(graceful=False) if self.pipeline else None,
                     lambda: self._stop_watcher.close() if self._stop_watcher else None,
                     self.observers.stop, self.listener_bus.close]
            for step in steps:
                try:
                    step()
                except Exception:
                    logger.exception("Cleaning up after a failed start failed too; going on with the rest")
            raise
        finished = self.pipeline.finished_after()
        if finished is not None:  # finished before a crash, without its final checkpoint
            self._pipeline_finished(finished)

    # ---------------------------------------------------------------- waiting
    def await_termination(self, timeout: float | None) -> bool:
        if self.state is ContextState.INITIALIZED:
            raise ContextStateError("await_termination() before start(); call start() first")
        with self._stop_on_signals():
            stopped = self._terminated.wait(timeout)
        if self.error is not None:
            raise self.error
        return stopped

    @contextmanager
    def _stop_on_signals(self) -> Iterator[None]:
        """While the main thread waits, SIGINT and SIGTERM stop the pipeline: the first
        gracefully, the next at once. Only signals left to Python's defaults or to PySpark's
        are taken (a handler the script installed is its own; an ignored signal stays ignored);
        the handlers before come back when the wait ends."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
        taken = [sig for sig, handler in previous.items() if _not_the_scripts_own(handler)]
        for sig in taken:
            signal.signal(sig, self._on_signal)
        try:
            yield
        finally:
            for sig in taken:
                signal.signal(sig, previous[sig])

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self._signals += 1
        if self._signals == 1:
            logger.warning("Stopping gracefully on %s: finishing received data and running batches (again to stop "
                           "at once)", name)
            stop = threading.Thread(target=self.stop, kwargs={"graceful": True}, name="batchline-stop-on-signal",
                                    daemon=True)
        elif self._signals == 2:
            logger.warning("Stopping at once on %s: cancelling running batches; they were not committed, so the "
                           "next start runs them", name)
            stop = threading.Thread(target=self.stop_at_once, name="batchline-stop-on-signal", daemon=True)
        else:
            return
        stop.start()

    def stop_at_once(self) -> None:
        """Stop immediately; when a graceful stop is under way, cut its waits short instead."""
        self._at_once.set()
        if self.generator is not None:
            self.generator.cut_short()
        self.stop(graceful=False)

    # ---------------------------------------------------------------- stopping
    def stop(self, graceful: bool, stop_spark_session: bool = False, final: bool = False, wait: bool = False) -> None:
        """Graceful: stop receiving, let every received record into a batch, finish generated
        batches (each wait bounded by the graceful-stop timeout). Immediate: stop the timer and
        cancel the Spark jobs of running batches. Final: every input finished; write the final
        checkpoint once the last batches committed. Wait: when a stop is under way on another
        thread, return once it has ended (the user's stop; batchline's own threads return)."""
        with self._state_lock:
            under_way = self.state is ContextState.STOPPED
            if self.state is ContextState.INITIALIZED:
                self.state = ContextState.STOPPED
                self._terminated.set()
                return
            self.state = ContextState.STOPPED
        if under_way:
            if wait:
                self._wait_for_stop_under_way(stop_spark_session)
            return
        logger.info("Stopping StreamingContext %s", "gracefully" if graceful else "immediately")
        if self._spark_watch is not None:
            self._spark_watch.close()
        if self._keep_warm is not None:
            self._keep_warm.stop()
        self._stop_warming()
        if self.pipeline is None or self.generator is None or self.scheduler is None:
            raise ContextStateError("the context is active but was never fully started; this is a bug in batchline")
        how, unfinished = StopHow.FAILED, []
        try:
            self.pipeline.stop_inputs(graceful)
            drained = self.generator.stop(process_received_data=graceful)
            graceful = graceful and not self._at_once.is_set()  # a second signal came during the wait
            unfinished = self.scheduler.shutdown(graceful)
            if final:
                self._write_final_checkpoint()
            self.pipeline.close_outputs()
            how = (StopHow.FAILED if self.error is not None else StopHow.FINISHED if final
                   else StopHow.IMMEDIATE if not graceful
                   else StopHow.GRACEFUL if drained and not unfinished else StopHow.GRACEFUL_TIMED_OUT)
        finally:
            # Listeners (the progress kept at the location among them) and whoever asked for the
            # stop hear of it while this driver still holds the lease.
            self.listener_bus.flush(_LISTENER_FLUSH_S)
            try:
                self._answer_stop_requests(how, unfinished)
                if self.checkpoints is not None:
                    self.checkpoints.close()
            finally:
                try:
                    self._restore_adaptive()
                    self.observers.stop()
                    self.listener_bus.close()
                finally:
                    # Whatever a step above raised, the wait in await_termination ends.
                    logger.info("Pipeline %s stopped (%s)", self.name, how.value)
                    self._terminated.set()
                if stop_spark_session and self._gone is None:
                    self.spark.stop()

    def _wait_for_stop_under_way(self, stop_spark_session: bool) -> None:
        """The caller must not go on while this pipeline still writes to its checkpoint location
        (its lease, its progress records). A listener that stops the pipeline does not wait: the
        stop under way waits for the listeners."""
        if self.listener_bus.on_listener_thread:
            return
        self._terminated.wait()
        if stop_spark_session and self._gone is None:
            self.spark.stop()  # the stop under way was not asked to

    def _restore_adaptive(self) -> None:
        """The session's own adaptive setting back, unless Spark is gone (there is no session to
        set it in, and asking would only raise)."""
        if self._adaptive is None or self._gone is not None:
            return
        try:
            self._adaptive.restore()
        except Exception as error:
            if spark_gone(self.spark) is None:
                raise
            logger.debug("Not restoring the adaptive setting: Spark is gone (%s)", error_text(error))

    def _spark_went_away(self, why: str) -> None:
        """Spark went away under the running pipeline (its JVM killed or exited, the SparkContext
        stopped): nothing can run or commit any more. Said once, as the error the run ends with;
        the stop runs at once (cutting short a graceful one under way), and the wait in
        ``await_termination`` ends within ``_SPARK_GONE_STOP_S`` whatever a step of it finds.
        What was committed is in the checkpoint, so the next start resumes exactly."""
        with self._gone_lock:
            if self._gone is not None:
                return
            gone = self._gone = SparkGoneError(
                why, self.commit.last_committed if self.commit is not None else None, self.checkpoints is not None)
        self.error = gone  # what failed after it failed because of it
        logger.error("%s", gone)
        if self._spark_watch is not None:
            self._spark_watch.close()
        self._at_once.set()
        if self.generator is not None:
            self.generator.cut_short()
        threading.Thread(target=self._stop_without_spark, name="batchline-stop-spark-gone", daemon=True).start()

    def _stop_without_spark(self) -> None:
        try:
            self.stop(graceful=False)  # returns at once when a stop is under way: _at_once cuts that one short
        except Exception as error:  # noqa: BLE001 (the run's error is already said: Spark is gone)
            logger.debug("The stop after Spark went away failed: %s", error_text(error))
        if not self._terminated.wait(_SPARK_GONE_STOP_S):
            logger.warning("The stop did not end %.0f s after Spark went away; ending the wait for it (nothing "
                           "uncommitted can commit any more)", _SPARK_GONE_STOP_S)
            self._terminated.set()

    def _pipeline_finished(self, batch_time: int) -> None:
        """Every output's stream finished as of ``batch_time`` (committed): stop, then write the
        final checkpoint. On a thread of its own: this is called from the batch's commit."""
        with self._finish_lock:  # not the state lock: start() holds it when a restart finds the pipeline finished
            if self._finishing:
                return
            self._finishing = True
        logger.info("Pipeline finished with batch %s: every input ended and every operator drained; stopping "
                    "after a final checkpoint", format_batch_time(batch_time))
        threading.Thread(target=self.stop, kwargs={"graceful": True, "final": True}, name="batchline-finish",
                         daemon=True).start()

    def _write_final_checkpoint(self) -> None:
        if self.checkpoints is None or self.commit is None:
            logger.info("Pipeline finished (no checkpoint location, so no final checkpoint)")
            return
        writer = self.checkpoints.checkpoint_writer()
        writer.stop()  # what is queued first: the final checkpoint is the newest
        final = self.commit.final_checkpoint()
        writer.write_now(final)
        assert final.final is not None
        logger.info("Final checkpoint written for batch %s with the outputs' commits %s; the pipeline is finished",
                    format_batch_time(final.time), final.final.output_commits)

    def _fail(self, error: BaseException) -> None:
        """A batch or the generator failed: remember the error and stop without waiting."""
        why = spark_gone(self.spark)
        if why is not None:  # it failed because Spark went away: that is the error to tell
            self._spark_went_away(why)
            return
        if self.error is None:
            self.error = error
        threading.Thread(target=self.stop, kwargs={"graceful": False}, name="batchline-stop-on-error",
                         daemon=True).start()

    def _stop_requested(self, request: StopRequest) -> None:
        """``batchline stop`` asked this driver to stop (from the stop watcher's thread). Whichever
        stop runs (this one, or one already under way) answers it."""
        with self._stop_requests_lock:
            answered = self._stopped_how
            if answered is None:
                self._stop_requests.append(request)
        if answered is not None:
            self._report_stop(request.request_id, *answered)
            return
        threading.Thread(target=self.stop, kwargs={"graceful": not request.immediate},
                         name="batchline-stop-request", daemon=True).start()

    def _answer_stop_requests(self, how: StopHow, unfinished: list[int]) -> None:
        with self._stop_requests_lock:
            self._stopped_how = (how, unfinished)
            requests, self._stop_requests = self._stop_requests, []
        # One record per request (each requester waits for its own), and one when nobody asked
        # (a signal, stop(), a failure), so that the location always says how this run ended.
        for request_id in [r.request_id for r in requests] or [""]:
            self._report_stop(request_id, how, unfinished)
        if self._stop_watcher is not None:
            self._stop_watcher.close()

    def _report_stop(self, request_id: str, how: StopHow, unfinished: list[int]) -> None:
        if self.checkpoints is None:
            return
        # Not str(): a Py4J error asks the JVM for its text, and the JVM may be gone.
        reason = error_text(self.error) if how is StopHow.FAILED and self.error else None
        record_stop_outcome(self.checkpoints.storage, StopOutcome(
            request_id, self.checkpoints.lease.holder, how, self.clock.now_ms(),
            self.commit.last_committed if self.commit is not None else None, unfinished, reason))

    # ---------------------------------------------------------------- seeing it run
    def dashboard_snapshot(self) -> dict[str, Any]:
        last = self.lifecycle.last_progress
        lease = self.checkpoints.lease if self.checkpoints is not None else None
        status = {
            "name": self.name,
            "location": self.checkpoints.storage.url if self.checkpoints is not None else None,
            "state": ("finished" if self._finishing else self.state.value),
            "batch_interval_ms": self.settings.batch_interval_ms,
            "lease_holder": lease.holder if lease is not None and lease.token is not None else None,
            "started_at_ms": self._started_at_ms,
            "backlog": last.backlog if last is not None else 0,
            "excluded_executors": [dataclasses.asdict(e) for e in last.excluded_executors] if last else [],
            "finished_inputs": sorted(self.lifecycle.facts.finished_inputs()),
            "finished": self._finishing,
        }
        return {"status": status, "progress": [p.to_json() for p in self.lifecycle.recent_progress]}


class _Facts:
    """What progress records tell of the running pipeline beyond the batch (``PipelineFacts``)."""

    def __init__(self, run: PipelineRun) -> None:
        self._run = run

    def finished_inputs(self) -> dict[str, int]:
        pipeline = self._run.pipeline
        return {s.name: t for s in pipeline.inputs if (t := s.finished_after()) is not None} if pipeline else {}

    def upstream_inputs(self, operator: str) -> tuple[str, ...]:
        pipeline = self._run.pipeline
        if pipeline is None:
            return ()
        for runtime in pipeline.runtimes:
            if runtime.node.checkpoint_claim() == (STATE_DIR, operator):
                ancestors = runtime.node.ancestors()
                return tuple(s.name for s in pipeline.inputs if s.node.node_id in ancestors)
        return ()

    def lease(self) -> tuple[str, int] | None:
        checkpoints = self._run.checkpoints
        if checkpoints is None or checkpoints.lease.token is None:
            return None
        return checkpoints.lease.holder, checkpoints.lease.token

    def backlog_after(self, batch_time: int) -> int:
        generator = self._run.generator
        return generator.due_after(batch_time) if generator is not None else 0


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
            logger.debug("Adaptive query execution is off while the pipeline runs: each batch's jobs run as planned, "
                        "as in Structured Streaming")

    def restore(self) -> None:
        if self._before == "false":
            return
        if self._before is None:
            self._spark.conf.unset(self.KEY)
        else:
            self._spark.conf.set(self.KEY, self._before)
