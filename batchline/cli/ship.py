"""What ``batchline run`` ships to the executors: the pipeline's folder as a zip of its
Python modules and packages, so that what the script imports from beside it is found by the
executors' Python workers too (not only by the driver)."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

__all__ = ["package_folder"]

logger = logging.getLogger(__name__)

_SKIPPED_DIRS = {"__pycache__", "node_modules", "site-packages"}
MAX_SHIPPED_BYTES = 50 * 1024 * 1024


def _skipped(directory: Path) -> bool:
    """Hidden folders, caches and virtual environments are not the pipeline's code."""
    return directory.name.startswith(".") or directory.name in _SKIPPED_DIRS or (directory / "pyvenv.cfg").exists()


def package_folder(folder: Path) -> str:
    """A zip of the ``.py`` files under ``folder`` (paths relative to it), in a temporary
    directory removed when the process exits."""
    directory = tempfile.mkdtemp(prefix="batchline-run-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    archive = Path(directory) / f"{folder.name or 'pipeline'}.zip"
    total = 0
    count = 0
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if not _skipped(Path(root) / d))
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = Path(root) / name
                total += path.stat().st_size
                if total > MAX_SHIPPED_BYTES:
                    logger.warning("Shipping only the first %d modules of %s: the rest pass %d MB; install large "
                                   "packages on the workers instead", count, folder, MAX_SHIPPED_BYTES // 2**20)
                    return str(archive)
                zipped.write(path, path.relative_to(folder).as_posix())
                count += 1
    logger.debug("Packaged %d modules of %s for the executors", count, folder)
    return str(archive)
