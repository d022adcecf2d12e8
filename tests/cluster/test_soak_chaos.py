"""Five minutes of the chaos soak (tests/cluster/soak_chaos.py) in CI's chaos tier: the driver
killed 30-70 s after its start (and a few seconds after its first commit), an executor every
1-2 minutes, the S3 endpoint down for 10-30 s every 1-2 minutes, a file damaged once; the
output equals what any correct run writes. The hour: ``pytest -m soak_chaos`` (tests/soak_chaos/)."""

import json

from tests.cluster.soak_chaos import SoakSettings, run_soak_chaos


def test_five_minutes_of_every_fault_at_once_end_with_the_exact_output(standalone_cluster, s3_endpoint, tmp_path):
    settings = SoakSettings(duration_s=300, driver_life_s=(30, 70), executor_every_s=(60, 120),
                            outage_every_s=(60, 120), outage_s=(10, 30), file_every_s=2.0)
    record = run_soak_chaos(standalone_cluster, s3_endpoint, tmp_path, settings)
    print(json.dumps(record.to_json()), flush=True)
    assert record.driver_kills >= 3 and record.executor_kills >= 1 and record.s3_outages >= 1, record
    assert record.files_damaged == 1, record
