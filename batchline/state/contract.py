"""The typed contract between a stateful operator's driver and its tasks.

- ``OperatorSpec``: what is static for the operator (its store, generation, keys, schemas,
  function, timeout kind, event-time column). It travels pickled inside the task closure;
  the function is user code, which is fine there and never goes into a checkpoint.
- ``BatchParams``: what changes per batch (batch time, the version to build on, the lease
  token, the watermark). The batch's DataFrame is built before the previous batch finished,
  so these reach the tasks as a Spark local property of the job: the driver publishes
  ``{operator: params.to_json()}`` with ``with_batch_params`` and each task reads exactly its
  own entry with ``batch_params_from_property``.
- ``MARKER_COLUMN``: which state partition a task runs comes with its rows, not from Spark's
  task number.
- ``Stats``: what a task counted, summed across tasks with ``Stats.merge``.
- Errors: a task that fails because of the state function raises a ``StateFunctionError``
  that carries its attributes in its text (a ``CarriedError``); Spark hands the driver that
  text inside its own error, and ``StateFunctionError.carried_in`` builds the error again.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.types import StructType

from batchline.checkpoint.events import JobEventStore
from batchline.errors import CarriedError, ConfigurationError, MissingBatchParamsError
from batchline.state.group_state import GroupStateTimeout
from batchline.state.schema import RowSchema
from batchline.state.store import StateStore

__all__ = [
    "BATCH_PARAMS_PROPERTY",
    "LATE_AT",
    "BatchParams",
    "ErrorKind",
    "MARKER_COLUMN",
    "OperatorSpec",
    "PartitionFacts",
    "RECENT_VERSIONS",
    "StateFunctionError",
    "Stats",
    "batch_params_from_property",
    "with_batch_params",
]

logger = logging.getLogger(__name__)

BATCH_PARAMS_PROPERTY = "batchline.state.batch"
"""The Spark local property that carries each operator's ``BatchParams`` to its tasks."""
RECENT_VERSIONS = 8
"""How many of its newest versions an operator names to its tasks (``BatchParams.recent_versions``)."""
LATE_AT = "__batchline_late_at"
"""The column a stateful node's ``late_rows`` adds to its input rows: the epoch ms at or before
which the watermark makes the row late."""
MARKER_COLUMN = "__batchline_state_partition"
"""The column of the operator's shuffled input that tells each task its state partition: one
marker row per partition holds the partition's number, data rows hold null
(``batchline.state.placement``)."""


# -------------------------------------------------------------------- static and per batch
@dataclass(frozen=True)
class OperatorSpec:
    """What a task needs of its operator that does not change between batches."""

    store: StateStore
    """The operator's state store; it travels with the task as its ``__reduce__`` says."""
    generation: int
    key_names: tuple[str, ...]
    key_schema: StructType
    state: RowSchema
    output: RowSchema
    fn: Callable[..., Any]
    flat: bool
    timeout: GroupStateTimeout
    event_time_column: str | None = None
    journal: JobEventStore | None = None
    """Where a task records that its partition finished (SPEC F2); None where nothing restarts
    (the state-function tester)."""
    late_column: str | None = None
    """The column compared with the watermark to drop late rows (``value <= watermark``, as
    Spark's); None: no row is late. A state function's is its event-time column under
    event-time timeouts; a window aggregation's, the window's end."""
    rows_column: str | None = None
    """The column that says how many input rows each row stands for (a partial aggregate's
    count), for the rows and late rows counted; None: one each."""
    input_column: str | None = None
    """The column that says which of the operator's inputs a row came from (a join's side),
    so that the newest event time is counted per input; None: the operator reads one input."""

    @property
    def operator(self) -> str:
        return self.store.operator

    @property
    def single_key(self) -> bool:
        return len(self.key_names) == 1


