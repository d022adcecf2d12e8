"""The base of the built-in stateful operators (aggregations, deduplication): a stateful
operator whose state function and schemas follow from its input's columns, known when its
first batch is built."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from pyspark.sql.types import StructType, TimestampNTZType, TimestampType

from batchline.errors import ConfigurationError
from batchline.state.group_state import GroupStateTimeout
from batchline.state.schema import RowSchema, StateSchemaError
from batchline.state.stateful import StatefulNode
from batchline.streams.base import StreamNode

__all__ = ["ROWS", "BuiltInNode", "check_event_time"]

ROWS = "__batchline_rows"
"""The column of a partial row that says how many input rows it stands for."""


class BuiltInNode(StatefulNode):
    """A built-in stateful operator over ``partials`` (a frame Spark computes from the
    stream's rows). ``derive`` gives its state function, state and output schemas."""

    resolved = False
    rows_column: str | None = ROWS

    def __init__(self, partials: StreamNode, key_names: tuple[str, ...], *, timeout: GroupStateTimeout, name: str,
                 num_partitions: int | None) -> None:
        empty = StructType([])
        super().__init__(partials, key_names, _unresolved, flat=True, state_schema=empty, output_schema=empty,
                         timeout=timeout, name=name, num_partitions=num_partitions, initial_state=None)

    @property
    def rows_node(self) -> StreamNode:
        return self.parents[0].parents[0]  # the stream the partials are computed from

    def resolve(self, input_schema: StructType) -> None:
        if self.resolved:
            return
        fn, state, output = self.derive(input_schema)
        self.fn, self.state_schema, self.output_schema = fn, RowSchema.of(state), RowSchema.of(output)
        self.resolved = True

    @abstractmethod
    def derive(self, input_schema: StructType) -> tuple[Callable[..., Any], StructType, StructType]:
        """The state function (plain data: it is pickled into the tasks), the state's schema and
        the output's, from the schema of the partials."""

    def check_stored_state(self, stored: StructType) -> None:
        """A built-in operator's state is read exactly as it was written: other aggregates (or
        types) under the same name would read the old partials as new ones."""
        if stored.simpleString() != self.state_schema.struct.simpleString():
            raise StateSchemaError(
                f"operator {self.name!r} keeps its state as {stored.simpleString()} at the checkpoint location, but "
                f"is now defined with state {self.state_schema.struct.simpleString()} (its aggregates or their "
                "input types changed); give the changed operator another name= to start its state afresh, or "
                "restore its earlier definition")


def check_event_time(node: StatefulNode, input_schema: StructType) -> None:
    """The watermark's column must hold timestamps, as Spark requires."""
    declared = node.parents[0].watermark()
    if node.event_time is None or declared is None:
        return
    found = input_schema[node.event_time.column].dataType
    if not isinstance(found, (TimestampType, TimestampNTZType)):
        raise ConfigurationError(
            f"operator {node.name!r}: the watermark's column {declared.column!r} holds {found.simpleString()}, not "
            "timestamps; convert it before with_watermark, e.g. with_column('ts', F.timestamp_seconds('seconds'))")


def _unresolved(key: Any, rows: Any, state: Any) -> Any:
    raise AssertionError("a built-in operator's state function is set when its first batch is built")
