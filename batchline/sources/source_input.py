"""How the engine runs a :class:`Source`: plan and log each batch, read its splits in Spark
tasks, count good and bad rows in the job that consumes them, replay after a restart.

The batch log holds each batch's ``SourceBatch`` (positions and splits, JSON); the checkpoint
holds the position after the last logged batch and, for a bounded source, its end of input.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from batchline.batch_time import format_batch_time
from batchline.errors import ConfigurationError, SourceError
from batchline.scheduler.job import Job, JobKind
from batchline.sources.dead_letters import CountedBatch, DeadLetterNode, DeadLetterReader
from batchline.sources.parsing import DEAD_LETTER_SCHEMA, RAW, REASON, SOURCE_FILE
from batchline.sources.source import BatchTimes, DeadLetter, Position, Source, SourceBatch, SourceRun, Split
from batchline.spark import forget_accumulator, observe_last_attempts
from batchline.state.schema import as_struct
from batchline.streams import InputNode, InputRuntime, Readers, RuntimeEnv, StreamRuntime
from batchline.streams.base import ArrowFunction
from batchline.streams.handover import ArrowHandover

__all__ = ["SourceInput", "SourceReader"]

logger = logging.getLogger(__name__)

_ROWS_PER_ARROW_BATCH = 8192
_DEAD_LETTERS_LOGGED_PER_BATCH = 20


class SourceInput(InputNode):
    """A pipeline's input over a user's (or a built-in) :class:`Source`; ``dead_letters`` is
    the stream of the records its ``read`` refused."""

    def __init__(self, source: Source, name: str, batch_interval_ms: int) -> None:
        if not isinstance(source, Source):
            raise ConfigurationError(
                f"ssc.input() takes a batchline.Source; got {source!r}. Subclass batchline.Source (schema, "
                "initial_position, plan, read)")
        if type(source).plan is Source.plan and type(source).plan_at is Source.plan_at:
            raise ConfigurationError(f"{type(source).__name__} does not say what a batch takes: implement plan() "
                                     "(or plan_at(), for batches that depend on stream time)")
        schema = as_struct(source.schema(), f"what {type(source).__name__}.schema() returns")
        super().__init__(name, batch_interval_ms, bounded=source.bounded)
        self.source = source
        self.schema = schema
        self.dead_letters = DeadLetterNode(self)

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> SourceReader:
        return SourceReader(self, env, parents)


class SourceReader(InputRuntime, DeadLetterReader):
    node: SourceInput

    def __init__(self, node: SourceInput, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> None:
        super().__init__(node, env, parents)
        self.source = node.source
        # The batch's rows are counted (observe) in the tasks that read them, often those of a
        # shuffle's map stage: a stage re-run must not count them again.
        if env.spark is not None:  # None: the source's planning tried without Spark
            observe_last_attempts(env.spark)
        self.source.attach(SourceRun(node.name, env.spark, env.checkpoint.storage if env.checkpoint else None,
                                     env.clock))
        if type(self.source).has_unplanned is not Source.has_unplanned:  # it is pushed records: a stop waits
            env.receiver_tracker.watch(self.source.has_unplanned)
        self.position: dict[str, Any] | None = None
        self.end_of_input: dict[str, Any] | None = None
        self._batches: dict[int, SourceBatch] = {}
        self._read: dict[int, CountedBatch] = {}
        self._direct: dict[int, Accumulator[Tally]] = {}
        """Batches an output wrote in the tasks that read them (``map_in_arrow``): what those
        tasks counted."""
        self._native: set[int] = set()
        """Batches Spark reads natively (``Source.frame``): no split is read in Python."""
        self._null_fields_named: set[str] = set()
        """The columns already named at WARN as null in every row of a batch (once per run)."""
        self._fields_with_values: set[str] = set()
        """The columns that had a value in some row of this run: never named as misspelt."""

    @functools.cached_property
    def _columns(self) -> list[Column]:
        """The schema's columns, built once (building a column is a call into the JVM)."""
        return [F.col(name) for name in self.node.schema.fieldNames()]

    @functools.cached_property
    def _metrics(self) -> list[Column]:
        """What the observation of a counted batch counts: good rows and dead letters, and, for
        a source that finds its columns by name, each column's values among the good rows (in
        the same job: a misspelt field costs no job of its own to notice)."""
        good = F.col(REASON).isNull()
        fields = [F.count(F.when(good, F.col(name))).alias(f"{_VALUES}{i}")
                  for i, name in enumerate(self.node.schema.fieldNames())] if self.source.reads_fields_by_name else []
        return [F.count(F.when(good, 1)).alias("records"), F.count(F.col(REASON)).alias("dead_letters"), *fields]

    def _warn_of_null_fields(self, batch: SourceBatch, observed: dict[str, Any]) -> None:
        """Name at WARN, once per field for the run, a column null in every good row of the
        batch that had no value in any batch before: its records probably spell the field
        otherwise (``uid`` in the schema, ``user`` in the files), and every row would go on
        with a null there. A column that had a value once is optional, not misspelt."""
        names = self.node.schema.fieldNames()
        counts = {name: int(observed.get(f"{_VALUES}{i}", 1)) for i, name in enumerate(names)}
        self._fields_with_values.update(name for name, values in counts.items() if values)
        empty = [name for name, values in counts.items()
                 if not values and name not in self._fields_with_values and name not in self._null_fields_named]
        if not empty:
            return
        self._null_fields_named.update(empty)
        files = [str(name).rsplit("/", 1)[-1] for name in batch.info.get("files", ())]
        where = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "") if files \
            else "the batch"
        try:
            found = self.source.record_fields(batch)
        except Exception as error:  # noqa: BLE001 - only a hint for a warning
            logger.debug("Input %s: could not learn the records' fields: %s", self.name, error)
            found = None
        hint = (f"the files probably spell it otherwise (their fields: {', '.join(found)})" if found
                else "check its spelling against the records' fields")
        for name in empty:
            logger.warning("Input %r: field %r is null in every row of %s; %s", self.name, name, where, hint)

    # ---------------------------------------------------------------- positions
    def open(self) -> None:
        self.source.open()
        if self.position is None:
            self.position = dict(self.source.initial_position())
        if self.node.bounded and self.end_of_input is None:
            self.end_of_input = dict(self.source.end_of_input())
            logger.info("Bounded input %s reads up to %s, where it stood at its first start", self.name,
                        _shown(self.end_of_input))

    def recover_after_restart(self) -> None:
        position = self.position if self.position is not None else self.source.initial_position()
        self.source.recover_received(dict(position))

    def start(self) -> None:
        self.source.start_receiving()

    def stop(self, graceful: bool) -> None:
        try:
            self.source.stop_receiving(graceful)
        except Exception:  # noqa: BLE001 (stopping goes on)
            logger.exception("Stopping input %s failed", self.name)
        try:
            self.source.close()
        except Exception:  # noqa: BLE001 (stopping goes on)
            logger.exception("Closing input %s failed", self.name)

    def snapshot(self) -> dict[str, Any]:
        return self.source.checkpoint_position(self.position, self.end_of_input)

    def restore(self, snapshot: dict[str, Any]) -> None:
        position, end_of_input = self.source.restore_position(snapshot)
        self.position = None if position is None else dict(position)
        self.end_of_input = None if end_of_input is None else dict(end_of_input)

    def exhausted(self) -> bool:
        return (self.node.bounded and self.position is not None and self.end_of_input is not None
                and self.source.exhausted(self.position, self.end_of_input))

    # ---------------------------------------------------------------- batches
    def _times(self, batch_time: int) -> BatchTimes:
        return BatchTimes(batch_time, self.zero_time)

    def allocate(self, batch_time: int) -> None:
        if self.position is None:
            raise SourceError(f"input {self.name!r} was asked for a batch before it was opened; this is a bug in "
                              "batchline")
        batch = self.source.plan_at(dict(self.position), self.end_of_input, self._times(batch_time))
        if not isinstance(batch, SourceBatch):
            raise SourceError(f"{type(self.source).__name__}.plan() must return a SourceBatch; got {batch!r}")
        if batch.splits:
            logger.debug("Batch %s takes %d splits from %s: %s to %s", format_batch_time(batch_time),
                         len(batch.splits), self.name, _shown(batch.start), _shown(batch.end))
        self._take(batch_time, batch, advance=True)

    def allocation(self, batch_time: int) -> dict[str, Any]:
        return self.source.log_batch(self._batches[batch_time])

    def restore_allocation(self, batch_time: int, allocation: dict[str, Any], advance: bool) -> None:
        position = self.position if advance else None
        self._take(batch_time, self.source.logged_batch(allocation, position, self._times(batch_time)), advance)

    def _take(self, batch_time: int, batch: SourceBatch, advance: bool) -> None:
        self._batches[batch_time] = batch
        if advance:
            self.position = dict(batch.end)
        records = batch.records if batch.records is not None else None if batch.splits else 0
        self.report(batch_time, records, metadata=dict(batch.info), lag=batch.lag)

    def batch(self, batch_time: int) -> SourceBatch | None:
        """What ``batch_time`` took (None once forgotten, or for a batch it was not in)."""
        return self._batches.get(batch_time)

    def can_replay(self, batch_time: int) -> bool:
        batch = self._batches.get(batch_time)
        return batch is None or not batch.splits or self.source.can_replay(batch)

    def forget_before(self, threshold_time: int) -> None:
        for batch_time in [t for t in self._batches if t <= threshold_time]:
            self.source.forget(self._batches.pop(batch_time))

    def on_batch_committed(self, batch_time: int) -> None:
        batch = self._batches.get(batch_time)
        if batch is None or not batch.splits:
            return
        try:
            self.source.acknowledge(batch)
        except Exception:  # noqa: BLE001 (the batch is committed: an acknowledgement is best effort)
            logger.exception("Input %s could not acknowledge batch %s (it is committed and stays so; the source "
                             "may deliver its records again to other readers)", self.name,
                             format_batch_time(batch_time))

    # ---------------------------------------------------------------- reading
    def _counts(self, batch: SourceBatch) -> bool:
        """Whether the engine counts the batch's rows as jobs read them (not when the plan
        knew how many, nor for a source that asks not to be counted)."""
        return bool(batch.splits) and batch.records is None and self.source.counted

    def compute(self, batch_time: int) -> DataFrame:
        """The batch's good rows; all rows are counted, good and bad, by the first job that
        reads them all (``observe``), or by the tasks of an output that wrote the batch in the
        pass that read it (``map_in_arrow``)."""
        batch = self._batches.get(batch_time)
        if batch is None or not batch.splits:
            return self.env.empty_frame(self.node.schema)
        if not self._counts(batch):
            native = self.source.frame(self.env.spark, batch)
            if native is not None:
                self._native.add(batch_time)
                return native
        counts = Observation()
        rows = self._rows(batch_time, batch).observe(counts, *self._metrics)
        if self._cached:
            rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        self._read[batch_time] = CountedBatch(rows, counts)
        return rows.where(F.col(REASON).isNull()).select(*self._columns)

    @property
    def _cached(self) -> bool:
        # Read once: cached only when several jobs read the rows, or later batches do (windows).
        return self._readers.jobs > 1 or self.remember_ms > self.node.slide_ms

    def map_in_arrow(self, batch_time: int, df: DataFrame, fn: ArrowFunction, schema: Any) -> DataFrame:
        """``fn`` in the tasks that read the splits, when ``df`` is this batch as read and the
        output handing it over is its only reader: one Python pass over the rows, where
        ``df.mapInArrow`` would read them, hand them to the JVM and back to a second pass.
        The tasks count good rows and dead letters themselves (the observation sees no job)."""
        batch = self._batches.get(batch_time)
        with self._lock:
            handed = self._generated.get(batch_time)
        if (df is not handed or batch is None or not batch.splits or batch_time in self._native
                or not self._counts(batch) or self._readers.jobs != 1 or self.remember_ms > self.node.slide_ms):
            return df.mapInArrow(fn, schema)
        tally: Accumulator[Tally] = self.env.spark.sparkContext.accumulator({}, _TallyParam())
        previous = self._direct.pop(batch_time, None)
        if previous is not None:
            forget_accumulator(previous)  # a re-run of the batch counts afresh
        self._direct[batch_time] = tally
        arrow = ArrowHandover.of(self.env.spark, _with_dead_letter_columns(self.node.schema))
        return self._over_splits(batch, direct_task(self.source, list(batch.splits), arrow, fn, tally), schema)

    def _rows(self, batch_time: int, batch: SourceBatch) -> DataFrame:
        """Every row of the batch with the dead-letter columns (null for good rows)."""
        native = self.source.frame(self.env.spark, batch)
        if native is not None:
            self._native.add(batch_time)
            if REASON in native.columns:  # the source parsed its records: its dead letters are in the frame
                return native
            return native.select(*self._columns, F.lit(None).cast("string").alias(RAW),
                                 F.lit(None).cast("string").alias(REASON))
        schema = _with_dead_letter_columns(self.node.schema)
        reader = split_reader(self.source, list(batch.splits), to_arrow_schema(schema, timezone="UTC"))
        return self._over_splits(batch, reader, schema)

    def _over_splits(self, batch: SourceBatch, task: ArrowFunction, schema: Any) -> DataFrame:
        """``task`` over the batch's splits, one per partition: it gets the split's number."""
        splits = len(batch.splits)
        return self.env.spark.range(0, splits, 1, splits).mapInArrow(task, schema)

    @property
    def _readers(self) -> Readers:
        return self.env.readers.get(self.node.node_id, Readers(0, False))

    def release(self, batch_time: int, df: DataFrame) -> None:
        self._native.discard(batch_time)
        direct = self._direct.pop(batch_time, None)
        if direct is not None:
            forget_accumulator(direct)
        read = self._read.pop(batch_time, None)
        if read is not None and read.frame.is_cached:
            read.frame.unpersist()

    def prepare_job(self, batch_time: int) -> Job | None:
        """A job that reads and counts the batch's rows only when the first job that reads
        them would not read them all (a ``console`` output)."""
        batch = self._batches.get(batch_time)
        if batch is None or not self._counts(batch) or self._readers.first_reads_all:
            return None
        read = self._counted(batch_time)

        def read_and_count() -> None:
            read.frame.count()  # the observation counts; after_jobs reports

        return Job(batch_time, self.name, read_and_count, JobKind.READ)

    def _counted(self, batch_time: int) -> CountedBatch:
        self.get_or_compute(batch_time)
        return self._read[batch_time]

    def after_jobs(self, batch_time: int) -> None:
        """Report the batch's good rows and dead letters as the jobs that read them counted
        them (once, however many jobs read them, and whichever attempt of a task or of the
        batch did), and say where the bad ones went."""
        batch = self._batches.get(batch_time)
        if batch is None or not self._counts(batch):
            return
        read = self._counted(batch_time)
        direct = self._direct.get(batch_time)
        counted = direct.value if direct is not None else {}
        if direct is not None and set(counted) == set(range(len(batch.splits))):
            # every split was read to its end by the tasks that wrote it
            good, bad = sum(c[0] for c in counted.values()), sum(c[1] for c in counted.values())
            if not read.counted():
                # Spark keeps an observation until a query holding it ends: one that holds it and
                # reads nothing (a limit of 0, no task) lets it go, where it would stay for ever.
                read.frame.limit(0).collect()
        else:
            if not read.counted():
                read.frame.count()  # no job read every row (every reader had finished): count now
            observed = read.counts.get
            good, bad = int(observed["records"]), int(observed["dead_letters"])
            if good and self.source.reads_fields_by_name:
                self._warn_of_null_fields(batch, observed)
        self.report(batch_time, good, dead_letters=bad, metadata=dict(batch.info), lag=batch.lag)
        if bad and self.node.dead_letters.node_id not in self.env.consumed:
            rows = self.dead_letter_frame(batch_time).limit(_DEAD_LETTERS_LOGGED_PER_BATCH).collect()
            logger.warning("Batch %s: %d bad records of input %s went to the dead letters; attach an output to "
                           "stream.dead_letters to keep them (first %d follow)", format_batch_time(batch_time),
                           bad, self.name, len(rows))
            for row in rows:
                logger.warning("Dead letter from %s: %s | raw: %s", row.source, row.reason, row.raw_record)

    def dead_letter_frame(self, batch_time: int) -> DataFrame:
        """The batch's bad records: ``raw_record``, ``reason``, ``source`` (the file a parsed
        record came from, else the input's name), ``batch_time``."""
        self.get_or_compute(batch_time)
        read = self._read.get(batch_time)
        if read is None:
            return self.env.empty_frame(DEAD_LETTER_SCHEMA)
        where = F.col(SOURCE_FILE) if SOURCE_FILE in read.frame.columns else F.lit(self.name)
        return read.frame.where(F.col(REASON).isNotNull()).select(
            F.col(RAW).alias("raw_record"), F.col(REASON).alias("reason"), where.alias("source"),
            F.lit(format_batch_time(batch_time)).alias("batch_time"))


