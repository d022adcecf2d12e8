"""One summary line per batch: logged at INFO by the listener every context adds (unless
``log_batches=False``), or printed by the demo's."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from batchline.batch_time import format_batch_time
from batchline.scheduler.listener import BatchInfo, StreamingListener

__all__ = ["BatchSummaryLogger", "BatchSummaryPrinter", "summary_line"]

logger = logging.getLogger(__name__)


def summary_line(info: BatchInfo) -> str:
    parts = [
        f"batch {format_batch_time(info.batch_time)}",
        f"{info.num_records} records",
        f"scheduling delay {info.scheduling_delay_ms} ms",
        f"processing time {info.processing_delay_ms} ms",
    ]
    if info.dead_letters:
        parts.append(f"{info.dead_letters} dead letters")
    for progress in info.state_operators.values():
        parts.append(f"{progress.operator}: {progress.state_keys} keys in state, {progress.output_rows} out"
                     + (f", {progress.timed_out} timed out" if progress.timed_out else "")
                     + (f", {progress.late_rows} late" if progress.late_rows else ""))
    if info.attempts > 1:
        parts.append(f"ran {info.attempts} times")
    if info.excluded_executors:
        parts.append("excluded executors: " + ", ".join(
            f"{e.executor_id} on {e.host} since {format_batch_time(e.since_ms)}" for e in info.excluded_executors))
    if info.failure:
        parts.append(f"FAILED: {info.failure}")
    return " | ".join(parts)


class BatchSummaryPrinter(StreamingListener):
    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out or sys.stdout

    def on_batch_completed(self, info: BatchInfo) -> None:
        print(summary_line(info), file=self._out, flush=True)


class BatchSummaryLogger(StreamingListener):
    """Logs each finished batch's summary line at INFO (a failed one at WARNING)."""

    def on_batch_completed(self, info: BatchInfo) -> None:
        logger.log(logging.WARNING if info.failure else logging.INFO, "%s", summary_line(info))
