"""Redis Streams through a stateless pipeline into PostgreSQL: rows per second, against the
limit a bare Python script reaches on one core in the same run (``XRANGE`` pages, then ``COPY``
of the same rows with psycopg 3), rounds alternating.

Both start real servers from Debian's packages (redis-server, postgresql) on loopback, with
one stream of ``--rows`` entries (fields user, amount, ts) loaded once.
- bare: one process, one thread: ``XRANGE`` in pages of 10,000 entries, each page's rows
  written with ``copy.write_row`` into a table (stream, id, user, amount, ts).
- batchline: ``redis_stream(..., schema=..., bounded=True)`` → ``write_postgres(table)``
  (exactly once: COPY from the tasks into staging, one transaction per batch with its
  progress row), ``local[2]``, a warm SparkSession; timed from ``start()`` to the finished
  pipeline (planning, reading, staging, commits, checkpoints).

    python -m benchmarks.connectors [--rows 1000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import redis
from pyspark.sql.types import DoubleType, LongType, StructField, StructType, TimestampType

from batchline import StreamingContext
from batchline.spark import local_spark_session
from benchmarks.machine import write_result
from harness.servers import PostgresServer, RedisServer

STREAM = "events"
SCHEMA = StructType([StructField("user", LongType(), False), StructField("amount", DoubleType(), False),
                     StructField("ts", TimestampType(), False)])
TABLE_DDL = "(stream text, id text, \"user\" bigint, amount double precision, ts timestamptz)"

BARE_SCRIPT = r'''
import sys, time, psycopg, redis
url, dsn, table, stream = sys.argv[1:5]
client = redis.Redis.from_url(url)
began = time.perf_counter()
rows = 0
with psycopg.connect(dsn) as conn:
    with conn.cursor().copy(f"COPY {table} (stream, id, \"user\", amount, ts) FROM STDIN") as copy:
        cursor = "-"
        while True:
            page = client.xrange(stream, cursor, "+", count=10_000)
            if not page:
                break
            for entry_id, fields in page:
                copy.write_row((stream, entry_id.decode(), int(fields[b"user"]), float(fields[b"amount"]),
                                fields[b"ts"].decode()))
            rows += len(page)
            cursor = "(" + page[-1][0].decode()
print(rows, time.perf_counter() - began)
'''


def load(client: redis.Redis, rows: int) -> None:
    client.delete(STREAM)
    pipe = client.pipeline(transaction=False)
    for i in range(rows):
        pipe.xadd(STREAM, {"user": str(i % 5000), "amount": f"{(i * 7919) % 100000 / 100:.2f}",
                           "ts": f"2026-11-23T10:{(i // 60000) % 60:02d}:{(i // 1000) % 60:02d}.{i % 1000:03d}Z"})
        if i % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()


def fresh_table(dsn: str, name: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")
        conn.execute(f"CREATE TABLE {name} {TABLE_DDL}")


def count(dsn: str, name: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        total, distinct = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {name}").fetchone() or (0, 0)
    return int(total), int(distinct)


def bare(redis_url: str, dsn: str, rows: int) -> float:
    fresh_table(dsn, "bare")
    done = subprocess.run([sys.executable, "-c", BARE_SCRIPT, redis_url, dsn, "bare", STREAM], check=True,
                          capture_output=True, text=True)
    copied, seconds = done.stdout.split()
    assert int(copied) == rows and count(dsn, "bare") == (rows, rows)
    return rows / float(seconds)


def engine(spark, redis_url: str, dsn: str, rows: int, work: Path, round_: int) -> float:
    table = "engine"
    fresh_table(dsn, table)
    ssc = StreamingContext(spark, "200ms", checkpoint=str(work / f"checkpoint-{round_}"))
    ssc.redis_stream(redis_url, [STREAM], name="events", schema=SCHEMA, bounded=True,
                     max_records_per_batch=250_000, split_size=25_000).write_postgres(dsn, table)
    began = time.perf_counter()
    assert ssc.run_until_finished(1800)
    seconds = time.perf_counter() - began
    assert count(dsn, table) == (rows, rows), count(dsn, table)
    return rows / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="batchline-connectors-"))
    redis_server = RedisServer(work / "redis").start()
    postgres = PostgresServer(work / "postgres").start()
    spark = local_spark_session("local[2]", "batchline-bench-connectors", shuffle_partitions=2)
    try:
        client = redis.Redis.from_url(redis_server.url)
        load(client, args.rows)
        print(f"loaded {args.rows} entries", flush=True)
        engine(spark, redis_server.url, postgres.dsn, args.rows, work, -1)  # warm-up: JIT, Python workers
        bare_rates, engine_rates = [], []
        for r in range(args.rounds):
            bare_rates.append(bare(redis_server.url, postgres.dsn, args.rows))
            engine_rates.append(engine(spark, redis_server.url, postgres.dsn, args.rows, work, r))
            print(f"round {r + 1}: bare {bare_rates[-1]:,.0f} rows/s, batchline {engine_rates[-1]:,.0f} rows/s",
                  flush=True)
    finally:
        spark.stop()
        postgres.stop()
        redis_server.stop()
        shutil.rmtree(work, ignore_errors=True)
    engine_rate, bare_rate = statistics.median(engine_rates), statistics.median(bare_rates)
    figures = {
        "rows": args.rows,
        "rounds": args.rounds,
        "engine_rows_per_s": round(engine_rate),
        "bare_script_rows_per_s": round(bare_rate),
        "engine_rounds": [round(r) for r in engine_rates],
        "bare_rounds": [round(r) for r in bare_rates],
        "ratio": round(engine_rate / bare_rate, 3),
        "goal_ratio": 1.0,
    }
    print(json.dumps(figures, indent=2))
    print(f"wrote {write_result('connectors', figures)}")


if __name__ == "__main__":
    main()
