"""A pipeline driver for the crash tests: JSON files in, JSON files out, checkpointed.

    python tests/drivers/chaos_driver.py IN OUT CHECKPOINT [--naive-sink | --jsonl-sink] [--kill-after-first-write]
                                 [--stateful] [--jsonl-out DIR] [--stateful-out DIR] [--event-time-out DIR]
                                 [--join-in DIR] [--master M]

``--naive-sink`` replaces batchline's file output by a plain Spark append (no commit
protocol); ``--jsonl-sink`` by the user's own exactly-once sink of ``examples/jsonl_sink.py``
(as ``stream.write(sink)``: its commit taken by the engine after the batch's jobs).
``--kill-after-first-write`` SIGKILLs this process right after the first batch
with rows has been written, before the batch is committed (once: a marker file remembers).
``--stateful`` writes, instead of the input rows, a running total and count per key ``n % 7``
after every batch, as ids ``k<key>-t<total>-c<count>``: a batch applied twice to the state,
or not at all, shows. ``--fail-once`` makes the state function raise once, in the middle
of a partition (give a master with task retries, e.g. ``local[2,2]``).

More outputs of the same run, beside OUT's (so that one driver, killed, tests them all):
``--jsonl-out DIR`` writes the input rows to DIR through the example's sink as well, and
``--stateful-out DIR`` writes the ``--stateful`` totals to DIR with batchline's file output
(its state named ``totals`` in the checkpoint, as with ``--stateful``);
``--event-time-out DIR`` writes a windowed count in append mode and a deduplication on event
time ``n`` seconds to DIR/windows and DIR/dedup (``write_event_time_outputs``). With
``--kill-after-first-write``, the kill comes once every file output (OUT's and
``--stateful-out``'s) has written the first batch with rows, before the batch is committed.
``--join-in DIR`` (with ``--event-time-out``) reads clicks from DIR as a second file input
and writes their full outer join with the input rows to DIR/join (``write_join_output``).
"""

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import IntegerType, StringType, StructField, StructType  # noqa: E402

from batchline import StreamingContext, StreamingListener, window  # noqa: E402
from batchline import aggregates as agg  # noqa: E402
from batchline.sinks.files import FileSink  # noqa: E402
from batchline.spark import local_spark_session  # noqa: E402
from tests.helpers import wait_for_go  # noqa: E402

SCHEMA = StructType([StructField("id", StringType(), False), StructField("n", IntegerType(), False)])


