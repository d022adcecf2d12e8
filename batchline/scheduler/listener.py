"""Batch lifecycle events for listeners (SPEC A4, H2, H3, I3): submitted, started, retrying,
completed, and each finished batch's progress record.

Listeners never slow batches down: each listener gets its events, in order, on a thread of
its own through a bounded queue (as Spark's ``AsyncEventQueue``). A listener that raises is
logged and keeps getting events; one that blocks holds up only its own queue, which drops
events (counted, logged) once it is full, and is named in a WARN line while it is stuck.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from batchline.scheduler.input_info import StreamInputInfo
from batchline.scheduler.progress import BatchDelays, ExcludedExecutor, StateOperatorProgress

if TYPE_CHECKING:
    from batchline.scheduler.progress import BatchProgress

__all__ = ["BatchInfo", "ExcludedExecutor", "StreamingListener", "ListenerBus", "ListenerEvent",
           "DEFAULT_LISTENER_QUEUE"]

logger = logging.getLogger(__name__)

DEFAULT_LISTENER_QUEUE = 10_000
"""Events a listener may fall behind by before its newest ones are dropped."""
_STUCK_WARN_S = 10.0


@dataclass(frozen=True)
class BatchInfo:
    batch_time: int
    submission_time: int
    processing_start_time: int | None = None
    processing_end_time: int | None = None
    input_infos: dict[int, StreamInputInfo] = field(default_factory=dict)
    failure: str | None = None
    """Why the batch failed; while it is retrying (``on_batch_retrying``), why the last run failed."""
    state_operators: dict[str, StateOperatorProgress] = field(default_factory=dict)
    """Each stateful operator's progress for the batch, by operator name."""
    attempts: int = 0
    """How many times the batch's jobs have run so far: 0 when submitted, 1 when started, more
    after retries (SPEC H3)."""
    excluded_executors: list[ExcludedExecutor] = field(default_factory=list)
    """Executors Spark excluded for failures, as the batch ended (SPEC H2); empty when none are."""

    @property
    def _delays(self) -> BatchDelays:
        return BatchDelays(self.batch_time, self.processing_start_time, self.processing_end_time)

    @property
    def scheduling_delay_ms(self) -> int | None:
        """From the batch's time until its first job started."""
        return self._delays.scheduling_ms

    @property
    def processing_delay_ms(self) -> int | None:
        return self._delays.processing_ms

    @property
    def total_delay_ms(self) -> int | None:
        return self._delays.total_ms

    @property
    def num_records(self) -> int:
        return sum(info.num_records or 0 for info in self.input_infos.values())

    @property
    def dead_letters(self) -> int:
        return sum(info.dead_letters for info in self.input_infos.values())

    @property
    def late_records(self) -> int:
        """Rows dropped by stateful operators for arriving behind the watermark."""
        return sum(p.late_rows for p in self.state_operators.values())


class StreamingListener:
    """Override what you need. Each listener's methods are called in order on a thread of the
    listener's own, never on a batch's thread: a slow listener delays only itself."""

    def on_batch_submitted(self, info: BatchInfo) -> None:
        pass

    def on_batch_started(self, info: BatchInfo) -> None:
        pass

    def on_batch_retrying(self, info: BatchInfo) -> None:
        """Run ``info.attempts`` of the batch failed (``info.failure``); it runs again after a backoff."""

    def on_batch_completed(self, info: BatchInfo) -> None:
        pass

    def on_progress(self, progress: BatchProgress) -> None:
        """The finished batch's progress record (after ``on_batch_completed``)."""

    def on_error(self, error: BaseException) -> None:
        pass


class ListenerEvent(enum.Enum):
    """What the bus tells listeners; each value is the ``StreamingListener`` method it calls."""

    BATCH_SUBMITTED = "on_batch_submitted"
    BATCH_STARTED = "on_batch_started"
    BATCH_RETRYING = "on_batch_retrying"
    BATCH_COMPLETED = "on_batch_completed"
    PROGRESS = "on_progress"
    ERROR = "on_error"


