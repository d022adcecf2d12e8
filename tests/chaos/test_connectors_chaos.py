"""Redis in, a stateful operator, PostgreSQL out; and Kafka in (a topic of 6 partitions), the
same stateful operator, Kafka out; one driver runs both. Kill -9 the driver at 20 random
moments while events are appended to Redis and produced to Kafka all along, restart it each
time; the tables, and the output topic as a read_committed consumer sees it, must equal an
uninterrupted run's, with no row lost or duplicated."""

import json
import random
import threading
import time
import uuid

import psycopg
import redis
from confluent_kafka import Consumer, Producer

from tests.helpers import DRIVERS, DriverProcess, in_background, poll_until

DRIVER = DRIVERS / "connectors_driver.py"
USERS, EVENTS, KILLS = 12, 1500, 20


def event(seq):
    return {"user": f"u{seq % USERS:02d}", "seq": seq, "amount": (seq * 7919) % 1000}


def expected_rows():
    totals = {}
    rows = []
    for seq in range(EVENTS):
        e = event(seq)
        total, count = totals.get(e["user"], (0, 0))
        totals[e["user"]] = (total + e["amount"], count + 1)
        rows.append((e["user"], seq, e["amount"], *totals[e["user"]]))
    return sorted(rows), sorted((user, *t) for user, t in totals.items())


def start_driver(redis_url, dsn, checkpoint, suffix, kafka, *flags, warm=False) -> DriverProcess:
    return DriverProcess(DRIVER, redis_url, dsn, checkpoint, suffix, "--kafka", kafka, *flags, warm=warm)


def create_tables(dsn, suffix):
    with psycopg.connect(dsn) as conn:
        conn.execute(f"DROP TABLE IF EXISTS events_{suffix}, totals_{suffix}")
        conn.execute(f"CREATE TABLE events_{suffix} (user_id_unused int, \"user\" text, seq bigint, amount bigint, "
                     "total bigint, count bigint)")
        conn.execute(f"CREATE TABLE totals_{suffix} (\"user\" text PRIMARY KEY, total bigint, count bigint)")


def table_rows(dsn, suffix):
    with psycopg.connect(dsn) as conn:
        events = conn.execute(f'SELECT "user", seq, amount, total, count FROM events_{suffix}').fetchall()
        totals = conn.execute(f'SELECT "user", total, count FROM totals_{suffix}').fetchall()
    return sorted(events), sorted(totals)


def kafka_rows(kafka, suffix, expected):
    """The output topic as a read_committed consumer sees it: (user, seq, amount, total, count)."""
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": uuid.uuid4().hex, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    consumer.subscribe([f"running_{suffix}"])
    rows, deadline, quiet_since = [], time.monotonic() + 120, time.monotonic()
    try:
        while time.monotonic() < deadline and (len(rows) < expected or time.monotonic() - quiet_since < 3):
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            quiet_since = time.monotonic()
            row = json.loads(message.value())
            assert message.key() == row["user"].encode()
            rows.append((row["user"], row["seq"], row["amount"], row["total"], row["count"]))
    finally:
        consumer.close()
    return sorted(rows)


def append_all(client, kafka, stop_early):
    """Entries appended, and the same events produced (keyed by user), all along, about 60 a second."""
    producer = Producer({"bootstrap.servers": kafka, "linger.ms": 5, "partitioner": "murmur2_random"})
    for seq in range(EVENTS):
        if stop_early.is_set():
            return
        e = event(seq)
        client.xadd("events", e)
        producer.produce("events", json.dumps(e).encode(), e["user"].encode())
        if seq % 30 == 29:
            producer.flush(30)
            time.sleep(0.5)
    assert producer.flush(30) == 0


def clean_run(redis_url, dsn, checkpoint, kafka):
    """The uninterrupted run: reads the stream and the topic as they are (every event appended)
    to their ends."""
    clean = start_driver(redis_url, dsn, checkpoint, "clean", kafka, "--bounded")
    try:
        assert clean.process.wait(240) == 0
    finally:
        clean.kill()


def test_killed_driver_writes_postgres_and_kafka_exactly_once(redis_server, postgres_server, kafka_broker,
                                                               tmp_path):
    """Each driver is started warm while the one before it runs (its Spark starts meanwhile)
    and told to go once that one was killed; the kill points are drawn from its ``started``
    as ever. The uninterrupted run reads the stream once every entry was appended, alongside
    the kills."""
    client = redis.Redis.from_url(redis_server.url)
    client.delete("events")
    dsn = postgres_server.dsn
    create_tables(dsn, "chaos")
    create_tables(dsn, "clean")
    kafka = kafka_broker.bootstrap_servers
    kafka_broker.create_topic("events", partitions=6)
    for suffix in ("chaos", "clean"):
        kafka_broker.create_topic(f"running_{suffix}", partitions=3)
    rng = random.Random(21)
    stop = threading.Event()
    writer = threading.Thread(target=append_all, args=(client, kafka, stop), daemon=True)
    writer.start()
    checkpoint = tmp_path / "chaos"
    kills_after_commits = 0
    clean = None
    warm = start_driver(redis_server.url, dsn, checkpoint, "chaos", kafka, warm=True)
    try:
        for _ in range(KILLS):
            driver = warm
            driver.go()
            warm = start_driver(redis_server.url, dsn, checkpoint, "chaos", kafka, warm=True)
            assert driver.started.wait(60), "the driver did not start"
            if rng.random() < 0.5:
                time.sleep(rng.uniform(0, 8))  # anywhere: restarting, running batches
            else:
                poll_until(lambda d=driver: len(d.completed) >= 1, 60, 0.05,
                           stop=lambda d=driver: d.process.poll() is not None)
                time.sleep(rng.uniform(0, 1.5))  # within the next batches: planning, COPY, commit
            kills_after_commits += bool(driver.completed)
            assert driver.process.poll() is None, "the driver exited before it was killed"
            driver.kill()
            if clean is None and not writer.is_alive():
                clean = in_background(clean_run, redis_server.url, dsn, tmp_path / "clean", kafka)
        writer.join(120)
        assert not writer.is_alive()
        driver = warm
        driver.go()
        poll_until(lambda: len(table_rows(dsn, "chaos")[0]) >= EVENTS and len(driver.completed) >= 3, 180, 0.2)
        kafka_chaos = kafka_rows(kafka, "chaos", EVENTS)
        driver.kill()
    finally:
        stop.set()
        warm.kill()

    if clean is None:
        clean_run(redis_server.url, dsn, tmp_path / "clean", kafka)
    else:
        clean(300)
    expected_events, expected_totals = expected_rows()
    assert table_rows(dsn, "clean") == (expected_events, expected_totals)
    chaos_events, chaos_totals = table_rows(dsn, "chaos")
    assert len(chaos_events) == len(set(chaos_events)), "a row was written twice"
    assert chaos_events == expected_events
    assert chaos_totals == expected_totals
    assert kafka_rows(kafka, "clean", EVENTS) == expected_events
    assert len(kafka_chaos) == len(set(kafka_chaos)), "a Kafka record was written twice"
    assert kafka_chaos == expected_events
    assert kills_after_commits >= 5, f"only {kills_after_commits} kills came after a batch committed"