class Progress(StreamingListener):
    def on_batch_completed(self, info):
        print(f"completed {info.batch_time} {info.num_records}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("incoming")
    parser.add_argument("out")
    parser.add_argument("checkpoint")
    parser.add_argument("--naive-sink", action="store_true")
    parser.add_argument("--jsonl-sink", action="store_true")
    parser.add_argument("--kill-after-first-write", action="store_true")
    parser.add_argument("--stateful", action="store_true")
    parser.add_argument("--fail-once", action="store_true")
    parser.add_argument("--jsonl-out")
    parser.add_argument("--stateful-out")
    parser.add_argument("--event-time-out")
    parser.add_argument("--join-in")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--wait-for-go", action="store_true")  # tests.helpers.DriverProcess(warm=True)
    args = parser.parse_args()

    spark = local_spark_session(args.master, "chaos-driver", shuffle_partitions=2)
    if args.wait_for_go:
        wait_for_go()
    ssc = StreamingContext(spark, "500ms", checkpoint=args.checkpoint, checkpoint_interval="1s")
    ssc.add_listener(Progress())
    events = ssc.file_stream(args.incoming, "json", SCHEMA, settle=0, max_files_per_batch=1)
    totals = None
    if args.stateful or args.stateful_out:
        totals = events.with_column("k", F.col("n") % 7).group_by_key("k").flat_map_groups_with_state(
            make_running_total(args.checkpoint + ".failed" if args.fail_once else None),
            state_schema="total long, count long", output_schema="id string", name="totals",
            num_partitions=3)
    if args.stateful:
        events = totals
    marker = Path(args.checkpoint + ".killed")
    file_outputs = [args.out] + ([args.stateful_out] if args.stateful_out else [])
    written: dict[int, set[str]] = {}
    lock = threading.Lock()

    def writer(out):
        sink = FileSink(out, "json")

        def write(df, batch_time):
            if args.naive_sink:
                df.write.mode("append").json(out)
            else:
                sink.write(df, batch_time)
            if args.kill_after_first_write and not marker.exists() and df.take(1):
                with lock:
                    written.setdefault(int(batch_time), set()).add(out)
                    if len(written[int(batch_time)]) == len(file_outputs):
                        marker.write_text(str(batch_time))
                        os.kill(os.getpid(), signal.SIGKILL)

        return write

    if args.jsonl_sink:
        events.write(jsonl_sink().JsonLinesSink(args.out), name="out")
    else:
        events.foreach_batch(writer(args.out), name="out")
    if args.jsonl_out:
        events.write(jsonl_sink().JsonLinesSink(args.jsonl_out), name="jsonl")
    if args.stateful_out:
        totals.foreach_batch(writer(args.stateful_out), name="totals-out")
    if args.event_time_out:
        write_event_time_outputs(events, Path(args.event_time_out))
        if args.join_in:
            write_join_output(ssc, events, args.join_in, Path(args.event_time_out))
    print("started", flush=True)
    ssc.start()
    ssc.await_termination()


def write_event_time_outputs(events, out):
    """Event time ``n`` seconds: per key ``k = n % 3``, counts and sums of 30 s windows in
    append mode to ``out/windows``; and the input rows deduplicated on ``d = n % 400`` to
    ``out/dedup`` (the later duplicate, 400 s on, dropped). Each operator is its output's
    only reader, so it runs inside that output's job."""
    timed = events.with_column("ts", F.timestamp_seconds("n")).with_watermark("ts", "5 seconds")
    windows = (timed.with_column("k", F.col("n") % 3)
               .group_by_key(window("ts", "30 seconds"), "k")
               .aggregate(agg.count(), agg.sum("n"), output_mode="append", name="windows", num_partitions=2))
    windows.write_files(str(out / "windows"), "json", name="windows-out")
    firsts = timed.with_column("d", F.col("n") % 400).drop_duplicates("d", name="dedup", num_partitions=2)
    firsts.write_files(str(out / "dedup"), "json", name="dedup-out")


CLICKS = StructType([StructField("cid", StringType(), False), StructField("k", IntegerType(), False),
                     StructField("m", IntegerType(), False)])


def write_join_output(ssc, events, clicks_in, out):
    """The input rows (event time ``n`` s, key ``n``) full-outer-joined with the clicks of
    ``clicks_in`` (event time ``m`` s, key ``k``) within 10 s after the row, both with a 5 s
    watermark, to ``out/join`` as ids ``j<id>-<cid>`` (``-`` for a side without a match)."""
    rows = events.with_column("ts", F.timestamp_seconds("n")).with_column("k", F.col("n")) \
        .with_watermark("ts", "5 seconds")
    clicks = ssc.file_stream(clicks_in, "json", CLICKS, settle=0, max_files_per_batch=1) \
        .with_column("cts", F.timestamp_seconds("m")).with_watermark("cts", "5 seconds")
    joined = rows.join(clicks, "k", how="full", within=("ts", "cts", "0 seconds", "10 seconds"), name="join",
                       num_partitions=2)
    ids = joined.select(F.concat(F.lit("j"), F.coalesce("id", F.lit("-")), F.lit("-"),
                                 F.coalesce("cid", F.lit("-"))).alias("id"))
    ids.write_files(str(out / "join"), "json", name="join-out")


def jsonl_sink():
    """The example's module, pickled into the tasks by value (the workers cannot import it)."""
    from pyspark import cloudpickle

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import jsonl_sink

    cloudpickle.register_pickle_by_value(jsonl_sink)
    return jsonl_sink


def make_running_total(fail_marker):
    def running_total(key, rows, state):
        total, count = state.get() if state.exists else (0, 0)
        for row in rows:
            total, count = total + row.n, count + 1
        if fail_marker and count > 40 and key == 3:
            try:
                os.close(os.open(fail_marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                raise RuntimeError("injected task failure")
        state.update((total, count))
        yield (f"k{key}-t{total}-c{count}",)

    return running_total


if __name__ == "__main__":
    main()
