"""A receiver of text lines over TCP (SPEC B2); ``ReceiverSource`` makes its blocks an input."""

from __future__ import annotations

import logging
import socket
import threading
import time

from batchline.sources.receiver import Receiver

__all__ = ["SocketReceiver"]

logger = logging.getLogger(__name__)


class SocketReceiver(Receiver):
    """Connects to ``host:port`` and stores every line (UTF-8, without its line ending).

    A dropped or refused connection is retried every ``reconnect_interval_s``. On a graceful
    stop it keeps reading until the socket has been quiet for ``drain_quiet_s`` (at most
    ``max_drain_s``), so every line the peer sent before the stop is stored; an immediate
    stop stops reading at once.
    """

    def __init__(
        self,
        host: str,
        port: int,
        reconnect_interval_s: float = 1.0,
        drain_quiet_s: float = 0.1,
        max_drain_s: float = 5.0,
    ) -> None:
        super().__init__()
        self.host = host
        self.port = port
        self._reconnect_interval_s = reconnect_interval_s
        self._drain_quiet_s = drain_quiet_s
        self._max_drain_s = max_drain_s
        self._thread: threading.Thread | None = None

    def on_start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"SocketReceiver-{self.host}:{self.port}", daemon=True)
        self._thread.start()

    def on_stop(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self.is_stopped:
            try:
                with socket.create_connection((self.host, self.port), timeout=self._reconnect_interval_s) as conn:
                    logger.info("Connected to %s:%d", self.host, self.port)
                    self._read(conn)
                    if not self.is_stopped:
                        logger.warning("Connection to %s:%d closed by peer; reconnecting", self.host, self.port)
            except OSError as error:
                if self.is_stopped:
                    return
                logger.warning(
                    "Cannot receive from %s:%d (%s); retrying in %.1f s",
                    self.host, self.port, error, self._reconnect_interval_s,
                )
            self._stopped.wait(self._reconnect_interval_s)

    def _read(self, conn: socket.socket) -> None:
        conn.settimeout(self._drain_quiet_s)
        pending = b""
        drain_until: float | None = None
        while True:
            if self.is_stopped:
                if not self.stopping_gracefully:
                    break
                drain_until = drain_until or time.monotonic() + self._max_drain_s
                if time.monotonic() > drain_until:
                    logger.warning("Still receiving from %s:%d %.0f s after a graceful stop; stopping",
                                   self.host, self.port, self._max_drain_s)
                    break
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                if self.is_stopped:
                    break  # quiet for drain_quiet_s after the stop: everything sent is in
                continue
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._store_line(line)
        if pending:
            self._store_line(pending)

    def _store_line(self, raw: bytes) -> None:
        self.store(raw.rstrip(b"\r").decode("utf-8", errors="replace"))
