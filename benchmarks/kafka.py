"""Kafka in and out (issue 33): records per second from a 6-partition topic of JSON records,
parsed, through a stateless pipeline into another topic exactly once, side by side in one run
with (a) a bare Python consume-transform-produce loop on one core and (b) Spark Structured
Streaming's own Kafka source and sink; then batchline's 1 s batches with 10k records a second
arriving.

A real broker (``harness.servers.KafkaBroker``: Apache Kafka 4.4.0, KRaft, one node) on
loopback. The input, produced once (a fast producer: linger, big batches, one partition in
turn per record): ``--records`` JSON records ``{"id": i, "user": "u<i % 10000>", "amount":
((i * 7919) % 100000) / 100, "ts": ISO-8601}`` in a topic of 6 partitions. Every side keeps
``amount > 10`` (99% of the records), projects ``id, user, amount``, writes each row as a JSON
object keyed by ``user`` into its own 6-partition output topic, and reads at most
``--batch-records`` records per batch (a transaction per that many records in the bare loop).
Each side is a fresh process (``benchmarks/kafka_run.py``) timed from its start to its exit.
Every output topic is then read by a read_committed consumer and must hold exactly the
expected records: each kept id once, with its user, amount and key; any difference fails the
benchmark.

- batchline: ``kafka_stream(schema=..., bounded=True, max_records_per_batch=n)`` →
  ``filter`` → ``select`` → ``write_kafka(key="user")`` (one Kafka transaction per batch,
  written by the driver), ``local[2]``, ``run_until_finished()``.
- bare: one thread, confluent-kafka: read_committed consumer, ``json.loads``, the filter and
  projection, ``json.dumps``, a transactional producer, ``send_offsets_to_transaction`` and a
  commit every n records read.
- Structured Streaming: the ``spark-sql-kafka-0-10_2.13`` connector (4.2.0: Maven Central has
  none for 4.3.0), fetched with ``mvn dependency:copy-dependencies`` into
  ``~/.cache/batchline/spark-sql-kafka-<version>`` and passed with ``spark.jars``;
  ``from_json`` → filter → ``to_json``, ``maxOffsetsPerTrigger=n``, availableNow. Its Kafka sink
  writes from the tasks and has no transactions: at least once, not exactly once.

Steady state: batchline unbounded with 1 s batches on another input topic, while this process
produces 10,000 records a second into it (a thread, 1,000 records every 100 ms), for
``--steady-seconds``; the batches of the first ``--steady-warmup`` seconds are left out (the
first batch starts the Python workers and the tasks' Kafka clients, and the backlog of those
seconds is caught up after it).

    python -m benchmarks.kafka [--records 1000000] [--batch-records 200000] [--sides bare,batchline,structured]
                               [--steady-seconds 90] [--steady-warmup 30]
                               [--steady-partitions 6] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bounded import SideProcess

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 6
USERS = 10_000
CONNECTOR_VERSION = "4.2.0"
CONNECTOR_NEW_JARS = ("spark-sql-kafka-0-10_2.13-", "spark-token-provider-kafka-0-10_2.13-", "kafka-clients-",
                      "commons-pool2-")
"""The connector's runtime jars that pip's PySpark does not ship (the rest of what Maven lists,
Scala, Hadoop's client and so on, PySpark has, at its own versions)."""
GOAL = 1.0
STEADY_RATE = 10_000
BASE_S = 1_795_000_000  # 2026-11-18T...: the records' ts, one per millisecond


# ------------------------------------------------------------------ the input
def amount_of(ids: np.ndarray) -> np.ndarray:
    return ((ids * 7919) % 100_000) / 100


def record(i: int) -> bytes:
    seconds, millis = divmod(BASE_S * 1000 + i, 1000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return (f'{{"id": {i}, "user": "u{i % USERS}", "amount": {((i * 7919) % 100_000) / 100!r}, '
            f'"ts": "{stamp}.{millis:03d}Z"}}').encode()


def produce_input(bootstrap: str, topic: str, first: int, count: int) -> float:
    """``count`` records from id ``first``, partition ``id % 6``; seconds taken."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 1_000_000, "acks": "all"})
    began = time.perf_counter()
    for i in range(first, first + count):
        while True:
            try:
                producer.produce(topic, record(i), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) > 0:
        raise SystemExit(f"{topic}: records still undelivered after 120 s")
    return time.perf_counter() - began


def expected_ids(records: int) -> np.ndarray:
    ids = np.arange(records, dtype=np.int64)
    return ids[amount_of(ids) > 10]


# ------------------------------------------------------------------ an output, checked
def read_output(bootstrap: str, topic: str, broker: Any) -> dict[str, Any]:
    """Every record a read_committed consumer sees in ``topic``, checked record by record;
    the ids in a sorted array."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    ends = {p: high for p, (_, high) in broker.watermarks(topic, read_committed=True).items()}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-verify", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "fetch.max.bytes": 64 << 20})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    pending = {p for p, end in ends.items() if end > 0}
    ids: list[int] = []
    bad: list[str] = []
    deadline = time.monotonic() + 300
    while pending:
        if time.monotonic() > deadline:
            raise SystemExit(f"{topic}: reading the output took over 300 s; partitions {pending} not at their end")
        for message in consumer.consume(10_000, 1.0):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001
                    if message.offset() >= ends[message.partition()]:
                        pending.discard(message.partition())
                    continue
                raise SystemExit(f"{topic}: {error.str()}")
            row = json.loads(message.value())
            i = int(row["id"])
            ids.append(i)
            if len(bad) < 5 and (sorted(row) != ["amount", "id", "user"] or row["user"] != f"u{i % USERS}"
                                 or message.key() != row["user"].encode()
                                 or abs(row["amount"] - ((i * 7919) % 100_000) / 100) > 1e-9):
                bad.append(f"offset {message.partition()}/{message.offset()}: key {message.key()!r} value "
                           f"{message.value()!r}")
    consumer.close()
    return {"ids": np.sort(np.array(ids, dtype=np.int64)), "bad": bad}


