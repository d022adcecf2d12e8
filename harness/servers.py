"""Real servers for the tests and benchmarks on 127.0.0.1, each on a free port: Redis and
PostgreSQL from Debian's packages (in a temporary directory, stopped after), an
S3-compatible endpoint (moto's server), and Apache Kafka's own broker (jars from Maven
Central, see ``harness.kafka_install``; ``python -m harness.servers kafka`` fetches them).

A server that cannot start raises with what to install or its log's tail: a test that needs
one fails, it never skips.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 30


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ServerError(RuntimeError):
    """A test server did not start."""


class _Delayed:
    """A WSGI application that answers each request ``seconds`` later, on the request's own
    thread: an endpoint as far away as an object store in another building."""

    def __init__(self, app: Any, seconds: float) -> None:
        self.app, self.seconds = app, seconds

    def __call__(self, environ: Any, start_response: Any) -> Any:
        time.sleep(self.seconds)
        return self.app(environ, start_response)


class S3Server:
    """moto's S3 server on loopback, in a thread of this process, with the suite's buckets;
    ``storage_options`` are the fsspec (s3fs) options that reach it. ``latency_ms`` delays
    every answer by that much, as a round trip to S3 itself takes (moto on loopback answers
    in a few milliseconds, which hides how many round trips follow one another)."""

    BUCKETS = ("batchline-test", "batchline-sink", "batchline-conditional")

    def __init__(self, latency_ms: float = 0) -> None:
        self.port = free_port()
        self.latency_ms = latency_ms
        self._server: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"key": "testing", "secret": "testing",
                "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"}}

    def start(self) -> S3Server:
        import boto3
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        for bucket in self.BUCKETS:
            client.create_bucket(Bucket=bucket)
        if self.latency_ms:
            wsgi = self._server._server  # noqa: SLF001 (werkzeug's server, which moto's thread made)
            wsgi.app = _Delayed(wsgi.app, self.latency_ms / 1000)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


class RedisServer:
    """``redis-server`` without persistence; ``url`` reaches database 0."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerError("redis-server is not installed; install it: apt-get install redis-server")
        self.directory.mkdir(parents=True, exist_ok=True)
        log = self.directory / "redis.log"
        self._process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory), "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--logfile", str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ServerError(f"redis-server did not come up on port {self.port}:\n{_tail(log)}")

    def restart(self, down_s: float) -> None:
        """Stop the server as an operator would (``SHUTDOWN SAVE``: its data saved to its
        directory), keep it down for ``down_s`` seconds, and start it again on the same port,
        with the data it had."""
        assert self._process is not None, "start the server first"
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as conn:
            conn.sendall(b"SHUTDOWN SAVE\r\n")
            conn.recv(64)  # the connection closes once the data is saved
        self._process.wait(30)
        self._process = None
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None


