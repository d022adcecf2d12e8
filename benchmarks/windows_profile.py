"""Where the batchline side of ``benchmarks/windows.py`` spends its time (``--profile``): a
separate run of the side, not the measured one, with

- Spark's event log: every task's executor run and CPU time, by job and stage (a stage runs
  Python when one of its RDDs is Python's or Arrow's: the state tasks, which merge the
  partials into the state and hand the rows out to the write in the same stage; the other
  stages are the JVM's: reading and the partial aggregation, the final aggregation and the
  shuffle into the state partitions);
- cProfile around every state task in the Python workers (the stateful operator's
  ``mapInArrow`` function, wrapped), from its first input batch to its last output batch,
  so reading the partials from the JVM and writing the rows back to it are in it.

cProfile slows Python down, so its figures are shares of the tasks' profiled time, not seconds
of the measured run.
"""

from __future__ import annotations

import collections
import cProfile
import json
import os
import pstats
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchline.state.execution import StateTask

ENV = "BENCH_WINDOWS_PROFILE"
"""Set to a directory, the batchline side of ``windows_run`` profiles into it."""
EVENTS_ONLY = "BENCH_WINDOWS_EVENTS_ONLY"
"""Set (to anything), only Spark's event log is written: the tasks run as measured."""

# The Python functions whose cumulative time the summary names (file suffix, function).
PARTS = {
    "state task (run_partition)": ("state/execution.py", "run_partition"),
    "reading the partial rows (markers, late rows)": ("state/execution.py", "_input_rows"),
    "state function calls (per key, or in bulk)": ("state/execution.py", "_call_function"),
    "merging in bulk (keys, entries, merge)": ("state/execution.py", "_merge_in_bulk"),
    "— the keys' entries as Arrow": ("state/entries.py", "table_of"),
    "— MergeIntoState.merge": ("state/aggregation.py", "merge"),
    "timing out in bulk": ("state/execution.py", "_time_out_in_bulk"),
    "applying the changes to the resident state": ("state/entries.py", "merge"),
    "MergeIntoState.__call__": ("state/aggregation.py", "__call__"),
    "MergeIntoState._merge": ("state/aggregation.py", "_merge"),
    "MergeIntoState._row_out": ("state/aggregation.py", "_row_out"),
    "state delta (encode)": ("state/execution.py", "_delta_table"),
    "rows out (encode)": ("state/execution.py", "_output_batch"),
    "loading a partition's state": ("state/execution.py", "load_partition"),
    "finish record": ("state/execution.py", "_record_finish"),
}


def install(directory: Path) -> dict[str, str]:
    """Wrap every state task in cProfile (dumps under ``directory/tasks``); the Spark settings
    of the event log (under ``directory/events``)."""
    from batchline.state import operator

    (directory / "tasks").mkdir(parents=True, exist_ok=True)
    original = operator.spark_task

    def spark_task(*args: Any, **kwargs: Any) -> StateTask:
        task = original(*args, **kwargs)
        # ``run``, not the task itself: an output that takes the state task's rows calls it.
        task.run = profiled(task.run, str(directory / "tasks"))  # type: ignore[method-assign]
        return task

    if not os.environ.get(EVENTS_ONLY):
        operator.spark_task = spark_task  # type: ignore[assignment]
    return event_log_conf(directory)


def event_log_conf(directory: Path) -> dict[str, str]:
    """The Spark settings that write the event log under ``directory/events``."""
    (directory / "events").mkdir(parents=True, exist_ok=True)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": (directory / "events").as_uri(),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}


def profiled(task: Callable[..., Iterator[Any]], directory: str) -> Callable[..., Iterator[Any]]:
    def run(*args: Any) -> Iterator[Any]:
        profile = cProfile.Profile()
        began = time.perf_counter()
        profile.enable()
        try:
            yield from task(*args)
        finally:
            profile.disable()
            name = f"{directory}/task-{os.getpid()}-{time.time_ns()}"
            profile.dump_stats(name + ".prof")
            Path(name + ".json").write_text(json.dumps({"wall_s": time.perf_counter() - began}))
    return run


def summarise(directory: Path, top: int = 15) -> dict[str, Any]:
    return {"spark_event_log": _event_log(directory / "events"), "python_state_tasks": _profiles(directory / "tasks",
                                                                                                   top)}


