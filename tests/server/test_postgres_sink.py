"""PostgreSQL out, exactly once (SPEC C2), against a real PostgreSQL server: append and upsert,
a batch written again is skipped, the table checked against the stream, a server restarted in
the middle of a batch, a fenced driver refused, and credentials nowhere to be seen."""

import datetime as dt
import logging
import uuid
from decimal import Decimal

import psycopg
import pytest
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from batchline import BatchContext, BatchTime, ConfigurationError, SinkContext, StreamingContext
from batchline.checkpoint.lease import FencedError
from batchline.errors import BatchFailedError, SinkError
from batchline.scheduler.retry import RetryPolicy
from batchline.sinks.postgres import PostgresSink
from batchline.testing import END, list_stream

ROWS = StructType([StructField("key", StringType(), False), StructField("value", LongType(), True)])


@pytest.fixture
def table(postgres_server):
    name = f"t_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_server.dsn) as conn:
        conn.execute(f"CREATE TABLE {name} (key text PRIMARY KEY, value bigint, note text)")
    return name


def select(dsn, sql):
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


def batch(time_ms, token=1, output="out"):
    """A batch of a pipeline of its own per test (the progress table is shared)."""
    return BatchContext(BatchTime(time_ms), output, PIPELINE[0], token)


PIPELINE = ["p"]


@pytest.fixture(autouse=True)
def pipeline_of_its_own():
    PIPELINE[0] = f"p-{uuid.uuid4().hex[:8]}"


def opened(sink, output="out"):
    sink.open(SinkContext(PIPELINE[0], output))
    return sink


def written(sink, df, context):
    """``sink.write`` and the commit it leaves, as the engine takes them."""
    pending = sink.write(df, context)
    if pending is not None:
        pending.commit()


def test_upsert_inserts_and_updates_by_key_and_the_last_row_of_a_batch_wins(spark, postgres_server, table, tmp_path):
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"))
    items = [[("a", 1), ("b", 2)], [("a", 10), ("c", 3), ("a", 11)], [("b", None)], END]
    stream = list_stream(ssc, items, ROWS, name="rows", bounded=True)
    stream.write_postgres(postgres_server.dsn, table, mode="upsert", key=["key"])
    assert ssc.run_until_finished(60)
    assert select(postgres_server.dsn, f"SELECT key, value FROM {table} ORDER BY key") == [
        ("a", 11), ("b", None), ("c", 3)]
    assert select(postgres_server.dsn, f"SELECT count(*) FROM batchline_progress WHERE output = 'postgres:{table}'") \
        == [(3,)]


def test_append_writes_every_row_once_even_when_a_batch_is_written_again(spark, postgres_server, table):
    sink = opened(PostgresSink(postgres_server.dsn, table))
    df = spark.createDataFrame([("a", 1), ("b", 2), ("c", 3)], ROWS).repartition(2)
    written(sink, df, batch(1000))
    written(sink, df, batch(1000))  # the same batch again (a re-run after a crash): skipped
    written(sink, spark.createDataFrame([("d", 4)], ROWS), batch(2000))
    assert select(postgres_server.dsn, f"SELECT key, value, note FROM {table} ORDER BY key") == [
        ("a", 1, None), ("b", 2, None), ("c", 3, None), ("d", 4, None)]
    assert sink.last_commit() == {"table": table, "batch_time": 2000}
    assert select(postgres_server.dsn, "SELECT count(*) FROM pg_tables WHERE tablename LIKE '_batchline_stage_%'") \
        == [(0,)]


TYPED = StructType([StructField("s", StringType()), StructField("l", LongType()), StructField("d", DoubleType()),
                    StructField("b", BooleanType()), StructField("n", DecimalType(10, 2)),
                    StructField("ts", TimestampType()), StructField("day", DateType()),
                    StructField("j", StringType())])
"""A column of every type written to PostgreSQL (``j`` is text going into jsonb)."""


def typed_table(dsn, prefix):
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn) as conn:
        conn.execute(f"CREATE TABLE {name} (s text, l bigint, d double precision, b boolean, n numeric(10,2), "
                     "ts timestamptz, day date, j jsonb)")
    return name


