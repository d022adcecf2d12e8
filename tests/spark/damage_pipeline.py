"""The small stateful pipeline the damage tests run (SPEC E3): a running count per user over
the deterministic generator, on a manual clock, with Parquet output through ``FileSink``.

On a manual clock every batch has the same input in every run, so the output of a run that
was stopped, damaged and restarted can be compared with an uninterrupted run's, batch by batch.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from batchline import StreamingContext
from batchline.clock import ManualClock
from batchline.errors import BatchFailedError
from batchline.scheduler.retry import RetryPolicy
from batchline.sinks.files import FileSink
from batchline.testing import BatchRecorder

INTERVAL_MS = 1000
START_MS = 10_500
CRASH_AT = 23_000
"""The pre-run's last batch: its output is committed, then it fails before its commit marker
(what a driver killed between the two leaves), so a restart runs it again and reads more of
the files it left (its logged inputs, the sink's commit record, finished partitions)."""
END_MS = 27_000


def count_events(key, rows, state):
    count = (state.get()[0] if state.exists else 0) + sum(1 for _ in rows)
    state.update((count,))
    yield (key, count)


class CountsRun:
    """One driver of the pipeline over ``root/checkpoint`` (the checkpoint) and ``root/out``
    (the output), from ``start_ms`` on its own manual clock."""

    def __init__(self, spark: Any, root: Path, start_ms: int, crash_at: int | None = None,
                 retry: RetryPolicy | None = None, checkpoint: str | None = None,
                 storage_options: dict[str, Any] | None = None, lease_ttl: str = "15s") -> None:
        self.clock = ManualClock(start_ms)
        self.ssc = StreamingContext(spark, "1s", clock=self.clock, checkpoint=checkpoint or str(root / "checkpoint"),
                                    checkpoint_interval="2s", checkpoint_storage_options=storage_options,
                                    retry=retry or RetryPolicy.never(), lease_ttl=lease_ttl, metrics_port=None,
                                    dashboard_port=None)
        self.recorder = BatchRecorder()
        self.ssc.add_listener(self.recorder)
        events = self.ssc.generator_stream(rate=10, users=5, seed=11, max_records_per_batch=15, name="events")
        counts = events.group_by_key("id").flat_map_groups_with_state(
            count_events, state_schema="count long", output_schema="id long, count long", name="counts",
            num_partitions=2)
        sink = FileSink(str(root / "out"))

        def output(df, batch_time) -> None:
            sink.write(df, int(batch_time))
            if int(batch_time) == crash_at:
                raise RuntimeError("the driver died after the output committed")

        counts.foreach_batch(output, name="out")

    def run_through(self, last_ms: int, timeout_s: float = 120) -> None:
        """Advance the clock batch by batch up to ``last_ms``, waiting for each; the error that
        stopped the pipeline is raised."""
        while self.clock.now_ms() < last_ms:
            self.clock.advance(min(INTERVAL_MS, last_ms - self.clock.now_ms()))
            target = self.clock.now_ms() - self.clock.now_ms() % INTERVAL_MS
            deadline = time.monotonic() + timeout_s
            while not any(i.batch_time >= target for i in self.recorder.completed):
                if self.ssc.await_termination(0.02):  # raises the error that stopped it
                    raise AssertionError(f"the pipeline stopped without an error before batch {target}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"batch {target} did not complete in {timeout_s} s")

    def crash(self) -> None:
        """Run up to CRASH_AT, whose output commits and then fails the batch."""
        self.ssc.start()
        try:
            self.run_through(CRASH_AT)
            # The failed batch may be recorded as completed (with its failure) before the
            # pipeline's stop raises it: wait for the stop.
            self.ssc.await_termination(60)
        except BatchFailedError as error:
            assert "the driver died after the output committed" in str(error), error
        else:
            raise AssertionError(f"batch {CRASH_AT} did not fail")
        self.ssc.stop()


def output_rows(out: Path) -> dict[int, list[tuple[int, int]]]:
    """The visible output, by batch: (id, count) rows, sorted."""
    batches: dict[int, list[tuple[int, int]]] = {}
    for directory in sorted(out.glob("batch_time=*")):
        rows = [(int(r["id"]), int(r["count"])) for f in sorted(directory.glob("*.parquet"))
                for r in pq.read_table(f).to_pylist()]
        batches[int(directory.name.split("=", 1)[1])] = sorted(rows)
    return batches

