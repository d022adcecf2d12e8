"""The driver JVM's class-data archive: Spark's classes mapped from one file at start.

A Spark driver loads and verifies some ten thousand classes from Spark's jars before its
session is up and its first query is planned; that is most of a cold start (about 10 s of a
17 s start and first query on a 2-core machine). Java's class-data sharing (CDS) keeps those
classes, already parsed and verified, in an archive the JVM maps at start. Measured on the
same machine, the same start and first query took 11 s with it.

HotSpot makes such an archive of the classes a run loaded when it exits
(``-XX:ArchiveClassesAtExit``); a later JVM maps it (``-XX:SharedArchiveFile``). So:

- A driver JVM that ``local_spark_session`` starts, while no archive exists for its Java and
  Spark, writes one when it exits, under a name of its own ending ``.part``. HotSpot writes an
  archive's header last: a part with a whole header is finished, anything else was cut short.
- The next start moves a finished part into place (the first one wins) and starts from it.
  Parts cut short are deleted once they are older than any write could take.
- The archive is named by what it must match: the ``java`` binary, Spark's jars, and the
  driver settings that change the class path or the JVM's memory layout. Anything else the
  JVM checks itself: an archive it cannot use is left aside, and the JVM starts as it would
  without one.
- Only the newest ``KEEP`` archives stay (each is 100-200 MB): one for each Java and Spark in
  use, not one for every upgrade ever run.

It is the driver's own JVM only: executors on a cluster start as they did. Set
``BATCHLINE_CLASS_ARCHIVE=off`` to start without one; ``BATCHLINE_CACHE_DIR`` moves the cache
(default ``~/.cache/batchline``). Options of your own that already set the JVM's class sharing
(``-Xshare``, ``-XX:SharedArchiveFile``, ``-XX:ArchiveClassesAtExit``) are left alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import struct
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ARCHIVE_SWITCH", "CACHE_DIR", "DRIVER_JAVA_OPTIONS", "DYNAMIC_ARCHIVE_MAGIC", "KEEP", "archive_dir",
           "archive_options", "is_whole"]

logger = logging.getLogger(__name__)

ARCHIVE_SWITCH = "BATCHLINE_CLASS_ARCHIVE"
"""``off`` (or ``0``, ``false``, ``no``): start the driver's JVM without an archive, and make none."""
CACHE_DIR = "BATCHLINE_CACHE_DIR"
KEEP = 2
DYNAMIC_ARCHIVE_MAGIC = 0xF00BABA8
"""The first word of a dynamic CDS archive (HotSpot's ``CDS_DYNAMIC_ARCHIVE_MAGIC``), written
with the rest of the header after every region: a file that starts with it is whole."""
_PART_TIMEOUT_S = 600
"""A part still without its header this long after its last write was cut short (a JVM
killed while it wrote): no write of one takes minutes."""
_QUIET = ("-XX:+IgnoreUnrecognizedVMOptions", "-Xlog:cds*=off", "-Xlog:class+path=off")
"""HotSpot prints to the driver's stdout when an archive cannot be used or a class cannot go
into one (a signed jar's); neither is the user's business: the JVM starts as without it.
A JVM that does not know the options (not HotSpot) ignores them."""
_OWN_SHARING = ("-Xshare", "-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit")
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
_KEYED_SETTINGS = ("spark.driver.extraClassPath", "spark.driver.memory")
_UNKEYED = ("-D", "-Xlog")
"""JVM options that leave an archive usable: system properties and logging. Any other (heap
size, pointer compression, the collector) names an archive of its own."""
_KEYED_ENVIRONMENT = ("PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR", "SPARK_CLASSPATH", "JAVA_TOOL_OPTIONS",
                      "_JAVA_OPTIONS")


def archive_dir() -> Path:
    """Where the archives are kept: ``$BATCHLINE_CACHE_DIR/jvm``, else ``~/.cache/batchline/jvm``."""
    root = os.environ.get(CACHE_DIR)
    return (Path(root) if root else Path.home() / ".cache" / "batchline") / "jvm"


def archive_options(java: str, spark_home: str, settings: Mapping[str, str]) -> str | None:
    """The JVM options that start the driver's JVM from its archive, or make it write one when
    it exits; None when the JVM should start as it would without batchline (switched off,
    sharing set by the user, or no cache directory can be written)."""
    if os.environ.get(ARCHIVE_SWITCH, "").strip().lower() in ("off", "0", "false", "no"):
        return None
    own = settings.get(DRIVER_JAVA_OPTIONS, "")
    if any(option.startswith(_OWN_SHARING) for option in own.split()):
        return None
    directory = archive_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        name = f"spark-{_key(java, spark_home, settings)}"
        archive = _settle(directory, name)
        if archive is not None:
            os.utime(archive)  # in use: the newest are the ones kept
            option = f"-XX:SharedArchiveFile={archive}"
        else:
            option = f"-XX:ArchiveClassesAtExit={directory / f'{name}.{uuid.uuid4().hex[:12]}.part'}"
            logger.debug("No class-data archive for this Java and Spark yet: the driver's JVM writes one when it "
                         "exits, and the next start maps it")
    except OSError as error:
        logger.debug("No class-data archive for the driver's JVM: %s", error)
        return None
    return " ".join([*_QUIET, shlex.quote(option)])


def _key(java: str, spark_home: str, settings: Mapping[str, str]) -> str:
    """What an archive must match, hashed: the java binary, Spark's jars, and the settings, JVM
    options and environment that change the driver's class path or memory layout."""
    jars = Path(spark_home) / "jars"
    java_stat = os.stat(java)
    identity = {
        "java": [os.path.realpath(java), java_stat.st_size, java_stat.st_mtime_ns],
        "spark_home": os.path.realpath(spark_home),
        "jars": sorted((entry.name, entry.stat().st_size) for entry in os.scandir(jars)) if jars.is_dir() else [],
        "settings": {key: settings.get(key) for key in _KEYED_SETTINGS},
        "java_options": [o for o in settings.get(DRIVER_JAVA_OPTIONS, "").split() if not o.startswith(_UNKEYED)],
        "environment": {key: os.environ.get(key) for key in _KEYED_ENVIRONMENT},
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _settle(directory: Path, name: str) -> Path | None:
    """The finished archive named ``name``, after moving a finished part into place and
    deleting parts that were cut short; drops all but the newest ``KEEP`` archives."""
    archive = directory / f"{name}.jsa"
    now = time.time()
    for part in sorted(directory.glob(f"{name}.*.part")):
        try:
            whole = is_whole(part)
            if whole and not archive.exists():
                os.replace(part, archive)  # a local cache: the first whole part wins
                logger.info("The driver's JVM starts from a class-data archive of Spark's classes from now on (%s)",
                            archive)
            elif whole or now - part.stat().st_mtime > _PART_TIMEOUT_S:
                part.unlink()
        except FileNotFoundError:  # another start settled it first
            continue
    archives = sorted(directory.glob("spark-*.jsa"), key=_modified, reverse=True)
    for old in archives[KEEP:]:
        if old != archive:
            old.unlink(missing_ok=True)
    return archive if is_whole(archive) else None


def is_whole(path: Path) -> bool:
    """Whether ``path`` is a dynamic archive HotSpot finished writing (its header is last)."""
    try:
        with open(path, "rb") as file:
            head = file.read(4)
    except FileNotFoundError:
        return False
    return len(head) == 4 and struct.unpack("=I", head)[0] == DYNAMIC_ARCHIVE_MAGIC


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
