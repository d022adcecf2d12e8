"""Machine and run facts written next to every benchmark figure."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory_gib = round(pages * page_size / 2**30, 1)
    except (ValueError, OSError):
        pass
    import pyspark

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
    }


def descendants(root: int, parent_of: dict[int, int]) -> set[int]:
    """Every process below ``root``, given each process's parent (from ``/proc/<pid>/stat``)."""
    found: set[int] = set()
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parent_of.items():
            if parent == pid and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def write_result(name: str, figures: dict[str, Any], path: Path | None = None) -> Path:
    """The figures with machine, date and command, as ``benchmarks/results/<name>.json`` (or ``path``)."""
    path = path or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m", f"benchmarks.{Path(sys.argv[0]).stem}", *sys.argv[1:]]),
        "machine": machine(),
        **figures,
    }
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
