"""A TCP proxy on loopback in front of a server, which a test can take down and bring back up:
what a client sees when the server stops for a while and starts again, without losing what
the server holds (moto's S3 server keeps its objects in memory, in this process).

``down()`` closes every open connection and refuses new ones (the port is closed, as a
stopped server's is); ``up()`` listens again on the same port. Clients reach the server through
``port``.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
from contextlib import suppress

__all__ = ["TcpProxy"]

logger = logging.getLogger(__name__)

_CHUNK = 64 * 1024


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._accepting: threading.Thread | None = None
        self.port = 0
        self.outages = 0

    def start(self) -> TcpProxy:
        self._listen()
        return self

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        self._accepting = threading.Thread(target=self._accept, args=(listener,), name="tcp-proxy-accept",
                                           daemon=True)
        self._accepting.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down() or stop()
            try:
                server = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # went down meanwhile
                    client.close()
                    server.close()
                    return
                self._connections.update((client, server))
            threading.Thread(target=self._pipe, args=(client, server), name="tcp-proxy-pipe", daemon=True).start()

    def _pipe(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        with selectors.DefaultSelector() as selector:
            try:
                # down() may have closed the pair already (its fd is then -1: ValueError).
                for end in peers:
                    selector.register(end, selectors.EVENT_READ)
                while True:
                    for key, _ in selector.select():
                        end: socket.socket = key.fileobj  # type: ignore[assignment]
                        data = end.recv(_CHUNK)
                        if not data:
                            return
                        peers[end].sendall(data)
            except (OSError, ValueError):
                return
            finally:
                with self._lock:
                    self._connections.difference_update(peers)
                for end in peers:
                    with suppress(OSError):
                        end.close()

    def down(self) -> None:
        """Close the port and every connection through it, as a server that stopped."""
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._connections = set(self._connections), set()
        if listener is not None:
            listener.close()
            self.outages += 1
        for connection in connections:
            with suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                connection.close()
        if self._accepting is not None:
            self._accepting.join(5)
        logger.info("Proxy to %s:%d is down", *self._target)

    def up(self) -> None:
        """Listen again, on the same port."""
        if self._listener is None:
            self._listen()
            logger.info("Proxy to %s:%d is up again on port %d", *self._target, self.port)

    def stop(self) -> None:
        self.down()