_STOP = object()


class _Dispatcher:
    """One listener's queue and thread."""

    def __init__(self, listener: StreamingListener, capacity: int) -> None:
        self.listener = listener
        self._queue: queue.Queue[object] = queue.Queue(maxsize=capacity)
        self.dropped = 0
        self.busy_since: float | None = None
        self.busy_in = ""
        self._warned_stuck = False
        self._thread = threading.Thread(target=self._run, name=f"batchline-listener-{type(listener).__name__}",
                                        daemon=True)
        self._thread.start()

    def offer(self, item: object) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.warning("Listener %r is %d events behind; dropped %d events so far. Make it quicker, or hand "
                               "its work to a thread of its own", self.listener, self._queue.maxsize, self.dropped)

    @property
    def is_current_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def flush(self, deadline: float) -> bool:
        handled = threading.Event()  # set by the thread once it reaches this point of the queue
        try:
            self._queue.put(handled, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            return False
        return handled.wait(max(0.0, deadline - time.monotonic()))

    def stop(self, deadline: float | None = None) -> None:
        """Let the thread end once it handled what is queued (waiting for it until ``deadline``)."""
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            return  # a daemon thread stuck in its listener; it goes with the process
        if deadline is not None and not self.is_current_thread:
            self._thread.join(max(0.0, deadline - time.monotonic()))

    def warn_if_stuck(self) -> None:
        since = self.busy_since
        if since is None or self._warned_stuck or time.monotonic() - since < _STUCK_WARN_S:
            return
        self._warned_stuck = True
        logger.warning("Listener %r has been in %s for %.0f s; batches go on, and its events wait in its queue",
                       self.listener, self.busy_in, time.monotonic() - since)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            assert isinstance(item, tuple)
            event, payload = item
            method = event.value
            self.busy_in, self.busy_since = method, time.monotonic()
            try:
                getattr(self.listener, method)(payload)
            except Exception:
                logger.exception("Listener %r failed in %s; continuing", self.listener, method)
            finally:
                self.busy_since = None
                self._warned_stuck = False


class ListenerBus:
    """Delivers events to each listener in order, on the listener's own thread."""

    def __init__(self, capacity: int = DEFAULT_LISTENER_QUEUE) -> None:
        self._capacity = capacity
        self._dispatchers: list[_Dispatcher] = []
        self._lock = threading.Lock()

    def add(self, listener: StreamingListener) -> None:
        with self._lock:
            self._dispatchers.append(_Dispatcher(listener, self._capacity))

    def remove(self, listener: StreamingListener) -> None:
        with self._lock:
            found = next((d for d in self._dispatchers if d.listener is listener), None)
            if found is None:
                raise ValueError(f"{listener!r} is not a listener of this pipeline")
            self._dispatchers.remove(found)
        found.stop()

    def post(self, event: ListenerEvent, payload: object) -> None:
        with self._lock:
            dispatchers = list(self._dispatchers)
        for dispatcher in dispatchers:
            dispatcher.warn_if_stuck()
            dispatcher.offer((event, payload))

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait (up to ``timeout_s`` in all) until every listener handled the events posted so far.
        Called from a listener (one that stops the pipeline), it does not wait for that listener."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            dispatchers = [d for d in self._dispatchers if not d.is_current_thread]
        behind = [d.listener for d in dispatchers if not d.flush(deadline)]
        if behind:
            logger.warning("Listener(s) %s did not handle their events within %.0f s; not waiting for them",
                           ", ".join(repr(listener) for listener in behind), timeout_s)
        return not behind

    @property
    def on_listener_thread(self) -> bool:
        """Whether the calling thread is a listener's (one that stops the pipeline, say)."""
        with self._lock:
            return any(d.is_current_thread for d in self._dispatchers)

    def close(self, timeout_s: float = 1.0) -> None:
        """End every listener's thread once it handled what it was given; no event is taken after."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            dispatchers, self._dispatchers = self._dispatchers, []
        for dispatcher in dispatchers:
            dispatcher.stop(deadline)
