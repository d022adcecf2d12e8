"""Issue 17's two rows on a real standalone cluster (``harness.cluster.StandaloneCluster``: a
master and two one-core workers) with the tests' S3 endpoint (``harness.servers.S3Server``):

A. Restart after kill -9 to the first batch with new rows (``benchmarks.checkpoint_restart``'s
   drivers and timing, on the cluster): batchline with its checkpoint and output on the S3
   endpoint against Structured Streaming on the same input and history, alternating, median of
   the repeats. Structured Streaming's checkpoint goes through Hadoop's file systems and pip's
   PySpark has no S3 connector, so it stays on local disk (an advantage to it); batchline is
   also run with its checkpoint on local disk, to compare like with like and to see what the
   S3 checkpoint costs. Both read their input from local disk (the executors are on this
   machine) and write their output to the S3 endpoint through batchline's ``FileSink``.
   batchline's driver and executors start from the class-data archives untimed first restarts
   write (``batchline.class_archive``, in a cache of the benchmark's own); Structured
   Streaming's start as Spark ships.
B. A 400-event batch of the cluster tests' pipeline (checkpoint and output on S3, 500 ms
   interval; ``benchmarks.cluster_batch_driver``) against a bare PySpark job of the same shape
   in the same driver, after a warm-up round of both, the side going first alternating. The
   engine's batch time is its progress record's processing plus commit (first job start to
   commit marker written); its generation overlaps the batch before (``max_batches_ahead``),
   so it is given apart.

``--s3-latency-ms`` delays every answer of the S3 endpoint by that much, as a round trip to S3
itself takes (20-50 ms; moto on loopback answers in a few): what counts there is how many
round trips follow one another, not how many requests the endpoint's CPU serves. Its figures
go to ``cluster_s3_<N>ms.json``. ``--case`` runs one case only (its name ends the file's).

    python -m benchmarks.cluster [--repeats 3] [--batches 30] [--warmup 5] [--s3-latency-ms N]
        [--case both|restart|batch]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from batchline.class_archive import CACHE_DIR, archive_dir, is_whole
from benchmarks.checkpoint_restart import Restart, restart_time
from benchmarks.machine import write_result
from harness.cluster import StandaloneCluster
from harness.servers import S3Server

RESTARTS = {
    "batchline": ("batchline", "s3"),
    "sss": ("sss", "local"),
    "batchline_local_checkpoint": ("batchline", "local"),
}
"""Each restart case: the driver's engine and where its checkpoint is."""


