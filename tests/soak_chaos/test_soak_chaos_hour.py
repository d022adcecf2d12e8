"""An hour of the chaos soak (tests/cluster/soak_chaos.py): the driver killed at random every
30-120 s, an executor killed every 2-4 minutes, the S3 endpoint down for 10-30 s every 4-8
minutes, a state snapshot damaged once; at the end the output equals what any correct run
writes and every restart made progress.

Runs only when named: ``pytest -m soak_chaos`` (conftest.py deselects it otherwise).
``BATCHLINE_SOAK_CHAOS_S`` sets another length; ``BATCHLINE_SOAK_CHAOS_RECORD`` a file for the
run's record (faults of each kind, restarts, time to the first commit after each), which
BENCHMARKS.md reports.
"""

import json
import os
from pathlib import Path

from tests.cluster.soak_chaos import SoakSettings, run_soak_chaos


def test_an_hour_of_every_fault_at_once_ends_with_the_exact_output(standalone_cluster, s3_endpoint, tmp_path):
    # A file every 2 s (30 events a second): a driver killed every 30-120 s spends about a minute
    # starting, and the batches in between must still gain on the input.
    settings = SoakSettings(duration_s=float(os.environ.get("BATCHLINE_SOAK_CHAOS_S", "3600")), file_every_s=2.0)
    record = run_soak_chaos(standalone_cluster, s3_endpoint, tmp_path, settings)
    print(json.dumps(record.to_json(), indent=1), flush=True)
    if os.environ.get("BATCHLINE_SOAK_CHAOS_RECORD"):
        Path(os.environ["BATCHLINE_SOAK_CHAOS_RECORD"]).write_text(json.dumps(record.to_json(), indent=1) + "\n")
    assert record.driver_kills >= settings.duration_s / 120 and record.executor_kills >= 1, record
    assert record.s3_outages >= 1 and record.files_damaged == 1, record
