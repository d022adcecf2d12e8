"""Batches into a PostgreSQL table, exactly once (SPEC C2), on ``ExactlyOnceSink``.

Each batch goes in three steps:

1. If the progress table holds a row for (pipeline, output, batch time), the batch was
   committed before: nothing is computed or written again.
2. The Spark tasks load their partition's rows with ``COPY`` (psycopg 3) into an unlogged
   staging table of this attempt: binary COPY built from the Arrow columns, or CSV written by
   Arrow where a column's type has no binary encoder (``batchline.sinks.pg_copy``). Each task
   replaces its own partition's rows in one transaction, so a retried or speculative task
   never doubles them.
3. The driver moves the staged rows into the table and adds the batch's progress row, in one
   transaction: under a lock per (pipeline, output), it skips a batch already recorded and
   refuses a fencing token older than the newest recorded one (a driver that lost its
   checkpoint lease). Then the staging table is dropped. A batch without rows stops after
   step 2: no transaction, no progress row. This is the sink's ``commit``: the engine takes
   it once the batch's jobs all succeeded, in batch order, and in a pipeline without
   stateful operators while the next batch's tasks run.

``mode=WriteMode.APPEND`` (or ``"append"``) inserts the rows; ``WriteMode.UPSERT`` inserts or updates by
``key`` (``INSERT ... ON CONFLICT``; of several rows with one key in a batch, the last wins).
The stream's columns are checked against the table's before the first batch writes anything.
The DSN's password never appears in logs, errors or checkpoints.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from batchline.checkpoint.lease import FencedError
from batchline.choices import choose
from batchline.errors import ConfigurationError, SinkError
from batchline.sinks.exactly_once import ExactlyOnceSink, WriteAttempt
from batchline.sinks.pg_copy import CopyEncoding, copy_encoding
from batchline.sinks.sink import BatchContext, PendingCommit, SinkContext

__all__ = ["PostgresSink", "WriteMode", "PROGRESS_TABLE", "describe_dsn"]

logger = logging.getLogger(__name__)

PROGRESS_TABLE = "batchline_progress"
_STAGE_PREFIX = "_batchline_stage_"
_PART, _ROW = "_batchline_part", "_batchline_row"


class WriteMode(enum.Enum):
    """How ``write_postgres`` puts a batch's rows into the table."""

    APPEND = "append"
    """Insert every row."""
    UPSERT = "upsert"
    """Insert, or update the row of the same ``key`` (``INSERT ... ON CONFLICT``)."""


# Spark's type -> PostgreSQL's types (information_schema's data_type) a value of it goes into.
_TEXT = ("text", "character varying", "character", "json", "jsonb", "uuid")
_COMPATIBLE: dict[str, tuple[str, ...]] = {
    "string": _TEXT,
    "tinyint": ("smallint", "integer", "bigint", "numeric"),
    "smallint": ("smallint", "integer", "bigint", "numeric"),
    "int": ("integer", "bigint", "numeric"),
    "bigint": ("bigint", "numeric"),
    "float": ("real", "double precision", "numeric"),
    "double": ("double precision", "numeric"),
    "boolean": ("boolean",),
    "decimal": ("numeric",),
    "timestamp": ("timestamp with time zone", "timestamp without time zone"),
    "timestamp_ntz": ("timestamp without time zone",),
    "date": ("date",),
}


def describe_dsn(dsn: str) -> str:
    """The DSN as logs and errors show it: user, host, port and database, never the password."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 (a malformed DSN is reported without its text)
        return "postgresql://(malformed DSN)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{parts.get('host', 'localhost')}{port}/{parts.get('dbname', '')}"


@dataclass(frozen=True)
class _Stage:
    """An attempt's staging table, and what its tasks need to fill it."""

    table: str
    schema: StructType
    encoding: CopyEncoding


