"""A real Spark standalone cluster for the tests: one master and two workers, separate JVMs
started from the installed pyspark's ``spark-class`` on 127.0.0.1, each worker with one core,
so each runs an executor of its own.

Worker ``i`` (1 or 2) runs with ``BATCHLINE_TEST_WORKER=i`` in its environment, which its
executors and their Python workers inherit: a test's user code can fail on one chosen
executor only. Nothing is shared with the drivers but the machine; drivers keep their
checkpoints and outputs on the S3 endpoint. The workers have the repository's root on their
``PYTHONPATH``: a driver's state function may refer to a module of ``harness`` (the
executors unpickle such functions by module).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

WORKER_ENV = "BATCHLINE_TEST_WORKER"
ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 90.0
DRIVER_CONF = {"spark.driver.host": "127.0.0.1", "spark.executor.memory": "768m", "spark.cores.max": "2"}
"""What a driver on this cluster sets: executors that fit a worker's 1g, one per worker."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ClusterError(RuntimeError):
    pass


@dataclass
class StandaloneCluster:
    directory: Path
    workers: int = 2
    worker_memory: str = "1g"
    master_port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def start(self) -> StandaloneCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._launch("master", "org.apache.spark.deploy.master.Master",
                     "--host", "127.0.0.1", "--port", str(self.master_port), "--webui-port", str(self.ui_port))
        for i in range(1, self.workers + 1):
            work = self.directory / f"worker-{i}"
            work.mkdir(exist_ok=True)
            self._launch(f"worker-{i}", "org.apache.spark.deploy.worker.Worker",
                         "--host", "127.0.0.1", "--cores", "1", "--memory", self.worker_memory,
                         "--webui-port", str(free_port()), "--work-dir", str(work), self.url,
                         env={WORKER_ENV: str(i), "SPARK_LOCAL_DIRS": str(work)})
        try:
            self._wait_for_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, name: str, main_class: str, *args: str, env: dict[str, str] | None = None) -> None:
        spark_home = Path(pyspark.__file__).parent
        python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        log = open(self.directory / f"{name}.log", "wb")  # noqa: SIM115 - owned by the process
        self.processes.append(subprocess.Popen(
            [str(spark_home / "bin" / "spark-class"), main_class, *args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
                 "SPARK_NO_DAEMONIZE": "1", "PYTHONPATH": python_path,
                 **(env or {})},
        ))

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
            return json.load(response)

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last: object = None
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise ClusterError(f"a Spark standalone process exited with {process.returncode} at start-up:\n"
                                       + self.logs())
            try:
                last = self.status()
            except (OSError, ValueError) as error:  # not listening yet, or an empty page while the UI starts
                last = error
            else:
                if sum(w.get("state") == "ALIVE" for w in last.get("workers", [])) == self.workers:
                    return
            time.sleep(0.5)
        raise ClusterError(f"the standalone cluster did not come up in {START_TIMEOUT_S:.0f} s "
                           f"(last status: {last}); logs:\n{self.logs()}")

    def executor_pids(self) -> dict[int, int]:
        """The live executor JVMs, by the worker (1, 2, ...) that started them."""
        pids = {}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(b"CoarseGrainedExecutorBackend" in part for part in cmdline):
                for entry in environ:
                    if entry.startswith(f"{WORKER_ENV}=".encode()):
                        pids[int(entry.split(b"=", 1)[1])] = int(proc.name)
        return pids

    def logs(self, tail: int = 40) -> str:
        out = []
        for log in sorted(self.directory.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-tail:]
            out.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        # Executors live in their workers' process groups; none may outlive the cluster.
        for pid in self.executor_pids().values():
            os.kill(pid, signal.SIGKILL)