def check(name: str, found: dict[str, Any], want: np.ndarray) -> dict[str, Any]:
    ids = found["ids"]
    unique = np.unique(ids)
    verdict = {"records": int(len(ids)), "distinct_ids": int(len(unique)), "id_sum": int(ids.sum()),
               "expected_records": int(len(want)), "expected_id_sum": int(want.sum())}
    problems = []
    if found["bad"]:
        problems.append(f"records unlike their input, e.g. {found['bad'][:3]}")
    if len(unique) != len(ids):
        problems.append(f"{len(ids) - len(unique)} duplicates")
    if not np.array_equal(unique, want):
        missing = np.setdiff1d(want, unique)
        extra = np.setdiff1d(unique, want)
        problems.append(f"{len(missing)} ids missing (e.g. {missing[:5].tolist()}), {len(extra)} not expected "
                        f"(e.g. {extra[:5].tolist()})")
    if problems:
        raise SystemExit(f"WRONG OUTPUT of {name}: " + "; ".join(problems) + f" ({verdict})")
    return {**verdict, "exact": True}


# ------------------------------------------------------------------ a side
class Run(SideProcess):
    """``python -m benchmarks.kafka_run side ...`` from its start to its exit."""

    def __init__(self, side: str, work: Path, bootstrap: str, in_topic: str, out_topic: str, per_batch: int,
                 extra: str = "", on_line: Any = None) -> None:
        super().__init__(side, [sys.executable, "-m", "benchmarks.kafka_run", side, bootstrap, in_topic, out_topic,
                                str(work / f"{side}-checkpoint"), str(per_batch), extra],
                         work / f"{side}.stderr", on_line)

    def result(self) -> dict[str, Any]:
        found = [json.loads(line[len("result "):]) for line in self.lines if line.startswith("result ")]
        return found[-1] if found else {}

    def batches(self) -> list[dict[str, Any]]:
        out = []
        for line in self.lines:
            if line.startswith("batch "):
                t, n, start, end, delay = line.split()[1:6]
                out.append({"time": int(t), "records": int(n), "start": int(start), "end": int(end),
                            "processing_ms": int(end) - int(start),
                            "scheduling_delay_ms": None if delay == "None" else int(delay)})
        return out

    def steps(self) -> dict[int, dict[str, tuple[float, int]]]:
        found: dict[int, dict[str, tuple[float, int]]] = {}
        for line in self.lines:
            if line.startswith("step "):
                _, name, batch, seconds, records = line.split()
                previous = found.setdefault(int(batch), {}).get(name, (0.0, 0))
                found[int(batch)][name] = (previous[0] + float(seconds), previous[1] + int(records))
        return found