@dataclass(frozen=True)
class BatchParams:
    """What a task needs of its batch, published by the driver when the batch's job runs."""

    batch_time: int
    prev_version: int | None
    """The operator's last committed version, or None when the driver has just started."""
    token: int
    """The driver's lease token: a cache built under another driver is never trusted."""
    watermark_ms: int | None
    keep_finished: bool = True
    """Whether a partition that recorded its finish of this batch keeps it (False: the batch
    re-runs whole, because an input it read cannot replay)."""
    end_of_input: bool = False
    """Every input has ended: every key with a timeout times out now (SPEC G3's drain)."""
    finished_partitions: tuple[int, ...] = ()
    """Partitions drained for good (SPEC G2): their tasks do nothing."""
    idle_partitions: tuple[int, ...] = ()
    """Partitions that sit this batch out (no row, no timer due, in a batch that runs only the
    partitions whose timers are due): their tasks do nothing and write no version."""
    skip: bool = False
    """The operator does nothing in this batch (it skipped it, or it finished before): every
    task gives no row, whatever partition its marker names."""
    behind: Mapping[int, int | None] = field(default_factory=dict)
    """Partitions whose newest version is older than ``prev_version`` because they sat batches
    out: partition to that version (None: the newest below this batch, after a restart)."""
    left_out: tuple[int, ...] = ()
    """Partitions a restart kept: their rows were left out of the batch's shuffle, so their
    tasks have only the output they stored to give, and must never run the function instead."""
    recent_versions: tuple[int, ...] = ()
    """The operator's newest versions this driver committed (at most ``RECENT_VERSIONS``),
    oldest first: a worker whose cached copy of a partition is at one of them reads the deltas
    after it without listing the partition's files (on an object store, a request on the
    task's path each time a partition lands on another worker)."""

    def version_of(self, partition: int) -> int | None:
        """The version ``partition`` builds on."""
        return self.behind[partition] if partition in self.behind else self.prev_version

    def to_json(self) -> dict[str, Any]:
        return {"batch_time": self.batch_time, "prev_version": self.prev_version, "token": self.token,
                "watermark_ms": self.watermark_ms, "keep_finished": self.keep_finished,
                "end_of_input": self.end_of_input, "finished_partitions": list(self.finished_partitions),
                "idle_partitions": list(self.idle_partitions), "skip": self.skip,
                "behind": {str(p): v for p, v in sorted(self.behind.items())}, "left_out": list(self.left_out),
                "recent_versions": list(self.recent_versions)}

    @classmethod
    def from_json(cls, payload: Any) -> BatchParams:
        """Parameters from ``to_json``'s output; every field must be there (null where optional)."""

        def integer(name: str, optional: bool) -> int | None:
            if not isinstance(payload, dict) or name not in payload:
                value: Any = _ABSENT
            else:
                value = payload[name]
            if value is None and optional:
                return None
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigurationError(
                    f"batch parameters {payload!r} lack an integer {name!r}; the driver and the workers run "
                    "different batchline versions. Install the same version on both and restart"
                )
            return value

        batch_time, token = integer("batch_time", False), integer("token", False)
        assert batch_time is not None and token is not None
        keep = payload.get("keep_finished") if isinstance(payload, dict) else None
        if not isinstance(keep, bool):
            raise ConfigurationError(
                f"batch parameters {payload!r} lack a boolean 'keep_finished'; the driver and the workers run "
                "different batchline versions. Install the same version on both and restart"
            )
        end = payload.get("end_of_input", False)
        finished = payload.get("finished_partitions", [])
        idle = payload.get("idle_partitions", [])
        behind = payload.get("behind", {})
        skip = payload.get("skip", False)
        left_out = payload.get("left_out", [])
        recent = payload.get("recent_versions", [])
        if (not isinstance(end, bool) or not isinstance(finished, list) or not isinstance(idle, list)
                or not isinstance(behind, dict) or not isinstance(skip, bool) or not isinstance(left_out, list)
                or not isinstance(recent, list)):
            raise ConfigurationError(
                f"batch parameters {payload!r} have a malformed 'end_of_input', 'finished_partitions', "
                "'idle_partitions', 'skip', 'behind', 'left_out' or 'recent_versions'; the driver and the workers run "
                "different batchline versions. Install the same version on both and restart"
            )
        return cls(batch_time, integer("prev_version", True), token, integer("watermark_ms", True), keep, end,
                   tuple(int(p) for p in finished), tuple(int(p) for p in idle), skip,
                   {int(p): None if v is None else int(v) for p, v in behind.items()}, tuple(int(p) for p in left_out),
                   tuple(int(v) for v in recent))


_ABSENT = object()


def with_batch_params(current: str | None, operator: str, params: BatchParams) -> str:
    """The local property's new value: ``current`` with ``operator``'s entry set to ``params``
    (other operators' entries stay, for jobs that evaluate several operators)."""
    published = json.loads(current) if current else {}
    published[operator] = params.to_json()
    return json.dumps(published, sort_keys=True)


def batch_params_from_property(value: str | None, operator: str) -> BatchParams:
    """The task's side of ``with_batch_params``: this operator's parameters, and only them."""
    published = json.loads(value) if value else {}
    if operator not in published:
        raise MissingBatchParamsError(operator)
    return BatchParams.from_json(published[operator])


# -------------------------------------------------------------------- statistics
_SUM, _MAX, _OR, _UNION, _MAX_EACH = "sum", "max", "or", "union", "max_each"


@dataclass(frozen=True)
class PartitionFacts:
    """What a state partition holds after a batch: the driver's view of it between batches,
    from which it knows which partitions have a timer due without running a job (SPEC E6)."""

    keys: int
    state_bytes: int
    next_timer_ms: int | None
    """The earliest deadline among its keys (processing or event time, as the operator's
    timeout kind), or None when none of its keys has a timeout."""

    def to_json(self) -> list[int | None]:
        return [self.keys, self.state_bytes, self.next_timer_ms]

    @classmethod
    def from_json(cls, payload: Any) -> PartitionFacts:
        keys, state_bytes, next_timer_ms = payload
        return cls(int(keys), int(state_bytes), None if next_timer_ms is None else int(next_timer_ms))


