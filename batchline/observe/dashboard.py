"""The web dashboard: a small HTTP server, on a thread of its own, that serves one page and the
snapshot it polls.

Routes: ``GET /`` is the page (``static/index.html``), ``GET /static/<file>`` one of the files
shipped in ``static/`` (looked up by exact name: nothing else on disk is reachable), ``GET
/api/snapshot`` the JSON of ``snapshot()``; anything else is 404. Everything the page needs ships
in the package, so it works with no network.

The server binds exactly to ``host`` (loopback by default: not reachable from other hosts unless
``host`` says so). Bound to loopback it also answers only requests addressed to a loopback name
(the ``Host`` header), so a web page of another site cannot read it through DNS rebinding.

Bound to any other address it answers only requests that carry its access token (the one given,
else one made at start), every path alike, and 401 otherwise (``batchline.observe.access``). A
page opened with ``?token=`` gets the token back as an HttpOnly, same-site cookie, which the
browser then sends with the page's script, style sheet and snapshot fetches.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from batchline.observe.access import (
    cookie_name,
    is_loopback,
    query_token,
    required_token,
    token_admits,
    unauthorized_message,
    with_token,
)
from batchline.observe.addresses import http_url

__all__ = ["DashboardServer"]

logger = logging.getLogger(__name__)

STATIC_PACKAGE = "batchline.observe"
STATIC_DIR = "static"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".txt": "text/plain; charset=utf-8",
}
"""The content types of what ``static/`` may hold; a file of another kind is not served."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The page loads only what the server ships: no CDN, no inline script."""

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def _static_files() -> dict[str, bytes]:
    """The files of ``static/`` by name, read once (they ship with the package)."""
    files: dict[str, bytes] = {}
    root = resources.files(STATIC_PACKAGE).joinpath(STATIC_DIR)
    if not root.is_dir():
        logger.warning("the dashboard's static files are missing (%s)", root)
        return files
    for entry in root.iterdir():
        suffix = "." + entry.name.rpartition(".")[2] if "." in entry.name else ""
        if entry.is_file() and suffix in CONTENT_TYPES and not entry.name.startswith("."):
            files[entry.name] = entry.read_bytes()
    return files


def _host_name(header: str) -> str:
    """The host name of a ``Host`` header (without the port; IPv6 without its brackets)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], dashboard: DashboardServer) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.dashboard = dashboard
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The default prints a traceback to stderr (a client that went away mid-answer, mostly).
        logger.debug("dashboard request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "batchline-dashboard"
    sys_version = ""
    timeout = 30
    """Seconds a connection may idle before the server drops it."""
    _cookie: str | None = None
    """The ``Set-Cookie`` value of the answer being sent (a page opened with ``?token=``)."""

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        self._answer(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        dashboard = self.server.dashboard
        self._cookie = None
        if not dashboard.host_allowed(self.headers.get("Host")):
            self._send(HTTPStatus.FORBIDDEN, b"forbidden\n", "text/plain; charset=utf-8", body)
            return
        target = urlsplit(self.path)
        if not dashboard.admits(self.headers.get("Authorization"), target.query, self.headers.get("Cookie")):
            self._send(HTTPStatus.UNAUTHORIZED, unauthorized_message("dashboard", dashboard.url).encode(),
                       "text/plain; charset=utf-8", body, {"WWW-Authenticate": 'Bearer realm="batchline"'})
            return
        if dashboard.token is not None and query_token(target.query, dashboard.token):
            # The page's own requests (script, style sheet, snapshot) carry no query: the cookie carries the token.
            self._cookie = (f"{cookie_name(dashboard.port)}={dashboard.token}; Path=/; HttpOnly; SameSite=Strict")
        path = target.path
        if path in ("/", "/index.html"):
            self._static("index.html", body)
        elif path.startswith("/static/"):
            self._static(path[len("/static/"):], body)
        elif path == "/api/snapshot":
            self._snapshot(body)
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8", body)

    def _static(self, name: str, body: bool) -> None:
        content = self.server.dashboard.static_files.get(name)
        if content is None:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8", body)
            return
        content_type = CONTENT_TYPES["." + name.rpartition(".")[2]]
        extra = {"Content-Security-Policy": CONTENT_SECURITY_POLICY} if name.endswith(".html") else {}
        self._send(HTTPStatus.OK, content, content_type, body, extra)

    def _snapshot(self, body: bool) -> None:
        try:
            payload = json.dumps(self.server.dashboard.snapshot()).encode()
        except Exception as exc:  # the page shows it; the server goes on
            logger.exception("the dashboard's snapshot failed")
            error = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, error, "application/json", body)
            return
        self._send(HTTPStatus.OK, payload, "application/json", body)

    def _send(self, status: HTTPStatus, content: bytes, content_type: str, body: bool,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(content)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if self._cookie is not None:
            self.send_header("Set-Cookie", self._cookie)
        self.end_headers()
        if body:
            self.wfile.write(content)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        logger.debug("dashboard %s: " + format, self.address_string(), *args)


class DashboardServer:
    """Serves the dashboard at ``url`` on a thread of its own until ``stop()``.

    ``snapshot`` is called on the server's threads, once per request of ``/api/snapshot`` (the
    page polls it every second), and must return JSON types: ``{"status": {...}, "progress":
    [BatchProgress.to_json(), ...]}``. When it raises, the request is answered with 500 and the
    error, and the server goes on. ``port=0`` takes any free port; ``port`` tells which.

    ``token`` is the access token every request must carry; without one, a server bound off
    loopback makes one (``token`` tells which, ``open_url`` is the address with it) and a server
    on loopback requires none.
    """

    def __init__(self, snapshot: Callable[[], dict[str, Any]], host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None) -> None:
        self.snapshot = snapshot
        self.host = host
        self.token: str | None = required_token(host, token)
        self._requested_port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self.static_files: dict[str, bytes] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Binds to ``host``:``port`` and serves on a daemon thread. A server starts once."""
        with self._lock:
            if self._server is not None or self._stopped:
                raise RuntimeError("the dashboard server was already started")
            self.static_files = _static_files()
            self._server = _Server((self.host, self._requested_port), self)
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                            name="batchline-dashboard", daemon=True)
            self._thread.start()
        logger.debug("Dashboard at %s", self.url)

    def stop(self) -> None:
        """Stops serving and closes the socket; calling it again (or before ``start()``) does nothing."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        logger.debug("dashboard at %s stopped", self.url)

    def __enter__(self) -> DashboardServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ where
    @property
    def port(self) -> int:
        """The port the server is bound to (the one chosen when ``port=0``)."""
        if self._server is None:
            raise RuntimeError("the dashboard server is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)

    @property
    def open_url(self) -> str:
        """The address to open in a browser: ``url``, with ``?token=`` when a token is required."""
        return with_token(self.url, self.token)

    def admits(self, authorization: str | None, query: str, cookie_header: str | None) -> bool:
        """Whether a request with these ``Authorization`` and ``Cookie`` headers and this query
        string carries the token (any request does when none is required)."""
        return token_admits(self.token, authorization, query, cookie_header, cookie_name(self.port))

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request's ``Host`` header may reach a server bound to ``host``: any, unless
        bound to loopback, where only loopback names (against DNS rebinding)."""
        if header is None or not is_loopback(self.host):
            return True
        name = _host_name(header)
        return name in LOOPBACK_NAMES or name == self.host.lower() or is_loopback(name)
