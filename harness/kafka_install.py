"""Apache Kafka's own broker jars, fetched from Maven Central with ``mvn`` into a cache directory
that the tests and benchmarks share: ``python -m harness.kafka_install`` (or ``python -m
harness.servers kafka``) fetches them once; ``ensure_kafka()`` does the same lazily.

Why Maven and not the release tarball: Maven Central is reachable wherever the Spark jars are,
``mvn`` resolves exactly the broker's runtime dependencies, and the local repository (~/.m2)
makes a second fetch (another cache directory, CI) cost seconds.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.servers import ServerError

KAFKA_VERSION = "4.4.0"
# kafka_2.13's POM declares slf4j-api 1.7.36 and no SLF4J binding, so the broker (Scala code logs
# through slf4j) would log nothing. The release tarball ships slf4j 2 with log4j's slf4j2 bridge;
# the same is added here, at the log4j version kafka_2.13 4.4.0 itself depends on.
SLF4J_VERSION = "2.0.17"
LOG4J_VERSION = "2.25.5"
FETCH_TIMEOUT_S = 900

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>batchline.harness</groupId>
  <artifactId>kafka-broker-fetch</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>{slf4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId><version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def kafka_home(version: str = KAFKA_VERSION) -> Path:
    """Where the jars of ``version`` live: ``$BATCHLINE_KAFKA_HOME`` when set (one version per
    home), else ``~/.cache/batchline/kafka-<version>``."""
    override = os.environ.get("BATCHLINE_KAFKA_HOME")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "batchline" / f"kafka-{version}"


def _complete(libs: Path, version: str) -> bool:
    # ``libs`` appears only by a rename of a finished download, so its broker jar means it is whole.
    return (libs / f"kafka_2.13-{version}.jar").is_file()


def ensure_kafka(version: str = KAFKA_VERSION, quiet: bool = True) -> Path:
    """The directory of the broker's jars (for ``java -cp '<dir>/*'``), fetched first if missing.

    Idempotent, and safe when several processes (pytest workers, CI and a developer) call it at
    once: the fetch holds an exclusive ``flock`` on ``<home>/.lock`` and builds into a temporary
    directory renamed to ``libs`` only when ``mvn`` succeeded, so no one sees half a download.
    """
    home = kafka_home(version)
    libs = home / "libs"
    if _complete(libs, version):
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(libs, version):  # another process fetched it while this one waited
            return libs
        _fetch(version, home, libs, quiet)
    return libs


def _fetch(version: str, home: Path, libs: Path, quiet: bool) -> None:
    how = ("fetch it by hand with `python -m harness.kafka_install` (needs Maven and Java 17: "
           "apt-get install maven openjdk-17-jre-headless, and Maven Central reachable)")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ServerError(f"mvn is not installed, so Apache Kafka {version} cannot be fetched; {how}")
    with tempfile.TemporaryDirectory(prefix="kafka-fetch-", dir=home) as scratch:
        work = Path(scratch)
        (work / "pom.xml").write_text(_POM.format(kafka=version, slf4j=SLF4J_VERSION, log4j=LOG4J_VERSION))
        staged = work / "libs"
        command = [mvn, "-B", "-ntp", *(["-q"] if quiet else []), "-f", str(work / "pom.xml"),
                   "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={staged}"]
        try:
            done = subprocess.run(command, cwd=work, capture_output=quiet, text=True, timeout=FETCH_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise ServerError(f"mvn did not fetch Apache Kafka {version} within {FETCH_TIMEOUT_S}s; "
                                    f"{how}") from exc
        if done.returncode != 0 or not _complete(staged, version):
            output = "\n".join(((done.stdout or "") + (done.stderr or "")).splitlines()[-30:])
            raise ServerError(f"`{' '.join(command)}` failed ({done.returncode}) fetching Apache Kafka "
                                    f"{version} into {libs}; {how}\n{output}")
        if libs.exists():  # a leftover without the broker jar (it failed _complete)
            shutil.rmtree(libs)
        staged.rename(libs)


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.kafka_install [version]``: fetch (or find) the jars, print where."""
    args = sys.argv[1:] if argv is None else argv
    version = args[0] if args else KAFKA_VERSION
    try:
        libs = ensure_kafka(version, quiet=False)
    except ServerError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"Apache Kafka {version}: {libs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
