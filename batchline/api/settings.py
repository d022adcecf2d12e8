"""What a ``StreamingContext``'s arguments come to, checked once: every setting the running
pipeline reads, in one frozen record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batchline.api.launch import launch_defaults
from batchline.checkpoint.manager import CheckpointSettings, default_checkpoint_interval_ms
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError
from batchline.observe.observers import ObserveSettings
from batchline.scheduler.job_generator import default_max_batches_ahead
from batchline.scheduler.retry import RetryPolicy

__all__ = ["ContextSettings", "FROM_LAUNCH", "FromLaunch", "GRACEFUL_STOP_TIMEOUT_INTERVALS"]

GRACEFUL_STOP_TIMEOUT_INTERVALS = 10
LOOPBACK = "127.0.0.1"


class FromLaunch:
    """A port, host or access token left out: what ``batchline run`` set (``batchline.api.launch``),
    else the default (ports off, hosts on loopback, no token given)."""

    def __repr__(self) -> str:
        return "FROM_LAUNCH"


FROM_LAUNCH = FromLaunch()


@dataclass(frozen=True)
class ContextSettings:
    batch_interval_ms: int
    concurrent_jobs: int
    graceful_stop_timeout_ms: int
    retry: RetryPolicy
    checkpoint: CheckpointSettings | None
    """None: no checkpoint location (the pipeline starts fresh every time)."""
    max_batches_ahead: int
    observe: ObserveSettings
    keep_workers_warm: bool
    log_batches: bool = True
    """One INFO line per finished batch on the ``batchline.observe.summary`` logger."""

    @classmethod
    def of(cls, batch_interval: object, *, concurrent_jobs: int, graceful_stop_timeout: object | None,
           checkpoint: str | None, checkpoint_interval: object | None, keep_checkpoints: int,
           checkpoint_storage_options: dict[str, Any] | None, lease_ttl: object, retry: RetryPolicy | None,
           max_batches_ahead: int | None, metrics_port: int | None | FromLaunch, metrics_host: str | FromLaunch,
           dashboard_port: int | None | FromLaunch, dashboard_host: str | FromLaunch, progress_records: int,
           keep_workers_warm: bool, log_batches: bool = True,
           access_token: str | None | FromLaunch = FROM_LAUNCH) -> ContextSettings:
        """The settings of ``StreamingContext(...)``'s arguments (documented there), or a
        ``ConfigurationError`` naming the argument and what to pass."""
        batch_interval_ms = parse_duration_ms(batch_interval, "batch interval")
        if concurrent_jobs < 1:
            raise ConfigurationError(f"concurrent_jobs must be at least 1; got {concurrent_jobs}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry is a RetryPolicy, e.g. RetryPolicy(max_attempts=3); got {retry!r}")
        launch = launch_defaults()
        return cls(
            batch_interval_ms=batch_interval_ms,
            concurrent_jobs=concurrent_jobs,
            graceful_stop_timeout_ms=(
                parse_duration_ms(graceful_stop_timeout, "graceful stop timeout")
                if graceful_stop_timeout is not None
                else GRACEFUL_STOP_TIMEOUT_INTERVALS * batch_interval_ms),
            retry=retry if retry is not None else RetryPolicy(),
            checkpoint=_checkpoint_settings(batch_interval_ms, checkpoint, checkpoint_interval, keep_checkpoints,
                                            checkpoint_storage_options, lease_ttl),
            max_batches_ahead=_max_batches_ahead(max_batches_ahead, concurrent_jobs),
            observe=ObserveSettings(
                launch.metrics_port if isinstance(metrics_port, FromLaunch) else metrics_port,
                (launch.host or LOOPBACK) if isinstance(metrics_host, FromLaunch) else metrics_host,
                launch.dashboard_port if isinstance(dashboard_port, FromLaunch) else dashboard_port,
                (launch.host or LOOPBACK) if isinstance(dashboard_host, FromLaunch) else dashboard_host,
                progress_records,
                launch.access_token if isinstance(access_token, FromLaunch) else access_token),
            keep_workers_warm=keep_workers_warm,
            log_batches=log_batches,
        )


def _max_batches_ahead(value: object, concurrent_jobs: int) -> int:
    if value is None:
        return default_max_batches_ahead(concurrent_jobs)
    if isinstance(value, bool) or not isinstance(value, int) or value < concurrent_jobs:
        raise ConfigurationError(
            f"max_batches_ahead must be a whole number of batches, at least concurrent_jobs ({concurrent_jobs}) so "
            f"that as many can run at once; got {value!r}. Leave it out for the default "
            f"({default_max_batches_ahead(concurrent_jobs)}), or pass e.g. 10**9 for no limit"
        )
    return value


def _checkpoint_settings(
    batch_interval_ms: int,
    location: str | None,
    interval: object | None,
    keep: int,
    storage_options: dict[str, Any] | None,
    lease_ttl: object,
) -> CheckpointSettings | None:
    if location is None:
        if interval is not None:
            raise ConfigurationError("checkpoint_interval was given without a checkpoint location; add checkpoint=...")
        return None
    interval_ms = (
        parse_duration_ms(interval, "checkpoint interval")
        if interval is not None
        else default_checkpoint_interval_ms(batch_interval_ms)
    )
    if interval_ms % batch_interval_ms:
        raise ConfigurationError(
            f"the checkpoint interval ({interval_ms} ms) must be a positive multiple of the batch interval "
            f"({batch_interval_ms} ms), e.g. {default_checkpoint_interval_ms(batch_interval_ms)} ms"
        )
    if keep < 1:
        raise ConfigurationError(f"keep_checkpoints must be at least 1; got {keep}")
    return CheckpointSettings(location, interval_ms, keep, parse_duration_ms(lease_ttl, "lease ttl"),
                              dict(storage_options or {}), batch_interval_ms)
