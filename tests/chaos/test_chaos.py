"""kill -9 a real driver at random moments; the output must equal an uninterrupted run's:
nothing lost, nothing duplicated."""

import collections
import json
import os
import random
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.helpers import DRIVERS, ROOT, DriverProcess, in_background, poll_until

DRIVER = DRIVERS / "chaos_driver.py"
EXAMPLES = ROOT / "examples"
FILES, PER_FILE = 30, 20


def start_driver(incoming, out, checkpoint, *flags, warm=False) -> DriverProcess:
    return DriverProcess(DRIVER, incoming, out, checkpoint, *flags, warm=warm)


def write_inputs(incoming):
    incoming.mkdir()
    for f in range(FILES):
        rows = [{"id": f"f{f:02d}-r{r:02d}", "n": f * PER_FILE + r} for r in range(PER_FILE)]
        (incoming / f"events-{f:02d}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_clicks(clicks):
    """The second input of ``--join-in``, a file for each input file: a click 3 s after each
    row whose ``n`` is a multiple of 4 (key ``n``), and one without a row to meet (key ``-n``)
    for each ``n`` ending in 5."""
    clicks.mkdir()
    for f in range(FILES):
        rows = []
        for n in range(f * PER_FILE, (f + 1) * PER_FILE):
            if n % 4 == 0:
                rows.append({"cid": f"c{n}", "k": n, "m": n + 3})
            if n % 10 == 5:
                rows.append({"cid": f"x{n}", "k": -n, "m": n})
        (clicks / f"clicks-{f:02d}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))


def expected_join_ids():
    """What ``--join-in`` writes once every file was read: each row and its click; each row
    without one, and each click without one, once the watermark (both streams' newest time
    minus 5 s: 594 s) says none can come: a row once 10 s and 1 ms after it lie before the
    watermark, a click once 1 ms after it does (Spark's state watermarks)."""
    watermark_ms = (FILES * PER_FILE - 1 - 5) * 1000
    ids = []
    for n in range(FILES * PER_FILE):
        row = f"f{n // PER_FILE:02d}-r{n % PER_FILE:02d}"
        if n % 4 == 0:
            ids.append(f"j{row}-c{n}")
        elif n * 1000 <= watermark_ms - 10_001:
            ids.append(f"j{row}--")
        if n % 10 == 5 and n * 1000 <= watermark_ms - 1:
            ids.append(f"j--x{n}")
    return collections.Counter(ids)


def visible_rows(out):
    """What a plain reader sees: every visible JSON part file's rows."""
    for directory, subdirs, files in os.walk(out):
        subdirs[:] = [d for d in subdirs if not d.startswith(("_", "."))]  # readers skip these
        for name in files:
            if name.startswith("part-"):
                text = Path(directory, name).read_text()
                yield from (json.loads(line) for line in text.splitlines() if line.strip())


def output_ids(out):
    return collections.Counter(row["id"] for row in visible_rows(out))


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


def expected_event_time_ids():
    """What ``--event-time-out`` writes once every file was read: the 30 s windows of event
    time ``n`` s that the watermark (the newest ``n`` minus 5 s) has passed, per key ``n % 3``,
    with their counts and sums (as ``window_ids`` names them); and the first row of each
    ``n % 400`` (the input ids of ``n < 400``)."""
    newest = FILES * PER_FILE - 1
    windows = collections.Counter()
    for start in range(0, newest - 5 - 30 + 1, 30):
        for k in range(3):
            ns = [n for n in range(start, start + 30) if n % 3 == k]
            windows[f"w{k}-{start}-c{len(ns)}-s{sum(ns)}"] += 1
    firsts = collections.Counter(f"f{n // PER_FILE:02d}-r{n % PER_FILE:02d}" for n in range(400))
    return windows, firsts


def window_ids(out):
    """The windowed counts a plain reader sees, as ``w<key>-<start s>-c<count>-s<sum>``."""
    def name(row):
        start = datetime.fromisoformat(row["window_start"].replace("Z", "+00:00"))
        return f"w{row['k']}-{round(start.timestamp())}-c{row['count']}-s{row['sum_n']}"

    return collections.Counter(name(row) for row in visible_rows(out))


def jsonl_ids(out):
    """What a reader of the example's JSON-lines output sees: the rows its commit records name."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        from jsonl_sink import committed_rows
    finally:
        sys.path.remove(str(EXAMPLES))
    return collections.Counter(row["id"] for row in committed_rows(str(out)))


def finish(driver, out, *, timeout=180, expected=FILES * PER_FILE, read=output_ids, more=()):
    """Let a started driver run until every expected record is in the output (as ``read``
    sees it; and in each ``(out, expected, read)`` of ``more``) and a few more batches
    passed; then kill it."""
    outputs = [(out, expected, read), *more]
    deadline = time.monotonic() + timeout
    try:
        if not poll_until(lambda: all(sum(r(o).values()) >= e for o, e, r in outputs) and len(driver.completed) >= 3,
                          timeout, 0.2, stop=lambda: driver.process.poll() is not None):
            if driver.process.poll() is not None:
                return driver
            raise TimeoutError("the driver did not finish the input; outputs have "
                               f"{[sum(r(o).values()) for o, _, r in outputs]} of {[e for _, e, _ in outputs]}")
        seen = len(driver.completed)
        poll_until(lambda: len(driver.completed) >= seen + 2, max(0.0, deadline - time.monotonic()), 0.1)
        return driver
    finally:
        driver.kill()


def run_to_completion(incoming, out, checkpoint, *flags, timeout=180, expected=FILES * PER_FILE, read=output_ids,
                      more=()):
    """Run a driver until every expected record is in the output (as ``read`` sees it) and a
    few more batches passed."""
    return finish(start_driver(incoming, out, checkpoint, *flags), out, timeout=timeout, expected=expected, read=read,
                  more=more)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The input files, written once: every test reads them and none changes them."""
    incoming = tmp_path_factory.mktemp("chaos-inputs") / "in"
    write_inputs(incoming)
    write_clicks(incoming.parent / "clicks")
    return incoming


ALL_IDS = collections.Counter(f"f{f:02d}-r{r:02d}" for f in range(FILES) for r in range(PER_FILE))


def test_random_kill_9s_of_three_outputs_lose_and_duplicate_nothing(spark, tmp_path, inputs):
    """One driver writes three outputs of the same input files: the input rows with batchline's
    file output, the same rows through the example's ``JsonLinesSink`` (a user's own
    ``ExactlyOnceSink``: its commit taken by the engine after the batch's jobs), and running
    totals per key of a stateful operator with batchline's file output (a batch whose state
    change was applied twice, or lost, would write totals an uninterrupted run never writes);
    besides, a windowed count in append mode and a deduplication on event time: each window
    emitted once with its count and sum, each key's first row once; and a full outer join of
    the rows with a second file input (clicks): each pair once, each row or click without a
    match once.
    It is killed anywhere (starting Spark, recovering, staging, committing, checkpointing);
    every output then equals an uninterrupted run's: nothing lost, nothing duplicated."""
    def outputs(root):
        return root / "out", root / "jsonl-out", root / "stateful-out", root / "checkpoint"

    def flags(root):
        _, jsonl, stateful, _ = outputs(root)
        return ("--jsonl-out", jsonl, "--stateful-out", stateful, "--event-time-out", root / "event-time",
                "--join-in", inputs.parent / "clicks")

    totals_expected = expected_totals()
    windows_expected, firsts_expected = expected_event_time_ids()
    join_expected = expected_join_ids()

    def finish_all(driver, root):
        out, jsonl, stateful, _ = outputs(root)
        return finish(driver, out, timeout=300, more=[(jsonl, FILES * PER_FILE, jsonl_ids),
                                                      (stateful, sum(totals_expected.values()), output_ids),
                                                      (root / "event-time" / "windows", len(windows_expected),
                                                       window_ids),
                                                      (root / "event-time" / "dedup", len(firsts_expected),
                                                       output_ids),
                                                      (root / "event-time" / "join", sum(join_expected.values()),
                                                       output_ids)])

    # The uninterrupted run, on checkpoint and outputs of its own, alongside the kills.
    reference = tmp_path / "reference"
    reference_done = in_background(
        lambda: finish_all(start_driver(inputs, outputs(reference)[0], outputs(reference)[3], *flags(reference)),
                           reference))

    root = tmp_path / "killed"
    out, jsonl, stateful, checkpoint = outputs(root)
    rng = random.Random(20261121)
    kills, kills_mid_run, kills_after_commits = 0, 0, 0
    # The drivers killed after `started` are started warm, each while the one before it runs.
    warm = start_driver(inputs, out, checkpoint, *flags(root), warm=True)
    try:
        for attempt in range(22):
            if attempt % 5 == 4:
                driver = start_driver(inputs, out, checkpoint, *flags(root))  # cold: the kill lands in its start-up
                time.sleep(rng.uniform(0.5, 3.0))  # during start-up and recovery
            else:
                driver = warm
                driver.go()
                warm = start_driver(inputs, out, checkpoint, *flags(root), warm=True)
                assert driver.started.wait(60), "the driver did not start"
                kills_mid_run += 1
                if attempt % 5 in (1, 3):  # within the batches after one completed: staging, commit, checkpoint
                    poll_until(lambda d=driver: d.completed, 60, 0.05,
                               stop=lambda d=driver: d.process.poll() is not None)
                    time.sleep(rng.uniform(0.0, 1.5))
                else:  # anywhere in batch generation, job execution and checkpoint writing
                    time.sleep(rng.uniform(0.0, 4.0))
            kills_after_commits += bool(driver.completed)
            driver.kill()
            kills += 1
            seen = duckdb_ids(out)
            assert seen == output_ids(out) and set(seen.values()) <= {1}, "DuckDB sees what the plain reader does not"
            assert set(jsonl_ids(jsonl).values()) <= {1}, "a row was committed twice"
            assert set(output_ids(stateful).values()) <= {1}, "a running total was written twice"
            assert set(window_ids(root / "event-time" / "windows").values()) <= {1}, "a window was emitted twice"
            assert set(output_ids(root / "event-time" / "dedup").values()) <= {1}, "a first row passed twice"
            assert set(output_ids(root / "event-time" / "join").values()) <= {1}, "a joined row was written twice"

        reference_done()
        expected = output_ids(outputs(reference)[0])
        assert sorted(expected) == sorted(ALL_IDS)
        assert set(expected.values()) == {1}
        assert jsonl_ids(outputs(reference)[1]) == ALL_IDS
        assert output_ids(outputs(reference)[2]) == totals_expected
        assert window_ids(reference / "event-time" / "windows") == windows_expected
        assert output_ids(reference / "event-time" / "dedup") == firsts_expected
        assert output_ids(reference / "event-time" / "join") == join_expected

        warm.go()
        finish_all(warm, root)
    finally:
        warm.kill()
    got = output_ids(out)
    assert kills >= 20 and kills_mid_run >= 15
    assert kills_after_commits >= 3, f"only {kills_after_commits} kills came after a batch completed"
    duplicated = {k: v for k, v in got.items() if v > 1}
    missing = set(expected) - set(got)
    assert not duplicated, f"duplicated records: {sorted(duplicated)[:10]}"
    assert not missing, f"lost records: {sorted(missing)[:10]}"
    assert got == expected
    assert jsonl_ids(jsonl) == ALL_IDS

    # Every window emitted once, final, with the uninterrupted run's count and sum; every key's first row once.
    assert window_ids(root / "event-time" / "windows") == windows_expected
    assert output_ids(root / "event-time" / "dedup") == firsts_expected
    # Each pair once, each row and click without a match once.
    assert output_ids(root / "event-time" / "join") == join_expected

    got_totals = output_ids(stateful)
    assert got_totals == totals_expected, (f"missing {sorted(set(totals_expected) - set(got_totals))[:5]}, "
                                           f"unexpected {sorted(set(got_totals) - set(totals_expected))[:5]}")
    from batchline.state import read_state

    state = {row["k"]: (row["total"], row["count"]) for row in read_state(spark, str(checkpoint), "totals").collect()}
    totals: dict[int, tuple[int, int]] = {}
    for n in range(FILES * PER_FILE):
        total, count = totals.get(n % 7, (0, 0))
        totals[n % 7] = (total + n, count + 1)
    assert state == totals


def test_the_same_kill_duplicates_output_without_the_commit_protocol(tmp_path, inputs):
    """The kill lands after a batch's output was written and before the batch committed. The
    plain append and batchline's output run side by side, each in drivers of its own."""
    def killed_then_restarted(out, checkpoint, *flags):
        first = start_driver(inputs, out, checkpoint, *flags, "--kill-after-first-write")
        assert first.wait_exit(120) != 0  # it killed itself with SIGKILL
        run_to_completion(inputs, out, checkpoint, *flags)
        return output_ids(out)

    naive_done = in_background(killed_then_restarted, tmp_path / "naive-out", tmp_path / "naive-checkpoint",
                               "--naive-sink")
    safe = killed_then_restarted(tmp_path / "safe-out", tmp_path / "safe-checkpoint")
    naive = naive_done()
    assert any(count > 1 for count in naive.values()), "a plain append should have written a batch twice"
    assert set(safe.values()) == {1} and len(safe) == FILES * PER_FILE


def test_a_kill_and_restart_on_a_cluster_master_with_separate_executors(tmp_path, inputs):
    """local-cluster starts executor processes of their own: files, checkpoint and outputs all
    live at locations every executor reaches, nothing on the driver alone. The driver writes
    the input rows and a stateful pipeline's running totals, and kills itself once both
    outputs wrote the first batch with rows: state files are written by executor processes
    at the checkpoint location, and a restarted driver's executors (new processes) read them
    back."""
    expected = expected_totals()
    out, stateful, checkpoint = tmp_path / "out", tmp_path / "stateful-out", tmp_path / "checkpoint"
    master = ("--master", "local-cluster[2,1,1024]")
    first = start_driver(inputs, out, checkpoint, "--stateful-out", stateful, "--kill-after-first-write", *master)
    assert first.wait_exit(180) != 0
    run_to_completion(inputs, out, checkpoint, "--stateful-out", stateful, *master, timeout=240,
                      more=[(stateful, sum(expected.values()), output_ids)])
    got = output_ids(out)
    assert set(got.values()) == {1} and len(got) == FILES * PER_FILE
    assert output_ids(stateful) == expected


def test_a_task_that_fails_once_is_retried_without_applying_its_batch_twice(tmp_path, inputs):
    """The state function raises once, after other keys of its partition were processed; the
    retried task starts again from the state before the batch."""
    expected = expected_totals()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    run_to_completion(inputs, out, checkpoint, "--stateful", "--fail-once", "--master", "local[2,2]",
                      expected=sum(expected.values()))
    assert Path(str(checkpoint) + ".failed").exists(), "the failure was not injected"
    assert output_ids(out) == expected
