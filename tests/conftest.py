import os
import re
import sys
from pathlib import Path

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

TESTS = Path(__file__).resolve().parent

FOLDER_MARKERS = {
    "unit": (),
    "spark": ("spark",),
    "server": ("spark", "server"),
    "browser": ("spark", "browser"),
    "chaos": ("spark", "chaos", "server"),
    "cluster": ("spark", "chaos", "cluster", "server"),
    "soak": ("spark", "soak"),
    "soak_chaos": ("spark", "chaos", "cluster", "server", "soak_chaos"),
}
"""A test's folder says what it needs, and so its markers: ``pytest -m "not chaos and not
cluster"`` is the fast tier (README). ``chaos`` tests kill processes (drivers, executors, Python
workers) and compare with a clean run; their drivers start Spark in processes of their own."""
NEEDS = {"spark": "spark", "s3_endpoint": "server", "redis_server": "server", "postgres_server": "server",
         "kafka_broker": "server", "standalone_cluster": "cluster", "chromium": "browser"}
"""What a fixture needs: a test may use it only in a folder whose markers include that."""


def _folder(item: pytest.Item) -> str:
    folder = Path(str(item.path)).parent
    if folder.parent != TESTS or folder.name not in FOLDER_MARKERS:
        raise pytest.UsageError(f"{item.nodeid} is not in one of tests/{{{','.join(FOLDER_MARKERS)}}}/: put each "
                                "test file in the folder of what it needs (see tests/conftest.py)")
    return folder.name


def pytest_collection_modifyitems(config, items):
    misplaced = []
    for item in items:
        folder = _folder(item)
        markers = FOLDER_MARKERS[folder]
        for marker in markers:
            item.add_marker(marker)
        needs = {NEEDS[f] for f in item.fixturenames if f in NEEDS} - set(markers)
        if needs:
            misplaced.append(f"{item.nodeid} uses {', '.join(sorted(needs))} but sits in tests/{folder}/")
    if misplaced:
        raise pytest.UsageError("tests in a folder that does not match what they need (move each file to the "
                                "folder of the most it needs):\n" + "\n".join(misplaced))
    # The soak tests run for an hour or more: only a selection that names one (``-m soak``,
    # ``-m soak_chaos``) runs it.
    named = config.getoption("markexpr") or ""
    for long_run in ("soak", "soak_chaos"):
        if re.search(rf"\b{long_run}\b", named):
            continue
        soaks = [item for item in items if item.get_closest_marker(long_run)]
        if soaks:
            config.hook.pytest_deselected(items=soaks)
            items[:] = [item for item in items if not item.get_closest_marker(long_run)]


@pytest.fixture(scope="session")
def spark():
    from batchline.spark import local_spark_session

    session = local_spark_session("local[2]", "batchline-tests", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3-compatible endpoint (moto's server on loopback) with the suite's buckets;
    yields the fsspec storage options that reach it."""
    from harness.servers import S3Server

    server = S3Server().start()
    yield server.storage_options
    server.stop()


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory):
    """A Spark standalone master and two one-core workers, separate JVMs on 127.0.0.1 (see
    harness/cluster.py). Fails, never skips, when they do not come up."""
    from harness.cluster import StandaloneCluster

    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real redis-server on loopback (Debian's package), for the whole session. Fails, never
    skips, when it cannot start."""
    from harness.servers import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL cluster of its own on loopback (Debian's package), for the whole
    session; ``dsn`` carries a password. Fails, never skips, when it cannot start."""
    from harness.servers import PostgresServer

    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A real Apache Kafka broker (KRaft, one node) on loopback, for the whole session; its jars
    are fetched from Maven Central on first use (harness/kafka_install.py). Fails, never skips,
    when they cannot be fetched or the broker cannot start."""
    from harness.servers import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    yield broker
    broker.stop()


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="session")
def chromium(tmp_path_factory):
    """Debian's headless Chromium driven through Debian's chromedriver (Selenium), for the
    whole session. Fails, never skips, when either is missing (`apt-get install chromium
    chromium-driver`)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(path)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: install Debian's browser with "
                    "`apt-get install chromium chromium-driver` (CI does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # Headless, as root, and without the background connections this closed network refuses.
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1100",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    # The driver named explicitly: Selenium must not try to download one.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
