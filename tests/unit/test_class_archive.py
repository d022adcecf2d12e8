"""The driver JVM's class-data archive, without a JVM: which options a start gets, how a part
a JVM wrote becomes the archive, and what the archive's name depends on."""

from __future__ import annotations

import os
import shlex
import struct
import time
from pathlib import Path

import pytest

from batchline import class_archive
from batchline.class_archive import ARCHIVE_SWITCH, CACHE_DIR, DYNAMIC_ARCHIVE_MAGIC, archive_options

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
