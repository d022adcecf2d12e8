"""The class-data archives of the driver's and the executors' JVMs, without a JVM: which options a
start gets, how a part a JVM wrote becomes the archive, what the archive's name depends on, and
how an executor is told to write its part."""

from __future__ import annotations

import os
import shlex
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from batchline import class_archive
from batchline.class_archive import (
    ARCHIVE_SWITCH,
    CACHE_DIR,
    DYNAMIC_ARCHIVE_MAGIC,
    ExecutorArchiveDump,
    archive_options,
    can_dump,
    executor_archive,
    executor_pids,
    executors_here,
)
from tests.helpers import wait_for

WHOLE = struct.pack("=I", DYNAMIC_ARCHIVE_MAGIC) + b"\0" * 60
"""The start of an archive whose header HotSpot wrote: a whole one."""


@pytest.fixture()
def spark_home(tmp_path: Path) -> Path:
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    (home / "jars" / "spark-core.jar").write_bytes(b"core")
    return home


@pytest.fixture()
def java(tmp_path: Path) -> str:
    binary = tmp_path / "java"
    binary.write_text("#!/bin/sh\n")
    return str(binary)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(ARCHIVE_SWITCH, raising=False)
    return tmp_path / "cache" / "jvm"


def option(options: str | None, name: str) -> str | None:
    """The value of ``-XX:<name>=`` among ``options``."""
    assert options is not None
    values = [o.split("=", 1)[1] for o in shlex.split(options) if o.startswith(f"-XX:{name}=")]
    return values[0] if values else None


def test_a_first_start_writes_a_part_at_exit_and_the_next_maps_it(java, spark_home, cache):
    first = archive_options(java, str(spark_home), {})
    part = option(first, "ArchiveClassesAtExit")
    assert part is not None and part.endswith(".part") and Path(part).parent == cache
    assert option(first, "SharedArchiveFile") is None
    assert "-Xlog:cds*=off" in shlex.split(first) and "-XX:+IgnoreUnrecognizedVMOptions" in shlex.split(first)

    Path(part).write_bytes(WHOLE)  # what the JVM leaves when it exits
    second = archive_options(java, str(spark_home), {})
    archive = option(second, "SharedArchiveFile")
    assert archive is not None and archive.endswith(".jsa") and Path(archive).read_bytes() == WHOLE
    assert option(second, "ArchiveClassesAtExit") is None
    assert not Path(part).exists()
    assert option(archive_options(java, str(spark_home), {}), "SharedArchiveFile") == archive


def test_a_part_cut_short_is_not_mapped_and_goes_once_it_is_old(java, spark_home, cache):
    part = Path(option(archive_options(java, str(spark_home), {}), "ArchiveClassesAtExit"))
    part.write_bytes(b"\0" * 64)  # the JVM was killed before it wrote the header
    again = archive_options(java, str(spark_home), {})
    assert option(again, "SharedArchiveFile") is None
    assert part.exists(), "a part may still be written by a JVM that is exiting"
    old = time.time() - 3600
    os.utime(part, (old, old))
    archive_options(java, str(spark_home), {})
    assert not part.exists()


def test_of_two_whole_parts_the_first_becomes_the_archive_and_the_other_goes(java, spark_home, cache):
    parts = [Path(option(archive_options(java, str(spark_home), {}), "ArchiveClassesAtExit")) for _ in range(2)]
    assert parts[0] != parts[1], "two JVMs started before either exited write parts of their own"
    for part in parts:
        part.write_bytes(WHOLE)
    archive = option(archive_options(java, str(spark_home), {}), "SharedArchiveFile")
    assert archive is not None
    assert [p for p in parts if p.exists()] == []
    assert sorted(p.name for p in cache.iterdir()) == [Path(archive).name]


@pytest.mark.parametrize("change", ["jar", "class path", "driver memory", "heap option", "java"])
def test_the_archive_is_named_by_the_java_the_jars_and_the_class_path(java, spark_home, cache, change):
    settings = {"spark.driver.memory": "1g"}
    Path(option(archive_options(java, str(spark_home), settings), "ArchiveClassesAtExit")).write_bytes(WHOLE)
    assert option(archive_options(java, str(spark_home), settings), "SharedArchiveFile") is not None
    if change == "jar":
        (spark_home / "jars" / "spark-kafka.jar").write_bytes(b"more")
    elif change == "class path":
        settings = {**settings, "spark.driver.extraClassPath": "/opt/extra.jar"}
    elif change == "driver memory":
        settings = {"spark.driver.memory": "40g"}  # past 32 GB the JVM's pointers change
    elif change == "heap option":
        settings = {**settings, "spark.driver.extraJavaOptions": "-XX:-UseCompressedOops"}
    else:
        Path(java).write_text("#!/bin/sh\n# another build\n")
    options = archive_options(java, str(spark_home), settings)
    assert option(options, "SharedArchiveFile") is None
    assert option(options, "ArchiveClassesAtExit") is not None


