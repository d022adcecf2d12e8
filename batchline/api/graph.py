"""The pipeline's graph: its inputs and output operations (Spark's DStreamGraph)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from batchline.errors import ConfigurationError, NoOutputOperationError
from batchline.scheduler.job import Job

if TYPE_CHECKING:
    from batchline.api.output import OutputOperation
    from batchline.checkpoint.manager import CheckpointManager
    from batchline.sources.base import InputStream
    from batchline.state.operator import StatefulStream

__all__ = ["StreamGraph"]

logger = logging.getLogger(__name__)


class StreamGraph:
    def __init__(self, batch_interval_ms: int) -> None:
        self.batch_interval_ms = batch_interval_ms
        self.inputs: list[InputStream] = []
        self.outputs: list[OutputOperation] = []
        self.stateful: list[StatefulStream] = []
        """Stateful operators in the order they were built, so upstream ones run first."""
        self.zero_time: int | None = None
        self.remember_ms: int | None = None
        self._consumed: set[int] = set()
        self._lock = threading.Lock()

    def add_input(self, stream: InputStream) -> int:
        """Register an input; its name becomes unique ("queue", "queue-2", ...): checkpoints
        find inputs by name."""
        with self._lock:
            stream.name = _unique(stream.name, {s.name for s in self.inputs})
            self.inputs.append(stream)
            return len(self.inputs) - 1

    def add_output(self, operation: OutputOperation) -> None:
        with self._lock:
            self.outputs.append(operation)

    def add_stateful(self, operator: StatefulStream, name: str) -> str:
        """Register a stateful operator; its name finds its state, so two may not share one."""
        with self._lock:
            if name in {op.name for op in self.stateful}:
                raise ConfigurationError(
                    f"two stateful operators are named {name!r}; give each a stable name=..., "
                    "which is where its state is kept"
                )
            self.stateful.append(operator)
            return name

    def open_state(self, manager: CheckpointManager | None, zero_time: int,
                   progress: dict[str, dict[str, Any]] | None = None) -> None:
        """Attach stateful operators to their stored state (SPEC E4: an operator whose state
        is in the checkpoint but which the pipeline no longer has is refused)."""
        if not self.stateful:
            return
        if manager is None:
            raise ConfigurationError(
                f"stateful operator {self.stateful[0].name!r} keeps its state at the checkpoint location; "
                "create the StreamingContext with checkpoint=<path or URL>"
            )
        from batchline.state.store import STATE_DIR

        names = {op.name for op in self.stateful}
        orphans = [n for n in manager.storage.list_names(STATE_DIR) if n not in names]
        if orphans:
            raise ConfigurationError(
                f"the checkpoint at {manager.storage.url} holds the state of operator(s) {orphans}, which this "
                f"pipeline does not have (it has {sorted(names)}). If an operator was renamed, pass its old "
                f"name=...; to drop its state on purpose, delete {manager.storage.url}/{STATE_DIR}/<name>"
            )
        for operator in self.stateful:
            operator.open(manager, zero_time)
            if progress and operator.name in progress:
                operator.restore_progress(progress[operator.name])

    def state_progress(self) -> dict[str, dict[str, Any]]:
        return {op.name: op.progress_json() for op in self.stateful}

    def on_batch_committed(self, batch_time: int) -> None:
        for operator in self.stateful:
            operator.on_batch_committed(batch_time)

    def unique_output_name(self, name: str) -> str:
        return _unique(name, {op.name for op in self.outputs})

    def validate(self) -> None:
        if not self.outputs:
            raise NoOutputOperationError(
                "the pipeline has no output operation, so no batch would ever run; add one, "
                "e.g. stream.foreach_batch(fn), stream.console() or stream.write_files(path)"
            )

    def is_consumed(self, stream_id: int) -> bool:
        """Whether some output reads from the stream (known once the graph has started)."""
        return stream_id in self._consumed

    def start(self, zero_time: int) -> None:
        self.validate()
        self.zero_time = zero_time
        for operation in self.outputs:
            operation.stream.initialize(zero_time)
        for stream in self.inputs:
            if stream.zero_time is None:
                stream.initialize(zero_time)
        for operation in self.outputs:
            operation.stream.remember(self.remember_ms or operation.stream.slide_ms)
            self._consumed |= operation.stream.ancestors()
        for stream in self.inputs:
            stream.start()

    def stop(self) -> None:
        for stream in self.inputs:
            stream.stop()

    def allocate_inputs(self, batch_time: int) -> None:
        """Let every input pick its data (files, offsets, blocks) for the batch."""
        for stream in self.inputs:
            stream.allocate(batch_time)

    def allocations(self, batch_time: int) -> dict[str, dict[str, Any]]:
        """Every input's allocation for a batch, by input name, for the batch log."""
        return {stream.name: stream.allocation(batch_time) for stream in self.inputs}

    def restore_allocations(self, batch_time: int, allocations: dict[str, dict[str, Any]], advance: bool) -> None:
        """Give a batch the allocations the batch log holds (an input new since then gets nothing)."""
        for stream in self.inputs:
            if stream.name in allocations:
                stream.restore_allocation(batch_time, allocations[stream.name], advance)
            else:
                stream.report(batch_time, num_records=0)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {stream.name: stream.snapshot() for stream in self.inputs}

    def restore(self, snapshots: dict[str, dict[str, Any]]) -> None:
        names = {stream.name for stream in self.inputs}
        for name in sorted(set(snapshots) - names):
            logger.warning("The checkpoint has input %r, which this pipeline no longer has; its progress is dropped",
                           name)
        for stream in self.inputs:
            if stream.name in snapshots:
                stream.restore(snapshots[stream.name])
            else:
                logger.info("Input %r is new since the checkpoint; it starts from its beginning", stream.name)

    def generate_jobs(self, batch_time: int) -> list[Job]:
        """Inputs' preparation jobs first (they read and count), then the stateful operators
        (each runs its state function once and caches the result), then one job per output."""
        logger.debug("Generating jobs for time %d ms", batch_time)
        jobs = [job for stream in self.inputs if (job := stream.prepare_job(batch_time)) is not None]
        jobs += [job for op in self.stateful
                 if self.is_consumed(op.stream_id) and (job := op.job(batch_time)) is not None]
        jobs += [job for op in self.outputs if (job := op.generate_job(batch_time)) is not None]
        logger.debug("Generated %d jobs for time %d ms", len(jobs), batch_time)
        return jobs

    def clear_metadata(self, batch_time: int) -> None:
        logger.debug("Clearing metadata for time %d ms", batch_time)
        for operation in self.outputs:
            operation.stream.clear_metadata(batch_time)
        for stream in self.inputs:
            if not self.is_consumed(stream.stream_id):
                stream.clear_metadata(batch_time)

    @property
    def max_input_remember_ms(self) -> int:
        return max((stream.remember_ms for stream in self.inputs), default=self.batch_interval_ms)


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    n = 2
    while f"{name}-{n}" in taken:
        n += 1
    return f"{name}-{n}"
