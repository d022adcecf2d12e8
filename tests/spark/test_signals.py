"""A pipeline stopped by a signal, as a user stops one: SIGTERM to ``batchline run`` and Ctrl-C
to a plain ``python script.py`` stop it gracefully, the code after ``await_termination()``
runs, the checkpoint is left cleanly stopped and the next start says so; and a script that
configured no logging still shows its start line and one line per batch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import SystemClock
from batchline.observe.control import StopHow
from batchline.observe.status import read_status
from tests.helpers import wait_for

pytestmark = pytest.mark.spark  # each pipeline starts Spark in its own process

PIPELINE = '''
import os
import sys
import time

from pyspark.sql.types import LongType, StringType, StructField, StructType

from batchline import StreamingContext
from batchline.scheduler.listener import StreamingListener
from batchline.spark import local_spark_session

source, out, checkpoint, mode = sys.argv[1:5]
spark = local_spark_session("local[1]", "batchline-signal-test", shuffle_partitions=1)
ssc = StreamingContext(spark, "500ms", checkpoint=checkpoint, name="signals", log_batches=mode != "quiet",
                       graceful_stop_timeout="120s" if mode == "hold" else None)
schema = StructType([StructField("user", StringType()), StructField("n", LongType())])
events = ssc.file_stream(source, "json", schema=schema, settle=0)
hold, holding = checkpoint + "-hold", checkpoint + "-holding"


def held(batches):
    """A task that waits while the hold file exists: a batch a graceful stop would wait for."""
    for batch in batches:
        while os.path.exists(hold):
            open(holding, "w").close()
            time.sleep(0.05)
        yield batch


if mode == "hold":
    events = events.transform(lambda df: df.mapInArrow(held, df.schema), keeps_empty=True)
events.write_files(out, "json", name="out")
ssc.start()


class Ready(StreamingListener):
    """Two batches of this run finished, long after the main thread began to wait: the test may
    signal now."""

    def __init__(self):
        self.batches = 0

    def on_batch_completed(self, info):
        self.batches += 1
        if self.batches == 2:
            print("ready", flush=True)


ssc.add_listener(Ready())
stopped = ssc.await_termination()
print(f"after await_termination: {stopped}", flush=True)
spark.stop()
'''

BATCH_LINE = re.compile(r"batchline\.observe\.summary: batch \S+ \| \d+ records \| scheduling delay")
STOPPING = ("Stopping gracefully on {}: finishing received data and running batches (again to stop at once)")


class Script:
    """A pipeline process whose stdout and stderr are read as they come."""

    def __init__(self, command: list[str], cwd: Path) -> None:
        self.process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.out: list[str] = []
        self.err: list[str] = []
        self._ready = threading.Event()
        self._readers = [threading.Thread(target=self._read, args=(self.process.stdout, self.out), daemon=True),
                         threading.Thread(target=self._read, args=(self.process.stderr, self.err), daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))
            if line.strip() == "ready":
                self._ready.set()
        self._ready.set()  # the process ended: stop_with finds it gone

    def stop_with(self, signum: int, before_signal=lambda: None, timeout_s: float = 120) -> int:
        try:
            self._ready.wait(180)
            assert self.process.poll() is None and "ready" in self.out, \
                "the pipeline never finished two batches:\n" + "\n".join(self.err[-40:])
            before_signal()
            self.process.send_signal(signum)
            code = self.process.wait(timeout_s)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        for reader in self._readers:
            reader.join(10)
        return code

    @property
    def stderr(self) -> str:
        return "\n".join(self.err)


def write_inputs(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    source, script = tmp_path / "in", tmp_path / "pipeline.py"
    source.mkdir()
    (source / "a.json").write_text("".join(json.dumps({"user": u, "n": i}) + "\n" for i, u in enumerate("abcab")))
    script.write_text(textwrap.dedent(PIPELINE))
    return script, source, tmp_path / "out", tmp_path / "checkpoint"


def start_line(stderr: str) -> str:
    [line] = [line for line in stderr.splitlines() if "Pipeline signals started" in line]
    return line


def test_sigterm_to_batchline_run_stops_gracefully_and_the_next_start_says_so(tmp_path):
    script, source, out, checkpoint = write_inputs(tmp_path)
    run = [sys.executable, "-m", "batchline.cli.main", "run", "--dashboard-port", "0", "--metrics-port", "0",
           str(script), str(source), str(out), str(checkpoint)]

    first = Script([*run, "loud"], tmp_path)
    assert first.stop_with(signal.SIGTERM) == 0, first.stderr[-5000:]
    assert "after await_termination: True" in first.out, first.out
    assert STOPPING.format("SIGTERM") in first.stderr
    assert "Traceback" not in first.stderr, first.stderr[-5000:]
    # Where it runs, without -v: the location, a fresh start, both addresses.
    line = start_line(first.stderr)
    assert f"Pipeline signals started, batches every 500 ms; checkpoint {checkpoint}: starting fresh; " \
           "dashboard http://127.0.0.1:" in line, line
    assert "; metrics http://127.0.0.1:" in line, line
    assert len([x for x in first.err if BATCH_LINE.search(x)]) >= 2, first.stderr[-5000:]
    # -v is for the scheduler's detail: not shown by default.
    assert "Added jobs for time" not in first.stderr

    status = read_status(CheckpointStorage(str(checkpoint), warn=False), SystemClock())
    assert status.state == "stopped"
    assert status.lease is not None and status.lease.released
    assert status.last_stop is not None and status.last_stop.how is StopHow.GRACEFUL
    assert "  last stop: graceful, at " in status.describe()

    second = Script([*run, "quiet"], tmp_path)
    assert second.stop_with(signal.SIGTERM) == 0, second.stderr[-5000:]
    line = start_line(second.stderr)
    assert re.search(r"checkpoint \S+: resuming from batch \S+Z; the last run stopped gracefully at \S+Z", line), line
    # log_batches=False: no line per batch.
    assert not [x for x in second.err if BATCH_LINE.search(x)], second.stderr[-5000:]


def test_ctrl_c_stops_a_library_pipeline_gracefully_and_its_lines_show_without_logging_configured(tmp_path):
    script, source, out, checkpoint = write_inputs(tmp_path)
    plain = Script([sys.executable, str(script), str(source), str(out), str(checkpoint), "loud"], tmp_path)
    assert plain.stop_with(signal.SIGINT) == 0, plain.stderr[-5000:]
    assert "after await_termination: True" in plain.out, plain.out
    assert "Traceback" not in plain.stderr and "KeyboardInterrupt" not in plain.stderr, plain.stderr[-5000:]
    assert STOPPING.format("SIGINT") in plain.stderr
    # The script configured no logging: batchline's INFO lines show on stderr all the same.
    assert f"checkpoint {checkpoint}: starting fresh" in start_line(plain.stderr)
    assert "dashboard" not in start_line(plain.stderr)  # off in library use unless asked for
    assert len([x for x in plain.err if BATCH_LINE.search(x)]) >= 2, plain.stderr[-5000:]
    assert "Pipeline signals stopped (graceful)" in plain.stderr
    status = read_status(CheckpointStorage(str(checkpoint), warn=False), SystemClock())
    assert (status.state, status.last_stop and status.last_stop.how) == ("stopped", StopHow.GRACEFUL)


def test_a_second_ctrl_c_stops_at_once_while_the_graceful_stop_waits_for_a_batch(tmp_path):
    script, source, out, checkpoint = write_inputs(tmp_path)
    hold, holding = Path(f"{checkpoint}-hold"), Path(f"{checkpoint}-holding")
    held = Script([sys.executable, str(script), str(source), str(out), str(checkpoint), "hold"], tmp_path)

    def hold_a_batch_then_ask_gracefully():
        hold.touch()
        (source / "b.json").write_text(json.dumps({"user": "z", "n": 9}) + "\n")
        wait_for(holding.exists, "a batch held in its task", 60)
        held.process.send_signal(signal.SIGINT)  # the graceful stop now waits for the held batch (up to 120 s)
        wait_for(lambda: any(STOPPING.format("SIGINT") in line for line in held.err), "the graceful stop", 30)

    started = time.monotonic()
    assert held.stop_with(signal.SIGINT, hold_a_batch_then_ask_gracefully, timeout_s=60) == 0, held.stderr[-5000:]
    assert time.monotonic() - started < 100  # not the graceful stop's 120 s
    assert "Stopping at once on SIGINT: cancelling running batches" in held.stderr
    assert "after await_termination: True" in held.out, held.out
    assert "Traceback" not in held.stderr and "KeyboardInterrupt" not in held.stderr, held.stderr[-5000:]
    status = read_status(CheckpointStorage(str(checkpoint), warn=False), SystemClock())
    assert (status.state, status.last_stop and status.last_stop.how) == ("stopped", StopHow.IMMEDIATE)
