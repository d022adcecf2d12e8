"""What a running pipeline shows of itself, started with it and stopped after it: the
progress records kept at the checkpoint location, the Prometheus endpoint and the dashboard.
Each is a listener of the batches' progress records, so a slow exporter never delays a batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batchline.checkpoint.storage import CheckpointStorage
from batchline.errors import ConfigurationError
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

    def __post_init__(self) -> None:
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

    def start(self, storage: CheckpointStorage | None) -> list[BatchProgress]:
        """Start what the settings ask for; returns the records an earlier run left at the
        location (the dashboard shows them until new ones come)."""
        earlier = read_progress(storage) if storage is not None else []
        if storage is not None:
            self._bus.add(ProgressLog(storage, self._settings.progress_records, earlier))
        if self._settings.metrics_port is not None:
            self.metrics = PipelineMetrics(self._name)
            self.metrics.start_server(self._settings.metrics_port, self._settings.metrics_host)
            self._bus.add(_MetricsFeed(self.metrics))
        if self._settings.dashboard_port is not None:
            self.dashboard = DashboardServer(self._snapshot, self._settings.dashboard_host,
                                             self._settings.dashboard_port)
            self.dashboard.start()
        return earlier

    def stop(self) -> None:
        if self.metrics is not None:
            self.metrics.stop_server()
        if self.dashboard is not None:
            self.dashboard.stop()