def test_values_of_every_supported_type_arrive_as_they_were(spark, postgres_server):
    name, schema = typed_table(postgres_server.dsn, "typed"), TYPED
    stamp = dt.datetime(2026, 11, 23, 12, 30, 45, 123456, tzinfo=dt.UTC)
    rows = [('a "quoted", with\nnewline', 2**62, 1.5, True, Decimal("12.34"), stamp, dt.date(2026, 1, 2), '{"k": 1}'),
            ("", None, None, None, None, None, None, None)]
    sink = opened(PostgresSink(postgres_server.dsn, name))
    written(sink, spark.createDataFrame(rows, schema), batch(1000))
    found = select(postgres_server.dsn, f"SELECT s, l, d, b, n, ts, day, j FROM {name} ORDER BY s DESC")
    assert found[0][:5] == rows[0][:5] and found[0][5] == stamp and found[0][6] == rows[0][6]
    assert found[0][7] == {"k": 1}
    assert found[1] == ("", None, None, None, None, None, None, None)  # an empty string is not NULL


def test_a_stream_that_does_not_fit_the_table_is_refused_naming_each_column(spark, postgres_server, table, tmp_path):
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "checkpoint"))
    schema = StructType([StructField("key", LongType()), StructField("value", LongType()),
                         StructField("extra", StringType())])
    list_stream(ssc, [[(1, 2, "x")], END], schema, bounded=True).write_postgres(postgres_server.dsn, table)
    with pytest.raises(BatchFailedError) as failure:
        ssc.run_until_finished(60)
    message = str(failure.value)
    assert "column 'key' is bigint in the stream but text in the table" in message
    assert "column 'extra' is in the stream but not in the table" in message
    assert "attempts" not in message  # a configuration error is not retried
    assert select(postgres_server.dsn, f"SELECT count(*) FROM {table}") == [(0,)]

    with psycopg.connect(postgres_server.dsn) as conn:
        conn.execute(f"ALTER TABLE {table} ADD COLUMN required int NOT NULL")
    sink = opened(PostgresSink(postgres_server.dsn, table))
    with pytest.raises(ConfigurationError, match="table column 'required' is NOT NULL without a default"):
        written(sink, spark.createDataFrame([("a", 1)], ROWS), batch(1000))


def test_missing_table_and_missing_unique_key_are_refused_at_start(postgres_server, table):
    with pytest.raises(ConfigurationError, match="table nowhere does not exist"):
        opened(PostgresSink(postgres_server.dsn, "nowhere"))
    with pytest.raises(ConfigurationError, match=r"needs a primary key or unique index on exactly those columns"):
        opened(PostgresSink(postgres_server.dsn, table, mode="upsert", key=["value"]))


class RestartingSink(PostgresSink):
    """Restarts the server once, after the batch's rows were staged and before they are moved."""

    def __init__(self, server, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server = server
        self.restarts = 0

    def _commit(self, conn, *args):
        if not self.restarts:
            self.restarts += 1
            self.server.restart()
        return super()._commit(conn, *args)


def test_a_server_restarted_in_the_middle_of_a_batch_fails_it_and_the_retry_commits_it_once(
        spark, postgres_server, table, tmp_path, caplog):
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"),
                           retry=RetryPolicy(max_attempts=3, initial_backoff="200ms"))
    sink = RestartingSink(postgres_server, postgres_server.dsn, table)
    list_stream(ssc, [[("a", 1), ("b", 2)], [("c", 3)], END], ROWS, bounded=True).write(sink, name="pg")
    with caplog.at_level(logging.WARNING):
        assert ssc.run_until_finished(120)
    assert sink.restarts == 1
    assert "failed in output 'pg' (attempt 1 of 3)" in caplog.text
    assert select(postgres_server.dsn, f"SELECT key, value FROM {table} ORDER BY key") == [("a", 1), ("b", 2), ("c", 3)]
    assert select(postgres_server.dsn, "SELECT count(*) FROM batchline_progress WHERE output = 'pg'") == [(2,)]


def test_a_driver_whose_token_is_older_than_the_newest_recorded_is_refused(spark, postgres_server, table):
    df = spark.createDataFrame([("a", 1)], ROWS)
    old = opened(PostgresSink(postgres_server.dsn, table))
    new = opened(PostgresSink(postgres_server.dsn, table))
    written(old, df, batch(1000, token=1))
    written(new, spark.createDataFrame([("b", 2)], ROWS), batch(2000, token=2))  # took the location over
    with pytest.raises(FencedError, match="lease token 1 is older than token 2"):
        written(old, spark.createDataFrame([("c", 3)], ROWS), batch(3000, token=1))
    assert select(postgres_server.dsn, f"SELECT key FROM {table} ORDER BY key") == [("a",), ("b",)]