def restart_case(cluster: StandaloneCluster, s3: S3Server, repeats: int) -> dict[str, Any]:
    samples: dict[str, list[Restart]] = {case: [] for case in RESTARTS}
    # Untimed: batchline's first driver JVM to exit writes the class-data archive the timed ones
    # start from (``batchline.class_archive``), as ``benchmarks.checkpoint_restart`` does. It writes
    # it as it exits, after the driver's kill; the next start settles it. An executor writes the
    # executors' archive once a session has run 20 s, which a restart's drivers may not
    # outlive: untimed restarts go on until both are written.
    for _ in range(_UNTIMED_RESTARTS):
        print(f"untimed restart: {_restart(cluster, s3, *RESTARTS['batchline']).first_batch_s:.2f} s", flush=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "spark" not in _archives_written():
            time.sleep(1)
        if _archives_written() >= {"spark", "executor"}:
            break
    archives = sorted(_archives_written())
    print(f"class-data archives written: {archives}", flush=True)
    for _ in range(repeats):
        for case, (engine, checkpoint) in RESTARTS.items():
            restart = _restart(cluster, s3, engine, checkpoint)
            samples[case].append(restart)
            print(f"restart {case}: {restart.first_batch_s:.2f} s (session up at {restart.session_s:.2f} s, "
                  f"{restart.rows_before} rows re-run first)", flush=True)
    medians = {case: round(statistics.median(r.first_batch_s for r in rs), 2) for case, rs in samples.items()}
    return {
        "median_s": medians,
        "samples_s": {case: [round(r.first_batch_s, 2) for r in rs] for case, rs in samples.items()},
        # Process start to SparkSession up (JVM, app registered; executors come after), and
        # the rows of a re-run of the batch the kill cut short, which comes before the new rows.
        "session_up_s": {case: [round(r.session_s, 2) for r in rs] for case, rs in samples.items()},
        "rows_re_run_first": {case: [r.rows_before for r in rs] for case, rs in samples.items()},
        "ratio": round(medians["batchline"] / medians["sss"], 3),
        "ratio_both_checkpoints_local": round(medians["batchline_local_checkpoint"] / medians["sss"], 3),
        "goal_ratio": 0.8,
        # Whose archives batchline's timed restarts started from (``spark``: the driver's).
        "class_data_archives": archives,
        "checkpoint": {"batchline": "S3 endpoint", "sss": "local disk (no Hadoop S3 connector in pip's PySpark)",
                       "batchline_local_checkpoint": "local disk"},
    }


_UNTIMED_RESTARTS = 3


def _archives_written() -> set[str]:
    """Whose class-data archives are written, whole: ``spark`` (the driver's), ``executor``."""
    found = [*archive_dir().glob("*.jsa"), *(p for p in archive_dir().glob("*.part") if is_whole(p))]
    return {path.name.split("-", 1)[0] for path in found}


def _restart(cluster: StandaloneCluster, s3: S3Server, engine: str, checkpoint: str) -> Restart:
    run = f"restart-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="batchline-cluster-", ignore_cleanup_errors=True) as root:
        location = f"s3://batchline-test/{run}/checkpoint" if checkpoint == "s3" else str(Path(root) / "checkpoint")
        where = [f"s3://batchline-sink/{run}/out", location, "--master", cluster.url,
                 "--storage-options", json.dumps(s3.storage_options)]
        return restart_time(engine, Path(root), where)


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def batch_case(cluster: StandaloneCluster, s3: S3Server, rounds: int, batches: int, warmup: int) -> dict[str, Any]:
    run = f"batches-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cluster_batch_driver", cluster.url, f"s3://batchline-test/{run}",
         f"s3://batchline-sink/{run}", json.dumps(s3.storage_options), "--rounds", str(rounds),
         "--batches", str(batches)],
        capture_output=True, text=True, cwd=Path(__file__).parent.parent, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the batch driver failed ({done.returncode}):\n{done.stderr[-5000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    bare = [ms for samples in result["bare_ms"] for ms in samples[warmup:]]
    # The batches with the input's events; after them come a batch in which the state operator
    # finds its input ended, and the empty batches that were due meanwhile.
    rounds_of_data = [[r for r in samples if r["records"]][warmup:] for samples in result["engine"]]
    records = [r for samples in rounds_of_data for r in samples]
    assert all(r["status"] == "completed" and r["records"] == 400 for r in records), records
    assert len(records) == rounds * (batches - warmup), f"{len(records)} batches with events"
    batch = [r["processing_ms"] + r["commit_ms"] for r in records]
    # Completion to completion within a round: what the pipeline sustains while it is behind.
    spacing = [b["completed_ms"] - a["completed_ms"] for samples in rounds_of_data
               for a, b in zip(samples, samples[1:], strict=False)]
    jobs = sorted({kind for r in records for kind in r["jobs_ms"]})
    engine_ms, bare_ms = statistics.median(batch), statistics.median(bare)
    return {
        "events_per_batch": 400,
        "interval_ms": 500,
        "rounds": rounds,
        "batches_per_round": batches,
        "warmup_batches_per_round": warmup,
        "engine_batch_ms_median": _median(batch),
        "engine_batch_ms_p90": round(statistics.quantiles(batch, n=10)[-1], 1),
        "bare_pyspark_ms_median": _median(bare),
        "bare_pyspark_ms_p90": round(statistics.quantiles(bare, n=10)[-1], 1),
        "ratio": round(engine_ms / bare_ms, 3),
        "goal_ratio": 1.2,
        "where_the_engine_batch_goes_ms_median": {
            "processing": _median([r["processing_ms"] for r in records]),
            **{f"{kind}_job": _median([r["jobs_ms"].get(kind, 0) for r in records]) for kind in jobs},
            "commit": _median([r["commit_ms"] for r in records]),
            "generation_overlapping": _median([r["generation_ms"] for r in records]),
            "checkpoint_on_its_thread": _median([r["checkpoint_ms"] for r in records if r["checkpoint_ms"]]
                                                or [0]),
        },
        "engine_completion_spacing_ms_median": _median(spacing),
        "keeps_up_with_500ms": statistics.median(spacing) <= 500,
        "samples_ms": {"engine_batch": [[r["processing_ms"] + r["commit_ms"] for r in samples]
                                        for samples in rounds_of_data],
                       "bare_pyspark": [[round(ms) for ms in samples[warmup:]] for samples in result["bare_ms"]]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="restarts per case; rounds of case B")
    parser.add_argument("--batches", type=int, default=30, help="batches per round of case B, each side")
    parser.add_argument("--warmup", type=int, default=5, help="batches of each round of case B not counted")
    parser.add_argument("--s3-latency-ms", type=float, default=0, help="added to every answer of the S3 endpoint")
    parser.add_argument("--case", choices=("both", "restart", "batch"), default="both")
    args = parser.parse_args()
    # The drivers, the cluster's JVMs and their executors inherit it: loopback only.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Case B's driver imports the tests' pipeline (harness.numbering): the executors unpickle
    # its functions by module, so they need the repository on their path too.
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the S3 endpoint's line per request
    work = Path(tempfile.mkdtemp(prefix="batchline-bench-cluster-"))
    # A class-data archive of this benchmark's own runs, not of whatever ran on the machine before.
    os.environ[CACHE_DIR] = str(work / "cache")
    s3 = S3Server(latency_ms=args.s3_latency_ms).start()
    cluster = StandaloneCluster(work / "cluster")
    result: dict[str, Any] = {"s3_latency_ms": args.s3_latency_ms} if args.s3_latency_ms else {}
    try:
        cluster.start()
        if args.case in ("both", "restart"):
            result["restart"] = restart_case(cluster, s3, args.repeats)
            print(json.dumps(result["restart"], indent=2), flush=True)
        if args.case in ("both", "batch"):
            result["small_batch"] = batch_case(cluster, s3, args.repeats, args.batches, args.warmup)
            print(json.dumps(result["small_batch"], indent=2), flush=True)
    finally:
        cluster.stop()
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)
    name = "cluster" + (f"_s3_{args.s3_latency_ms:g}ms" if args.s3_latency_ms else "") + (
        "" if args.case == "both" else f"_{args.case}")
    print(f"wrote {write_result(name, result)}")


if __name__ == "__main__":
    main()