@dataclass
class Stats:
    """What one task (or, merged, every task of a batch) did."""

    rows: int = 0
    late_rows: int = 0
    keys_called: int = 0
    updated: int = 0
    removed: int = 0
    timed_out: int = 0
    output_rows: int = 0
    state_keys: int = 0
    state_bytes: int = 0
    """Estimated Arrow bytes of the partitions' state (keys times the mean delta row size)."""
    delta_bytes: int = 0
    """Bytes of the delta files written."""
    max_event_time_ms: int | None = field(default=None, metadata={"merge": _MAX})
    input_max_event_time_ms: dict[int, int] = field(default_factory=dict, metadata={"merge": _MAX_EACH})
    """The newest event time per input, for an operator that reads several (``input_column``)."""
    partitions: int = field(default=0, metadata={"merge": _OR})
    """A bit per state partition that ran, to prove none was coalesced away."""
    timers: int = field(default=0, metadata={"merge": _OR})
    """A bit per state partition that still holds a key with a timeout after the batch."""
    partitions_after: dict[int, PartitionFacts] = field(default_factory=dict, metadata={"merge": _UNION})
    """Per state partition that did the batch's work: what it holds after it."""
    warnings: tuple[str, ...] = ()
    """What the tasks read around (a damaged snapshot rebuilt from older files, a damaged kept
    output run again): the driver logs them at WARN, where the pipeline's log is read, since a
    Python worker's own log lines end up in the executor's stderr."""

    def merge(self, other: Stats) -> Stats:
        """Field by field: counts add up, the newest event time wins, partition bits combine."""
        merged: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            how = f.metadata.get("merge", _SUM)
            if how == _MAX:
                merged[f.name] = b if a is None else a if b is None else max(a, b)
            elif how == _OR:
                merged[f.name] = a | b
            elif how == _UNION:
                merged[f.name] = {**a, **b}
            elif how == _MAX_EACH:
                merged[f.name] = {k: max(a.get(k, v), v) for k, v in b.items()} | \
                    {k: v for k, v in a.items() if k not in b}
            else:
                merged[f.name] = a + b
        return Stats(**merged)

    def to_json(self) -> dict[str, Any]:
        payload = dataclasses.asdict(self)
        payload["partitions_after"] = {str(p): facts.to_json() for p, facts in self.partitions_after.items()}
        payload["input_max_event_time_ms"] = {str(i): t for i, t in self.input_max_event_time_ms.items()}
        return payload

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Stats:
        """Statistics a finish record kept; fields it lacks (an older writer) count as nothing."""
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in payload.items() if k in known}
        fields["partitions_after"] = {int(p): PartitionFacts.from_json(facts)
                                      for p, facts in fields.get("partitions_after", {}).items()}
        fields["input_max_event_time_ms"] = {int(i): int(t)
                                             for i, t in fields.get("input_max_event_time_ms", {}).items()}
        fields["warnings"] = tuple(fields.get("warnings", ()))
        return cls(**fields)


# -------------------------------------------------------------------- errors
class ErrorKind(enum.Enum):
    """Why a task failed because of the state function."""

    RAISED = "raised"
    WRONG_STATE_TYPE = "wrong_state_type"
    STATE_SCHEMA = "state_schema"
    OUTPUT_SCHEMA = "output_schema"
    STATE_ENCODING = "state_encoding"


class StateFunctionError(CarriedError):
    """The state function raised (or returned something unusable) for a key. Fix the
    function and start the pipeline again: the failed batch re-runs from the state before it.

    Raised in a task with ``carry=True`` (the default there); the driver finds it in Spark's
    error with ``StateFunctionError.carried_in``."""

    retryable = False  # the same keys and state fail the same way: no batch retry (SPEC H3)
    attributes = ("kind", "operator", "key_repr", "batch_time", "message", "python_traceback")

    def __init__(self, kind: ErrorKind | str, operator: str, key_repr: str | None, batch_time: int, message: str,
                 python_traceback: str = "", carry: bool = True) -> None:
        self.kind = ErrorKind(kind)
        self.operator = operator
        self.key_repr = key_repr
        """``repr`` of the key the function failed for, or None when no single key is to blame."""
        self.batch_time = batch_time
        self.message = message
        """What happened and what to do, without the traceback."""
        self.python_traceback = python_traceback
        """The Python traceback of the failure in the task, or empty."""
        super().__init__(f"{message}\n{python_traceback.rstrip()}" if python_traceback else message, carry)

    def attribute_values(self) -> dict[str, Any]:
        return {**super().attribute_values(), "kind": self.kind.value}
