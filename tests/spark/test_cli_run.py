"""``batchline run PIPELINE.py``: a pipeline script whose state function lives in a module beside
it runs from any directory, because the script's folder is shipped to Spark's Python workers.
(``python PIPELINE.py`` from another directory finds the module on the driver only; the workers
fail with ModuleNotFoundError.)"""

import collections
import json
import subprocess
import sys
import textwrap

import pytest

PIPELINE = '''
import sys

import counting
from batchline import StreamingContext
from batchline.spark import local_spark_session


def main():
    out, checkpoint = sys.argv[1], sys.argv[2]
    spark = local_spark_session("local[2]", "batchline-run-test", shuffle_partitions=2)
    ssc = StreamingContext(spark, "200ms", checkpoint=checkpoint)
    events = ssc.generator_stream(1_000_000, users=4, total=200, max_records_per_batch=80, partitions=2,
                                  name="events")
    counts = events.group_by_key("id").flat_map_groups_with_state(
        counting.count, state_schema=counting.Seen, output_schema="id int, events long", name="counts",
        num_partitions=2)
    counts.write_files(out, "json", name="counts")
    finished = ssc.run_until_finished(timeout=120)
    print(f"pipeline {'finished' if finished else 'did not finish'}: {ssc.dashboard_url} {ssc.metrics_url}",
          flush=True)
    spark.stop()


main()
'''

COUNTING = '''
from dataclasses import dataclass


@dataclass
class Seen:
    count: int


def count(key, rows, state):
    seen = state.get() if state.exists else Seen(0)
    total = seen.count + sum(1 for _ in rows)
    state.update(Seen(total))
    yield {"id": key, "events": total}
'''


def write_pipeline(folder):
    folder.mkdir()
    (folder / "pipeline.py").write_text(textwrap.dedent(PIPELINE))
    (folder / "counting.py").write_text(textwrap.dedent(COUNTING))


def read_counts(out):
    """Each batch's output rows, by batch time, from the committed files."""
    batches = collections.defaultdict(list)
    for path in sorted(out.glob("batch_time=*/*")):
        batch = int(path.parent.name.split("=", 1)[1])
        batches[batch] += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return dict(sorted(batches.items()))


@pytest.mark.spark  # the pipeline starts Spark in its own process
def test_run_ships_the_modules_beside_the_pipeline_to_the_workers(tmp_path):
    folder, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    write_pipeline(folder)
    elsewhere.mkdir()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    result = subprocess.run(
        [sys.executable, "-m", "batchline.cli.main", "run", "--no-dashboard", "--no-metrics",
         str(folder / "pipeline.py"), str(out), str(checkpoint)],
        cwd=elsewhere, capture_output=True, text=True, timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "ModuleNotFoundError" not in output, output[-5000:]
    assert "pipeline finished: None None" in result.stdout.splitlines(), output[-5000:]  # no dashboard, no metrics

    batches = read_counts(out)
    # 200 events in batches of 80, 80 and 40, over 4 users: each batch gives each of its users' running count.
    assert len(batches) == 3, batches
    finals, added = {}, []
    for rows in batches.values():
        ids = [row["id"] for row in rows]
        assert len(ids) == len(set(ids))  # one row per user and batch
        added.append(sum(row["events"] - finals.get(row["id"], 0) for row in rows))
        for row in rows:
            assert row["events"] > finals.get(row["id"], 0), (row, finals)
            finals[row["id"]] = row["events"]
    assert added == [80, 80, 40]  # the state carried each user's count from batch to batch
    assert set(finals) <= {0, 1, 2, 3} and len(finals) > 1
    assert list(elsewhere.iterdir()) == []