class PostgresServer:
    """A PostgreSQL cluster of its own (``initdb``, ``pg_ctl``), run as the ``postgres`` user
    when the tests run as root; superuser ``batchline`` with a password (``dsn`` carries it),
    database ``batchline``. ``restart()`` keeps the data and the port."""

    USER, DATABASE = "batchline", "batchline"
    password = "s3cret-batchline-pw"

    def __init__(self, directory: Path | str | None = None) -> None:
        # Its own directory under /tmp, reachable by the postgres user (pytest's are 0700 root's).
        del directory
        self.directory = Path(tempfile.mkdtemp(prefix="batchline-pg-"))
        self.directory.chmod(0o755)
        self.data = self.directory / "data"
        self.log = self.directory / "postgres.log"
        self.port = free_port()
        self._bin = self._find_bin()
        self._as_postgres = os.geteuid() == 0

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.USER}:{self.password}@127.0.0.1:{self.port}/{self.DATABASE}"

    @staticmethod
    def _find_bin() -> Path | None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if found:
            return Path(found[-1]).parent
        pg_ctl = shutil.which("pg_ctl")
        return Path(pg_ctl).parent if pg_ctl else None

    def _run(self, *command: str) -> None:
        if self._bin is None:
            raise ServerError("PostgreSQL is not installed; install it: apt-get install postgresql")
        argv = [str(self._bin / command[0]), *command[1:]]
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT_S * 2)
        if done.returncode != 0:
            raise ServerError(f"{' '.join(command[:2])} failed ({done.returncode}): {done.stderr.strip()}\n"
                              f"{_tail(self.log)}")

    def start(self) -> PostgresServer:
        if self._bin is None:
            raise ServerError("PostgreSQL is not installed; install it: apt-get install postgresql")
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.directory, user.pw_uid, user.pw_gid)
        if not self.data.exists():
            pwfile = self.directory / "pwfile"
            pwfile.write_text(self.password + "\n")
            if self._as_postgres:
                os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
            self._run("initdb", "-D", str(self.data), "-U", self.USER, f"--pwfile={pwfile}",
                      "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync")
            pwfile.unlink()
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(START_TIMEOUT_S), "-o",
                  f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off "
                  "-c synchronous_commit=off -c full_page_writes=off", "start")
        if not getattr(self, "_created", False):
            self._run("createdb", "-h", str(self.directory), "-p", str(self.port), "-U", self.USER, self.DATABASE)
            self._created = True
        return self

    def stop(self, cleanup: bool = True) -> None:
        if self.data.exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
            except ServerError:
                pass  # not running
        if cleanup:
            shutil.rmtree(self.directory, ignore_errors=True)

    def restart(self) -> PostgresServer:
        """Stop (ending every connection) and start again, same port, same data."""
        self.stop(cleanup=False)
        return self.start()


KafkaRecord = bytes | str | None | tuple[bytes | str | None, bytes | str | None]
"""What ``KafkaBroker.produce`` takes per record: a value, or a ``(key, value)`` pair."""

_KAFKA_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<!-- The broker's log in its directory; no shutdown hook, so the log runs to the JVM's end. -->
<Configuration status="WARN" shutdownHook="disable">
  <Appenders>
    <File name="file" fileName="{log}"><PatternLayout pattern="[%d] %p %m (%c)%n"/></File>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="org.apache.kafka.clients" level="WARN"/>
    <Root level="INFO"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
