"""The class-data archives of the driver's JVM and of executors on its machine: Spark's classes
mapped from one file at start.

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

Executors that run on the driver's machine (``local-cluster[...]``, a standalone master on
this machine) get an archive of their own (``executor_archive``): an executor's JVM loads
Spark's classes too, then the classes of its first tasks, all on the same cores the driver and
the other executors start on. An executor cannot write it as it exits: a standalone worker
kills an executor 10 s after asking it to stop, too soon for a JVM that ran Python tasks to
write one. So, while there is none, executors start able to write one while they run
(``-XX:+RecordDynamicDumpInfo``), and once the session has run ``DUMP_AFTER_S`` the driver has
one executor of its application on this machine write its part (``jcmd <pid> VM.cds
dynamic_dump``; the executor pauses for a few seconds, once). The next driver's start settles
it. This needs the JDK's ``jcmd`` beside the driver's ``java``, and a Java that can record
(one with its default class-data archive); without either, executors start as they did.
Executors on other machines would find neither the archive nor the cache folder, so a master
elsewhere gets no options for them.

Set ``BATCHLINE_CLASS_ARCHIVE=off`` to start without one; ``BATCHLINE_CACHE_DIR`` moves the
cache (default ``~/.cache/batchline``). Options of your own that already set a JVM's class
sharing (``-Xshare``, ``-XX:SharedArchiveFile``, ``-XX:ArchiveClassesAtExit``,
``-XX:+RecordDynamicDumpInfo``, in ``spark.driver.extraJavaOptions``, or in
``spark.executor.extraJavaOptions`` or ``spark.executor.defaultJavaOptions``) are left alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ARCHIVE_SWITCH", "CACHE_DIR", "DRIVER_JAVA_OPTIONS", "DUMP_AFTER_S", "DYNAMIC_ARCHIVE_MAGIC",
           "EXECUTOR_JAVA_OPTIONS", "KEEP", "ExecutorArchive", "ExecutorArchiveDump", "archive_dir", "archive_options",
           "can_dump", "executor_archive", "executor_pids", "executors_here", "is_whole"]

logger = logging.getLogger(__name__)

ARCHIVE_SWITCH = "BATCHLINE_CLASS_ARCHIVE"
"""``off`` (or ``0``, ``false``, ``no``): start the driver's and the executors' JVMs without an
archive, and make none."""
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
DUMP_AFTER_S = 20.0
"""How long after its SparkContext started a session has one of its executors on this machine
write the executors' archive (while there is none): by then they have usually started and run
a pipeline's first tasks, whose classes it then holds too."""
_FIND_EXECUTOR_S = 60.0
"""How long after ``DUMP_AFTER_S`` an executor of the application is looked for, once a second
(executors start late on a busy machine)."""
_DUMP_TIMEOUT_S = 300.0
_PROBE_TIMEOUT_S = 30.0
_EXECUTOR_MAIN = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"
_OWN_SHARING = ("-Xshare", "-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit", "-XX:+RecordDynamicDumpInfo")
_NO_ATTACH = ("-Xrs", "-XX:+DisableAttachMechanism")
"""Executor options with which ``jcmd`` cannot reach the JVM: no archive is dumped from one."""
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
EXECUTOR_JAVA_OPTIONS = "spark.executor.extraJavaOptions"
_UNKEYED = ("-D", "-Xlog")
"""JVM options that leave an archive usable: system properties and logging. Any other (heap
size, pointer compression, the collector) names an archive of its own."""
_KEYED_ENVIRONMENT = ("PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR", "SPARK_CLASSPATH", "JAVA_TOOL_OPTIONS",
                      "_JAVA_OPTIONS")


@dataclass(frozen=True)
class _Role:
    """Whose JVM an archive is for."""

    who: str
    prefix: str
    """Its archives' names start with it (the driver's ``spark-``, as they always did)."""
    own_options: tuple[str, ...]
    """The settings that carry its JVM options of the user's own."""
    keyed_settings: tuple[str, ...]
    """Settings that change its class path or memory layout."""
    writes_at_exit: bool
    """Its JVM writes its part as it exits; else one of its JVMs is told to while it runs."""

    def options_of(self, settings: Mapping[str, str]) -> list[str]:
        return [option for key in self.own_options for option in settings.get(key, "").split()]


_DRIVER = _Role("driver", "spark", (DRIVER_JAVA_OPTIONS,), ("spark.driver.extraClassPath", "spark.driver.memory"), True)
_EXECUTOR = _Role("executor", "executor", ("spark.executor.defaultJavaOptions", EXECUTOR_JAVA_OPTIONS),
                  ("spark.executor.extraClassPath", "spark.executor.memory"), False)


@dataclass(frozen=True)
class ExecutorArchive:
    """How the executors on this machine start: ``options`` go into
    ``spark.executor.extraJavaOptions``; ``dump_to``, when there is no archive yet, is the part
    one of them is to write (``ExecutorArchiveDump``)."""

    options: str
    dump_to: Path | None


