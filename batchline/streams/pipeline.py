"""The running graph: one runtime per node, built from a ``StreamGraph`` at ``start()``.

Everything a batch needs of the pipeline goes through here, the same way for every kind of
node: inputs allocate, log and replay their data; every node may prepare a job, verify the
batch, carry progress across restarts and move on when the batch is committed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from batchline.batch_time import format_batch_time
from batchline.checkpoint.model import FinishedReport, OperatorProgress
from batchline.errors import ConfigurationError
from batchline.scheduler.job import Job
from batchline.scheduler.progress import StateOperatorProgress
from batchline.streams.base import RuntimeEnv, StreamNode, StreamRuntime
from batchline.streams.graph import StreamGraph
from batchline.streams.inputs import InputRuntime
from batchline.streams.trigger import EdgeKind, TriggerVertex, tasks_to_trigger

__all__ = ["PipelineRuntime"]

logger = logging.getLogger(__name__)


class PipelineRuntime:
    def __init__(self, graph: StreamGraph, env: RuntimeEnv) -> None:
        graph.validate()
        self.graph = graph
        self.env = env
        self._runtimes: dict[int, StreamRuntime] = {}
        inputs = {node.node_id: node for node in graph.inputs}
        readers: dict[int, InputRuntime] = {}
        for node in graph.nodes():
            parents = [self._runtimes[p.node_id] for p in node.parents]
            if node.node_id in inputs:
                readers[node.node_id] = inputs[node.node_id].create_runtime(env, parents)
                self._runtimes[node.node_id] = readers[node.node_id]
            else:
                self._runtimes[node.node_id] = node.create_runtime(env, parents)
        self.inputs = [readers[node.node_id] for node in graph.inputs]
        self.zero_time: int | None = None

    def runtime_of(self, node: StreamNode) -> StreamRuntime:
        return self._runtimes[node.node_id]

    @property
    def runtimes(self) -> list[StreamRuntime]:
        """Parents before children."""
        return list(self._runtimes.values())

    # ---------------------------------------------------------------- lifecycle
    def start(self, zero_time: int) -> None:
        self.zero_time = zero_time
        for runtime in self.runtimes:
            runtime.initialize(zero_time)
        for operation in self.graph.outputs:
            node = operation.node
            self.runtime_of(node).remember(self.graph.remember_ms or node.slide_ms)

    def open(self) -> None:
        """Check the checkpoint location against the pipeline (SPEC E4: what it keeps for a
        node the pipeline no longer has is refused), then let every node open its part."""
        checkpoint = self.env.checkpoint
        if checkpoint is not None:
            url = checkpoint.storage.url
            for folder, names in sorted(self.graph.claims().items()):
                orphans = [n for n in checkpoint.storage.list_names(folder) if n not in names]
                if orphans:
                    raise ConfigurationError(
                        f"the checkpoint at {url} holds the {folder} of operator(s) {orphans}, which this pipeline "
                        f"does not have (it has {sorted(names)}). If an operator was renamed, pass its old "
                        f"name=...; to drop its {folder} on purpose, delete {url}/{folder}/<name>"
                    )
        for runtime in self.runtimes:
            runtime.open()
        for operation in self.graph.outputs:
            operation.open(self.runtime_of(operation.node))

    def close_outputs(self) -> None:
        for operation in self.graph.outputs:
            try:
                operation.sink.close()
            except Exception:  # noqa: BLE001 (the pipeline stops either way)
                logger.exception("Closing output %s failed", operation.name)

    def start_inputs(self) -> None:
        for stream in self.inputs:
            stream.start()

    def stop_inputs(self, graceful: bool) -> None:
        for stream in self.inputs:
            stream.stop(graceful)

    # ---------------------------------------------------------------- inputs
    def allocate_inputs(self, batch_time: int) -> None:
        """Let every input still running pick its data (files, offsets, blocks) for the batch;
        a finished input reads nothing (SPEC G2)."""
        for stream in self.inputs:
            if stream.finished_before(batch_time):
                stream.report(batch_time, num_records=0)
            else:
                stream.allocate(batch_time)
                stream.note_allocated(batch_time)

    def allocations(self, batch_time: int) -> dict[str, dict[str, Any]]:
        """The allocation of every input that took part in a batch, by input name, for the batch log."""
        return {stream.name: stream.allocation(batch_time) for stream in self.inputs
                if not stream.finished_before(batch_time)}

    def restore_allocations(self, batch_time: int, allocations: dict[str, dict[str, Any]], advance: bool) -> None:
        """Give a batch the allocations the batch log holds (an input new since then, or
        finished before it, gets nothing)."""
        for stream in self.inputs:
            if stream.name in allocations:
                stream.restore_allocation(batch_time, allocations[stream.name], advance)
                if advance:
                    stream.note_allocated(batch_time)
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

    # ---------------------------------------------------------------- finishing (SPEC G1-G4)
    def finished_after(self) -> int | None:
        """The batch after which the whole pipeline has nothing to do: every output's stream
        is finished (None while one may still produce)."""
        times = [self.runtime_of(op.node).finished_after() for op in self.graph.outputs]
        if not times or any(t is None for t in times):
            return None
        return max(t for t in times if t is not None)

    def finished_report(self) -> FinishedReport | None:
        """What a checkpoint records as finished: inputs by name (not read again after a
        restart), operators by their checkpoint name, and every finished stream; None while
        nothing has finished."""
        inputs = {s.name: t for s in self.inputs if (t := s.finished_after()) is not None}
        streams = tuple(repr(r.node) for r in self.runtimes if r.finished_after() is not None)
        if not inputs and not streams:
            return None
        return FinishedReport(inputs, streams, {op.name: t for op in self.graph.outputs
                                                if (t := self.runtime_of(op.node).finished_after()) is not None})

    def restore_finished(self, report: FinishedReport | None) -> None:
        """Take back which inputs a checkpoint recorded as finished (None: nothing had);
        operators restore their partitions' finish with their progress."""
        if report is None:
            return
        for stream in self.inputs:
            finished = report.inputs.get(stream.name)
            if finished is not None and not stream.node.bounded:
                logger.info("Input %s had ended before the restart and is now unbounded: it goes on from its "
                            "position", stream.name)
            elif finished is not None:
                stream.restore_finished(int(finished))
                logger.info("Input %s finished before the restart (after batch %s); it is not read again",
                            stream.name, format_batch_time(int(finished)))

    def tasks_to_trigger(self, work: list[int] | None = None) -> list[tuple[StreamRuntime, int]]:
        """The (stream, partition) pairs still running with no running predecessor: where a
        batch's work now starts once parts of the pipeline have finished (SPEC G4, O(n))."""
        order = self.runtimes
        index = {id(r): i for i, r in enumerate(order)}
        vertices = [
            TriggerVertex(i, r.partitions(), tuple(
                (index[id(p)], EdgeKind.ALL_TO_ALL if r.node.shuffles_input else EdgeKind.POINTWISE)
                for p in r.parents))
            for i, r in enumerate(order)
        ]
        finished = {i: r.finished_partitions() for i, r in enumerate(order)}
        return [(order[v], p) for v, p in tasks_to_trigger(vertices, finished, work)]

    def unreplayable(self, batch_time: int, allocations: dict[str, dict[str, Any]]) -> list[str]:
        """The inputs of a logged batch (given back its allocations) that cannot give it the
        same data again."""
        return [s.name for s in self.inputs if s.name in allocations and not s.can_replay(batch_time)]

    def recover_batch(self, batch_time: int, unreplayable: Sequence[str]) -> None:
        for runtime in self.runtimes:
            runtime.recover_batch(batch_time, unreplayable)

    def recover_after_restart(self) -> None:
        for stream in self.inputs:
            stream.recover_after_restart()

    @property
    def max_input_remember_ms(self) -> int:
        return max((stream.remember_ms for stream in self.inputs), default=self.graph.batch_interval_ms)

    # ---------------------------------------------------------------- batches
    def generate_jobs(self, batch_time: int, logged_here: bool = False) -> list[Job]:
        """Nodes' preparation jobs first, upstream before downstream (inputs read and count,
        stateful operators run their function once and cache the result), then one job per
        output, then the jobs that complete work which ran inside an output's job.
        ``logged_here``: this driver logged the batch (no driver ran it before)."""
        logger.debug("Generating jobs for time %d ms", batch_time)
        jobs = [job for runtime in self.runtimes
                if not runtime.finished_before(batch_time) and (job := runtime.prepare_job(batch_time)) is not None]
        jobs += [job for op in self.graph.outputs
                 if (job := op.job(self.runtime_of(op.node), batch_time, logged_here)) is not None]
        jobs += [job for runtime in self.runtimes
                 if not runtime.finished_before(batch_time) and (job := runtime.finish_job(batch_time)) is not None]
        logger.debug("Generated %d jobs for time %d ms", len(jobs), batch_time)
        return jobs

    def after_jobs(self, batch_time: int) -> None:
        for runtime in self.runtimes:
            runtime.after_jobs(batch_time)

    def verify(self, batch_time: int) -> None:
        for runtime in self.runtimes:
            runtime.verify(batch_time)

    def operator_progress(self, batch_time: int) -> dict[str, StateOperatorProgress]:
        found = (runtime.operator_progress(batch_time) for runtime in self.runtimes)
        return {progress.operator: progress for progress in found if progress is not None}

    def on_batch_committed(self, batch_time: int) -> None:
        for runtime in self.runtimes:
            runtime.on_batch_committed(batch_time)

    def clear_metadata(self, batch_time: int) -> None:
        logger.debug("Clearing metadata for time %d ms", batch_time)
        for runtime in self.runtimes:
            runtime.clear_metadata(batch_time)

    # ---------------------------------------------------------------- progress
    def progress(self) -> dict[str, OperatorProgress]:
        """Progress that must survive a restart, by the name each node keeps at the checkpoint."""
        found: dict[str, OperatorProgress] = {}
        for runtime in self.runtimes:
            claim = runtime.node.checkpoint_claim()
            progress = runtime.progress()
            if claim is not None and progress is not None:
                found[claim[1]] = progress
        return found

    def restore_progress(self, progress: dict[str, OperatorProgress]) -> None:
        for runtime in self.runtimes:
            claim = runtime.node.checkpoint_claim()
            if claim is not None and claim[1] in progress:
                runtime.restore_progress(progress[claim[1]])
