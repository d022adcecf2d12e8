"""kill -9 a real driver at random moments; the output must equal an uninterrupted run's:
nothing lost, nothing duplicated."""

import collections
import json
import os
import random
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import DRIVERS, ROOT, DriverProcess, poll_until

DRIVER = DRIVERS / "chaos_driver.py"
EXAMPLES = ROOT / "examples"
FILES, PER_FILE = 30, 20


def start_driver(incoming, out, checkpoint, *flags) -> DriverProcess:
    return DriverProcess(DRIVER, incoming, out, checkpoint, *flags)


def write_inputs(incoming):
    incoming.mkdir()
    for f in range(FILES):
        rows = [{"id": f"f{f:02d}-r{r:02d}", "n": f * PER_FILE + r} for r in range(PER_FILE)]
        (incoming / f"events-{f:02d}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))


def output_ids(out):
    """What a plain reader sees: every visible JSON part file's rows."""
    ids = []
    for directory, subdirs, files in os.walk(out):
        subdirs[:] = [d for d in subdirs if not d.startswith(("_", "."))]  # readers skip these
        for name in files:
            if name.startswith("part-"):
                text = Path(directory, name).read_text()
                ids += [json.loads(line)["id"] for line in text.splitlines() if line.strip()]
    return collections.Counter(ids)


def duckdb_ids(out):
    """What DuckDB reads of the output with a ``**`` glob, which skips no ``_`` or ``.`` names:
    a staged or uncommitted file under the output would show here."""
    import duckdb

    if not any(Path(out).rglob("*.json")):
        return collections.Counter()
    rows = duckdb.sql(f"select id from read_json('{out}/**/*.json', format='newline_delimited', "
                      "columns={'id': 'VARCHAR'})").fetchall()
    return collections.Counter(row[0] for row in rows)


def expected_totals():
    """The ids the ``--stateful`` driver writes: after each file (one per batch), each touched
    key's running total and count."""
    totals: dict[int, tuple[int, int]] = {}
    ids = []
    for f in range(FILES):
        touched = set()
        for r in range(PER_FILE):
            n = f * PER_FILE + r
            total, count = totals.get(n % 7, (0, 0))
            totals[n % 7] = (total + n, count + 1)
            touched.add(n % 7)
        ids += [f"k{k}-t{totals[k][0]}-c{totals[k][1]}" for k in touched]
    return collections.Counter(ids)


def jsonl_ids(out):
    """What a reader of the example's JSON-lines output sees: the rows its commit records name."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        from jsonl_sink import committed_rows
    finally:
        sys.path.remove(str(EXAMPLES))
    return collections.Counter(row["id"] for row in committed_rows(str(out)))


def run_to_completion(incoming, out, checkpoint, *flags, timeout=180, expected=FILES * PER_FILE, read=output_ids):
    """Run a driver until every expected record is in the output (as ``read`` sees it) and a
    few more batches passed."""
    driver = start_driver(incoming, out, checkpoint, *flags)
    deadline = time.monotonic() + timeout
    try:
        if not poll_until(lambda: sum(read(out).values()) >= expected and len(driver.completed) >= 3, timeout,
                          0.2, stop=lambda: driver.process.poll() is not None):
            if driver.process.poll() is not None:
                return driver
            raise TimeoutError(f"the driver did not finish the input; output has {sum(read(out).values())}")
        seen = len(driver.completed)
        poll_until(lambda: len(driver.completed) >= seen + 2, max(0.0, deadline - time.monotonic()), 0.1)
        return driver
    finally:
        driver.kill()


@pytest.fixture
def inputs(tmp_path):
    write_inputs(tmp_path / "in")
    return tmp_path / "in"


def test_random_kill_9s_lose_and_duplicate_nothing(tmp_path, inputs):
    reference = tmp_path / "reference-out"
    run_to_completion(inputs, reference, tmp_path / "reference-checkpoint")
    expected = output_ids(reference)
    assert sorted(expected) == sorted(f"f{f:02d}-r{r:02d}" for f in range(FILES) for r in range(PER_FILE))
    assert set(expected.values()) == {1}

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    rng = random.Random(20261121)
    kills, kills_mid_run = 0, 0
    for attempt in range(22):
        driver = start_driver(inputs, out, checkpoint)
        if attempt % 5 == 4:
            time.sleep(rng.uniform(0.5, 3.0))  # during start-up and recovery
        else:
            assert driver.started.wait(60), "the driver did not start"
            # Anywhere in batch generation, job execution and checkpoint writing.
            time.sleep(rng.uniform(0.0, 3.0))
            kills_mid_run += 1
        driver.kill()
        kills += 1
        seen = duckdb_ids(out)
        assert seen == output_ids(out) and set(seen.values()) <= {1}, "DuckDB sees what the plain reader does not"
    run_to_completion(inputs, out, checkpoint)
    got = output_ids(out)
    assert kills >= 20 and kills_mid_run >= 15
    duplicated = {k: v for k, v in got.items() if v > 1}
    missing = set(expected) - set(got)
    assert not duplicated, f"duplicated records: {sorted(duplicated)[:10]}"
    assert not missing, f"lost records: {sorted(missing)[:10]}"
    assert got == expected


def test_random_kill_9s_of_a_users_own_exactly_once_sink_lose_and_duplicate_nothing(tmp_path, inputs):
    """The example's ``JsonLinesSink`` (an ``ExactlyOnceSink``: its commit taken by the engine
    after the batch's jobs): killed anywhere (staging, committing, checkpointing, recovering),
    every input row is read from its committed output exactly once."""
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    rng = random.Random(31)
    kills_after_commits = 0
    for kill in range(6):
        driver = start_driver(inputs, out, checkpoint, "--jsonl-sink")
        assert driver.started.wait(60), "the driver did not start"
        if kill % 2:
            time.sleep(rng.uniform(0.0, 3.0))  # anywhere: starting Spark, recovering, running batches
        else:  # within the batches after one committed: staging, commit, checkpoint
            poll_until(lambda d=driver: d.completed, 60, 0.05, stop=lambda d=driver: d.process.poll() is not None)
            time.sleep(rng.uniform(0.0, 1.5))
        kills_after_commits += bool(driver.completed)
        driver.kill()
        assert set(jsonl_ids(out).values()) <= {1}, "a row was committed twice"
    run_to_completion(inputs, out, checkpoint, "--jsonl-sink", read=jsonl_ids)
    assert kills_after_commits >= 3, f"only {kills_after_commits} kills came after a batch completed"
    assert jsonl_ids(out) == collections.Counter(f"f{f:02d}-r{r:02d}" for f in range(FILES) for r in range(PER_FILE))


def test_the_same_kill_duplicates_output_without_the_commit_protocol(tmp_path, inputs):
    """The kill lands after a batch's output was written and before the batch committed."""
    naive_out = tmp_path / "naive-out"
    first = start_driver(inputs, naive_out, tmp_path / "naive-checkpoint", "--naive-sink", "--kill-after-first-write")
    assert first.wait_exit(120) != 0  # it killed itself with SIGKILL
    run_to_completion(inputs, naive_out, tmp_path / "naive-checkpoint", "--naive-sink")
    naive = output_ids(naive_out)
    assert any(count > 1 for count in naive.values()), "a plain append should have written a batch twice"

    safe_out = tmp_path / "safe-out"
    first = start_driver(inputs, safe_out, tmp_path / "safe-checkpoint", "--kill-after-first-write")
    assert first.wait_exit(120) != 0
    run_to_completion(inputs, safe_out, tmp_path / "safe-checkpoint")
    safe = output_ids(safe_out)
    assert set(safe.values()) == {1} and len(safe) == FILES * PER_FILE


def test_a_kill_and_restart_on_a_cluster_master_with_separate_executors(tmp_path, inputs):
    """local-cluster starts executor processes of their own: files, checkpoint and output all
    live at locations every executor reaches, nothing on the driver alone."""
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    master = ("--master", "local-cluster[2,1,1024]")
    first = start_driver(inputs, out, checkpoint, "--kill-after-first-write", *master)
    assert first.wait_exit(180) != 0
    run_to_completion(inputs, out, checkpoint, *master, timeout=240)
    got = output_ids(out)
    assert set(got.values()) == {1} and len(got) == FILES * PER_FILE


def test_random_kill_9s_of_a_stateful_pipeline_give_the_state_and_output_of_an_uninterrupted_run(
        spark, tmp_path, inputs):
    """Running totals per key: a batch whose state change were applied twice (or lost) would
    write totals that an uninterrupted run never writes."""
    expected = expected_totals()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    rng = random.Random(4)
    for attempt in range(8):
        driver = start_driver(inputs, out, checkpoint, "--stateful")
        assert driver.started.wait(60), "the driver did not start"
        time.sleep(rng.uniform(1.0, 4.0) if attempt % 4 else rng.uniform(0.0, 1.0))
        driver.kill()
    run_to_completion(inputs, out, checkpoint, "--stateful", expected=sum(expected.values()))
    got = output_ids(out)
    assert got == expected, (f"missing {sorted(set(expected) - set(got))[:5]}, "
                             f"unexpected {sorted(set(got) - set(expected))[:5]}")
    from batchline.state import read_state

    state = {row["k"]: (row["total"], row["count"]) for row in read_state(spark, str(checkpoint), "totals").collect()}
    totals: dict[int, tuple[int, int]] = {}
    for n in range(FILES * PER_FILE):
        total, count = totals.get(n % 7, (0, 0))
        totals[n % 7] = (total + n, count + 1)
    assert state == totals


def test_a_stateful_pipeline_survives_a_kill_on_a_cluster_master(tmp_path, inputs):
    """State files are written by executor processes at the checkpoint location, and a
    restarted driver's executors (new processes) read them back."""
    expected = expected_totals()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    master = ("--master", "local-cluster[2,1,1024]")
    first = start_driver(inputs, out, checkpoint, "--stateful", "--kill-after-first-write", *master)
    assert first.wait_exit(180) != 0
    run_to_completion(inputs, out, checkpoint, "--stateful", *master, timeout=240,
                      expected=sum(expected.values()))
    assert output_ids(out) == expected


def test_a_task_that_fails_once_is_retried_without_applying_its_batch_twice(tmp_path, inputs):
    """The state function raises once, after other keys of its partition were processed; the
    retried task starts again from the state before the batch."""
    expected = expected_totals()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    run_to_completion(inputs, out, checkpoint, "--stateful", "--fail-once", "--master", "local[2,2]",
                      expected=sum(expected.values()))
    assert Path(str(checkpoint) + ".failed").exists(), "the failure was not injected"
    assert output_ids(out) == expected
