"""Real servers for the tests and benchmarks on 127.0.0.1, each on a free port: Redis and
PostgreSQL from Debian's packages (in a temporary directory, stopped after), and an
S3-compatible endpoint (moto's server).

A server that cannot start raises with what to install or its log's tail: a test that needs
one fails, it never skips.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
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


class S3Server:
    """moto's S3 server on loopback, in a thread of this process, with the suite's buckets;
    ``storage_options`` are the fsspec (s3fs) options that reach it."""

    BUCKETS = ("batchline-test", "batchline-sink", "batchline-conditional")

    def __init__(self) -> None:
        self.port = free_port()
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