def test_credentials_never_appear_in_logs_errors_or_checkpoints(spark, postgres_server, table, tmp_path, caplog):
    password = postgres_server.password
    checkpoint = tmp_path / "c"
    with caplog.at_level(logging.DEBUG):
        ssc = StreamingContext(spark, "200ms", checkpoint=str(checkpoint))
        list_stream(ssc, [[("a", 1)], END], ROWS, bounded=True).write_postgres(postgres_server.dsn, table)
        assert ssc.run_until_finished(60)
        wrong = postgres_server.dsn.replace(password, "not-the-password")
        with pytest.raises(SinkError) as failure:
            opened(PostgresSink(wrong, table))
    assert "password authentication failed" in str(failure.value)
    assert "not-the-password" not in str(failure.value) and password not in str(failure.value)
    assert password not in caplog.text
    for path in checkpoint.rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path
    assert repr(PostgresSink(postgres_server.dsn, table)).count(password) == 0


def test_an_input_written_as_read_arrives_with_every_type_and_without_its_dead_letters(spark, postgres_server,
                                                                                        tmp_path, monkeypatch):
    """``ssc.input(source).write_postgres(...)`` copies in the tasks that read the source (one
    Python pass): the values arrive as they were, a bad record stays out of the table."""
    from batchline import DeadLetter, Source, SourceBatch

    name, schema = typed_table(postgres_server.dsn, "direct"), TYPED
    stamp = dt.datetime(2026, 11, 23, 12, 30, 45, 123456, tzinfo=dt.UTC)
    rows = [(f'row {i}, "quoted"\nnext line', 2**62 + i, i / 4, i % 2 == 0, Decimal(f"{i}.25"),
             stamp + dt.timedelta(seconds=i), dt.date(2026, 1, 1) + dt.timedelta(days=i), f'{{"k": {i}}}')
            for i in range(30)]
    rows.append(("", None, None, None, None, None, None, None))

    class Rows(Source):
        bounded = True

        def schema(self):
            return schema

        def initial_position(self):
            return {"next": 0}

        def end_of_input(self):
            return {"next": len(rows)}

        def plan(self, start, end_of_input):
            first, last = start["next"], min(start["next"] + 12, end_of_input["next"])
            splits = tuple({"from": a, "to": min(a + 5, last)} for a in range(first, last, 5))
            return SourceBatch(start, {"next": last}, splits)

        def read(self, split):
            for i in range(split["from"], split["to"]):
                yield rows[i]
                if i == 7:
                    yield DeadLetter("{}", "a bad record next to row 7")

    plans = []

    def mapped(context, df, fn, schema):  # the frame write_postgres runs, to see how many passes it makes
        frame = original(context, df, fn, schema)
        plans.append(frame._jdf.queryExecution().executedPlan().toString())
        return frame

    original = BatchContext.map_in_arrow
    monkeypatch.setattr(BatchContext, "map_in_arrow", mapped)
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"))
    ssc.input(Rows(), name="rows").write_postgres(postgres_server.dsn, name)
    assert ssc.run_until_finished(120)
    assert len(plans) == 3 and all(plan.count("MapInArrow") == 1 for plan in plans)
    found = select(postgres_server.dsn, f"SELECT s, l, d, b, n, ts, day, j::text FROM {name} ORDER BY l NULLS LAST")
    assert found == rows


def test_a_batch_whose_commit_is_abandoned_leaves_neither_rows_nor_a_staging_table(spark, postgres_server, table):
    """The engine abandons a staged batch when another part of the batch failed or the batch
    before it did not commit: its staging table goes, nothing reaches the table, and the
    batch can be written again."""
    sink = opened(PostgresSink(postgres_server.dsn, table))
    df = spark.createDataFrame([("a", 1), ("b", 2)], ROWS)
    pending = sink.write(df, batch(1000))
    stages = f"SELECT count(*) FROM pg_tables WHERE tablename LIKE '_batchline_stage_{sink._digest()}%'"
    assert select(postgres_server.dsn, stages) == [(1,)]
    pending.abandon()
    assert select(postgres_server.dsn, stages) == [(0,)]
    assert select(postgres_server.dsn, f"SELECT count(*) FROM {table}") == [(0,)]
    assert sink.last_commit() == {"table": table, "batch_time": None}
    written(sink, df, batch(1000))
    assert select(postgres_server.dsn, f"SELECT key, value FROM {table} ORDER BY key") == [("a", 1), ("b", 2)]
