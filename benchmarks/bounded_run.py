"""One side of ``benchmarks/bounded.py``, in a process of its own: a backfill of the
sessionization over JSON-lines files, from process start to exit.

    python -m benchmarks.bounded_run batchline|peer INPUT_DIR OUTPUT_DIR CHECKPOINT_DIR FILES_PER_BATCH

- ``batchline``: ``file_stream(..., bounded=True, max_files_per_batch=k)``, ``with_watermark``,
  ``flat_map_groups_with_state`` with event-time timeouts, ``write_files`` (parquet), and
  ``run_until_finished()``.
- ``peer``: Spark Structured Streaming, ``readStream.json`` with ``maxFilesPerTrigger=k``,
  ``withWatermark``, ``applyInPandasWithState`` with event-time timeouts, the parquet file
  sink, ``trigger(availableNow=True)`` and ``awaitTermination()``.

Both close a user's session at an ``is_last`` event or after a minute of event time without
events (benchmarks/sessionization.py's sessions, in event time: see ``bounded.py``). Each
side prints ``mark <what> <epoch s>`` lines for its phases and one ``batch ...`` line per
batch; the measuring process reads them.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

STARTED = time.time()  # only after the interpreter's own start-up; the parent times the process
GAP_MS = 60_000  # a session ends after a minute of event time without events
WATERMARK_DELAY = "10 seconds"
PARTITIONS = 4


_PRINT = threading.Lock()


def emit(line: str) -> None:
    """One whole line on stdout: the scheduler's threads log while the main thread marks."""
    with _PRINT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def mark(what: str, at: float | None = None) -> None:
    emit(f"mark {what} {time.time() if at is None else at:.3f}")


# ------------------------------------------------------------------ what a side prints
def instrument_batchline(ssc: Any, operator: str) -> None:
    """Print ``log <epoch s> <message>`` for batchline's log lines that mark phases of the run
    and one ``batch ...`` line per completed batch with ``operator``'s progress (the lines
    ``bounded.batchline_figures`` reads)."""
    from batchline import StreamingListener

    class Marks(logging.Handler):
        """``log <epoch s> <message>`` for the lines that mark phases of the run."""

        PREFIXES = ("Pipeline ", "Starting job", "Final checkpoint written",
                    "Bounded input", "Operator ", "Input ", "Generating jobs",
                    "Generated ")

        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if message.startswith(self.PREFIXES):
                emit(f"log {record.created:.3f} {message}")

    log = logging.getLogger("batchline")
    log.setLevel(logging.DEBUG)
    log.addHandler(Marks())
    log.propagate = False

    class Batches(StreamingListener):
        def on_batch_completed(self, info: Any) -> None:
            progress = info.state_operators.get(operator)
            if info.failure is not None:
                emit(f"failed {info.batch_time} {info.failure}")
                return
            fields = (info.batch_time, info.num_records, info.processing_start_time, info.processing_end_time,
                      progress.keys_called if progress else 0, progress.timed_out if progress else 0,
                      progress.output_rows if progress else 0, progress.late_rows if progress else 0,
                      progress.state_keys if progress else 0)
            emit("batch " + " ".join(str(f) for f in fields) + f" {time.time():.3f}")

    ssc.add_listener(Batches())


def emit_peer_progress(query: Any) -> None:
    """One ``batch ...`` line per progress of a finished Structured Streaming query (the lines
    ``bounded.peer_figures`` reads)."""
    for p in query.recentProgress:
        operators = p.get("stateOperators") or [{}]
        started = _iso_epoch(p["timestamp"])
        fields = (p["batchId"], p["numInputRows"], round(started * 1000),
                  round(started * 1000) + p["durationMs"].get("triggerExecution", 0),
                  operators[0].get("numRowsTotal", 0), operators[0].get("numRowsDroppedByWatermark", 0),
                  p.get("eventTime", {}).get("watermark", ""))
        emit("batch " + " ".join(str(f) for f in fields))


