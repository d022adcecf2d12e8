"""Every ``python`` code block of the README runs as written, so the README cannot drift from the product.

Each block runs in a process of its own (``sys.executable``, the repository on ``PYTHONPATH``) in a new
folder, as a user who pastes it into a file would run it. A block that names Redis or PostgreSQL by the
README's literal addresses gets the test's servers instead. A block that runs until stopped (a bare
``await_termination()``) gets Ctrl-C (SIGINT to its process group, as a terminal sends it) once it has
logged its first per-batch line, and must then exit 0 without a traceback. ``batchline status`` lines
shown under a block's heading run in that block's folder afterwards. Each test is named by the README
heading above its block.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import ROOT, poll_until

README = ROOT / "README.md"

BLOCK_TIMEOUT_S = 150.0
"""Longest a block may run (a Spark start takes 5-10 s of it)."""
FIRST_BATCH_TIMEOUT_S = 60.0
"""A block that runs until stopped gets Ctrl-C at its first per-batch line, or after this long."""
STOP_TIMEOUT_S = 60.0
"""How long a graceful stop may take after Ctrl-C."""

PER_BATCH_LINE = re.compile(r"batch \d{4}-\d\d-\d\dT[\d:.]+Z \| \d+ records")
RUNS_UNTIL_STOPPED = re.compile(r"\.await_termination\(\s*\)")
REDIS_URL = "redis://127.0.0.1:6379/0"
KAFKA_SERVERS = "127.0.0.1:9092"
POSTGRES_URL = re.compile(r"postgresql://[^\s\"']*@127\.0\.0\.1:5432/\w+")

RUNS_IN_FOLDER_OF = {"Troubleshooting / Reading write_files output back": "A first pipeline"}
"""Blocks that read what an earlier block wrote, as the README says they do."""
PRINTS = {
    "Troubleshooting / Reading write_files output back": ["ann"],
    "Testing your pipelines": ["all passed"],
    "Joining two streams": ["ad1 True", "ad2 False", "ad3 False"],
    "Dashboard, metrics and progress": ["dashboard: http://127.0.0.1:", "batchline_batches_total"],
}
"""What a block's output must contain, beyond exiting cleanly."""


@dataclass(frozen=True)
class Block:
    name: str
    code: str
    shell: tuple[str, ...]
    """``batchline status`` lines of shell blocks under the same heading."""


def _plain(text: str) -> str:
    return re.sub(r"[`*]", "", text).strip().rstrip(".")


def readme_blocks() -> list[Block]:
    """The README's python blocks, each named by its heading (and, when a heading has several, by
    the bold lead-in above the block)."""
    heading, lead = "", ""
    found: list[tuple[str, str, str]] = []
    shell: dict[str, list[str]] = {}
    lines = README.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading, lead = _plain(line.lstrip("#")), ""
        elif line.startswith("**"):
            lead = _plain(line.split("**")[1])
        elif line.startswith("```"):
            language = line[3:].strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            body = lines[i + 1:end]
            if language == "python":
                found.append((heading, lead, "\n".join(body) + "\n"))
            elif language == "bash":
                shell.setdefault(heading, []).extend(
                    cmd.split("#")[0].strip() for cmd in body if cmd.startswith("batchline status "))
            i = end
        i += 1
    per_heading: dict[str, int] = {}
    for heading, _, _ in found:
        per_heading[heading] = per_heading.get(heading, 0) + 1
    return [Block(f"{heading} / {lead}" if per_heading[heading] > 1 else heading, code,
                  tuple(shell.get(heading, ())))
            for heading, lead, code in found]


