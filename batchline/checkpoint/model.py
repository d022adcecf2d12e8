"""What a checkpoint holds: JSON only, never pickled user code (SPEC E4).

Every part is a frozen dataclass with ``to_json``/``from_json``; the file carries
``format_version``, and a file of an older version is converted by
``batchline.checkpoint.migrations`` before ``Checkpoint.from_json`` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Checkpoint", "FORMAT_VERSION", "OperatorProgress", "FinishedReport", "FinalRecord"]

FORMAT_VERSION = 2
"""The version this release writes; ``migrations`` reads every older one."""


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class OperatorProgress:
    """What a stateful operator must know again after a restart, as of a committed batch."""

    max_event_time_ms: int | None = None
    finished_partitions: tuple[int, ...] = ()
    """Partitions finished for good (their inputs ended and no timeout may fire)."""
    finished_after: int | None = None
    """The batch after which every partition was finished (None while one still runs)."""
    partitions: dict[int, Any] | None = None
    """Each partition's facts (its timers, as the operator encodes them), so that a restarted
    driver skips idle batches from the first; None when not known."""
    partitions_generation: int | None = None
    """The state generation ``partitions`` holds for (a rescale makes a new one)."""
    input_max_event_time_ms: dict[int, int] = field(default_factory=dict)
    """The newest event time per input, of an operator that reads several (a join)."""
    last_rows_at: int | None = None
    """The newest batch that brought the operator rows: an idle timeout moves the watermark on
    from it, so a restart without it would wait a whole timeout again. None: no rows yet (and
    what files written before the field read as)."""
    source_max_event_time_ms: dict[int, int] | None = None
    """The newest event time seen at each ``with_watermark`` upstream, of an operator whose rows
    come through several (a union); None for other operators, and as files written before the
    field read."""

    def to_json(self) -> dict[str, Any]:
        """The operator's own progress record: what it wrote, read back the same. Fields at their
        default are left out, so a file without them reads as it was written."""
        payload: dict[str, Any] = {"max_event_time_ms": self.max_event_time_ms}
        if self.last_rows_at is not None:
            payload["last_rows_at"] = self.last_rows_at
        if self.input_max_event_time_ms:
            payload["input_max_event_time_ms"] = {str(i): t for i, t in sorted(self.input_max_event_time_ms.items())}
        if self.source_max_event_time_ms is not None:
            payload["source_max_event_time_ms"] = {str(i): t for i, t in sorted(self.source_max_event_time_ms.items())}
        if self.finished_partitions:
            payload.update(finished_partitions=list(self.finished_partitions), finished_after=self.finished_after)
        if self.partitions is not None:
            payload["partitions"] = {str(p): facts for p, facts in sorted(self.partitions.items())}
            payload["partitions_generation"] = self.partitions_generation
        return payload

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> OperatorProgress:
        partitions = payload.get("partitions")
        sources = payload.get("source_max_event_time_ms")
        return cls(
            max_event_time_ms=_optional_int(payload.get("max_event_time_ms")),
            input_max_event_time_ms={int(i): int(t) for i, t in payload.get("input_max_event_time_ms", {}).items()},
            finished_partitions=tuple(int(p) for p in payload.get("finished_partitions", ())),
            finished_after=_optional_int(payload.get("finished_after")),
            partitions=None if partitions is None else {int(p): facts for p, facts in partitions.items()},
            partitions_generation=_optional_int(payload.get("partitions_generation")),
            last_rows_at=_optional_int(payload.get("last_rows_at")),
            source_max_event_time_ms=None if sources is None else {int(i): int(t) for i, t in sources.items()},
        )


@dataclass(frozen=True)
class FinishedReport:
    """What had finished as of the checkpoint (SPEC G1-G4)."""

    inputs: dict[str, int] = field(default_factory=dict)
    """Finished inputs by name, each with the batch it finished after: not read again."""
    streams: tuple[str, ...] = ()
    """Every finished stream, as it names itself (for people reading the checkpoint)."""
    outputs: dict[str, int] = field(default_factory=dict)
    """Outputs whose stream finished, by name, with the batch it finished after."""

    def to_json(self) -> dict[str, Any]:
        return {"inputs": dict(self.inputs), "streams": list(self.streams), "outputs": dict(self.outputs)}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> FinishedReport:
        return cls({str(k): int(v) for k, v in payload.get("inputs", {}).items()},
                   tuple(str(s) for s in payload.get("streams", ())),
                   {str(k): int(v) for k, v in payload.get("outputs", {}).items()})


@dataclass(frozen=True)
class FinalRecord:
    """The mark of a finished pipeline's last checkpoint (SPEC G3): a restart finds it and runs nothing."""

    finished_after: int | None
    """The batch after which the whole pipeline had nothing to do."""
    output_commits: dict[str, Any]
    """Each output's last commit, as its sink describes it (``Sink.last_commit``)."""

    def to_json(self) -> dict[str, Any]:
        return {"finished_after": self.finished_after, "output_commits": dict(self.output_commits)}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> FinalRecord:
        return cls(_optional_int(payload.get("finished_after")), dict(payload.get("output_commits", {})))


@dataclass(frozen=True)
class Checkpoint:
    """The pipeline's progress at ``time``: everything a restarted driver needs to go on.

    Inputs and outputs are named by their stable names, so a restarted pipeline may run
    changed code and still find its offsets. An input's position is its own JSON (its
    ``snapshot()``); the rest is typed here.
    """

    time: int
    zero_time: int
    batch_interval_ms: int
    checkpoint_interval_ms: int
    pending_times: tuple[int, ...]
    inputs: dict[str, dict[str, Any]]
    outputs: tuple[str, ...]
    written_at_ms: int
    operators: dict[str, OperatorProgress] = field(default_factory=dict)
    """Stateful operators' progress by the name each keeps at the checkpoint location."""
    finished: FinishedReport | None = None
    """What had finished; None while nothing has."""
    final: FinalRecord | None = None
    """Set on a finished pipeline's final checkpoint only."""
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "time": self.time,
            "zero_time": self.zero_time,
            "batch_interval_ms": self.batch_interval_ms,
            "checkpoint_interval_ms": self.checkpoint_interval_ms,
            "pending_times": list(self.pending_times),
            "inputs": self.inputs,
            "outputs": list(self.outputs),
            "written_at_ms": self.written_at_ms,
            "operators": {name: progress.to_json() for name, progress in self.operators.items()},
            "finished": None if self.finished is None else self.finished.to_json(),
            "final": None if self.final is None else self.final.to_json(),
        }

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Checkpoint:
        """Read a checkpoint of the current format (``migrations.upgrade`` brings older ones here)."""
        finished, final = payload["finished"], payload["final"]
        return cls(
            time=int(payload["time"]),
            zero_time=int(payload["zero_time"]),
            batch_interval_ms=int(payload["batch_interval_ms"]),
            checkpoint_interval_ms=int(payload["checkpoint_interval_ms"]),
            pending_times=tuple(int(t) for t in payload["pending_times"]),
            inputs=dict(payload["inputs"]),
            outputs=tuple(payload["outputs"]),
            written_at_ms=int(payload["written_at_ms"]),
            operators={name: OperatorProgress.from_json(p) for name, p in payload["operators"].items()},
            finished=None if finished is None else FinishedReport.from_json(finished),
            final=None if final is None else FinalRecord.from_json(final),
            format_version=int(payload["format_version"]),
        )

    @property
    def finished_inputs(self) -> dict[str, int]:
        """Finished inputs by name, each with the batch it finished after."""
        return {} if self.finished is None else dict(self.finished.inputs)