def side_figures(run: Run, records: int, verdict: dict[str, Any]) -> dict[str, Any]:
    marks = run.marks()
    figures: dict[str, Any] = {
        "wall_s": round(run.wall_s, 2),
        "records_per_s": round(records / run.wall_s),
        "timeline_s": {k: run.since_start(v) for k, v in marks.items()},
        "output": verdict,
        "load_average_before": run.load_before,
        "other_spark_or_test_processes_during_run": run.busy_during,
    }
    if run.side == "batchline":
        batches = [b for b in run.batches() if b["records"] > 0]
        steps = run.steps()
        per_batch = []
        for b in batches:
            s = steps.get(b["time"], {})
            produced = s.get("produce", (0.0, 0))
            per_batch.append({
                "records_in": b["records"], "records_out": s.get("commit", (0, 0))[1],
                "processing_s": round(b["processing_ms"] / 1000, 2),
                "tasks_s": round(s.get("tasks", (0.0, 0))[0], 2),
                "driver_commit_s": round(s.get("commit", (0.0, 0))[0], 2),
                "driver_produce_s": round(produced[0], 2),
                "commit_transaction_s": round(s.get("commit_transaction", (0.0, 0))[0], 3),
            })
        first_start = min(b["start"] for b in batches) / 1000
        last_end = max(b["end"] for b in batches) / 1000
        tasks = sum(p["tasks_s"] for p in per_batch)
        commit = sum(p["driver_commit_s"] for p in per_batch)
        produce = sum(p["driver_produce_s"] for p in per_batch)
        out = sum(p["records_out"] for p in per_batch)
        figures.update({
            "batches_with_data": len(batches),
            "batches": per_batch,
            "phases_s": {
                "interpreter_and_imports": round(marks["imported"] - run.started, 2),
                "spark_session": round(marks["spark"] - marks["imported"], 2),
                "to_first_batch": round(first_start - marks["spark"], 2),
                "batches_with_data": round(last_end - first_start, 2),
                "to_pipeline_finished": round(marks["finished"] - last_end, 2),
                "spark_stop_and_exit": round(run.started + run.wall_s - marks["finished"], 2),
            },
            "batch_time_split_s": {
                "tasks_total": round(tasks, 2), "driver_commit_total": round(commit, 2),
                "of_which_produce_loop": round(produce, 2),
                "of_which_commit_transaction": round(sum(p["commit_transaction_s"] for p in per_batch), 2),
                "driver_commit_share_of_batches": round(commit / max(1e-9, tasks + commit), 3),
                "driver_produce_us_per_record": round(produce / max(1, out) * 1e6, 2),
                "tasks_us_per_record_in": round(tasks / max(1, sum(b["records"] for b in batches)) * 1e6, 2),
            },
        })
    elif run.side == "structured":
        result = run.result()
        figures["batches"] = result.get("progress", [])
        figures["phases_s"] = {"interpreter_and_imports": round(marks["imported"] - run.started, 2),
                               "spark_session": round(marks["spark"] - marks["imported"], 2),
                               "query": round(marks["finished"] - marks["spark"], 2),
                               "spark_stop_and_exit": round(run.started + run.wall_s - marks["finished"], 2)}
    else:
        result = run.result()
        figures.update(result)
        figures["phases_s"] = {"interpreter_imports_and_clients": round(marks["ready"] - run.started, 2),
                               "loop": round(marks["finished"] - marks["ready"], 2)}
    return figures


