"""Prometheus metrics of one pipeline, fed by its progress records (one ``BatchProgress`` per
finished batch).

Each :class:`PipelineMetrics` owns a ``CollectorRegistry`` of its own, never the process-wide
default one, so two pipelines in one process do not clash; each serves its registry on a port
of its own (:meth:`PipelineMetrics.start_server`) or renders it as text (:meth:`render`).

What a record feeds:

- the batch itself, whatever its status: ``batchline_batches_total{status}``, the retries
  (``attempts - 1``), the delay gauges of the last batch, the processing-time histogram, the
  job-duration histogram, the backlog, the excluded executors, the batch time and the watermark;
- the data, from completed batches only (a failed batch runs again at the next start, and its
  records would be counted twice): records, dead letters and late records per input, input and
  processing rates per input, and what each stateful operator did and holds;
- the checkpoints the record carries (written on a thread of their own, each in the next record
  after it was written).

Progress durations are in milliseconds and times in epoch milliseconds; metrics are in seconds.

The endpoint bound off loopback (or given a token) answers only requests that carry the access
token (``batchline.observe.access``): a Prometheus scrape config passes it as
``authorization: {credentials: TOKEN}``, a browser as ``?token=TOKEN``.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from batchline.observe.access import required_token, token_admits, unauthorized_message, with_token
from batchline.observe.addresses import http_url
from batchline.scheduler.progress import COMPLETED, BatchProgress

__all__ = ["DURATION_BUCKETS", "PipelineMetrics"]

logger = logging.getLogger(__name__)

DURATION_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                                       300.0)
"""Histogram buckets in seconds, for durations from 10 ms to 5 min (and ``+Inf`` beyond)."""

_STOP_JOIN_S = 5.0


def _seconds(ms: int | float) -> float:
    return ms / 1000.0


_WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _guarded(app: _WsgiApp, token: str | None, url: Callable[[], str | None]) -> _WsgiApp:
    """``app`` answering only requests that carry ``token`` (all of them when it is None)."""
    if token is None:
        return app

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if token_admits(token, environ.get("HTTP_AUTHORIZATION"), environ.get("QUERY_STRING", "")):
            return app(environ, start_response)
        body = unauthorized_message("metrics endpoint", url() or "this address").encode()
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("Content-Length", str(len(body))),
                                            ("WWW-Authenticate", 'Bearer realm="batchline"')])
        return [body]

    return guarded


class _QuietHandler(WSGIRequestHandler):
    """Requests to the debug log, not to stderr (wsgiref's default)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (wsgiref's name)
        logger.debug("metrics %s: " + format, self.address_string(), *args)


