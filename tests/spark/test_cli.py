"""The command line as a newcomer meets it: the demo as a real process, and a clear word without Java."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

SUMMARY = re.compile(
    r"^batch \d{4}-\d\d-\d\dT[\d:.]+Z \| (\d+) records \| scheduling delay -?\d+ ms \| processing time \d+ ms"
)


@pytest.mark.spark  # the demo starts Spark in its own process
def test_demo_prints_batches_and_stops_gracefully_on_ctrl_c():
    process = subprocess.Popen(
        # 2 s batches (the demo's default): a cold first batch takes about 9 s on this machine, and
        # with 1 s batches the graceful stop's ten intervals could not drain the backlog it leaves.
        [sys.executable, "-m", "batchline.cli.main", "demo", "--rate", "250", "--batch-interval", "2s",
         "--master", "local[2]"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    summaries: list[str] = []
    two_batches = threading.Event()

    def read():
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if SUMMARY.match(line):
                summaries.append(line)
                if len(summaries) >= 2:
                    two_batches.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert two_batches.wait(120), "no batch summaries from the demo:\n" + "\n".join(lines[-30:])
        # The demo prints where its dashboard and metrics are, and both answer while it runs.
        addresses = dict(line.split(": ", 1) for line in lines if line.startswith(("dashboard: ", "metrics:   ")))
        dashboard, metrics = addresses["dashboard"].strip(), addresses["metrics"].strip()
        assert dashboard.startswith("http://127.0.0.1:") and metrics.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(dashboard + "api/snapshot", timeout=10) as response:
            assert json.load(response)["status"]["name"] == "batchline-demo"
        with urllib.request.urlopen(metrics, timeout=10) as response:
            assert "batchline_batches_total" in response.read().decode()
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(10)
    output = "\n".join(lines)
    assert "Stopping gracefully" in output
    assert lines[-1] == "Stopped gracefully."
    assert "Batch: " in output and "|user|started" in output and "|closed_by" in output
    assert all(re.search(r"sessions: \d+ keys in state, \d+ out", s) for s in summaries), summaries
    # The generator emits 250 events/s: every full batch after the first carries 500 records.
    counts = [int(SUMMARY.match(s).group(1)) for s in summaries]
    assert 500 in counts[1:], counts


def _batchline_command() -> str:
    """The ``batchline`` script the install put beside this interpreter, as a user runs it."""
    script = Path(sys.executable).with_name("batchline")
    assert script.exists(), f"{script} is missing: install the package with the README's first command"
    return str(script)


@pytest.mark.spark  # the demo starts Spark in its own process
def test_demo_runs_batches_for_a_duration_and_stops_gracefully(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    result = subprocess.run(
        [_batchline_command(), "demo", "--rate", "200", "--batch-interval", "1s", "--master", "local[2]",
         "--duration", "8", "--checkpoint", str(checkpoint)],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    summaries = [line for line in result.stdout.splitlines() if SUMMARY.match(line)]
    assert len(summaries) >= 2, output[-3000:]
    assert f"checkpoints in {checkpoint}" in result.stdout
    assert "Ran for 8 s; stopping gracefully..." in result.stdout
    assert result.stdout.splitlines()[-1] == "Stopped gracefully."
    assert "Traceback" not in output
    assert any(checkpoint.iterdir()), "the demo wrote no checkpoint"


def _run_cli_without_java(tmp_path, path_dirs):
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = os.pathsep.join(str(d) for d in path_dirs)
    return subprocess.run([sys.executable, "-m", "batchline.cli.main", "demo", "--duration", "1"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def test_cli_without_java_says_so_without_a_traceback(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    result = _run_cli_without_java(tmp_path, [empty])
    assert result.returncode != 0
    assert "no java was found on PATH" in result.stderr, result.stderr
    assert "Install Java 17" in result.stderr and "JAVA_HOME" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "Py4J" not in result.stderr and "py4j" not in result.stderr


def test_cli_with_an_old_java_names_the_version_found(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "java"
    fake.write_text('#!/bin/sh\necho \'openjdk version "11.0.22" 2024-01-16\' >&2\n')
    fake.chmod(0o755)
    result = _run_cli_without_java(tmp_path, [bin_dir])
    assert result.returncode != 0
    assert f"{fake} (from PATH) is Java 11" in result.stderr, result.stderr
    assert "Spark needs Java 17 or newer" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_the_batch_summary_names_retries_and_excluded_executors():
    from batchline.observe.summary import summary_line
    from batchline.scheduler.listener import BatchInfo, ExcludedExecutor

    info = BatchInfo(1_795_000_000_000, 1_795_000_000_000, 1_795_000_000_100, 1_795_000_000_900, attempts=2,
                     excluded_executors=[ExcludedExecutor("3", "10.0.0.7", 1_795_000_000_500)])
    line = summary_line(info)
    assert "ran 2 times" in line
    assert "excluded executors: 3 on 10.0.0.7 since 2026-11-18T" in line
