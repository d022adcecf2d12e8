"""What a running pipeline shows of itself, started with it and stopped after it: the
progress records kept at the checkpoint location, the Prometheus endpoint and the dashboard.
Each is a listener of the batches' progress records, so a slow exporter never delays a batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batchline.checkpoint.storage import CheckpointStorage
from batchline.errors import ConfigurationError
from batchline.observe.access import check_token, is_loopback, new_token, with_token
from batchline.observe.dashboard import DashboardServer
from batchline.observe.metrics import PipelineMetrics
from batchline.observe.progress_log import ProgressLog, read_progress
from batchline.scheduler.lifecycle import DEFAULT_RECENT_PROGRESS
from batchline.scheduler.listener import ListenerBus, StreamingListener
from batchline.scheduler.progress import BatchProgress

__all__ = ["ObserveSettings", "PipelineObservers"]

LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class ObserveSettings:
    metrics_port: int | None = None
    """Serve ``/metrics`` on this port (0: any free port); None: no metrics endpoint."""
    metrics_host: str = LOCALHOST
    dashboard_port: int | None = None
    """Serve the dashboard on this port (0: any free port); None: no dashboard."""
    dashboard_host: str = LOCALHOST
    progress_records: int = DEFAULT_RECENT_PROGRESS
    """Progress records kept in memory and at the checkpoint location."""
    access_token: str | None = field(default=None, repr=False)  # kept out of logged reprs of the settings
    """The token the dashboard and the metrics require, wherever they are bound; None: each one
    bound off loopback requires a token made at start (the same for both), one on loopback none."""

    def __post_init__(self) -> None:
        check_token(self.access_token)
        for what, port in (("metrics_port", self.metrics_port), ("dashboard_port", self.dashboard_port)):
            if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536):
                raise ConfigurationError(f"{what} must be a TCP port (0 for any free one) or None; got {port!r}")
        if isinstance(self.progress_records, bool) or not isinstance(self.progress_records, int) \
                or self.progress_records < 1:
            raise ConfigurationError(f"progress_records must be at least 1; got {self.progress_records!r}")


class _MetricsFeed(StreamingListener):
    def __init__(self, metrics: PipelineMetrics) -> None:
        self._metrics = metrics

    def on_progress(self, progress: BatchProgress) -> None:
        self._metrics.observe(progress)

    def __repr__(self) -> str:
        return f"metrics of {self._metrics.pipeline!r}"


class PipelineObservers:
    def __init__(self, name: str, settings: ObserveSettings, bus: ListenerBus,
                 snapshot: Callable[[], dict[str, Any]]) -> None:
        self._name = name
        self._settings = settings
        self._bus = bus
        self._snapshot = snapshot
        self.metrics: PipelineMetrics | None = None
        self.dashboard: DashboardServer | None = None

    @property
    def metrics_url(self) -> str | None:
        return self.metrics.url if self.metrics is not None else None

    @property
    def dashboard_url(self) -> str | None:
        return self.dashboard.url if self.dashboard is not None else None

    @property
    def access_token(self) -> str | None:
        """The token the dashboard or the metrics require (the same for both), None when neither does."""
        for token in (self.dashboard.token if self.dashboard else None, self.metrics.token if self.metrics else None):
            if token is not None:
                return token
        return None

    def addresses(self) -> list[str]:
        """What the start line says of the dashboard and the metrics: their addresses, with the
        token when it was made at start (the log is the only place it shows), not with one the
        user gave (who has it already; logs travel further than terminals)."""
        shown = []
        for what, url, token in (
                ("dashboard", self.dashboard_url, self.dashboard.token if self.dashboard else None),
                ("metrics", self.metrics_url, self.metrics.token if self.metrics else None)):
            if url is None:
                continue
            if token is None:
                shown.append(f"{what} {url}")
            elif self._settings.access_token is None:
                shown.append(f"{what} {with_token(url, token)} (the token is required: off loopback)")
            else:
                shown.append(f"{what} {url} (with the access token given)")
        return shown

    def start(self, storage: CheckpointStorage | None) -> list[BatchProgress]:
        """Start what the settings ask for; returns the records an earlier run left at the
        location (the dashboard shows them until new ones come)."""
        earlier = read_progress(storage) if storage is not None else []
        if storage is not None:
            self._bus.add(ProgressLog(storage, self._settings.progress_records, earlier))
        given, made = self._settings.access_token, new_token()

        def token_for(host: str) -> str | None:
            # One token for both servers off loopback, so that the one the start line shows opens both.
            return given if given is not None else None if is_loopback(host) else made

        if self._settings.metrics_port is not None:
            self.metrics = PipelineMetrics(self._name)
            self.metrics.start_server(self._settings.metrics_port, self._settings.metrics_host,
                                      token_for(self._settings.metrics_host))
            self._bus.add(_MetricsFeed(self.metrics))
        if self._settings.dashboard_port is not None:
            self.dashboard = DashboardServer(self._snapshot, self._settings.dashboard_host,
                                             self._settings.dashboard_port, token_for(self._settings.dashboard_host))
            self.dashboard.start()
        return earlier

    def stop(self) -> None:
        if self.metrics is not None:
            self.metrics.stop_server()
        if self.dashboard is not None:
            self.dashboard.stop()