def test_logging_and_system_properties_keep_the_archive(java, spark_home, cache):
    Path(option(archive_options(java, str(spark_home), {}), "ArchiveClassesAtExit")).write_bytes(WHOLE)
    options = archive_options(java, str(spark_home),
                              {"spark.driver.extraJavaOptions": "-Dlog4j2.level=warn -Xlog:gc:file=/tmp/gc.log"})
    assert option(options, "SharedArchiveFile") is not None


def test_only_the_newest_archives_are_kept(java, spark_home, cache):
    names = []
    for n in range(class_archive.KEEP + 2):
        settings = {"spark.driver.memory": f"{n + 1}g"}
        Path(option(archive_options(java, str(spark_home), settings), "ArchiveClassesAtExit")).write_bytes(WHOLE)
        names.append(Path(option(archive_options(java, str(spark_home), settings), "SharedArchiveFile")).name)
        stamp = time.time() - 100 + n
        os.utime(cache / names[-1], (stamp, stamp))
    assert sorted(p.name for p in cache.glob("*.jsa")) == sorted(names[-class_archive.KEEP:])


@pytest.mark.parametrize("own", ["-Xshare:off", "-XX:SharedArchiveFile=/opt/mine.jsa",
                                 "-Xmx2g -XX:ArchiveClassesAtExit=/tmp/mine.jsa"])
def test_sharing_the_user_set_is_left_alone(java, spark_home, own):
    assert archive_options(java, str(spark_home), {"spark.driver.extraJavaOptions": own}) is None


def test_switched_off_by_the_environment(java, spark_home, monkeypatch, cache):
    monkeypatch.setenv(ARCHIVE_SWITCH, "off")
    assert archive_options(java, str(spark_home), {}) is None
    assert not cache.exists()