# ------------------------------------------------------------------ peer (b)'s jars
def connector_jars(version: str = CONNECTOR_VERSION) -> list[str]:
    """The connector's jars that PySpark lacks, fetched once with Maven into the cache."""
    home = Path.home() / ".cache" / "batchline" / f"spark-sql-kafka-{version}"
    libs = home / "libs"
    if not (libs / f"spark-sql-kafka-0-10_2.13-{version}.jar").is_file():
        home.mkdir(parents=True, exist_ok=True)
        (home / "pom.xml").write_text(
            '<?xml version="1.0" encoding="UTF-8"?>\n<project xmlns="http://maven.apache.org/POM/4.0.0">'
            "<modelVersion>4.0.0</modelVersion><groupId>batchline.bench</groupId>"
            "<artifactId>spark-sql-kafka-fetch</artifactId><version>1</version><packaging>pom</packaging>"
            "<dependencies><dependency><groupId>org.apache.spark</groupId>"
            f"<artifactId>spark-sql-kafka-0-10_2.13</artifactId><version>{version}</version>"
            "</dependency></dependencies></project>\n")
        staged = home / "staged"
        shutil.rmtree(staged, ignore_errors=True)
        done = subprocess.run(["mvn", "-B", "-ntp", "-q", "-f", str(home / "pom.xml"), "dependency:copy-dependencies",
                               "-DincludeScope=runtime", f"-DoutputDirectory={staged}"],
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"mvn could not fetch spark-sql-kafka-0-10_2.13 {version}:\n{done.stdout[-2000:]}")
        shutil.rmtree(libs, ignore_errors=True)
        staged.rename(libs)
    return sorted(str(p) for p in libs.iterdir() if p.name.startswith(CONNECTOR_NEW_JARS))