BLOCKS = readme_blocks()
_folders: dict[str, Path] = {}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _with_servers(code: str, request: pytest.FixtureRequest) -> str:
    """The README's literal server addresses replaced by the test's servers, whose streams and tables
    the block uses emptied first."""
    if REDIS_URL in code:
        import redis

        server = request.getfixturevalue("redis_server")
        client = redis.Redis.from_url(server.url)
        for stream in re.findall(r"xadd\(\"([^\"]+)\"", code):
            client.delete(stream)
        code = code.replace(REDIS_URL, server.url)
    if POSTGRES_URL.search(code):
        import psycopg

        server = request.getfixturevalue("postgres_server")
        tables = re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", code)

        def drop() -> None:
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                for table in tables:
                    conn.execute(f"DROP TABLE IF EXISTS {table}")

        drop()
        request.addfinalizer(drop)  # other tests of the session use tables of these names
        code = POSTGRES_URL.sub(server.dsn, code)
    if KAFKA_SERVERS in code:
        broker = request.getfixturevalue("kafka_broker")
        topics = re.findall(r"NewTopic\(\"([^\"]+)\"", code)
        existing = set(broker.admin().list_topics(timeout=10).topics)
        gone = [t for t in topics if t in existing]
        if gone:
            for deleted in broker.admin().delete_topics(gone).values():
                deleted.result(30)
            poll_until(lambda: not set(gone) & set(broker.admin().list_topics(timeout=10).topics), 30, 0.1)
        code = code.replace(KAFKA_SERVERS, broker.bootstrap_servers)
    return code


def _output(folder: Path) -> str:
    return (folder / "stdout.txt").read_text() + (folder / "stderr.txt").read_text()


def _run(block: Block, folder: Path, request: pytest.FixtureRequest) -> str:
    """Run the block in ``folder``; return what it printed (stdout, then stderr)."""
    (folder / "block.py").write_text(_with_servers(block.code, request))
    with open(folder / "stdout.txt", "w") as out, open(folder / "stderr.txt", "w") as err:
        process = subprocess.Popen([sys.executable, "block.py"], cwd=folder, env=_env(), stdout=out, stderr=err,
                                   start_new_session=True)
    try:
        if RUNS_UNTIL_STOPPED.search(block.code):
            poll_until(lambda: PER_BATCH_LINE.search(_output(folder)), FIRST_BATCH_TIMEOUT_S, 0.2,
                       stop=lambda: process.poll() is not None)
            assert process.poll() is None, f"{block.name}: exited before Ctrl-C:\n{_output(folder)}"
            os.killpg(process.pid, signal.SIGINT)
            timeout = STOP_TIMEOUT_S
        else:
            timeout = BLOCK_TIMEOUT_S
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"README block under '{block.name}' still running after {timeout:g} s:\n{_output(folder)}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    printed = _output(folder)
    assert process.returncode == 0, f"README block under '{block.name}' exited {process.returncode}:\n{printed}"
    assert "Traceback" not in printed, f"README block under '{block.name}' printed a traceback:\n{printed}"
    return printed


def _folder_of(block: Block, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder ``block`` ran in, running it first if this session has not."""
    if block.name not in _folders:
        folder = tmp_path_factory.mktemp("readme")
        _run(block, folder, request)
        _folders[block.name] = folder
    return _folders[block.name]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_readme_block_runs(block, request, tmp_path_factory):
    if block.name in RUNS_IN_FOLDER_OF:
        before = next(b for b in BLOCKS if b.name == RUNS_IN_FOLDER_OF[block.name])
        folder = _folder_of(before, request, tmp_path_factory)
        printed = _run(block, folder, request)
    else:
        folder = tmp_path_factory.mktemp("readme")
        printed = _run(block, folder, request)
        _folders[block.name] = folder
    for text in PRINTS.get(block.name, []):
        assert text in printed, f"README block under '{block.name}' should print {text!r}:\n{printed}"
    for command in block.shell:
        argv = command.split()[1:]
        done = subprocess.run([sys.executable, "-m", "batchline.cli.main", *argv], cwd=folder, env=_env(),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"`{command}` after '{block.name}' exited {done.returncode}:\n" \
                                     f"{done.stdout}{done.stderr}"


def test_readme_names_every_block():
    """The parsing above finds the blocks the README has, and the blocks it depends on exist."""
    names = [b.name for b in BLOCKS]
    assert len(names) == len(set(names)), names
    assert len(names) == README.read_text().count("```python")
    for after, before in RUNS_IN_FOLDER_OF.items():
        assert after in names and before in names, (after, before, names)
    assert all(name in names for name in PRINTS), names
