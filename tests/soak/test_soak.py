"""Memory over a long run (issue 19, SPEC E6): 20,000 batches of the seed's sessionization on a
manual clock keep the driver's and the Python workers' resident memory within 10% of where it
stood after batch 1,000.

It takes about 1.5 hours on 2 cores, so it runs only when asked for: ``pytest -m soak`` (the
``soak`` marker is left out of every other selection, see conftest.py).
``BATCHLINE_SOAK_BATCHES`` runs fewer batches (at least 2,000). The run is
``benchmarks/soak.py`` with the fixed heap the README recommends for a long-running driver; its
samples stream to the test's output (``-s`` shows them as they come), and the figures are
printed at the end.
"""

import json
import os
import subprocess
import sys

from tests.helpers import ROOT

BASELINE = 1_000
BOUND_PERCENT = 10.0


def test_resident_memory_stays_within_ten_percent_of_batch_1000(tmp_path):
    batches = int(os.environ.get("BATCHLINE_SOAK_BATCHES", "20000"))
    assert batches >= 2 * BASELINE, f"BATCHLINE_SOAK_BATCHES is at least {2 * BASELINE}; got {batches}"
    output = tmp_path / "soak.json"
    command = [sys.executable, "-m", "benchmarks.soak", "--batches", str(batches), "--baseline", str(BASELINE),
               "--every", "500", "--fixed-heap", "--output", str(output)]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True, timeout=6 * 3600)  # its samples stream to this test's output
    figures = json.loads(output.read_text())
    growth = figures["growth_percent_since_baseline"]
    first, last = figures["samples_kib"][0], figures["samples_kib"][-1]
    print(f"after {batches} batches, resident memory since batch {BASELINE}: " + ", ".join(
        f"{kind} {'+' if percent >= 0 else ''}{percent}%" for kind, percent in growth.items() if percent is not None)
        + f"; at the last batch (KiB): driver {last['driver']}, JVM {last['jvm']}, Python workers "
        f"{last['python_workers']} (batch 1: {first['driver']}, {first['jvm']}, {first['python_workers']})")
    assert growth["driver"] is not None and growth["driver"] <= BOUND_PERCENT, growth
    assert growth["python_workers"] is not None and growth["python_workers"] <= BOUND_PERCENT, growth
