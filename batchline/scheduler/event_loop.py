"""A dedicated thread that handles events one at a time from an unbounded queue."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from batchline.errors import ContextStateError

__all__ = ["EventLoop"]

logger = logging.getLogger(__name__)

E = TypeVar("E")
_STOP = object()


class EventLoop(Generic[E]):
    def __init__(
        self,
        name: str,
        on_receive: Callable[[E], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.name = name
        self._on_receive = on_receive
        self._on_error = on_error
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False
        self._stopped = threading.Event()

    def start(self) -> None:
        if self._started:
            raise ContextStateError(f"event loop {self.name} was already started")
        self._started = True
        self._thread.start()

    def post(self, event: E) -> None:
        if self._stopped.is_set():
            logger.debug("Dropped %s: event loop %s is stopped", event, self.name)
            return
        self._queue.put(event)

    @property
    def is_active(self) -> bool:
        return self._started and not self._stopped.is_set()

    def stop(self) -> None:
        """Handle nothing after the event being handled now; join unless called from the loop."""
        if not self._started or self._stopped.is_set():
            return
        self._stopped.set()
        self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is _STOP or self._stopped.is_set():
                return
            logger.debug("Got event %s", event)
            try:
                self._on_receive(event)  # type: ignore[arg-type]
            except BaseException as error:  # noqa: BLE001 - reported, never swallowed
                self._on_error(error)