_VALUES = "values_of_column_"
"""The prefix of the observation's per-column counts (by the column's index: any name fits)."""


def _shown(position: Position) -> str:
    """A position for a log line: its JSON, cut short (a bounded file source's end lists files)."""
    text = json.dumps(dict(position), default=str)
    return text if len(text) <= 200 else text[:200] + "..."


def _with_dead_letter_columns(schema: StructType) -> StructType:
    """The rows as tasks give them: every column nullable (a dead letter has none of them),
    then the raw record and the reason."""
    return StructType([*(StructField(f.name, f.dataType, True, f.metadata) for f in schema.fields),
                       StructField(RAW, StringType(), True), StructField(REASON, StringType(), True)])


# ------------------------------------------------------------------------------ in the tasks
def split_reader(source: Source, splits: list[Split],
                 schema: pa.Schema) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each task runs: the split numbers it is given, read by ``source.read``,
    as Arrow batches of ``schema`` (the source's columns, then the raw record and the reason
    of dead letters)."""

    def read(numbers: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for number in _split_numbers(numbers):
            yield from to_arrow(source.read(splits[number]), schema)

    return read


def _split_numbers(numbers: Iterator[pa.RecordBatch]) -> Iterator[int]:
    for chunk in numbers:
        yield from chunk.column(0).to_pylist()


Tally = dict[int, tuple[int, int]]
"""What the tasks of a directly written batch count: per split read to its end, its good rows
and dead letters. Merged by split, so a split counted twice (a speculative or re-run task)
counts once."""


class _TallyParam(AccumulatorParam[Tally]):
    def zero(self, value: Tally) -> Tally:
        return {}

    def addInPlace(self, a: Tally, b: Tally) -> Tally:  # noqa: N802 - Spark's name
        a.update(b)
        return a


def direct_task(source: Source, splits: list[Split], arrow: ArrowHandover, fn: ArrowFunction,
                tally: Accumulator[Tally]) -> ArrowFunction:
    """The function each task of a directly written batch runs: its splits read by
    ``source.read`` and handed to ``fn`` (one call for the partition, as ``mapInArrow``
    makes it), good rows only, in the source's columns and in batches as Spark would cut
    them; dead letters are counted and left out (the input's dead-letter stream reads them
    again when asked). A split is counted once ``fn`` took its last row."""
    schema = arrow.schema
    width = len(schema.names) - 2
    good_schema = pa.schema(list(schema)[:width])

    def task(numbers: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counted: Tally = {}

        def good_rows() -> Iterator[pa.RecordBatch]:
            for number in _split_numbers(numbers):
                good = bad = 0
                for batch in to_arrow(source.read(splits[number]), schema):
                    reasons = batch.column(width + 1)
                    refused = len(reasons) - reasons.null_count
                    if refused:
                        batch = batch.filter(pc.is_null(reasons))
                    good, bad = good + batch.num_rows, bad + refused
                    rows = pa.RecordBatch.from_arrays(batch.columns[:width], schema=good_schema)
                    for offset in range(0, rows.num_rows, arrow.max_rows):  # no empty batch
                        yield rows.slice(offset, arrow.max_rows)
                counted[number] = (good, bad)

        yield from fn(good_rows())
        tally.add(counted)

    return task


def to_arrow(rows: Iterable[Any], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Rows (tuples, dicts, ``DeadLetter``s or whole Arrow batches) as Arrow batches of ``schema``."""
    names = schema.names[:-2]
    width = len(names)
    columns: list[list[Any]] = [[] for _ in schema.names]

    def flush() -> pa.RecordBatch:
        arrays = [pa.array(values, type=f.type) for values, f in zip(columns, schema, strict=True)]
        for values in columns:
            values.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    for row in rows:
        if isinstance(row, tuple | list):
            if len(row) != width:
                raise SourceError(f"a row read has {len(row)} values but the schema has {width} columns "
                                  f"({', '.join(names)}): {row!r}")
            for index, value in enumerate(row):
                columns[index].append(value)
            columns[width].append(None)
            columns[width + 1].append(None)
        elif isinstance(row, dict):
            for index, name in enumerate(names):
                columns[index].append(row.get(name))
            columns[width].append(None)
            columns[width + 1].append(None)
        elif isinstance(row, DeadLetter):
            for index in range(width):
                columns[index].append(None)
            columns[width].append(row.raw)
            columns[width + 1].append(row.reason)
        elif isinstance(row, pa.RecordBatch):
            if columns[0]:
                yield flush()
            nulls = pa.nulls(row.num_rows, pa.string())
            yield pa.RecordBatch.from_arrays([*(row.column(name).cast(schema.field(name).type) for name in names),
                                              nulls, nulls], schema=schema)
            continue
        else:
            raise SourceError(f"read() gave {type(row).__name__} {row!r}; give tuples or dicts of the schema's "
                              "columns, DeadLetter records or pyarrow RecordBatches")
        if len(columns[0]) >= _ROWS_PER_ARROW_BATCH:
            yield flush()
    if columns[0]:
        yield flush()