def _event_log(directory: Path) -> dict[str, Any]:
    """Executor run and CPU time summed by kind of stage (Python or JVM) and by job description."""
    jobs: dict[int, str] = {}
    stage_job: dict[int, int] = {}
    stage_rdds: dict[int, list[str]] = {}
    run_ms: collections.Counter[int] = collections.Counter()
    cpu_ms: collections.Counter[int] = collections.Counter()
    tasks: collections.Counter[int] = collections.Counter()
    for path in directory.rglob("*"):
        if not path.is_file() or path.name.startswith("appstatus"):
            continue
        for line in path.read_text().splitlines():
            event = json.loads(line)
            kind = event.get("Event")
            if kind == "SparkListenerJobStart":
                jobs[event["Job ID"]] = (event.get("Properties") or {}).get("spark.job.description") or "?"
                for stage in event["Stage IDs"]:
                    stage_job[stage] = event["Job ID"]
            elif kind == "SparkListenerStageCompleted":
                info = event["Stage Info"]
                # An RDD's name, or the plan node it runs (a ``MapInArrow`` is a MapPartitionsRDD).
                stage_rdds[info["Stage ID"]] = [r["Name"] + " " + json.loads(r.get("Scope") or "{}").get("name", "")
                                                for r in info.get("RDD Info", [])]
            elif kind == "SparkListenerTaskEnd" and event.get("Task Metrics"):
                stage = event["Stage ID"]
                run_ms[stage] += event["Task Metrics"]["Executor Run Time"]
                cpu_ms[stage] += event["Task Metrics"]["Executor CPU Time"] / 1e6
                tasks[stage] += 1
    by_kind: dict[str, dict[str, float]] = collections.defaultdict(lambda: {"run_s": 0.0, "cpu_s": 0.0, "tasks": 0})
    by_job: dict[str, float] = {}  # by job description: "batchline batch <ISO time>"
    rdds_by_kind: dict[str, set[str]] = collections.defaultdict(set)
    warm_up: collections.Counter[str] = collections.Counter()
    for stage in run_ms:
        description = jobs.get(stage_job.get(stage, -1), "?")
        if not description.startswith("batchline batch"):
            warm_up[description[:80]] += run_ms[stage] / 1000
            continue
        names = stage_rdds.get(stage, [])
        python = any("Python" in n or "Arrow" in n for n in names)
        kind = "python (state tasks, rows out, write)" if python else "jvm only"
        by_kind[kind]["run_s"] += run_ms[stage] / 1000
        by_kind[kind]["cpu_s"] += cpu_ms[stage] / 1000
        by_kind[kind]["tasks"] += tasks[stage]
        rdds_by_kind[kind].update(re.split(r"[ (\n]", n, maxsplit=1)[0] for n in names)
        by_job[description] = by_job.get(description, 0.0) + run_ms[stage] / 1000
    batches = [round(v, 2) for _, v in sorted(by_job.items())]
    return {
        "batch_jobs_executor_run_s_by_stage_kind": {k: {m: round(v, 2) for m, v in d.items()}
                                                    for k, d in by_kind.items()},
        "rdds_by_stage_kind": {k: sorted(v) for k, v in rdds_by_kind.items()},
        "executor_run_s_per_batch": batches,
        "other_jobs_executor_run_s": {k: round(v, 2) for k, v in warm_up.items()},
    }


def _profiles(directory: Path, top: int) -> dict[str, Any]:
    files = sorted(directory.glob("*.prof"))
    if not files:
        return {"tasks": 0}
    stats = pstats.Stats(*map(str, files))
    wall = sum(json.loads(p.read_text())["wall_s"] for p in directory.glob("*.json"))
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for (_, _, _), (_, _, tt, _, _) in entries.items())
    parts = {}
    for label, (suffix, function) in PARTS.items():
        cumulative = sum(ct for (file, _, name), (_, _, _, ct, _) in entries.items()
                         if file.endswith(suffix) and name == function)
        parts[label] = round(cumulative / total, 3) if total else None
    heaviest = sorted(entries.items(), key=lambda kv: -kv[1][2])[:top]
    return {
        "tasks": len(files),
        "wall_s_profiled": round(wall, 2),
        "cumulative_share": parts,
        "top_tottime": [{"function": f"{Path(file).name}:{line}({name})", "share": round(tt / total, 3),
                         "calls": nc} for (file, line, name), (_, nc, tt, _, _) in heaviest],
    }