def test_a_cache_that_cannot_be_written_starts_the_jvm_without_an_archive(java, spark_home, tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv(CACHE_DIR, str(blocked))
    assert archive_options(java, str(spark_home), {}) is None


def test_a_path_with_spaces_stays_one_option(java, spark_home, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR, str(tmp_path / "my cache"))
    part = option(archive_options(java, str(spark_home), {}), "ArchiveClassesAtExit")
    assert part is not None and " " in part and part.endswith(".part")


# ----------------------------------------------------------------------- executors
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc"), reason="executors are found in /proc (Linux)")


@pytest.fixture()
def recording_java(tmp_path: Path) -> str:
    """A ``java`` that starts with ``-XX:+RecordDynamicDumpInfo`` and notes its arguments, with
    a ``jcmd`` beside it that writes the part it is told to, whole, and notes its arguments."""
    folder = tmp_path / "jdk"
    folder.mkdir()
    java = folder / "java"
    java.write_text(f"#!/bin/sh\necho \"$@\" > {folder}/java.args\nexit 0\n")
    jcmd = folder / "jcmd"
    jcmd.write_text(f"#!/bin/sh\necho \"$@\" > {folder}/jcmd.args\n"
                    f"{sys.executable} -c 'import sys; open(sys.argv[1], \"wb\").write(bytes.fromhex(sys.argv[2]))' "
                    f"\"$4\" {WHOLE.hex()}\n")
    for binary in (java, jcmd):
        binary.chmod(0o755)
    return str(java)


def noted(java: str, binary: str) -> list[str] | None:
    """The arguments the fake ``binary`` beside ``java`` was last started with."""
    args = Path(java).parent / f"{binary}.args"
    return args.read_text().split() if args.exists() else None


def start_executor(app_id: str) -> subprocess.Popen:
    """A process with the command line of executor 3 of ``app_id``'s JVM."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "org.apache.spark.executor.CoarseGrainedExecutorBackend", "--driver-url", "x",
                             "--executor-id", "3", "--hostname", "127.0.0.1", "--app-id", app_id])


@pytest.fixture()
def executor():
    """Executor 3 of an application of its own: (its process, the application's id)."""
    app_id = f"app-{uuid.uuid4().hex}"
    process = start_executor(app_id)
    wait_for(lambda: executor_pids(app_id), "the executor's command line")
    yield process, app_id
    process.kill()
    process.wait()


@needs_proc
@pytest.mark.parametrize(("master", "here"), [
    ("local-cluster[2,1,1024]", True), ("spark://127.0.0.1:7077", True), ("spark://localhost:7077", True),
    (f"spark://{socket.gethostname()}:7077", True), ("spark://[::1]:7077", True),
    ("spark://10.0.3.7:7077", False), ("spark://127.0.0.1:7077,master-2.internal:7077", False),
    ("local[2]", False), ("yarn", False), ("k8s://https://127.0.0.1:6443", False)])
def test_executors_get_options_only_when_they_run_on_this_machine(recording_java, spark_home, master, here):
    assert executors_here(master) is here
    assert (executor_archive(master, recording_java, str(spark_home), {}) is not None) is here


@needs_proc
def test_without_an_archive_executors_record_and_one_is_to_dump_a_part_the_next_start_maps(
        recording_java, spark_home, cache):
    master = "local-cluster[2,1,1024]"
    first = executor_archive(master, recording_java, str(spark_home), {})
    assert first is not None and first.dump_to is not None
    assert "-XX:+RecordDynamicDumpInfo" in shlex.split(first.options)
    assert option(first.options, "SharedArchiveFile") is None
    assert first.dump_to.parent == cache and first.dump_to.name.startswith("executor-")
    assert first.dump_to.name.endswith(".part")
    driver_part = Path(option(archive_options(recording_java, str(spark_home), {}), "ArchiveClassesAtExit"))
    driver_part.write_bytes(WHOLE)

    first.dump_to.write_bytes(WHOLE)
    second = executor_archive(master, recording_java, str(spark_home), {})
    assert second is not None and second.dump_to is None
    assert "-XX:+RecordDynamicDumpInfo" not in second.options
    archive = option(second.options, "SharedArchiveFile")
    assert archive is not None and Path(archive).name.startswith("executor-") and Path(archive).read_bytes() == WHOLE
    assert list(cache.glob("executor-*.part")) == []
    assert driver_part.exists(), "the driver's part is the driver's start's to settle"


@needs_proc
def test_recording_is_tried_with_the_executors_own_options_and_heap_first(recording_java, spark_home):
    master = "spark://127.0.0.1:7077"
    settings = {"spark.executor.memory": "768m", "spark.executor.defaultJavaOptions": "-XX:+UseG1GC",
                "spark.executor.extraJavaOptions": "-Dfoo=bar"}
    assert executor_archive(master, recording_java, str(spark_home), settings) is not None
    assert noted(recording_java, "java") == ["-XX:+UseG1GC", "-Dfoo=bar", "-Xmx768m", "-XX:+RecordDynamicDumpInfo",
                                              "-version"]
    executor_archive(master, recording_java, str(spark_home), {"spark.executor.memory": "2gb"})
    assert "-Xmx2g" in noted(recording_java, "java")
    executor_archive(master, recording_java, str(spark_home), {"spark.executor.memory": "1024"})
    assert "-Xmx1024m" in noted(recording_java, "java")


@needs_proc
def test_a_java_that_cannot_record_or_be_reached_starts_executors_as_they_were(recording_java, spark_home):
    master = "spark://127.0.0.1:7077"
    jcmd = Path(recording_java).parent / "jcmd"
    Path(recording_java).write_text("#!/bin/sh\necho 'DynamicDumpSharedSpaces is unsupported' >&2\nexit 1\n")
    assert not can_dump(recording_java, [])
    assert executor_archive(master, recording_java, str(spark_home), {}) is None
    Path(recording_java).write_text("#!/bin/sh\nexit 0\n")
    assert can_dump(recording_java, [])
    for unreachable in ("-Xrs", "-XX:+DisableAttachMechanism"):
        assert not can_dump(recording_java, [unreachable])
        assert executor_archive(master, recording_java, str(spark_home),
                                {"spark.executor.extraJavaOptions": unreachable}) is None
    jcmd.unlink()
    assert not can_dump(recording_java, [])
    assert executor_archive(master, recording_java, str(spark_home), {}) is None


@needs_proc
def test_executor_archives_are_named_by_the_executors_settings_and_kept_apart_from_the_driver_s(
        recording_java, spark_home, cache):
    master, java = "spark://127.0.0.1:7077", recording_java
    for n in range(class_archive.KEEP + 1):  # more driver archives than are kept
        settings = {"spark.driver.memory": f"{n + 1}g"}
        Path(option(archive_options(java, str(spark_home), settings), "ArchiveClassesAtExit")).write_bytes(WHOLE)
        archive_options(java, str(spark_home), settings)
    settings = {"spark.executor.memory": "768m"}
    first = executor_archive(master, java, str(spark_home), settings)
    assert first is not None and first.dump_to is not None
    first.dump_to.write_bytes(WHOLE)
    kept = executor_archive(master, java, str(spark_home), settings)
    assert kept is not None and option(kept.options, "SharedArchiveFile")
    assert len(list(cache.glob("spark-*.jsa"))) == class_archive.KEEP, "the executors' archive counts apart"
    assert len(list(cache.glob("executor-*.jsa"))) == 1

    for other in ({"spark.executor.memory": "40g"}, {**settings, "spark.executor.extraClassPath": "/opt/x.jar"},
                  {**settings, "spark.executor.extraJavaOptions": "-XX:-UseCompressedOops"}):
        started = executor_archive(master, java, str(spark_home), other)
        assert started is not None and started.dump_to is not None, other
    # The driver's settings leave the executors' archive alone.
    same = executor_archive(master, java, str(spark_home), {**settings, "spark.driver.memory": "40g"})
    assert same is not None and same.dump_to is None


@needs_proc
@pytest.mark.parametrize("own", [{"spark.executor.extraJavaOptions": "-Xshare:off"},
                                 {"spark.executor.defaultJavaOptions": "-Xshare:off"},
                                 {"spark.executor.extraJavaOptions": "-XX:+RecordDynamicDumpInfo"}])
def test_the_executors_own_sharing_and_the_switch_are_left_alone(recording_java, spark_home, monkeypatch, own):
    master = "local-cluster[2,1,1024]"
    assert executor_archive(master, recording_java, str(spark_home), own) is None
    monkeypatch.setenv(ARCHIVE_SWITCH, "off")
    assert executor_archive(master, recording_java, str(spark_home), {}) is None


@needs_proc
def test_executors_of_an_application_are_found_by_their_command_line(executor):
    process, app_id = executor
    assert executor_pids(app_id) == {"3": process.pid}
    assert executor_pids(f"{app_id}-other") == {}


@needs_proc
def test_one_executor_of_the_application_is_told_to_dump_its_part(recording_java, executor, cache):
    process, app_id = executor
    cache.mkdir(parents=True)
    part = cache / "executor-0123.abc.part"
    ExecutorArchiveDump(recording_java, part, app_id, after_s=0).start().join(30)
    assert part.read_bytes() == WHOLE
    assert noted(recording_java, "jcmd") == [str(process.pid), "VM.cds", "dynamic_dump", str(part)]


@needs_proc
def test_an_executor_that_starts_late_is_waited_for(recording_java, cache):
    app_id = f"app-{uuid.uuid4().hex}"
    cache.mkdir(parents=True)
    part = cache / "executor-0123.abc.part"
    dump = ExecutorArchiveDump(recording_java, part, app_id, after_s=0).start()
    process = start_executor(app_id)  # after the dump looked first
    try:
        dump.join(30)
        assert part.read_bytes() == WHOLE
        assert noted(recording_java, "jcmd")[0] == str(process.pid)
    finally:
        process.kill()
        process.wait()


@needs_proc
def test_a_dump_that_fails_leaves_no_part_and_says_what_to_do(recording_java, executor, cache, caplog):
    _, app_id = executor
    cache.mkdir(parents=True)
    jcmd = Path(recording_java).parent / "jcmd"
    jcmd.write_text('#!/bin/sh\nprintf cut > "$4"\necho "Unable to open socket file"\nexit 1\n')
    part = cache / "executor-0123.abc.part"
    ExecutorArchiveDump(recording_java, part, app_id, after_s=0).start().join(30)
    assert not part.exists()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "jcmd exited with 1: Unable to open socket file" in warned[0]
    assert "BATCHLINE_CLASS_ARCHIVE=off" in warned[0]


@needs_proc
def test_a_dump_cancelled_before_its_time_runs_nothing(recording_java, executor, cache):
    _, app_id = executor
    cancelled = ExecutorArchiveDump(recording_java, cache / "executor-0123.abc.part", app_id, after_s=0.5).start()
    cancelled.cancel()
    cancelled.join(30)  # uncancelled, it would run jcmd at 0.5 s and end after
    assert noted(recording_java, "jcmd") is None