class PostgresSink(ExactlyOnceSink[int]):
    """Every batch into ``table`` (``name`` or ``schema.name``) of the database at ``dsn``."""

    def __init__(self, dsn: str, table: str, mode: WriteMode | str = WriteMode.APPEND, key: Sequence[str] = (),
                 progress_table: str = PROGRESS_TABLE) -> None:
        mode = choose(WriteMode, mode, "write_postgres mode")
        if isinstance(key, str):
            key = [key]
        if mode is WriteMode.UPSERT and not key:
            raise ConfigurationError("write_postgres(mode='upsert') needs key=[...]: the columns rows are matched by")
        if mode is WriteMode.APPEND and key:
            raise ConfigurationError("key=... is for mode='upsert'; leave it out to append")
        try:
            import psycopg  # noqa: F401
        except ImportError as error:
            raise ConfigurationError(
                "writing to PostgreSQL needs psycopg 3: pip install 'batchline[postgres]'") from error
        self._dsn = dsn
        self.table = table
        self.mode = mode
        self.key = list(key)
        self.progress_table = progress_table
        self.where = describe_dsn(dsn)
        self._password = _password(dsn)
        self._context: SinkContext | None = None
        self._columns: dict[str, tuple[str, bool, bool]] = {}
        """The table's columns: name -> (data type, nullable, has a default)."""
        self._checked: StructType | None = None

    def __repr__(self) -> str:
        return f"PostgresSink({self.where!r}, {self.table!r}, mode={self.mode.value!r})"

    # ---------------------------------------------------------------- the Sink interface
    def open(self, context: SinkContext) -> None:
        """Reach the database, find the table and its key, create the progress table, drop
        staging tables a crashed run left."""
        from psycopg import sql

        self._context = context
        with self._connect() as conn:
            self._columns = self._table_columns(conn)
            if self.mode is WriteMode.UPSERT:
                self._check_key(conn)
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('batchline_progress_ddl', 0))")
                conn.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (pipeline text NOT NULL, output text NOT NULL, "
                    "batch_time bigint NOT NULL, fencing_token bigint NOT NULL, rows bigint NOT NULL, "
                    "committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (pipeline, output, batch_time))"
                ).format(sql.Identifier(*self.progress_table.split("."))))
            for (name,) in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE tablename LIKE %s",
                    (_STAGE_PREFIX.replace("_", r"\_") + self._digest() + "%",)).fetchall():
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
                logger.info("Dropped staging table %s, left by a run of output %s that stopped mid-batch", name,
                            context.output)
            conn.commit()

    def write(self, df: DataFrame, batch: BatchContext) -> PendingCommit | None:
        """Steps 1 and 2; step 3 is the returned commit (the engine takes it once the batch's
        jobs succeeded; in a pipeline without stateful operators, while the next batch's jobs run)."""
        with self._failures_explained(batch):
            return super().write(df, batch)

    def last_commit(self) -> dict[str, Any] | None:
        return {"table": self.table, "batch_time": self.newest_commit}

    # ---------------------------------------------------------------- steps
    def is_committed(self, batch: BatchContext) -> bool:
        """Step 1: the progress table holds the batch."""
        with self._connect() as conn:
            committed = self._recorded(conn, self._opened(), int(batch.batch_time)) is not None
        if committed:
            self.note_committed(int(batch.batch_time))
        return committed

    def prepare(self, df: DataFrame, attempt: WriteAttempt) -> _Stage:
        """The stream's columns checked against the table's, and this attempt's staging table."""
        self._check_schema(df.schema)
        with self._connect() as conn:
            stage, encoding = self._create_stage(conn, df.schema, attempt.id[:12])
        return _Stage(stage, df.schema, encoding)

    def write_partition(self, rows: Iterator[pa.RecordBatch], attempt: WriteAttempt, partition: int) -> int:
        """Step 2, in a task; returns how many rows it staged."""
        stage: _Stage = attempt.prepared
        return _copy_partition(self._dsn, stage.table, stage.schema.fieldNames(), stage.encoding, rows, partition)

    def commit(self, messages: list[int], attempt: WriteAttempt) -> None:
        """Step 3."""
        stage: _Stage = attempt.prepared
        batch = attempt.batch
        try:
            with self._failures_explained(batch), self._connect() as conn:
                moved = self._commit(conn, self._opened(), batch, stage.table, stage.schema)
        finally:
            self._drop(stage.table)
        if moved is not None:
            logger.debug("Batch %s: %d rows into %s (%d staged)", batch.batch_time, moved, self.table, sum(messages))

    def abort(self, messages: list[int], attempt: WriteAttempt) -> None:
        self._drop(attempt.prepared.table)

    def _opened(self) -> SinkContext:
        if self._context is None:
            raise SinkError("the PostgreSQL output was not opened; this is a bug in batchline")
        return self._context

    @contextlib.contextmanager
    def _failures_explained(self, batch: BatchContext) -> Iterator[None]:
        """A failure of a step as a ``SinkError`` without the DSN's password; the engine's own
        errors (a fenced driver, a configuration to change) as they are."""
        try:
            yield
        except (FencedError, ConfigurationError, SinkError):
            raise
        except Exception as error:
            raise SinkError(
                f"writing batch {batch.batch_time} to {self.table} at {self.where} failed: {self._scrub(error)}. "
                "Nothing of the batch is in the table; it runs again (retries, or the next start)") from None

    def _commit(self, conn: Any, context: SinkContext, batch: BatchContext, stage: str,
                schema: StructType) -> int | None:
        """Step 3: the staged rows and the progress row in one transaction (None: committed before)."""
        from psycopg import sql

        time_ms = int(batch.batch_time)
        progress = sql.Identifier(*self.progress_table.split("."))
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                         (f"{context.pipeline}\n{context.output}",))
            if self._recorded(conn, context, time_ms) is not None:
                logger.warning("Batch %s was committed to %s by another driver meanwhile; discarding this one",
                               batch.batch_time, self.table)
                return None
            newest = conn.execute(sql.SQL("SELECT max(fencing_token) FROM {} WHERE pipeline = %s AND output = %s")
                                  .format(progress), (context.pipeline, context.output)).fetchone()[0]
            if newest is not None and newest > batch.fencing_token:
                raise FencedError(
                    f"output {context.output}: this driver's lease token {batch.fencing_token} is older than token "
                    f"{newest}, recorded in {self.progress_table} by a driver that took the checkpoint location "
                    f"over; batch {batch.batch_time} is not written. Run one driver per checkpoint location")
            cursor = conn.execute(self._insert(stage, schema))
            moved = cursor.rowcount
            conn.execute(sql.SQL("INSERT INTO {} (pipeline, output, batch_time, fencing_token, rows) "
                                 "VALUES (%s, %s, %s, %s, %s)").format(progress),
                         (context.pipeline, context.output, time_ms, batch.fencing_token, moved))
        return int(moved)

    def _insert(self, stage: str, schema: StructType) -> Any:
        from psycopg import sql

        columns = sql.SQL(", ").join(sql.Identifier(name) for name in schema.fieldNames())
        target, source = sql.Identifier(*self.table.split(".")), sql.Identifier(stage)
        if self.mode is WriteMode.APPEND:  # a table has no order: no sort of the batch's rows
            return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(target, columns, columns, source)
        keys = sql.SQL(", ").join(sql.Identifier(name) for name in self.key)
        others = [name for name in schema.fieldNames() if name not in self.key]
        action = sql.SQL("DO NOTHING") if not others else sql.SQL("DO UPDATE SET {}").format(
            sql.SQL(", ").join(sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(n), sql.Identifier(n))
                               for n in others))
        return sql.SQL("INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} FROM {} ORDER BY {}, {} DESC, {} DESC "
                       "ON CONFLICT ({}) {}").format(target, columns, keys, columns, source, keys,
                                                     sql.Identifier(_PART), sql.Identifier(_ROW), keys, action)

    def _create_stage(self, conn: Any, schema: StructType, attempt: str) -> tuple[str, CopyEncoding]:
        """An unlogged table for this attempt's rows: the stream's columns as the table has
        them, and each row's partition and place in it."""
        from psycopg import sql

        stage = f"{_STAGE_PREFIX}{self._digest()}_{attempt}"
        columns = sql.SQL(", ").join(sql.Identifier(name) for name in schema.fieldNames())
        conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
            sql.Identifier(stage), columns, sql.Identifier(*self.table.split("."))))
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} integer NOT NULL, ADD COLUMN {} bigint NOT NULL").format(
            sql.Identifier(stage), sql.Identifier(_PART), sql.Identifier(_ROW)))
        # The staging table's own column types, as COPY will find them (the table may have been
        # altered since open()): what the tasks encode for.
        types = [kind for (kind,) in conn.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_name = %s AND table_schema = "
            "current_schema() ORDER BY ordinal_position", (stage,)).fetchall()]
        conn.commit()
        return stage, copy_encoding(types)

    def _drop(self, stage: str) -> None:
        from psycopg import sql

        try:
            with self._connect() as conn:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(stage)))
                conn.commit()
        except Exception as error:  # noqa: BLE001 (the next start drops it)
            logger.warning("Could not drop staging table %s (%s); the next start drops it", stage,
                           self._scrub(error))


    def _recorded(self, conn: Any, context: SinkContext, time_ms: int) -> Any:
        from psycopg import sql

        row = conn.execute(sql.SQL("SELECT fencing_token FROM {} WHERE pipeline = %s AND output = %s AND "
                                   "batch_time = %s").format(sql.Identifier(*self.progress_table.split("."))),
                           (context.pipeline, context.output, time_ms)).fetchone()
        return None if row is None else row[0]

    # ---------------------------------------------------------------- checks
    def _table_columns(self, conn: Any) -> dict[str, tuple[str, bool, bool]]:
        schema_name, _, name = self.table.rpartition(".")
        rows = conn.execute(
            "SELECT column_name, data_type, is_nullable = 'YES', column_default IS NOT NULL OR is_identity = 'YES' "
            "FROM information_schema.columns WHERE table_name = %s AND table_schema = COALESCE(NULLIF(%s, ''), "
            "current_schema()) ORDER BY ordinal_position", (name, schema_name)).fetchall()
        if not rows:
            raise ConfigurationError(
                f"table {self.table} does not exist in {self.where}; create it first (CREATE TABLE {self.table} "
                "(...) with the stream's columns)")
        return {column: (kind, nullable, default) for column, kind, nullable, default in rows}

    def _check_key(self, conn: Any) -> None:
        missing = [k for k in self.key if k not in self._columns]
        if missing:
            raise ConfigurationError(f"key column(s) {missing} are not columns of table {self.table}")
        unique = conn.execute(
            "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND "
            "a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisunique GROUP BY i.indexrelid",
            (self.table,)).fetchall()
        if not any(set(columns) == set(self.key) for (columns,) in unique):
            raise ConfigurationError(
                f"upsert into {self.table} by {self.key} needs a primary key or unique index on exactly those "
                f"columns; add one: ALTER TABLE {self.table} ADD PRIMARY KEY ({', '.join(self.key)})")

    def _check_schema(self, schema: StructType) -> None:
        """Every stream column is a table column of a type its values go into; every table
        column the stream lacks may be left out (nullable or with a default)."""
        if self._checked == schema:
            return
        problems = []
        for field in schema.fields:
            kind = field.dataType.simpleString().split("(")[0]
            found = self._columns.get(field.name)
            if found is None:
                problems.append(f"column {field.name!r} is in the stream but not in the table (add it, or drop it "
                                "from the stream with select)")
            elif kind not in _COMPATIBLE:
                problems.append(f"column {field.name!r} is {kind} in the stream, which is not written to PostgreSQL; "
                                "turn it into text first (to_json for arrays, maps and structs)")
            elif found[0] not in _COMPATIBLE[kind]:
                problems.append(f"column {field.name!r} is {kind} in the stream but {found[0]} in the table (make "
                                f"the table's one of: {', '.join(_COMPATIBLE[kind])}; or cast it in the stream)")
        for column, (_, nullable, default) in self._columns.items():
            if column not in schema.fieldNames() and not nullable and not default:
                problems.append(f"table column {column!r} is NOT NULL without a default, and the stream has no "
                                "such column")
        if problems:
            raise ConfigurationError(
                f"the stream's columns do not fit table {self.table} at {self.where}: " + "; ".join(problems)
                + ". Nothing was written")
        self._checked = schema

    # ---------------------------------------------------------------- connections
    def _connect(self) -> Any:
        import psycopg

        try:
            return psycopg.connect(self._dsn, connect_timeout=10)
        except psycopg.Error as error:
            raise SinkError(f"cannot connect to {self.where}: {self._scrub(error)}. Check that the server is up and "
                            "the DSN's user, password and database are right") from None

    def _scrub(self, error: BaseException) -> str:
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return text.replace(self._password, "***") if self._password else text

    def _digest(self) -> str:
        context = self._context
        key = f"{context.pipeline}\n{context.output}" if context else self.table
        return hashlib.sha1(key.encode()).hexdigest()[:10]


