"""Your own exactly-once sink: JSON lines into a directory, a commit record per batch, as
``stream.write(JsonLinesSink("/data/out"), name="jsonl")``. Each task writes its partition to
a file of its own; a batch is committed once its record ``_commits/<batch time>.json``, naming
its files, is created, exclusively: a hard link of a whole temporary file, which fails if the
record exists (a record of the same content is this commit done before; another one is another
driver's, and this commit fails). A driver whose lease token is older than the newest record's
is fenced off. ``committed_rows`` reads only the files records name (not those of a crash or a
failed task); a batch run again after a crash is skipped.

Run it:  python examples/jsonl_sink.py OUT_DIR [EVENTS]

writes EVENTS generated events (default 1000; columns id, data, is_last, ts) through the sink
into OUT_DIR/events, with the checkpoint in OUT_DIR/checkpoint, and once every event is
committed prints ``committed 1000 rows in OUT_DIR/events``. Ctrl-C stops it gracefully; run it
again with the same OUT_DIR and it goes on where it stopped (or, finished, writes nothing),
never writing a row twice.
"""

import json
import os
import sys
import uuid

from batchline import ExactlyOnceSink
from batchline.checkpoint.lease import FencedError


class JsonLinesSink(ExactlyOnceSink):
    def __init__(self, directory):
        self.directory = os.path.abspath(directory)

    def is_committed(self, batch):  # on the driver, before the batch runs
        return os.path.exists(_record(self.directory, batch.batch_time))

    def write_partition(self, rows, attempt, partition):  # in a Spark task; returns its message
        name = f"{attempt.batch_time}-{partition:05d}-{attempt.id}.jsonl"
        lines = "".join(json.dumps(row, default=str) + "\n" for batch in rows for row in batch.to_pylist())
        _write_whole(os.path.join(self.directory, name), lines, rename=True)
        return name

    def commit(self, messages, attempt):  # on the driver, once the batch's tasks all succeeded
        token, path = attempt.batch.fencing_token, _record(self.directory, attempt.batch_time)
        records = _records(self.directory)  # a newer driver's commits carry a newer lease token
        newest = _read(records[-1])["fencing_token"] if records else token
        if newest > token:
            raise FencedError(f"lease token {token} is older than token {newest} of a newer driver's commit")
        record = json.dumps({"files": messages, "fencing_token": token})
        temp = _write_whole(path, record)
        try:
            os.link(temp, path)  # created exclusively: fails if the record exists
        except FileExistsError:
            if _read(path) != json.loads(record):  # not this commit done before: another driver's
                raise
        finally:
            os.remove(temp)

    def abort(self, messages, attempt):  # a task failed or another output did: drop the files
        for name in messages:  # an error here is logged; files no record names are never read
            os.remove(os.path.join(self.directory, name))


def committed_rows(directory):
    """Every row of every committed batch, batch by batch: what a reader of the output sees."""
    for record in _records(directory):
        for file in _read(record)["files"]:
            with open(os.path.join(directory, file)) as lines:
                yield from (json.loads(line) for line in lines)


def _records(directory):  # the commit records' paths, in batch order
    commits = os.path.join(directory, "_commits")
    names = sorted(n for n in os.listdir(commits) if n.endswith(".json")) if os.path.isdir(commits) else []
    return [os.path.join(commits, name) for name in names]


def _read(path):
    with open(path) as record:
        return json.load(record)


def _record(directory, batch_time):  # zero-padded: records sort in batch order
    return os.path.join(directory, "_commits", f"{int(batch_time):015d}.json")


def _write_whole(path, text, rename=False):  # a whole temporary file beside path (renamed to it)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(temp, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    if rename:
        os.replace(temp, path)
    return temp


def main(args):
    from batchline import StreamingContext
    from batchline.spark import local_spark_session

    out, events = args[0], int(args[1]) if len(args) > 1 else 1000
    spark = local_spark_session(app_name="jsonl-sink")
    ssc = StreamingContext(spark, "500ms", checkpoint=f"{out}/checkpoint")
    ssc.generator_stream(rate=500, total=events).write(JsonLinesSink(f"{out}/events"), name="jsonl")
    ssc.run_until_finished()
    print(f"committed {sum(1 for _ in committed_rows(f'{out}/events'))} rows in {out}/events", flush=True)


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if a != "--"])