def archive_dir() -> Path:
    """Where the archives are kept: ``$BATCHLINE_CACHE_DIR/jvm``, else ``~/.cache/batchline/jvm``."""
    root = os.environ.get(CACHE_DIR)
    return (Path(root) if root else Path.home() / ".cache" / "batchline") / "jvm"


def archive_options(java: str, spark_home: str, settings: Mapping[str, str]) -> str | None:
    """The JVM options that start the driver's JVM from its archive, or make it write one when
    it exits; None when the JVM should start as it would without batchline (switched off,
    sharing set by the user, or no cache directory can be written)."""
    found = _options(_DRIVER, java, spark_home, settings)
    return found[0] if found is not None else None


def executor_archive(master: str, java: str, spark_home: str, settings: Mapping[str, str]) -> ExecutorArchive | None:
    """The same for the executors of ``master``: None also when they may run on another
    machine (``executors_here``), when their options set class sharing themselves, or when
    there is no archive and none can be dumped (``can_dump``). Executors start the ``java`` of
    their worker, which on this machine is the driver's unless a worker was given another
    ``JAVA_HOME``: an archive of another Java is not mapped (the JVM starts as without it),
    but recording is tried with the driver's ``java`` only (set ``BATCHLINE_CLASS_ARCHIVE=off``
    where workers run a Java that cannot record)."""
    if not executors_here(master) or not os.path.isdir("/proc"):  # the dump finds executors in /proc
        return None
    found = _options(_EXECUTOR, java, spark_home, settings)
    if found is None:
        return None
    options, dump_to = found
    heap = _heap_option(settings.get("spark.executor.memory", "1g"))
    if dump_to is not None and not can_dump(java, [*_EXECUTOR.options_of(settings), *heap]):
        return None
    return ExecutorArchive(options, dump_to)


