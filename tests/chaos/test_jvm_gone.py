"""Spark going away under a running driver: a SIGTERM to the driver's whole process group (as
GNU ``timeout`` or ``kill -TERM -PGID`` send it), and the driver's JVM killed with ``kill -9``.
Either way the driver ends within seconds, without a traceback from batchline's threads, and a
restart of the same pipeline writes exactly what an uninterrupted run writes."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import SystemClock
from batchline.observe.control import StopHow
from batchline.observe.status import read_status
from tests.chaos.test_chaos import finish, output_ids, start_driver
from tests.helpers import DRIVERS, wait_for

DRIVER = DRIVERS / "chaos_driver.py"
FILES, PER_FILE = 8, 20  # one file a batch (max_files_per_batch=1): a few batches before the signal, more after
ALL_IDS = collections.Counter(f"f{f:02d}-r{r:02d}" for f in range(FILES) for r in range(PER_FILE))
"""What an uninterrupted run writes: every input row once (as test_chaos's reference run shows)."""
EXIT_WITHIN_S = 30


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The input files, written once and read by both tests."""
    incoming = tmp_path_factory.mktemp("jvm-gone-inputs") / "in"
    incoming.mkdir()
    for f in range(FILES):
        rows = [{"id": f"f{f:02d}-r{r:02d}", "n": f * PER_FILE + r} for r in range(PER_FILE)]
        (incoming / f"events-{f:02d}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return incoming


class GroupLeader:
    """The chaos driver in a session (and process group) of its own, as a service manager or
    ``timeout`` starts a command; its stdout and stderr read as they come."""

    def __init__(self, incoming: Path, out: Path, checkpoint: Path) -> None:
        self.log = checkpoint.parent / "driver-stderr.txt"
        self.process = subprocess.Popen([sys.executable, str(DRIVER), str(incoming), str(out), str(checkpoint)],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        return "\n".join(self.err)

    def wait_for_batches(self, count: int) -> None:
        wait_for(lambda: sum(line.startswith("completed ") for line in self.out) >= count
                 or self.process.poll() is not None, f"{count} completed batches", 180, 0.1)
        assert self.process.poll() is None, "the driver ended before the test stopped it:\n" + self.stderr[-5000:]

    def jvm_pid(self) -> int:
        """The driver's Spark JVM: its one ``java`` child (spark-submit execs java)."""
        found = subprocess.run(["pgrep", "-P", str(self.process.pid), "-x", "java"], capture_output=True,
                               text=True, check=False).stdout.split()
        assert len(found) == 1, f"expected one java child of the driver, found {found}"
        return int(found[0])

    def exit_code(self, timeout_s: float) -> int | None:
        """The driver's exit code, or None when it did not end within ``timeout_s`` (then the
        whole group is killed, the JVM with it)."""
        try:
            code: int | None = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            for group in {self.process.pid, *self._jvm_groups()}:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.process.wait()
        for reader in self._readers:
            reader.join(10)
        self.log.write_text(self.stderr)  # to read after a failure: the assertions show only its end
        return code

    def _jvm_groups(self) -> set[int]:
        try:
            return {os.getpgid(self.jvm_pid())} if self.process.poll() is None else set()
        except (AssertionError, ProcessLookupError):
            return set()


def restarted_output(incoming: Path, out: Path, checkpoint: Path) -> collections.Counter[str]:
    """Start the same pipeline again and let it run until every row is in the output."""
    finish(start_driver(incoming, out, checkpoint), out, expected=FILES * PER_FILE)
    return output_ids(out)


def thread_tracebacks(stderr: str) -> list[str]:
    """Tracebacks of threads other than the main one (``threading.excepthook`` names them)."""
    return [line for line in stderr.splitlines() if line.startswith("Exception in thread")]


def batchline_frames(stderr: str) -> list[str]:
    """The frames of batchline's code in every traceback printed, as ``path function``."""
    return [f"{found.group(1)} {found.group(2)}"
            for found in re.finditer(r'File ".*/(batchline/[^"]+)", line \d+, in (\S+)', stderr)]


def test_sigterm_to_the_drivers_process_group_stops_it_gracefully_and_a_restart_resumes_exactly(tmp_path, inputs):
    """The JVM runs in a process group of its own, so the group's SIGTERM reaches the driver
    only: its graceful stop finishes on a living Spark and the driver exits 0, as a stop on
    SIGTERM does."""
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    driver = GroupLeader(inputs, out, checkpoint)
    driver.wait_for_batches(3)
    os.killpg(driver.process.pid, signal.SIGTERM)
    code = driver.exit_code(EXIT_WITHIN_S)
    assert code is not None, f"the driver did not exit within {EXIT_WITHIN_S} s:\n" + driver.stderr[-5000:]
    assert "Stopping gracefully on SIGTERM" in driver.stderr, driver.stderr[-5000:]
    assert "Traceback" not in driver.stderr, driver.stderr[-5000:]
    assert code == 0, driver.stderr[-5000:]
    assert "stopped (graceful)" in driver.stderr, driver.stderr[-5000:]

    assert restarted_output(inputs, out, checkpoint) == ALL_IDS


def assert_ended_with_one_clear_error(driver: GroupLeader, code: int | None, checkpoint: Path) -> None:
    assert code is not None, f"the driver did not exit within {EXIT_WITHIN_S} s:\n" + driver.stderr[-5000:]
    assert code != 0, driver.stderr[-5000:]
    errors = [line for line in driver.err if " ERROR batchline." in line]
    assert len(errors) == 1, "\n".join(errors) or driver.stderr[-5000:]
    assert "the Spark JVM is gone" in errors[0] and "was committed" in errors[0], errors
    assert "start the pipeline again: it resumes from its checkpoint" in errors[0], errors
    assert not thread_tracebacks(driver.stderr), driver.stderr[-5000:]
    # The one traceback through batchline is the script's own: await_termination() raised the
    # error, as for a failed batch. (PySpark's accumulator server and Py4J print tracebacks of
    # their own when the JVM's connections break; they are theirs.)
    assert batchline_frames(driver.stderr) == ["batchline/api/context.py await_termination",
                                               "batchline/api/run.py await_termination"], driver.stderr[-5000:]
    assert "batchline.errors.SparkGoneError: the Spark JVM is gone" in driver.stderr, driver.stderr[-5000:]
    status = read_status(CheckpointStorage(str(checkpoint), warn=False), SystemClock())
    assert status.last_stop is not None and status.last_stop.how is StopHow.FAILED, status.describe()
    assert "the Spark JVM is gone" in (status.last_stop.reason or ""), status.describe()


def test_a_killed_jvm_ends_the_driver_with_one_clear_error_and_a_restart_resumes_exactly(tmp_path, inputs):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    driver = GroupLeader(inputs, out, checkpoint)
    driver.wait_for_batches(3)
    os.kill(driver.jvm_pid(), signal.SIGKILL)
    assert_ended_with_one_clear_error(driver, driver.exit_code(EXIT_WITHIN_S), checkpoint)

    assert restarted_output(inputs, out, checkpoint) == ALL_IDS


def test_sigterm_to_the_driver_and_its_jvm_at_once_ends_the_graceful_stop_with_the_clear_error(tmp_path, inputs):
    """What a service manager's default does (systemd's KillMode=control-group signals every
    process of the service): the JVM's shutdown hook stops Spark under the graceful stop the
    driver began. The stop ends as failed, within seconds, and says so once."""
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    driver = GroupLeader(inputs, out, checkpoint)
    driver.wait_for_batches(3)
    # The JVM first: the batches the graceful stop waits for then need a Spark that is stopping.
    os.kill(driver.jvm_pid(), signal.SIGTERM)
    driver.process.send_signal(signal.SIGTERM)
    code = driver.exit_code(EXIT_WITHIN_S)
    assert "Stopping gracefully on SIGTERM" in driver.stderr, driver.stderr[-5000:]
    assert_ended_with_one_clear_error(driver, code, checkpoint)
