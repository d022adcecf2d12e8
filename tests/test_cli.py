"""The demo, as a newcomer runs it: a real process, stopped with Ctrl-C."""

import os
import re
import signal
import subprocess
import sys
import threading

SUMMARY = re.compile(
    r"^batch \d{4}-\d\d-\d\dT[\d:.]+Z \| (\d+) records \| scheduling delay -?\d+ ms \| processing time \d+ ms"
)


def test_demo_prints_batches_and_stops_gracefully_on_ctrl_c():
    process = subprocess.Popen(
        [sys.executable, "-m", "batchline.cli.main", "demo", "--rate", "500", "--batch-interval", "1s",
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
    # The generator emits 500 events/s: every full batch after the first carries 500 records.
    counts = [int(SUMMARY.match(s).group(1)) for s in summaries]
    assert 500 in counts[1:], counts