def can_dump(java: str, options: list[str]) -> bool:
    """Whether a JVM of ``java`` started with ``options`` can be told to write its archive
    while it runs: ``jcmd`` is beside ``java``, nothing in ``options`` keeps ``jcmd`` out, and
    it starts with ``-XX:+RecordDynamicDumpInfo`` added. A JVM that cannot map its Java's
    default class-data archive (none shipped, or options that rule it out) refuses to start
    with that option at all, so it is tried first, with the executors' own options."""
    if not jcmd_of(java).is_file() or any(option in _NO_ATTACH for option in options):
        return False
    try:
        tried = subprocess.run([java, *options, "-XX:+RecordDynamicDumpInfo", "-version"], capture_output=True,
                               timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        logger.debug("Executors start without a class-data archive: %s could not be tried: %s", java, error)
        return False
    return tried.returncode == 0


def _heap_option(memory: str) -> list[str]:
    """``-Xmx`` for Spark's ``spark.executor.memory`` (``768m``, ``4g``, ``2gb``; MiB without
    a unit), as a worker starts an executor: a heap past 32 GiB rules the default archive out."""
    size = memory.strip().lower().removesuffix("b")
    if not size:
        return []
    return [f"-Xmx{size}" if size[-1] in "kmgt" else f"-Xmx{size}m"]


def jcmd_of(java: str) -> Path:
    return Path(os.path.realpath(java)).parent / "jcmd"


class ExecutorArchiveDump:
    """Has one executor of application ``app_id`` on this machine write the executors' archive
    to ``part`` once ``after_s`` passed, on a thread of its own (``start``). ``cancel`` before
    then leaves it; a session that stops sooner leaves no executor to find, and the next start
    tries again."""

    def __init__(self, java: str, part: Path, app_id: str, after_s: float | None = None) -> None:
        self._jcmd, self._part, self._app_id = jcmd_of(java), part, app_id
        self._after_s = DUMP_AFTER_S if after_s is None else after_s
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batchline-executor-archive", daemon=True)

    def start(self) -> ExecutorArchiveDump:
        self._thread.start()
        return self

    def cancel(self) -> None:
        self._cancelled.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        if self._cancelled.wait(self._after_s):
            return
        executors = executor_pids(self._app_id)
        deadline = time.monotonic() + _FIND_EXECUTOR_S
        while not executors:
            if time.monotonic() > deadline:
                logger.debug("No executor of %s on this machine to write the executors' class-data archive",
                             self._app_id)
                return
            if self._cancelled.wait(1.0):
                return
            executors = executor_pids(self._app_id)
        executor, pid = min(executors.items())
        began = time.monotonic()
        try:
            done = subprocess.run([str(self._jcmd), str(pid), "VM.cds", "dynamic_dump", str(self._part)],
                                  capture_output=True, text=True, timeout=_DUMP_TIMEOUT_S)
            problem = (None if is_whole(self._part) else
                       f"jcmd exited with {done.returncode}: {f'{done.stdout}{done.stderr}'.strip()[-500:]}")
        except (OSError, subprocess.TimeoutExpired) as error:
            problem = str(error)
        if problem is not None:
            logger.warning("Executor %s (process %d) could not write the executors' class-data archive (%s). They "
                           "start without one, and the next driver start tries again; if jcmd cannot reach executors "
                           "here (another user, no attach), set BATCHLINE_CLASS_ARCHIVE=off", executor, pid, problem)
            self._part.unlink(missing_ok=True)
            return
        logger.info("Executor %s wrote the executors' class-data archive in %.1f s: executors on this machine start "
                    "from it after the next driver start (%s)", executor, time.monotonic() - began, self._part)


def executor_pids(app_id: str) -> dict[str, int]:
    """The executor JVMs of application ``app_id`` on this machine, by executor id (from
    ``/proc``; none where there is no such folder)."""
    found: dict[str, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                args = file.read().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if _EXECUTOR_MAIN in args:
            named = dict(zip(args, args[1:], strict=False))
            if named.get(b"--app-id") == app_id.encode():
                found[named.get(b"--executor-id", b"").decode()] = int(entry)
    return found


def executors_here(master: str) -> bool:
    """Whether ``master`` starts its executors on this machine: ``local-cluster[...]``, or a
    standalone master (``spark://host:port``, several for a master with standby) on this
    machine's name or a loopback address. Its workers could still be elsewhere, where the
    options find no archive and no folder to write one in: then the JVM starts as without them."""
    if master.startswith("local-cluster"):
        return True
    if not master.startswith("spark://"):
        return False
    hosts = [address.rsplit(":", 1)[0].strip("[]") for address in master.removeprefix("spark://").split(",")]
    named = [host for host in hosts if host != "localhost" and not host.startswith("127.") and host != "::1"]
    if not named:
        return True
    here = {socket.gethostname(), socket.getfqdn()}  # a name lookup, only for names
    return all(host in here for host in named)


def _options(role: _Role, java: str, spark_home: str, settings: Mapping[str, str]) -> tuple[str, Path | None] | None:
    """The options that start ``role``'s JVM from its archive, or that let it write one, and
    then the part to write."""
    if os.environ.get(ARCHIVE_SWITCH, "").strip().lower() in ("off", "0", "false", "no"):
        return None
    if any(option.startswith(_OWN_SHARING) for option in role.options_of(settings)):
        return None
    directory = archive_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        name = f"{role.prefix}-{_key(role, java, spark_home, settings)}"
        archive = _settle(directory, name, role)
        part = None
        if archive is not None:
            os.utime(archive)  # in use: the newest are the ones kept
            option = f"-XX:SharedArchiveFile={archive}"
        else:
            part = directory / f"{name}.{uuid.uuid4().hex[:12]}.part"
            option = f"-XX:ArchiveClassesAtExit={part}" if role.writes_at_exit else "-XX:+RecordDynamicDumpInfo"
            logger.debug("No class-data archive for this Java and Spark yet: the %s's JVM writes one, and the next "
                         "start maps it", role.who)
    except OSError as error:
        logger.debug("No class-data archive for the %s's JVM: %s", role.who, error)
        return None
    return " ".join([*_QUIET, shlex.quote(option)]), part


def _key(role: _Role, java: str, spark_home: str, settings: Mapping[str, str]) -> str:
    """What an archive must match, hashed: the java binary, Spark's jars, and the settings, JVM
    options and environment that change its JVM's class path or memory layout."""
    jars = Path(spark_home) / "jars"
    java_stat = os.stat(java)
    identity = {
        "java": [os.path.realpath(java), java_stat.st_size, java_stat.st_mtime_ns],
        "spark_home": os.path.realpath(spark_home),
        "jars": sorted((entry.name, entry.stat().st_size) for entry in os.scandir(jars)) if jars.is_dir() else [],
        "settings": {key: settings.get(key) for key in role.keyed_settings},
        "java_options": [o for o in role.options_of(settings) if not o.startswith(_UNKEYED)],
        "environment": {key: os.environ.get(key) for key in _KEYED_ENVIRONMENT},
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _settle(directory: Path, name: str, role: _Role) -> Path | None:
    """The finished archive named ``name``, after moving a finished part into place and
    deleting parts that were cut short; drops all but the newest ``KEEP`` archives."""
    archive = directory / f"{name}.jsa"
    now = time.time()
    for part in sorted(directory.glob(f"{name}.*.part")):
        try:
            whole = is_whole(part)
            if whole and not archive.exists():
                os.replace(part, archive)  # a local cache: the first whole part wins
                logger.info("The %s's JVM starts from a class-data archive of Spark's classes from now on (%s)",
                            role.who, archive)
            elif whole or now - part.stat().st_mtime > _PART_TIMEOUT_S:
                part.unlink()
        except FileNotFoundError:  # another start settled it first
            continue
    archives = sorted(directory.glob(f"{role.prefix}-*.jsa"), key=_modified, reverse=True)
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