class PipelineMetrics:
    """The Prometheus metrics of the pipeline named ``pipeline``, in a registry of their own.

    :meth:`observe` takes each finished batch's progress record; it is thread safe, and one
    record is applied whole before the next one starts.
    """

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._server_lock = threading.Lock()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._host: str | None = None
        self._port: int | None = None
        self._token: str | None = None
        registry = self.registry

        self.pipeline_info = Gauge("batchline_pipeline_info", "The pipeline these metrics describe (always 1).",
                                   ["pipeline"], registry=registry)
        self.pipeline_info.labels(pipeline).set(1)

        # ------------------------------------------------------------ batches
        self.batches = Counter("batchline_batches", "Finished batches, by status (completed, failed).",
                               ["status"], registry=registry)
        self.batch_retries = Counter("batchline_batch_retries",
                                     "Extra runs of batches after a failed run (attempts - 1 per batch).",
                                     registry=registry)
        self.scheduling_delay = Gauge("batchline_scheduling_delay_seconds",
                                      "Last batch: from its batch time until its first job started.",
                                      registry=registry)
        self.processing_time = Gauge("batchline_processing_time_seconds",
                                     "Last batch: from its first job's start until its end.", registry=registry)
        self.total_delay = Gauge("batchline_total_delay_seconds", "Last batch: from its batch time until its end.",
                                 registry=registry)
        self.batch_duration = Histogram("batchline_batch_duration_seconds", "Processing time of batches.",
                                        buckets=DURATION_BUCKETS, registry=registry)
        self.job_duration = Histogram("batchline_job_duration_seconds",
                                      "Duration of each batch's jobs (the last attempt), by kind (read, state, "
                                      "output) and by the input's, operator's or output's name.", ["kind", "name"],
                                      buckets=DURATION_BUCKETS, registry=registry)
        self.backlog = Gauge("batchline_backlog_batches",
                             "Batches due and not yet finished when the last batch finished.", registry=registry)
        self.excluded_executors = Gauge("batchline_excluded_executors",
                                        "Executors Spark excluded for failures, as the last batch ended.",
                                        registry=registry)
        self.last_batch_time = Gauge("batchline_last_batch_time_seconds",
                                     "Batch time of the last finished batch, in Unix seconds.", registry=registry)
        self._watermark: Gauge | None = None
        """``batchline_watermark_seconds``: made at the first record with a watermark, so that a
        pipeline without one does not show a watermark of 1970."""

        # ------------------------------------------------------------ inputs
        self.input_records = Counter("batchline_input_records", "Records the inputs gave completed batches.",
                                     ["input"], registry=registry)
        self.dead_letters = Counter("batchline_dead_letters", "Records of completed batches sent to dead letters.",
                                    ["input"], registry=registry)
        self.late_records = Counter("batchline_late_records",
                                    "Records of completed batches that stateful operators dropped as late.",
                                    ["input"], registry=registry)
        self.input_rate = Gauge("batchline_input_rate",
                                "Last completed batch: records per second of batch interval.", ["input"],
                                registry=registry)
        self.processing_rate = Gauge("batchline_processing_rate",
                                     "Last completed batch: records per second of processing time.", ["input"],
                                     registry=registry)
        self.input_lag = Gauge("batchline_input_lag_records",
                               "Last completed batch: records waiting at the source beyond it when it was planned "
                               "(inputs that know, as Kafka's).", ["input"], registry=registry)

        # ------------------------------------------------------------ state
        self.state_input_rows = Counter("batchline_state_input_rows", "Rows stateful operators took in.",
                                        ["operator"], registry=registry)
        self.state_late_rows = Counter("batchline_state_late_rows",
                                       "Rows stateful operators dropped as late (behind the watermark).",
                                       ["operator"], registry=registry)
        self.state_updated_keys = Counter("batchline_state_updated_keys", "Keys whose state was updated.",
                                          ["operator"], registry=registry)
        self.state_removed_keys = Counter("batchline_state_removed_keys", "Keys whose state was removed.",
                                          ["operator"], registry=registry)
        self.state_timed_out_keys = Counter("batchline_state_timed_out_keys", "Keys whose state timed out.",
                                            ["operator"], registry=registry)
        self.state_output_rows = Counter("batchline_state_output_rows", "Rows stateful operators put out.",
                                         ["operator"], registry=registry)
        self.state_keys = Gauge("batchline_state_keys", "Keys in state after the last completed batch.",
                                ["operator"], registry=registry)
        self.state_bytes = Gauge("batchline_state_bytes",
                                 "Estimated bytes of state (in Arrow) after the last completed batch.",
                                 ["operator"], registry=registry)
        self.state_watermark = Gauge("batchline_state_watermark_seconds",
                                     "Each stateful operator's watermark after the last completed batch, in Unix "
                                     "seconds (operators with a watermark only).", ["operator"], registry=registry)

        # ------------------------------------------------------------ checkpoints
        self.checkpoints = Counter("batchline_checkpoints", "Checkpoints written.", registry=registry)
        self.checkpoint_duration = Histogram("batchline_checkpoint_duration_seconds", "Time to write a checkpoint.",
                                             buckets=DURATION_BUCKETS, registry=registry)
        self.checkpoint_bytes = Gauge("batchline_checkpoint_bytes", "Size of the last checkpoint written.",
                                      registry=registry)

    # ---------------------------------------------------------------- records
    def observe(self, progress: BatchProgress) -> None:
        """Update every metric from one finished batch's progress record (thread safe)."""
        with self._lock:
            self._observe_batch(progress)
            if progress.status == COMPLETED:
                self._observe_data(progress)
            for checkpoint in progress.checkpoints:
                self.checkpoints.inc()
                self.checkpoint_duration.observe(_seconds(checkpoint.duration_ms))
                self.checkpoint_bytes.set(checkpoint.bytes)

    def _observe_batch(self, progress: BatchProgress) -> None:
        self.batches.labels(progress.status).inc()
        self.batch_retries.inc(max(0, progress.attempts - 1))
        self.last_batch_time.set(_seconds(progress.batch_time))
        self.backlog.set(progress.backlog)
        self.excluded_executors.set(len(progress.excluded_executors))
        if progress.scheduling_delay_ms is not None:
            self.scheduling_delay.set(_seconds(progress.scheduling_delay_ms))
        if progress.processing_ms is not None:
            self.processing_time.set(_seconds(progress.processing_ms))
            self.batch_duration.observe(_seconds(progress.processing_ms))
        if progress.total_delay_ms is not None:
            self.total_delay.set(_seconds(progress.total_delay_ms))
        for job in progress.durations.jobs:
            self.job_duration.labels(job.kind, job.name).observe(_seconds(job.duration_ms))
        if progress.watermark_ms is not None:
            if self._watermark is None:
                self._watermark = Gauge("batchline_watermark_seconds",
                                        "The highest watermark among the stateful operators after the last batch, "
                                        "in Unix seconds.", registry=self.registry)
            self._watermark.set(_seconds(progress.watermark_ms))

    def _observe_data(self, progress: BatchProgress) -> None:
        for source in progress.inputs:
            name = source.name
            self.input_records.labels(name).inc(max(0, source.records))
            self.dead_letters.labels(name).inc(max(0, source.dead_letters))
            self.late_records.labels(name).inc(max(0, source.late_records))
            self.input_rate.labels(name).set(source.input_rate)
            self.processing_rate.labels(name).set(source.processing_rate)
            if source.lag is not None:
                self.input_lag.labels(name).set(source.lag)
        for op in progress.state_operators:
            name = op.operator
            self.state_input_rows.labels(name).inc(max(0, op.input_rows))
            self.state_late_rows.labels(name).inc(max(0, op.late_rows))
            self.state_updated_keys.labels(name).inc(max(0, op.updated))
            self.state_removed_keys.labels(name).inc(max(0, op.removed))
            self.state_timed_out_keys.labels(name).inc(max(0, op.timed_out))
            self.state_output_rows.labels(name).inc(max(0, op.output_rows))
            self.state_keys.labels(name).set(op.state_keys)
            self.state_bytes.labels(name).set(op.state_bytes)
            if op.watermark_ms is not None:
                self.state_watermark.labels(name).set(_seconds(op.watermark_ms))

    def render(self) -> str:
        """The registry in Prometheus' text exposition format."""
        return generate_latest(self.registry).decode()

    # ---------------------------------------------------------------- HTTP
    def start_server(self, port: int, host: str = "127.0.0.1", token: str | None = None) -> None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread (port 0 picks a free port;
        :attr:`url` tells which). Requests must carry ``token``; without one, a server bound off
        loopback makes one (:attr:`token` tells which) and one on loopback requires none."""
        with self._server_lock:
            if self._server is not None:
                raise RuntimeError(f"The metrics of pipeline {self.pipeline!r} are already served at {self.url}")
            required = required_token(host, token)

            # As prometheus_client's start_http_server: the socket's family is the host's (IPv6 needs its own).
            family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]

            class Server(ThreadingWSGIServer):
                address_family = family

            app = _guarded(make_wsgi_app(self.registry), required, lambda: self.url)
            server = make_server(str(address[0]), port, app, Server, handler_class=_QuietHandler)
            thread = threading.Thread(target=server.serve_forever, name=f"batchline-metrics-{self.pipeline}",
                                      daemon=True)
            thread.start()
            self._server, self._thread = server, thread
            self._host, self._port, self._token = host, int(server.server_port), required
        logger.debug("Serving the metrics of pipeline %r at %s", self.pipeline, self.url)

    def stop_server(self) -> None:
        """Stop serving and free the port; does nothing when not serving."""
        with self._server_lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
            self._host = self._port = self._token = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(_STOP_JOIN_S)
        logger.debug("Stopped serving the metrics of pipeline %r", self.pipeline)

    @property
    def port(self) -> int | None:
        """The port the server is bound to, or None when not serving."""
        return self._port

    @property
    def url(self) -> str | None:
        """Where the metrics are served (``http://HOST:PORT/metrics``), or None when not serving."""
        host, port = self._host, self._port
        if host is None or port is None:
            return None
        return http_url(host, port, "/metrics")

    @property
    def token(self) -> str | None:
        """The access token requests must carry, or None when the endpoint requires none."""
        return self._token

    @property
    def open_url(self) -> str | None:
        """:attr:`url`, with ``?token=`` when a token is required."""
        url = self.url
        return with_token(url, self._token) if url is not None else None
