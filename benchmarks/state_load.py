"""Loading one state partition from S3: its files read four at a time against one at a time.

A worker reads a partition's files when it loads it afresh (a restarted driver's first batch,
a rescale, ``batchline state``) or catches a copy several versions behind up. On an object
store each read is a round trip, so what counts is how many follow one another. This loads
one partition of a session-like state (``KEYS`` keys, a snapshot and ``DELTAS`` deltas of
``CHANGED`` keys each, as the per-key path writes them) from the tests' S3 endpoint
(``harness.servers.S3Server``), each answer delayed by ``--s3-latency-ms`` (as S3's own
round trip; 0: moto on loopback as it is), and catches a copy ``BEHIND`` versions behind up by
the versions the driver names. Each is timed with ``FileStateStore.reads_at_once`` 4 (what an
object store gets) and 1 (one file after another, as before), alternating, median of the
repeats.

    python -m benchmarks.state_load [--repeats 7] [--s3-latency-ms 0,20]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import statistics
import time
from typing import Any

import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

from batchline.checkpoint.storage import CheckpointStorage
from batchline.examples.sessionization import UserSession
from batchline.state.execution import load_partition
from batchline.state.schema import RowSchema
from batchline.state.store import DELTA, SNAPSHOT, FileHeader, FileStateStore, entries_table
from benchmarks.machine import write_result
from harness.servers import S3Server

KEYS, DELTAS, CHANGED, BEHIND = 20_000, 9, 2_000, 4
STATE = RowSchema.of(UserSession)
KEY_SCHEMA = StructType([StructField("user", LongType())])


def _entries(users: range, version: int) -> pa.Table:
    at = dt.datetime.fromtimestamp(version / 1000, dt.UTC)
    rows = ((user, STATE.unmake(UserSession(user, at, at, [f"event-{user}-{version}"] * 5)), version + 60_000)
            for user in users)
    return entries_table(KEY_SCHEMA, STATE, rows, True)


def _write_partition(store: FileStateStore) -> list[int]:
    """A snapshot at version 1000, then ``DELTAS`` deltas; the versions, oldest first."""
    versions = [1000 * (n + 1) for n in range(DELTAS + 1)]
    store.write_version(0, FileHeader(versions[0], 0, SNAPSHOT), _entries(range(KEYS), versions[0]))
    store.write_version(0, FileHeader(versions[0], 0, DELTA, first=True), _entries(range(KEYS), versions[0]))
    for n, version in enumerate(versions[1:], 1):
        start = (n * CHANGED) % KEYS
        store.write_version(0, FileHeader(version, 0, DELTA), _entries(range(start, start + CHANGED), version))
    return versions


def _timed(store: FileStateStore, at_once: int, versions: list[int]) -> tuple[float, float]:
    """Seconds to load the newest version afresh, and to catch a copy ``BEHIND`` versions behind up."""
    store.reads_at_once = at_once
    began = time.perf_counter()
    loaded = load_partition(store, STATE, True, 0, 0, versions[-1])
    fresh = time.perf_counter() - began
    assert loaded.version == versions[-1] and len(loaded.entries) == KEYS
    held = load_partition(store, STATE, True, 0, 0, versions[-1 - BEHIND])
    began = time.perf_counter()
    caught_up = load_partition(store, STATE, True, 0, 0, versions[-1], held=held)
    behind = time.perf_counter() - began
    assert caught_up.version == versions[-1]
    return fresh, behind


def measure(latency_ms: float, repeats: int) -> dict[str, Any]:
    server = S3Server(latency_ms=latency_ms).start()
    try:
        storage = CheckpointStorage(f"s3://batchline-test/state-load-{latency_ms:g}ms", server.storage_options)
        store = FileStateStore(storage, "sessions")
        versions = _write_partition(store)
        _timed(store, 4, versions)  # untimed: the client's connections and the code paths warm
        samples: dict[int, list[tuple[float, float]]] = {4: [], 1: []}
        for _ in range(repeats):
            for at_once in (4, 1):
                samples[at_once].append(_timed(store, at_once, versions))
    finally:
        server.stop()
    result: dict[str, Any] = {"s3_latency_ms": latency_ms}
    for what, index in (("load_afresh", 0), ("catch_up", 1)):
        side = {f"{n}_at_once_s": round(statistics.median(s[index] for s in samples[n]), 3) for n in (4, 1)}
        side["ratio"] = round(side["4_at_once_s"] / side["1_at_once_s"], 3)
        result[what] = side
    return result


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the S3 endpoint's line per request
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--s3-latency-ms", default="0,20")
    args = parser.parse_args()
    figures = {
        "keys": KEYS, "deltas_after_the_snapshot": DELTAS, "keys_changed_per_delta": CHANGED,
        "catch_up_versions": BEHIND, "repeats": args.repeats,
        "runs": [measure(float(ms), args.repeats) for ms in args.s3_latency_ms.split(",")],
    }
    print(json.dumps(figures, indent=2))
    print(f"wrote {write_result('state_load', figures)}")


if __name__ == "__main__":
    main()
