"""The numbering pipeline the cluster tests and ``benchmarks.cluster`` run: generator events
numbered per user with a count kept as state, so that any correct run writes the same rows
(an event lost, a batch applied twice or state lost shows as a missing, repeated or
renumbered row). The tests' driver is ``tests/drivers/cluster_driver.py``.

Executors import this module (a state function made by ``make_numbering`` refers to it), so
a cluster running it has the repository's root on its ``PYTHONPATH`` (``harness.cluster`` does).
"""

import collections
import io
import os
import time
from pathlib import Path
from typing import Any

from batchline import StreamingContext
from batchline.scheduler.retry import RetryPolicy
from harness.cluster import WORKER_ENV

USERS, SEED = 40, 7


def executor_jvm_pid() -> int:
    """The executor JVM above this Python worker (a worker forked by the daemon, or the daemon)."""
    pid = os.getpid()
    while pid > 1:
        if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("this Python worker does not run under an executor JVM")


def make_numbering(faulty_worker, hold_file, hold_at):
    def number_events(user, rows, state):
        if faulty_worker is not None and os.environ.get(WORKER_ENV) == faulty_worker:
            raise RuntimeError(f"injected fault: tasks fail on test worker {faulty_worker}")
        (count,) = state.get() if state.exists else (0,)
        for row in sorted(rows, key=lambda r: int(r.data.split("-")[1])):
            index = int(row.data.split("-")[1])
            if hold_file and index == hold_at:
                hold(hold_file)
            count += 1
            yield (row.data, user, count)
        state.update((count,))

    return number_events


def hold(hold_file: str) -> None:
    try:
        fd = os.open(hold_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    jvm = executor_jvm_pid()
    os.write(fd, str(jvm).encode())
    os.close(fd)
    deadline = time.monotonic() + 120
    while Path(f"/proc/{jvm}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(1)  # the executor is gone: nothing reads this worker's answers any more


def numbering_pipeline(spark, checkpoint: str, out: str, options: dict, total: int,
                       number_events, input_dir: str | None = None) -> StreamingContext:
    """The pipeline the cluster tests (and ``benchmarks.cluster``) run: 400-event batches of the
    generator every 500 ms, numbered per user by ``number_events`` with state in 3 partitions,
    written as JSON; checkpoint and output at ``options``' endpoint.

    ``input_dir``: the events are JSON lines files there instead (``{"id": user, "data":
    "event-<index>"}``, see ``write_event_files``), read as a bounded file input two files a
    batch: each file is a map task of its own, and batchline counts the rows as Spark reads
    them (``observe``), where it knows the generator's counts from its plan."""
    ssc = StreamingContext(spark, "500ms", checkpoint=checkpoint, checkpoint_interval="1s",
                           checkpoint_storage_options=options,
                           retry=RetryPolicy(max_attempts=4, initial_backoff="1s", max_backoff="4s"))
    if input_dir is not None:
        events = ssc.file_stream(input_dir, "json", "id int, data string", bounded=True, max_files_per_batch=2,
                                 name="events")
    else:
        events = ssc.generator_stream(4000, users=USERS, seed=SEED, partitions=2, max_records_per_batch=400,
                                      total=total)
    numbered = events.group_by_key("id").flat_map_groups_with_state(
        number_events, state_schema="count long", output_schema="event string, user int, seq long",
        name="numbering", num_partitions=3)
    numbered.write_files(out, "json", storage_options=options)
    return ssc


def write_event_files(directory: Path, events: list[tuple[str, int]], files: int) -> None:
    """``events`` (``(data, user)`` in index order) as ``files`` JSON lines files in
    ``directory``, oldest first, so that a file input takes them in that order."""
    directory.mkdir(parents=True, exist_ok=True)
    size = -(-len(events) // files)
    now = time.time() - files - 10
    for number in range(files):
        path = directory / f"events-{number:03d}.json"
        chunk = events[number * size:(number + 1) * size]
        path.write_text("".join(f'{{"id": {user}, "data": "{data}"}}\n' for data, user in chunk))
        os.utime(path, (now + number, now + number))


def numbered_output(out: str, options: dict[str, Any]) -> collections.Counter:
    """What a plain reader sees of a numbering pipeline's output on S3: every visible part file
    (JSON or Parquet), each read by pyarrow, as ``(event, user, seq)`` rows and how often each
    was written."""
    import pyarrow.json as pa_json
    import pyarrow.parquet as pq
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    fs.invalidate_cache()
    root = out.removeprefix("s3://")
    rows: collections.Counter = collections.Counter()
    for path in fs.find(root):
        relative = path[len(root) + 1:]
        if relative.startswith(("_", ".")) or not relative.rsplit("/", 1)[-1].startswith("part-"):
            continue
        data = io.BytesIO(fs.cat_file(path))
        table = pq.read_table(data) if path.endswith(".parquet") else pa_json.read_json(data)
        rows.update(zip(table["event"].to_pylist(), table["user"].to_pylist(), table["seq"].to_pylist(),
                        strict=True))
    return rows