# ------------------------------------------------------------------ steady state
class Feeder(threading.Thread):
    """``rate`` records a second into ``topic``, 1/10 of them every 100 ms, from id ``first``."""

    def __init__(self, bootstrap: str, topic: str, first: int, rate: int, partitions: int) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
        self.topic, self.next_id, self.rate, self.partitions = topic, first, rate, partitions
        self.stop_event = threading.Event()
        self.produced = 0
        self.late_ticks = 0

    def run(self) -> None:
        tick = 0.1
        due = time.monotonic()
        while not self.stop_event.is_set():
            for _ in range(self.rate // 10):
                i = self.next_id
                self.producer.produce(self.topic, record(i), partition=i % self.partitions)
                self.next_id += 1
            self.produced += self.rate // 10
            self.producer.poll(0)
            due += tick
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                self.late_ticks += 1
        self.producer.flush(30)


def steady(work: Path, broker: Any, seconds: float, warmup: float, partitions: int) -> dict[str, Any]:
    bootstrap = broker.bootstrap_servers
    broker.create_topic("steady-in", partitions)
    broker.create_topic("steady-out", PARTITIONS)
    feeder = Feeder(bootstrap, "steady-in", 0, STEADY_RATE, partitions)
    started: dict[str, float] = {}

    def on_line(line: str) -> None:
        if line.startswith("mark started") and not feeder.is_alive():
            started["at"] = time.time()
            feeder.start()

    run = Run("steady", work, bootstrap, "steady-in", "steady-out", 0, str(seconds), on_line)
    feeder.stop_event.set()
    feeder.join(60)
    if "at" not in started or not run.batches():
        raise SystemExit("steady: no batch completed:\n" + "\n".join(run.lines[-30:])
                         + "\n".join(run.stderr_path.read_text().splitlines()[-30:]))
    from_ms = (started["at"] + warmup) * 1000
    batches = [b for b in run.batches() if b["time"] >= from_ms]
    steps = run.steps()
    processing = [b["processing_ms"] for b in batches]
    commit = [steps.get(b["time"], {}).get("commit", (0.0, 0))[0] * 1000 for b in batches]
    tasks = [steps.get(b["time"], {}).get("tasks", (0.0, 0))[0] * 1000 for b in batches]
    delays = [b["scheduling_delay_ms"] for b in batches if b["scheduling_delay_ms"] is not None]
    p95 = float(np.percentile(processing, 95)) if processing else None
    return {
        "rate_records_per_s": STEADY_RATE, "interval_s": 1, "input_partitions": partitions,
        "run_s": seconds, "warmup_left_out_s": warmup,
        "records_produced": feeder.produced, "feeder_late_ticks": feeder.late_ticks,
        "batches_measured": len(batches),
        "records_per_batch_mean": round(statistics.mean(b["records"] for b in batches)) if batches else 0,
        "processing_ms": {"mean": round(statistics.mean(processing)), "median": round(statistics.median(processing)),
                          "p95": round(p95 or 0), "max": max(processing)} if processing else {},
        "tasks_ms_mean": round(statistics.mean(tasks)) if tasks else None,
        "driver_commit_ms_mean": round(statistics.mean(commit)) if commit else None,
        "scheduling_delay_ms": {"mean": round(statistics.mean(delays)), "max": max(delays),
                                "last": delays[-1]} if delays else {},
        "keeps_up": bool(processing) and (p95 or 0) < 1000 and (not delays or max(delays) < 1000),
        "batches": [{"records": b["records"], "processing_ms": b["processing_ms"],
                     "scheduling_delay_ms": b["scheduling_delay_ms"]} for b in batches],
    }


# ------------------------------------------------------------------ micro-measures for the profile
def micro(broker: Any, topic: str, count: int) -> dict[str, Any]:
    """Without Spark: the source's task read (``KafkaSource.read`` of one split: consume,
    Arrow, JSON parse) and a transactional producer's produce loop for pre-encoded records
    (the sink's ``_produce``), per record."""
    import pyarrow as pa
    from confluent_kafka import Producer

    from batchline.sinks.kafka import _produce
    from batchline.sources.kafka import KafkaSource

    bootstrap = broker.bootstrap_servers
    source = KafkaSource(bootstrap, topics=[topic], schema="id long, user string, amount double, ts timestamp")
    until = min(count, broker.watermarks(topic)[0][1])
    began = time.perf_counter()
    assert sum(b.num_rows for b in source.read({"ranges": [[topic, 1, 0, 1]]})) == 1
    first_read_s = time.perf_counter() - began  # imports pyspark.sql.pandas.types once (a worker does too)
    began = time.perf_counter()
    assert sum(b.num_rows for b in source.read({"ranges": [[topic, 2, 0, 1]]})) == 1
    one_record_s = time.perf_counter() - began
    began = time.perf_counter()
    rows = sum(b.num_rows for b in source.read({"ranges": [[topic, 0, 0, until]]}))
    read_s = time.perf_counter() - began
    values = [f'{{"id":{i},"user":"u{i % USERS}","amount":12.34}}'.encode() for i in range(until)]
    keys = [f"u{i % USERS}".encode() for i in range(until)]
    table = pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
                      "headers": pa.nulls(until, pa.list_(pa.struct([("key", pa.string()),
                                                                     ("value", pa.binary())])))})
    broker.create_topic("micro-out", PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-micro", "linger.ms": 5,
                         "enable.idempotence": True, "partitioner": "murmur2_random"})
    producer.init_transactions(30)
    producer.begin_transaction()
    began = time.perf_counter()
    _produce(producer, "micro-out", table)
    loop_s = time.perf_counter() - began
    producer.commit_transaction(60)
    total_s = time.perf_counter() - began
    return {"records": until, "source_read_us_per_record": round(read_s / rows * 1e6, 2),
            "source_first_read_in_a_process_ms": round(first_read_s * 1000, 1),
            "source_read_of_one_record_ms": round(one_record_s * 1000, 1),
            "sink_produce_loop_us_per_record": round(loop_s / until * 1e6, 2),
            "sink_produce_and_commit_us_per_record": round(total_s / until * 1e6, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch-records", type=int, default=200_000)
    parser.add_argument("--sides", default="bare,batchline,structured")
    parser.add_argument("--steady-seconds", type=float, default=90)
    parser.add_argument("--steady-warmup", type=float, default=30)
    parser.add_argument("--steady-partitions", type=int, default=PARTITIONS)
    parser.add_argument("--no-write", action="store_true", help="print the figures, write no results file")
    args = parser.parse_args()
    from benchmarks.machine import write_result
    from harness.servers import KafkaBroker

    work = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    broker = KafkaBroker(work / "broker").start()
    figures: dict[str, Any] = {}
    try:
        bootstrap = broker.bootstrap_servers
        broker.create_topic("records", PARTITIONS)
        seconds = produce_input(bootstrap, "records", 0, args.records)
        sizes = {p: high - low for p, (low, high) in broker.watermarks("records").items()}
        print(f"input: {args.records} records in 6 partitions ({sizes}), produced in {seconds:.1f} s", flush=True)
        want = expected_ids(args.records)
        sides: dict[str, Any] = {}
        peer_b: dict[str, Any] = {}
        for side in [s for s in args.sides.split(",") if s]:
            extra = ""
            if side == "structured":
                jars = connector_jars()
                extra = ",".join(jars)
                peer_b = {"connector": f"spark-sql-kafka-0-10_2.13 {CONNECTOR_VERSION} (no 4.3.0 on Maven Central)",
                          "jars": [Path(j).name for j in jars]}
            out_topic = f"out-{side}"
            broker.create_topic(out_topic, PARTITIONS)
            print(f"{side}: running", flush=True)
            try:
                run = Run(side, work, bootstrap, "records", out_topic, args.batch_records, extra)
            except SystemExit as failure:
                if side != "structured":
                    raise
                peer_b["error"] = str(failure)[-4000:]
                print(f"structured: FAILED\n{peer_b['error']}", flush=True)
                continue
            verdict = check(side, read_output(bootstrap, out_topic, broker), want)
            sides[side] = side_figures(run, args.records, verdict)
            print(f"{side}: {run.wall_s:.2f} s = {args.records / run.wall_s:,.0f} records/s; output exact "
                  f"({verdict['records']} records)", flush=True)
        ratios = {}
        if "batchline" in sides:
            for peer in ("bare", "structured"):
                if peer in sides:
                    ratios[peer] = round(sides["batchline"]["records_per_s"] / sides[peer]["records_per_s"], 2)
        steady_figures = steady(work, broker, args.steady_seconds, args.steady_warmup, args.steady_partitions) \
            if args.steady_seconds > 0 else None
        figures = {
            "records": args.records, "partitions": PARTITIONS, "records_per_batch": args.batch_records,
            "kept_by_filter": int(len(want)), "filter": "amount > 10", "projection": ["id", "user", "amount"],
            "master": "local[2]", "broker": f"Apache Kafka {KafkaBroker.VERSION} (KRaft, one node, loopback)",
            "input_produce_s": round(seconds, 1),
            "sides": sides,
            "peer_b": peer_b,
            "ratios_batchline_to_peer": ratios,
            "goal": f">= {GOAL:g}x each peer",
            "goal_met": {peer: ratio >= GOAL for peer, ratio in ratios.items()},
            "steady_10k_per_s_1s_batches": steady_figures,
            "micro": micro(broker, "records", 100_000),
        }
        print(json.dumps(figures, indent=1), flush=True)
        if not args.no_write:
            print(f"wrote {write_result('kafka', figures)}")
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
