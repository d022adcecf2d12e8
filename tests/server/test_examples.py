"""The shipped examples run as written."""

import runpy
import sys
import threading

import pyarrow.dataset as ds

from tests.helpers import ROOT

EXAMPLES = ROOT / "examples"


def run_example(name, *args, timeout=180):
    runner = threading.Thread(target=runpy.run_path, args=(str(EXAMPLES / name),), kwargs={"run_name": "__main__"})
    sys.argv = [name, *args]
    runner.start()
    runner.join(timeout)
    assert not runner.is_alive()


def test_redis_orders_example(spark, redis_server, tmp_path, monkeypatch):
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.delete("orders")
    client.xadd("orders", {"customer": "alice", "amount": "12.50", "at": "2026-11-23T10:00:00Z"})
    client.xadd("orders", {"customer": "alice", "amount": "7.50"})
    client.xadd("orders", {"customer": "bob", "amount": "a lot"})
    monkeypatch.setattr(sys, "argv", sys.argv)
    run_example("redis_orders.py", redis_server.url, str(tmp_path), "6")
    orders = ds.dataset(str(tmp_path / "orders"), format="parquet", partitioning="hive").to_table()
    assert sorted(str(a) for a in orders.column("amount").to_pylist()) == ["12.50", "7.50"]
    totals = ds.dataset(str(tmp_path / "totals"), format="parquet", partitioning="hive").to_table().to_pylist()
    assert max(str(row["total"]) for row in totals if row["customer"] == "alice") == "20.00"
    dead = [line for p in (tmp_path / "dead_letters").rglob("part-*") for line in p.read_text().splitlines()]
    assert len(dead) == 1 and "'a lot' is not a decimal(12,2)" in dead[0]


def test_orders_to_postgres_example(spark, postgres_server, tmp_path, monkeypatch):
    import psycopg

    monkeypatch.setattr(sys, "argv", sys.argv)
    run_example("orders_to_postgres.py", postgres_server.dsn, "5", str(tmp_path / "checkpoint"))
    with psycopg.connect(postgres_server.dsn) as conn:
        orders = conn.execute("SELECT count(*), count(DISTINCT data) FROM orders").fetchone()
        latest = conn.execute("SELECT count(*) FROM latest_order").fetchone()[0]
    assert orders[0] > 0 and orders[0] == orders[1]
    assert 0 < latest <= 50


def test_kafka_orders_example(spark, kafka_broker, tmp_path, monkeypatch):
    import json
    import uuid

    from confluent_kafka import Consumer

    for topic in ("orders", "order_counts"):
        kafka_broker.create_topic(topic, partitions=3)
    orders = [{"customer": "alice", "amount": 12.5, "ts": "2026-11-23T10:00:10"},
              {"customer": "alice", "amount": 7.5, "ts": "2026-11-23T10:00:40"},
              {"customer": "bob", "amount": 3.0, "ts": "2026-11-23T10:00:20"},
              {"customer": "bob", "amount": "a lot", "ts": "2026-11-23T10:00:30"},
              {"customer": "carol", "amount": 1.0, "ts": "2026-11-23T10:05:00"}]  # moves the watermark on
    kafka_broker.produce("orders", [(o["customer"], json.dumps(o)) for o in orders])
    monkeypatch.setattr(sys, "argv", sys.argv)
    run_example("kafka_orders.py", kafka_broker.bootstrap_servers, str(tmp_path), "8")
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    consumer.subscribe(["order_counts"])
    counts = []
    for _ in range(50):
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            counts.append(json.loads(message.value()))
    consumer.close()
    assert sorted((c["customer"], c["orders"], c["total"]) for c in counts) == [("alice", 2, 20.0), ("bob", 1, 3.0)]
    dead = [line for p in (tmp_path / "dead_letters").rglob("part-*") for line in p.read_text().splitlines()]
    assert len(dead) == 1 and "field 'amount'" in dead[0]
