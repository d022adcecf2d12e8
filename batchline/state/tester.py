"""Unit-test a state function without Spark: ``StateFunctionTester``.

The tester takes the function and the arguments of ``flat_map_groups_with_state`` /
``map_groups_with_state`` and runs it batch by batch through the same per-key path a Spark
task runs (``run_partition``: grouping, late rows, timeouts, the state codec, the output
schema), over a ``MemoryStateStore`` in this process. No Spark session starts; schemas given
as DDL strings are read by batchline's own parser for the simple types.

    from batchline.state import GroupStateTimeout, StateFunctionTester

    def count_clicks(user, rows, state):                 # the function under test, as in a pipeline
        if state.has_timed_out:
            yield {"user": user, "clicks": state.get()[0]}; state.remove(); return
        state.update(((state.get()[0] if state.exists else 0) + sum(1 for _ in rows),))
        state.set_timeout_duration("1 minute")

    tester = StateFunctionTester(count_clicks, "user", state_schema="clicks long", output_schema="user string, "
                                 "clicks long", timeout=GroupStateTimeout.PROCESSING_TIME)
    assert tester.process([{"user": "a"}, {"user": "a"}, {"user": "b"}]) == []
    assert tester.state("a") == (2,)
    tester.advance_processing_time("61 seconds")          # past both timeouts; b gets data again
    assert tester.process([{"user": "b"}]) == [{"user": "a", "clicks": 2}]
    assert tester.keys() == ["b"] and tester.last_stats.timed_out == 1

Each ``process`` call is one batch at the current processing time; batches, like the
engine's, have distinct times, so a ``process`` at the time of the previous batch runs one
millisecond later (and moves the clock). Rows are dicts (or, with ``input_schema``, tuples,
dataclasses or dicts of that schema) that include the key columns; output rows come back as
dicts, timestamps as naive UTC datetimes, as PySpark hands them out. Event time: give
``event_time_column`` and ``watermark_delay`` as ``with_watermark`` takes them, or move the
watermark by hand with ``advance_watermark``. A failing function raises
``StateFunctionError`` with the key and the Python traceback, and the batch leaves no trace.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema

from batchline.batch_time import epoch_ms
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError
from batchline.state.contract import BatchParams, OperatorSpec, StateFunctionError, Stats
from batchline.state.entries import StateEntries
from batchline.state.execution import PartitionCache, load_partition, run_partition
from batchline.state.group_state import GroupStateTimeout
from batchline.state.schema import RowSchema, as_python
from batchline.state.store import SNAPSHOT, FileHeader, MemoryStateStore, PartitionData, entries_table
from batchline.streams.base import Watermark

__all__ = ["StateFunctionTester"]

logger = logging.getLogger(__name__)

_GENERATION, _PARTITION = 0, 0
_UTC_MICROS = pa.timestamp("us", tz="UTC")


def _epoch_ms(value: int | _dt.datetime, what: str) -> int:
    if isinstance(value, _dt.datetime):
        return epoch_ms(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{what} is epoch milliseconds (an int) or a datetime; got {value!r}")
    return value


class StateFunctionTester:
    """Runs a state function batch by batch in this process, over in-memory state."""

    def __init__(
        self,
        fn: Callable[..., Any],
        keys: str | Sequence[str],
        *,
        state_schema: Any,
        output_schema: Any,
        timeout: GroupStateTimeout | None = None,
        flat: bool = True,
        event_time_column: str | None = None,
        watermark_delay: object | None = None,
        input_schema: Any | None = None,
        initial_state: Mapping[Any, Any] | None = None,
        processing_time: int | _dt.datetime = 0,
        name: str = "tester",
    ) -> None:
        self.key_names: tuple[str, ...] = (keys,) if isinstance(keys, str) else tuple(keys)
        if not self.key_names or not all(isinstance(k, str) for k in self.key_names):
            raise ConfigurationError(f"keys are the names of the key columns, e.g. 'user' or ('user', 'day'); "
                                     f"got {keys!r}")
        timeout = GroupStateTimeout.NO_TIMEOUT if timeout is None else timeout
        if not isinstance(timeout, GroupStateTimeout):
            raise ConfigurationError(f"timeout must be a GroupStateTimeout; got {timeout!r}")
        if (event_time_column is None) != (watermark_delay is None):
            raise ConfigurationError("give event_time_column and watermark_delay together, as "
                                     "stream.with_watermark(column, delay) takes them, or neither")
        self.fn = fn
        self.flat = flat
        self.timeout = timeout
        self.state_schema = RowSchema.of(state_schema)
        self.output_schema = RowSchema.of(output_schema)
        self.input_schema = RowSchema.of(input_schema) if input_schema is not None else None
        self.event_time_column = event_time_column
        self._watermark = (Watermark(event_time_column, parse_duration_ms(watermark_delay, "watermark delay",
                                                                          allow_zero=True))
                           if event_time_column is not None else None)
        self.store = MemoryStateStore(name)
        """The tester's state, as the operator's tasks would leave it in the checkpoint."""
        self.last_stats: Stats | None = None
        """What the last batch did (rows, keys called, timed out, late rows, ...)."""
        self._cache = PartitionCache(capacity=1)
        self._spec: OperatorSpec | None = None
        self._now = _epoch_ms(processing_time, "processing_time")
        if self._now < 0:
            raise ConfigurationError(f"processing time starts at or after the epoch; got {self._now} ms")
        self._version: int | None = None
        """The state version the next batch builds on (the last batch, or the last edit before any)."""
        self._max_event_time_ms: int | None = None
        self._watermark_floor_ms: int | None = None
        if initial_state:
            self._write_state({key: (value, None) for key, value in initial_state.items()}, initial=True)

    # ---------------------------------------------------------------- time
    @property
    def processing_time_ms(self) -> int:
        """The processing time of the next batch (epoch ms)."""
        return self._now

    def advance_processing_time(self, duration: object) -> int:
        """Move the clock on by ``duration`` (milliseconds as an int, as
        ``set_timeout_duration`` takes them, or "1 minute", a timedelta); the next ``process``
        runs then, and keys whose processing-time timeout passed are called with
        ``state.has_timed_out``. Returns the new time."""
        if isinstance(duration, int) and not isinstance(duration, bool):
            if duration <= 0:
                raise ConfigurationError(f"advance the processing time by a positive duration; got {duration} ms")
            step = duration
        else:
            step = parse_duration_ms(duration, "processing time step")
        self._now += step
        return self._now

    def set_processing_time(self, when: int | _dt.datetime) -> None:
        """Set the clock (epoch ms or a datetime, naive is UTC); it never goes back."""
        when_ms = _epoch_ms(when, "processing time")
        if when_ms < self._now:
            raise ConfigurationError(f"processing time only moves forward: {when_ms} ms is before {self._now} ms; "
                                     "create a new tester to start over")
        self._now = when_ms

    @property
    def watermark_ms(self) -> int | None:
        """The event-time watermark the next batch uses: the newest event time of the batches
        so far minus the delay, or what ``advance_watermark`` set, whichever is later."""
        derived = (self._watermark.after(self._max_event_time_ms)
                   if self._max_event_time_ms is not None and self._watermark is not None else None)
        candidates = [w for w in (derived, self._watermark_floor_ms) if w is not None]
        return max(candidates) if candidates else None

    def advance_watermark(self, to: int | _dt.datetime) -> None:
        """Move the watermark to ``to`` (epoch ms or a datetime, naive is UTC) for the next
        batches: event-time timeouts before it fire, rows older than it are late."""
        to_ms = _epoch_ms(to, "watermark")
        current = self.watermark_ms
        if current is not None and to_ms < current:
            raise ConfigurationError(f"the watermark only moves forward: {to_ms} ms is before {current} ms")
        self._watermark_floor_ms = to_ms

    # ---------------------------------------------------------------- batches
    def process(self, rows: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """Run one batch with ``rows`` at the current processing time; returns its output rows."""
        batch = self._record_batch(list(rows))
        spec = self._ensure_spec(batch.schema if batch is not None else None)
        if spec is None:  # no rows ever and nothing stored: no key can be called
            self.last_stats = Stats()
            return []
        if self._version is not None and self._now <= self._version:
            logger.debug("Batch at %d ms follows version %d: running it at %d ms", self._now, self._version,
                         self._version + 1)
            self._now = self._version + 1
        params = BatchParams(batch_time=self._now, prev_version=self._version, token=0,
                             watermark_ms=self.watermark_ms)
        reported: list[Stats] = []
        try:
            outputs = list(run_partition(spec, params, [batch] if batch is not None else [], _PARTITION,
                                         reported.append, cache=self._cache, background_snapshots=False))
        except StateFunctionError as failure:
            raise (StateFunctionError.carried_in(failure) or failure) from None
        stats = reported[0]
        self.last_stats = stats
        self._version = params.batch_time
        if stats.max_event_time_ms is not None:
            self._max_event_time_ms = max(self._max_event_time_ms or stats.max_event_time_ms,
                                          stats.max_event_time_ms)
        names = spec.output.names
        result: list[dict[str, Any]] = []
        for output in outputs:
            columns = [as_python(column) for column in output.columns]
            result += [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
        return result

    def _record_batch(self, rows: list[Any]) -> pa.RecordBatch | None:
        if not rows:
            return None
        if self.input_schema is not None:
            schema = self.input_schema
            try:
                tuples = [schema.unmake(row) for row in rows]
            except TypeError as error:
                raise ConfigurationError(f"an input row does not fit the input schema: {error}") from None
            columns = list(zip(*tuples, strict=True))
            arrow = schema.arrow
            batch = pa.RecordBatch.from_arrays(
                [pa.array(list(values), type=field.type) for values, field in zip(columns, arrow, strict=True)],
                schema=arrow)
        else:
            if not all(isinstance(row, Mapping) for row in rows):
                raise ConfigurationError("without input_schema, rows are dicts of column values; pass "
                                         "input_schema=... (a dataclass, StructType or DDL string) to give tuples")
            batch = pa.RecordBatch.from_pylist([dict(row) for row in rows])
            # As Spark hands them to tasks: timestamps in UTC (naive datetimes are UTC).
            for i, field in enumerate(batch.schema):
                if pa.types.is_timestamp(field.type) and field.type.tz is None:
                    batch = batch.set_column(i, field.name, batch.column(i).cast(_UTC_MICROS))
        missing = [k for k in (*self.key_names, *([self.event_time_column] if self.event_time_column else []))
                   if k not in batch.schema.names]
        if missing:
            raise ConfigurationError(f"input rows lack column(s) {missing}; every row carries the key columns "
                                     f"{list(self.key_names)}" + (" and the event-time column"
                                                                   if self.event_time_column else ""))
        return batch

    def _ensure_spec(self, schema: pa.Schema | None) -> OperatorSpec | None:
        """The operator's spec, once the key columns' types are known (from input_schema, the
        first input rows, or the first key given to set_state)."""
        if self._spec is not None:
            return self._spec
        if schema is None and self.input_schema is not None:
            schema = self.input_schema.arrow
        if schema is None:
            return None
        key_schema = from_arrow_schema(pa.schema([schema.field(k) for k in self.key_names]))
        self._spec = OperatorSpec(
            store=self.store, generation=_GENERATION, key_names=self.key_names, key_schema=key_schema,
            state=self.state_schema, output=self.output_schema, fn=self.fn, flat=self.flat, timeout=self.timeout,
            event_time_column=self.event_time_column,
            late_column=self.event_time_column if self.timeout is GroupStateTimeout.EVENT_TIME else None,
        )
        return self._spec

    def _spec_for_keys(self, keys: Iterable[Any]) -> OperatorSpec:
        spec = self._ensure_spec(None)
        if spec is not None:
            return spec
        key_tuples = [key if len(self.key_names) > 1 else (key,) for key in keys]
        if not key_tuples or any(not isinstance(k, tuple) or len(k) != len(self.key_names) for k in key_tuples):
            raise ConfigurationError(f"a key is a value of the key column {self.key_names[0]!r}"
                                     if len(self.key_names) == 1 else
                                     f"a key is a tuple of the key columns {list(self.key_names)}")
        arrays = [pa.array(list(values)) for values in zip(*key_tuples, strict=True)]
        schema = pa.schema([pa.field(n, _UTC_MICROS if pa.types.is_timestamp(a.type) else a.type)
                            for n, a in zip(self.key_names, arrays, strict=True)])
        found = self._ensure_spec(schema)
        assert found is not None
        return found

    # ---------------------------------------------------------------- state
    def _load(self) -> PartitionData:
        spec = self._spec
        if spec is None or self._version is None:
            return PartitionData(None, StateEntries(spec is None or spec.single_key))
        return load_partition(self.store, spec.state, spec.single_key, _GENERATION, _PARTITION, self._version)

    def keys(self) -> list[Any]:
        """The keys that have state, in the order the store holds them."""
        return [key for key, (value, _) in self._load().entries.items() if value is not None]

    def state(self, key: Any) -> Any | None:
        """The key's state as the function would see it (a fresh object), or None."""
        entry = self._load().entries.get(key)
        return None if entry is None or entry[0] is None else self.state_schema.make(entry[0])

    def timeout_of(self, key: Any) -> int | None:
        """The key's timeout deadline (epoch ms), or None; a key can hold one without state
        (a timeout set in the call that removed its state, or on a key that had none)."""
        entry = self._load().entries.get(key)
        return None if entry is None else entry[1]

    def set_state(self, key: Any, value: Any, timeout_ms: int | None = None) -> None:
        """Give ``key`` the state ``value`` (None removes it) and optionally a timeout deadline
        (epoch ms; with ``value`` None, a timeout without state), as if an earlier batch had
        left it so; the function is not called."""
        self._write_state({key: (value, timeout_ms)}, initial=False)

    def _write_state(self, changes: Mapping[Any, tuple[Any, int | None]], initial: bool) -> None:
        """Rewrite the state the next batch builds on as a snapshot with ``changes`` applied."""
        spec = self._spec_for_keys(changes)
        data = self._load()
        entries = dict(data.entries.items())
        for key, (value, timeout_ms) in changes.items():
            if value is None:
                if timeout_ms is None:
                    entries.pop(key, None)
                else:
                    entries[key] = (None, timeout_ms)
                continue
            try:
                entries[key] = (spec.state.unmake(value), timeout_ms)
            except TypeError as error:
                raise ConfigurationError(f"the state of key {key!r} does not fit the state schema: {error}") from None
        # A batch ran: its version now holds the edited state. Before any: a version just below.
        version = self._version if self._version is not None else max(self._now - 1, 0)
        keep_initial = initial or bool(data.initial_keys)
        rows = ((k, v, t) for k, (v, t) in entries.items())
        self.store.write_version(_GENERATION, FileHeader(version, _PARTITION, SNAPSHOT, initial=keep_initial),
                                 entries_table(spec.key_schema, spec.state, rows, spec.single_key))
        self._version = version
        self._cache.clear()  # the next batch loads the edited version