# ------------------------------------------------------------------ batchline
def run_batchline(input_dir: str, output_dir: str, checkpoint: str, files_per_batch: int) -> None:
    import datetime as dt
    from collections.abc import Iterator

    from batchline import StreamingContext
    from batchline.examples.sessionization import ClosedSession, UserSession
    from batchline.sources.generator import USER_EVENT_SCHEMA
    from batchline.spark import local_spark_session
    from batchline.state import GroupState, GroupStateTimeout

    mark("imported")
    gap = dt.timedelta(milliseconds=GAP_MS)

    def update_session(user: int, events: Iterator[Any], state: GroupState[UserSession]) -> Iterator[ClosedSession]:
        """``examples/sessionization.py``'s ``update_session`` in event time: a gap of more
        than a minute between two events of the user also closes the session, so the sessions
        do not depend on where the batches cut the input."""
        if state.has_timed_out:
            closed = state.get()
            state.remove()
            yield ClosedSession(user, closed.started, closed.last_seen, len(closed.events), "timeout")
            return
        session: UserSession | None = state.get_option()
        for event in sorted(events, key=lambda e: e.ts):
            if session is not None and event.ts - session.last_seen > gap:
                yield ClosedSession(user, session.started, session.last_seen, len(session.events), "timeout")
                session = None
            if session is None:
                session = UserSession(user, event.ts, event.ts)
            session.events.append(event.data)
            session.last_seen = max(session.last_seen, event.ts)
            if event.is_last:
                yield ClosedSession(user, session.started, session.last_seen, len(session.events), "last event")
                session = None
        if session is None:
            state.remove()
        else:
            state.update(session)
            state.set_timeout_timestamp(session.last_seen, f"{GAP_MS} ms")

    spark = local_spark_session("local[2]", "bench-bounded", shuffle_partitions=PARTITIONS)
    mark("spark")
    ssc = StreamingContext(spark, "1s", checkpoint=checkpoint)
    instrument_batchline(ssc, "sessions")
    events = ssc.file_stream(input_dir, "json", USER_EVENT_SCHEMA, bounded=True, max_files_per_batch=files_per_batch,
                             name="events")
    sessions = events.with_watermark("ts", WATERMARK_DELAY).group_by_key("id").flat_map_groups_with_state(
        update_session, state_schema=UserSession, output_schema=ClosedSession, timeout=GroupStateTimeout.EVENT_TIME,
        name="sessions", num_partitions=PARTITIONS)
    sessions.write_files(output_dir, format="parquet", name="out")
    ssc.run_until_finished()
    mark("finished")
    spark.stop()
    mark("spark_stopped")


# ------------------------------------------------------------------ the peer
def run_peer(input_dir: str, output_dir: str, checkpoint: str, files_per_batch: int) -> None:
    from collections.abc import Iterator

    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout as SparkTimeout
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from batchline.sources.generator import USER_EVENT_SCHEMA
    from batchline.spark import local_spark_session

    mark("imported")
    # PySpark 4.3's applyInPandasWithState cannot read an array in its state schema (its worker
    # fails with KeyError: 'elementType'), so the session's events are joined in one string,
    # as in benchmarks/sessionization.py.
    state_schema = StructType([StructField("started", LongType()), StructField("last_seen", LongType()),
                               StructField("events", StringType())])
    sep = "\x1f"
    output_schema = StructType([StructField("user", LongType()), StructField("started", LongType()),
                                StructField("ended", LongType()), StructField("events", LongType()),
                                StructField("closed_by", StringType())])
    columns = output_schema.fieldNames()

    def update_session(key: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        """The batchline side's function for pandas frames (benchmarks/sessionization.py's shape)."""
        user = int(key[0])
        if state.hasTimedOut:
            started, last_seen, events = state.get
            state.remove()
            yield pd.DataFrame([(user, started, last_seen, len(events.split(sep)), "timeout")], columns=columns)
            return
        session = state.getOption
        session = (session[0], session[1], session[2].split(sep)) if session is not None else None
        closed = []
        pdf = pd.concat(list(frames)).sort_values("ts")  # a key's rows may come in several frames
        for ts, is_last, data in zip(pdf["ts"].astype("int64") // 1_000_000, pdf["is_last"], pdf["data"],
                                     strict=True):
            ts = int(ts)
            if session is not None and ts - session[1] > GAP_MS:
                closed.append((user, session[0], session[1], len(session[2]), "timeout"))
                session = None
            if session is None:
                session = (ts, ts, [])
            session[2].append(data)
            session = (session[0], max(session[1], ts), session[2])
            if is_last:
                closed.append((user, session[0], session[1], len(session[2]), "last event"))
                session = None
        if session is None:
            state.remove()
        else:
            state.update((session[0], session[1], sep.join(session[2])))
            state.setTimeoutTimestamp(session[1] + GAP_MS)
        if closed:
            yield pd.DataFrame(closed, columns=columns)

    spark = local_spark_session("local[2]", "bench-bounded-peer", shuffle_partitions=PARTITIONS)
    mark("spark")
    query = (
        spark.readStream.schema(USER_EVENT_SCHEMA).option("maxFilesPerTrigger", files_per_batch).json(input_dir)
        .withWatermark("ts", WATERMARK_DELAY)
        .groupBy("id")
        .applyInPandasWithState(update_session, output_schema, state_schema, "append", SparkTimeout.EventTimeTimeout)
        .writeStream.format("parquet").option("path", output_dir).option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    finish_peer(spark, query)


def _iso_epoch(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def finish_peer(spark, query) -> None:
    """Wait for Structured Streaming's query to end, print its progress, stop Spark; each step marked."""
    mark("query_started")
    query.awaitTermination()
    mark("finished")
    emit_peer_progress(query)
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    spark.stop()
    mark("spark_stopped")


if __name__ == "__main__":
    side, input_dir, output_dir, checkpoint, files_per_batch = sys.argv[1:6]
    mark("python", STARTED)
    {"batchline": run_batchline, "peer": run_peer}[side](input_dir, output_dir, checkpoint, int(files_per_batch))