def _password(dsn: str) -> str | None:
    from psycopg.conninfo import conninfo_to_dict

    try:
        password = conninfo_to_dict(dsn).get("password")
        return str(password) if password else None
    except Exception:  # noqa: BLE001
        return None


# ------------------------------------------------------------------------------ in the tasks
def _copy_partition(dsn: str, stage: str, columns: list[str], encoding: CopyEncoding,
                    rows: Iterator[pa.RecordBatch], part: int) -> int:
    """A task's rows (at least one) into the staging table with ``COPY``, replacing what an
    earlier attempt of the same partition staged, in one transaction; how many it staged."""
    from psycopg import sql

    lock = int.from_bytes(hashlib.sha1(stage.encode()).digest()[:4], "big", signed=True)
    names = [*columns, _PART, _ROW]
    count = 0
    conn = _locked_connection(dsn, lock, part)
    try:
        conn.execute(sql.SQL("DELETE FROM {} WHERE {} = %s").format(sql.Identifier(stage), sql.Identifier(_PART)),
                     (part,))
        with conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN ({})").format(
                sql.Identifier(stage), sql.SQL(", ").join(map(sql.Identifier, names)),
                sql.SQL(encoding.option))) as copy:
            copy.write(encoding.start())
            for batch in rows:
                copy.write(encoding.rows(
                    [*batch.columns, pa.array([part] * batch.num_rows, pa.int32()),
                     pa.array(range(count, count + batch.num_rows), pa.int64())], names))
                count += batch.num_rows
            copy.write(encoding.end())
        conn.commit()
    except BaseException:
        conn.close()
        raise
    _KEPT[dsn] = conn
    return count