"""


class KafkaBroker:
    """One Apache Kafka broker in KRaft combined mode (broker and controller in one JVM, node 1)
    on two free loopback ports, its data under ``directory``; ``bootstrap_servers`` reaches it.

    Set up for tests on a small machine beside Spark: a heap of at most 512 MB, serial GC,
    internal topics of one partition and replica, no automatic topic creation, no rebalance
    delay, retention checked every second and timed-out transactions aborted within seconds.
    ``start()`` returns when the broker serves metadata, a transactional producer can
    initialise and the group coordinator answers: about 3.5 s on two busy cores, storage format
    included. ``stop_broker()`` / ``start_again()`` keep the data and the ports (a test stops
    the broker in the middle of a batch): about 2 s after a clean stop, about 5 s after
    ``stop_broker(kill=True)``, which waits out the dead incarnation's 3 s session.
    """

    VERSION = "4.4.0"
    START_TIMEOUT_S = 90
    STOP_TIMEOUT_S = 30
    JVM_OPTIONS = ("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                   "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")
    """C1 only (TieredStopAtLevel=1): the JVM starts about a second sooner, and a test broker's
    throughput is bound by the client and the disk, not the JIT. Also a class-data-sharing
    archive of the broker's classes (see ``_cds_options``)."""
    READY_ID = "batchline-harness-ready"

    def __init__(self, directory: Path | str, version: str = VERSION) -> None:
        self.directory = Path(directory)
        self.version = version
        self.port = free_port()
        self.controller_port = free_port()
        self.data = self.directory / "data"
        self.log = self.directory / "kafka.log"
        self.output = self.directory / "kafka.out"
        self.start_seconds: float | None = None
        """How long the last start() took (format included the first time)."""
        # Kafka's own form (a random UUID, URL-safe base64); one starting with "-" would read as an
        # option on the storage tool's command line (1 start in 64).
        self._cluster_id = "-"
        while self._cluster_id.startswith("-"):
            self._cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        self._process: subprocess.Popen[bytes] | None = None
        self._cds_dump: tuple[Path, Path] | None = None
        self._admin: Any = None
        self._client_log = logging.getLogger("harness.kafka")

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """Settings for a confluent_kafka client of this broker; librdkafka's log goes to Python's
        logging (``harness.kafka``), not to stderr, so a restart's refused connections stay quiet."""
        return {"bootstrap.servers": self.bootstrap_servers, "logger": self._client_log, **extra}

    # -- the process -------------------------------------------------------------------------

    def _properties(self) -> str:
        settings = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data),
            "num.partitions": 1,
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            # Retention (retention.ms / retention.bytes of a topic) applied within a second or two,
            # and the deleted segments' files removed soon after.
            "log.initial.task.delay.ms": 0,
            "log.retention.check.interval.ms": 1000,
            "log.segment.delete.delay.ms": 1000,
            # After a crash (stop_broker(kill=True)) the controller refuses the new incarnation of
            # node 1 until the old one's session expires: 3 s, not the default 9 s.
            "broker.session.timeout.ms": 3000,
            "broker.heartbeat.interval.ms": 500,
            # A transaction whose producer died is aborted soon after its transaction.timeout.ms.
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
            # Few threads and a small compaction buffer: two cores and Spark beside the broker.
            "num.network.threads": 2,
            "num.io.threads": 4,
            "background.threads": 2,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    @staticmethod
    def _java() -> str:
        java_home = os.environ.get("JAVA_HOME")
        if java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK):
            return str(Path(java_home) / "bin" / "java")
        java = shutil.which("java")
        if java is None:
            raise ServerError("java is not installed (Kafka needs Java 17 or later); install it: "
                              "apt-get install openjdk-17-jre-headless")
        return java

    def _cds_options(self, java: str, libs: Path, dump: bool) -> list[str]:
        """Class-data sharing: the JVM maps the broker's classes, already parsed and verified, from
        an archive instead of loading them from 45 jars, which saves about 40% of the CPU of a
        start (0.6 s instead of 1.0 s for the storage format). The archive belongs to one JDK and
        one set of jars, so it sits beside the jars, named after the ``java`` binary. The first
        broker to run without one writes it when it stops cleanly (``dump``; that stop takes a few
        seconds longer, once); a JVM that cannot use an archive ignores it (``-Xshare:auto``)."""
        binary = Path(java).resolve()
        stat = binary.stat()
        key = hashlib.sha1(f"{binary}:{stat.st_mtime_ns}:{stat.st_size}:{self.JVM_OPTIONS}".encode()).hexdigest()
        archive = libs.parent / "cds" / f"kafka-{key[:16]}.jsa"
        options = ["-Xlog:cds*=off"]
        if archive.is_file():
            options.append(f"-XX:SharedArchiveFile={archive}")
        elif dump:
            archive.parent.mkdir(exist_ok=True)
            partial = archive.with_name(f"{archive.stem}.{os.getpid()}.{id(self)}.partial")
            self._cds_dump = (partial, archive)
            options.append(f"-XX:ArchiveClassesAtExit={partial}")
        return options

    def _java_command(self, libs: Path, main: str, *args: str, dump: bool = False) -> list[str]:
        java = self._java()
        return [java, *self.JVM_OPTIONS, *self._cds_options(java, libs, dump),
                f"-Dlog4j2.configurationFile={self.directory / 'log4j2.xml'}", "-cp", f"{libs}/*", main, *args]

    def _failure(self, what: str) -> ServerError:
        return ServerError(f"Kafka {self.version} {what} (port {self.port}):\n{_tail(self.log)}\n"
                           f"--- {self.output.name}:\n{_tail(self.output, 15)}")

    def start(self) -> KafkaBroker:
        """Fetch the jars if missing, format the storage the first time, start the JVM, and wait
        until the broker is ready for plain and transactional clients."""
        from harness.kafka_install import ensure_kafka

        if self._process is not None and self._process.poll() is None:
            return self
        libs = ensure_kafka(self.version)
        began = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "server.properties"
        config.write_text(self._properties())
        (self.directory / "log4j2.xml").write_text(_KAFKA_LOG4J2.format(log=self.log))
        if not (self.data / "meta.properties").exists():
            with open(self.output, "ab") as out:
                done = subprocess.run(
                    self._java_command(libs, "kafka.tools.StorageTool", "format", "--config", str(config),
                                       "--cluster-id", self._cluster_id),
                    stdout=out, stderr=subprocess.STDOUT, timeout=self.START_TIMEOUT_S)
            if done.returncode != 0:
                raise self._failure(f"storage format failed ({done.returncode})")
        with open(self.output, "ab") as out:
            self._process = subprocess.Popen(self._java_command(libs, "kafka.Kafka", str(config), dump=True),
                                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_ready(time.monotonic() + self.START_TIMEOUT_S)
        except BaseException:  # never leave a half-started JVM behind
            self.stop_broker(kill=True)
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Producer

        def remaining() -> float:
            left = deadline - time.monotonic()
            if self._process is None or self._process.poll() is not None:
                raise self._failure("exited while starting")
            if left <= 0:
                raise self._failure(f"did not become ready within {self.START_TIMEOUT_S}s")
            return left

        while True:  # the PLAINTEXT listener opens after the controller has elected itself
            remaining()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        while True:  # then the broker has registered with the controller and serves metadata
            try:
                if self.admin().list_topics(timeout=min(5.0, remaining())).brokers:
                    break
            except KafkaException:
                pass
            time.sleep(0.05)
        # The first InitProducerId creates __transaction_state, the first FindCoordinator of a
        # group __consumer_offsets: done here, not in the first test that needs them. After a
        # restart both coordinators load their state first ("load in progress"): retried.
        producer = Producer(self.client_config(**{"transactional.id": self.READY_ID}))
        while True:
            try:
                producer.init_transactions(min(10.0, remaining()))
                break
            except KafkaException as exc:
                if exc.args[0].fatal():
                    raise self._failure(f"refused a transactional producer: {exc}") from exc
                time.sleep(0.1)
        producer.flush(0)
        while True:
            future = self.admin().list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(self.READY_ID)], request_timeout=min(10.0, remaining()))
            try:
                future[self.READY_ID].result()
                return
            except KafkaException:
                time.sleep(0.1)

    def stop_broker(self, kill: bool = False) -> None:
        """Stop the JVM and keep the data and the ports: a clean shutdown (SIGTERM), or a crash
        (``kill=True``, SIGKILL) after which the next start recovers the logs."""
        process, self._process = self._process, None
        self._admin = None  # a new one after the restart, not one waiting on the old connection
        if process is None or process.poll() is not None:
            self._keep_cds_archive(whole=False)
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(self.STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            kill = True
        self._keep_cds_archive(whole=not kill)

    def _keep_cds_archive(self, whole: bool) -> None:
        # The JVM writes the archive as it exits: whole only after a clean stop. A rename, so a
        # broker starting in another process never maps half an archive.
        if self._cds_dump is None:
            return
        (partial, archive), self._cds_dump = self._cds_dump, None
        if whole and partial.is_file():
            os.replace(partial, archive)
        else:
            partial.unlink(missing_ok=True)

    def start_again(self) -> KafkaBroker:
        """After ``stop_broker()``: the same data, the same ports, the same cluster."""
        return self.start()

    def stop(self) -> None:
        self.stop_broker()

    # -- helpers for tests -------------------------------------------------------------------

    def admin(self) -> Any:
        """An AdminClient of this broker (one per broker; it reconnects after a restart)."""
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(self.client_config())
        return self._admin

    def _wait_partitions(self, name: str, partitions: int, timeout: float = 30.0) -> None:
        # CreateTopics / CreatePartitions answer before every partition has a leader in the
        # metadata a producer sees; wait for that so the first produce does not fail.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            topic = self.admin().list_topics(name, timeout=5).topics.get(name)
            if (topic is not None and topic.error is None and len(topic.partitions) == partitions
                    and all(p.leader >= 0 and p.error is None for p in topic.partitions.values())):
                return
            time.sleep(0.05)
        raise self._failure(f"topic {name} did not get {partitions} partitions with leaders")

    def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None) -> None:
        """Create a topic (replication factor 1) and wait until every partition has a leader;
        ``config`` are topic settings such as ``{"retention.ms": "1000"}``."""
        from confluent_kafka.admin import NewTopic

        futures = self.admin().create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=dict(config or {}))])
        futures[name].result(30)
        self._wait_partitions(name, partitions)

    def add_partitions(self, name: str, total: int) -> None:
        """Grow a topic to ``total`` partitions (Kafka only adds) and wait for their leaders."""
        from confluent_kafka.admin import NewPartitions

        self.admin().create_partitions([NewPartitions(name, total)])[name].result(30)
        self._wait_partitions(name, total)

    def delete_records(self, name: str, before: Mapping[int, int]) -> dict[int, int]:
        """Delete the records of each partition below an offset (``{partition: offset}``, -1 for
        all): what retention does, at once. Returns each partition's new low watermark."""
        from confluent_kafka import TopicPartition

        futures = self.admin().delete_records([TopicPartition(name, p, offset) for p, offset in before.items()])
        return {tp.partition: future.result(30).low_watermark for tp, future in futures.items()}

    def watermarks(self, name: str, read_committed: bool = False) -> dict[int, tuple[int, int]]:
        """``{partition: (low, high)}`` of a topic; with ``read_committed`` the high end is the
        last stable offset (the first offset of an open transaction, if any)."""
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        count = len(self.admin().list_topics(name, timeout=10).topics[name].partitions)
        isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
        ends: dict[int, list[int]] = {p: [] for p in range(count)}
        for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
            futures = self.admin().list_offsets({TopicPartition(name, p): spec for p in range(count)},
                                                isolation_level=isolation, request_timeout=30)
            for tp, future in futures.items():
                ends[tp.partition].append(future.result().offset)
        return {p: (low, high) for p, (low, high) in sorted(ends.items())}

    def produce(self, topic: str, records: Iterable[KafkaRecord],
                partition: int | None = None) -> list[tuple[int, int]]:
        """Write records (values, or ``(key, value)`` pairs), non-transactionally with acks=all,
        and return each one's ``(partition, offset)`` in order; raises if any was not written."""
        from confluent_kafka import KafkaException, Producer

        producer = Producer(self.client_config(**{"acks": "all", "linger.ms": 5}))
        written: list[tuple[int, int] | None] = []
        errors: list[Any] = []

        def delivered(index: int) -> Any:
            def report(error: Any, message: Any) -> None:
                if error is not None:
                    errors.append(error)
                else:
                    written[index] = (message.partition(), message.offset())
            return report

        for index, record in enumerate(records):
            key, value = record if isinstance(record, tuple) else (None, record)
            written.append(None)
            while True:
                try:
                    producer.produce(topic, value=value, key=key, on_delivery=delivered(index),
                                     partition=-1 if partition is None else partition)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
        if producer.flush(60) > 0:
            raise ServerError(f"{topic}: records still undelivered after 60s")
        if errors:
            raise KafkaException(errors[0])
        return [place for place in written if place is not None]


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.servers kafka [version]``: fetch Apache Kafka's broker jars into the
    cache (CI does this up front; the tests' fixture would do it on first use)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "kafka":
        print("usage: python -m harness.servers kafka [version]", file=sys.stderr)
        return 2
    from harness.kafka_install import main as fetch

    return fetch(args[1:])


if __name__ == "__main__":
    sys.exit(main())
