"""A pipeline's description (Spark's DStreamGraph, less its running state): inputs by unique
name, output operations by unique name, and what nodes keep at the checkpoint location."""

from __future__ import annotations

import threading

from batchline.errors import ConfigurationError, ContextStateError, NoOutputOperationError
from batchline.sinks.sink import Sink
from batchline.streams.base import Readers, StreamNode
from batchline.streams.inputs import InputNode
from batchline.streams.output import OutputOperation

__all__ = ["StreamGraph"]


class StreamGraph:
    def __init__(self, batch_interval_ms: int, remember_ms: int | None = None, *, checkpointed: bool = True) -> None:
        self.batch_interval_ms = batch_interval_ms
        self.checkpointed = checkpointed
        """Whether the pipeline has a checkpoint location: without one, ``validate`` refuses what
        needs one (an output that writes outside the process, a stateful operator)."""
        self.remember_ms = remember_ms
        """How long every output's stream keeps its DataFrames at least (``remember=``)."""
        self.inputs: list[InputNode] = []
        self.outputs: list[OutputOperation] = []
        self._claims: dict[tuple[str, str], StreamNode] = {}
        self._lock = threading.Lock()
        self._started = False
        """Set by ``validate`` at start: the running pipeline is the graph as it was then."""

    def _check_not_started(self, what: str) -> None:
        if self._started:
            raise ContextStateError(f"cannot add {what} to a pipeline that has started; build the whole "
                                    "pipeline before start()")

    def add_input(self, node: InputNode) -> InputNode:
        """Register an input; its name becomes unique ("queue", "queue-2", ...): checkpoints
        find inputs by name."""
        self._check_not_started("an input")
        with self._lock:
            node.name = _unique(node.name, {s.name for s in self.inputs})
            node.input_id = len(self.inputs)
            self.inputs.append(node)
            return node

    def add_output(self, node: StreamNode, sink: Sink, name: str) -> OutputOperation:
        """Register an output; its name becomes unique ("console", "console-2", ...)."""
        if not isinstance(sink, Sink):
            raise ConfigurationError(
                f"an output takes a batchline.Sink; got {sink!r}. Subclass batchline.Sink (write(df, batch)), "
                "or pass a function to stream.foreach_batch(fn)")
        self._check_not_started("an output")
        with self._lock:
            operation = OutputOperation(_unique(name, {op.name for op in self.outputs}), node, sink)
            self.outputs.append(operation)
            return operation

    def claim(self, node: StreamNode) -> None:
        """Register what a node keeps at the checkpoint location; two may not keep the same."""
        claim = node.checkpoint_claim()
        if claim is None:
            return
        with self._lock:
            if claim in self._claims:
                raise ConfigurationError(
                    f"two nodes keep {claim[0]}/{claim[1]} at the checkpoint location; give each a stable, "
                    "unique name=..., which is where its state is kept"
                )
            self._claims[claim] = node

    def claims(self) -> dict[str, set[str]]:
        """Names claimed in each checkpoint folder."""
        folders: dict[str, set[str]] = {}
        for folder, name in self._claims:
            folders.setdefault(folder, set()).add(name)
        return folders

    def validate(self) -> None:
        if not self.outputs:
            raise NoOutputOperationError(
                "the pipeline has no output operation, so no batch would ever run; add one, "
                "e.g. stream.foreach_batch(fn), stream.console() or stream.write_files(path)"
            )
        if not self.checkpointed:
            self._refuse_without_checkpoint()
        self._started = True

    def _refuse_without_checkpoint(self) -> None:
        """Without a checkpoint location every run starts from the beginning of its inputs:
        an output that writes outside the process would write again what an earlier run wrote,
        and a stateful operator has nowhere to keep its state."""
        outputs = [f"{op.name!r} ({type(op.sink).__name__})" for op in self.outputs if op.sink.needs_checkpoint]
        consumed = self.consumed()
        stateful = [claim[1] for node in self.nodes()
                    if node.node_id in consumed and (claim := node.checkpoint_claim()) is not None]
        problems = []
        if outputs:
            problems.append(f"output(s) {', '.join(outputs)} write outside this process, and without a checkpoint "
                            "location every run starts from the beginning of its inputs and writes again what an "
                            "earlier run wrote")
        if stateful:
            problems.append(f"stateful operator(s) {', '.join(repr(n) for n in stateful)} keep their state at the "
                            "checkpoint location")
        if problems:
            raise ConfigurationError(
                f"the pipeline needs a checkpoint location: {'; '.join(problems)}. Create the context with "
                'StreamingContext(..., checkpoint="a local path or s3://..."): a rerun with the same location goes '
                "on where the last run stopped and writes nothing twice")

    def nodes(self) -> list[StreamNode]:
        """Every input and every node an output reads, parents before children, in build order."""
        found: dict[int, StreamNode] = {}

        def visit(node: StreamNode) -> None:
            if node.node_id not in found:
                for parent in node.parents:
                    visit(parent)
                found[node.node_id] = node

        for node in [*self.inputs, *(op.node for op in self.outputs)]:
            visit(node)
        return sorted(found.values(), key=lambda n: n.node_id)

    def readers(self, node: StreamNode) -> list[StreamNode | OutputOperation]:
        """What reads ``node``'s rows in a batch's jobs, in the order the jobs run: first the
        nearest nodes downstream that materialize (their own job reads all their input), then
        the outputs that reach ``node`` through none of them; a materializing node that runs
        inside its only output's job reads at that output's place."""
        children: dict[int, list[StreamNode]] = {}
        for child in self.nodes():
            for parent in child.parents:
                children.setdefault(parent.node_id, []).append(child)
        materializing: dict[int, StreamNode] = {}
        plain: set[int] = set()
        pending = [node]
        while pending:
            for child in children.get(pending.pop().node_id, []):
                if child.materializes:
                    materializing[child.node_id] = child
                elif child.node_id not in plain:
                    plain.add(child.node_id)
                    pending.append(child)
        plain.add(node.node_id)
        in_output_job = self.read_by_one_output() & materializing.keys()
        first = [n for n in sorted(materializing.values(), key=lambda n: n.node_id) if n.node_id not in in_output_job]
        in_order: list[StreamNode | OutputOperation] = [
            materializing[op.node.node_id] if op.node.node_id in in_output_job else op
            for op in self.outputs if op.node.node_id in plain or op.node.node_id in in_output_job]
        return [*first, *in_order]

    def input_readers(self) -> dict[int, Readers]:
        """``readers`` of every input, as the inputs' runtimes see them."""
        found = {}
        for node in self.inputs:
            readers = self.readers(node)
            first = readers[0] if readers else None
            found[node.node_id] = Readers(
                len(readers), first is not None and (not isinstance(first, OutputOperation) or first.reads_all_rows))
        return found

    def read_by_one_output(self) -> frozenset[int]:
        """Ids of the nodes whose rows only one output operation reads, directly (no other
        node reads them, no window, no second output), and reads all of them: a stateful
        operator among them runs inside that output's job instead of a job of its own."""
        children = {parent.node_id for node in self.nodes() for parent in node.parents}
        outputs = [op.node.node_id for op in self.outputs]
        return frozenset(op.node.node_id for op in self.outputs
                         if outputs.count(op.node.node_id) == 1 and op.node.node_id not in children
                         and op.reads_all_rows)

    def read_in_one_pass(self) -> frozenset[int]:
        """The nodes of ``read_by_one_output`` whose output reads them in one pass: a stateful
        operator among them needs no cache of its rows."""
        by_one = self.read_by_one_output()
        return frozenset(op.node.node_id for op in self.outputs if op.node.node_id in by_one and op.evaluates_once)

    def consumed(self) -> frozenset[int]:
        """Ids of the nodes some output reads from."""
        return frozenset(i for op in self.outputs for i in op.node.ancestors())

    @property
    def ordered_batches(self) -> bool:
        return any(node.ordered_batches for node in self.nodes())


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    n = 2
    while f"{name}-{n}" in taken:
        n += 1
    return f"{name}-{n}"