_KEPT: dict[str, Any] = {}
"""Per Python worker, its connection to each DSN, kept between tasks (Spark reuses workers):
a task then skips connecting (and the password exchange), and the server a new backend."""


def _locked_connection(dsn: str, lock: int, part: int) -> Any:
    """A connection with a transaction open that holds the partition's staging lock. A kept
    connection that fails at this first statement (the server dropped it: a restart) is closed
    and replaced by a new one; nothing was written on it yet, so taking the lock again is safe."""
    import psycopg

    kept = _KEPT.pop(dsn, None)
    if kept is not None and not kept.closed:
        try:
            _lock_partition(kept, lock, part)
            return kept
        except Exception:  # noqa: BLE001 (a new connection is tried; its error is the one raised)
            kept.close()
    # No prepared statements (a transaction-mode pooler such as PgBouncer would mix them up
    # between server connections); keepalives, so a kept connection to a vanished host fails
    # within a minute instead of hanging.
    conn = psycopg.connect(dsn, connect_timeout=10, prepare_threshold=None, keepalives=1, keepalives_idle=30,
                           keepalives_interval=10, keepalives_count=3)
    try:
        _lock_partition(conn, lock, part)
    except BaseException:
        conn.close()
        raise
    return conn


def _lock_partition(conn: Any, lock: int, part: int) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (lock, part))

