"""The chaos soak (SPEC E3): a stateful pipeline of JSON files in and Parquet out on
the standalone cluster, with its checkpoint and output on the S3 endpoint, run for a while
under every kind of fault at once:

- the driver killed (SIGKILL) at a random moment, ``driver_life_s`` after it started (and
  never before it committed a batch, so that every restart must make progress), then started
  again;
- an executor JVM killed every ``executor_every_s`` (its worker starts a new one);
- the S3 endpoint down for ``outage_s`` every ``outage_every_s`` (a TCP proxy in front of moto's
  server closes its port and every connection; harness/tcp_proxy.py);
- a file damaged once, while the driver is down: the newest snapshot (a restart reads
  around it from the older files and says so), or, before there is one, the newest delta of
  a batch not committed (its partition runs the batch again), or else the newest batch
  checkpoint (a restart falls back to the one before).

Input files keep coming all along (one every ``file_every_s``, events numbered on). When the
time is up the faults stop, one last driver works off what is left, and the output is compared
with what any correct run writes: every event once, numbered per user in order. Returns the
record of the run (faults of each kind, restarts, time from each driver's start to its first
commit).

The CI chaos tier runs 5 minutes of it (test_soak_chaos.py); ``pytest -m soak_chaos`` runs the
hour (tests/soak_chaos/).
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import s3fs

from harness.numbering import numbered_output
from harness.tcp_proxy import TcpProxy
from tests.helpers import DRIVERS, poll_until

DRIVER = DRIVERS / "soak_chaos_driver.py"
USERS = 25
EVENTS_PER_FILE = 60


@dataclass
class SoakSettings:
    duration_s: float
    driver_life_s: tuple[float, float] = (30, 120)
    executor_every_s: tuple[float, float] = (120, 240)
    outage_every_s: tuple[float, float] = (240, 480)
    outage_s: tuple[float, float] = (10, 30)
    file_every_s: float = 1.0
    seed: int = 34


@dataclass
class SoakRecord:
    duration_s: float
    files: int = 0
    events: int = 0
    driver_kills: int = 0
    executor_kills: int = 0
    s3_outages: int = 0
    s3_outage_seconds: float = 0.0
    files_damaged: int = 0
    damaged: str = ""
    restarts: int = 0
    batches_committed: int = 0
    batch_retries: int = 0
    seconds_to_first_commit: list[float] = field(default_factory=list)
    """For each driver, from its process start to its first committed batch."""
    final_catch_up_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _Driver:
    def __init__(self, master: str, incoming: Path, checkpoint: str, out: str, options: dict, log: Path,
                 kill_delay_s: float) -> None:
        self.began = time.monotonic()
        self.first_commit_s: float | None = None
        self.records: list[int] = []
        """Input records of each batch it committed, in order."""
        self.retries = 0
        with open(log, "ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(DRIVER), master, str(incoming), checkpoint, out, json.dumps(options)],
                stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
        self.killable_at: float | None = None
        """A moment a few seconds after its first commit (in the batches after it): a kill
        never comes before a driver made progress, nor always right at a commit."""
        self._kill_delay_s = kill_delay_s
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("completed "):
                _, _, records, attempts = line.split()
                self.records.append(int(records))
                self.retries += int(attempts) - 1
                if self.first_commit_s is None:
                    self.first_commit_s = time.monotonic() - self.began
                    self.killable_at = time.monotonic() + self._kill_delay_s

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


class _Feeder:
    """Writes a file of events every ``every_s``, numbered on from the last one."""

    def __init__(self, incoming: Path, every_s: float, rng: random.Random) -> None:
        self.incoming = incoming
        self.every_s = every_s
        self.rng = rng
        self.files = 0
        self.events: list[tuple[str, int]] = []
        self._stop = threading.Event()
        incoming.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.write_one()

    def write_one(self) -> None:
        lines = []
        for _ in range(EVENTS_PER_FILE):
            index = len(self.events)
            user = self.rng.randrange(USERS)
            self.events.append((f"event-{index}", user))
            lines.append(json.dumps({"event": f"event-{index}", "user": user, "index": index}))
        temp = self.incoming / f".events-{self.files:06d}.json.tmp"
        temp.write_text("\n".join(lines) + "\n")
        temp.rename(self.incoming / f"events-{self.files:06d}.json")  # whole, as a producer should
        self.files += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def expected_rows(events: list[tuple[str, int]]) -> collections.Counter:
    counts: dict[int, int] = collections.Counter()
    rows = []
    for event, user in events:
        counts[user] += 1
        rows.append((event, user, counts[user]))
    return collections.Counter(rows)


def _damage_a_file(checkpoint: str, options: dict, rng: random.Random) -> str | None:
    """Flip four bytes of the newest snapshot, or else of the newest delta of a batch that was
    not committed (its partition runs the batch again), or else of the newest batch checkpoint
    (a restart falls back to the one before): the damage a restart must read around exactly.
    The last is there from a driver's second checkpoint on, however slowly the machine runs.
    Returns the file, or None when there is none of them yet."""
    fs = s3fs.S3FileSystem(**options)
    fs.invalidate_cache()
    root = checkpoint.removeprefix("s3://")
    files = fs.find(f"{root}/state")
    snapshots = [p for p in files if p.endswith(".snapshot.arrow")]
    committed = {p.rsplit("/", 2)[-2] for p in fs.find(f"{root}/events") if p.endswith("/completed.json")}
    uncommitted = [p for p in files if p.endswith(".delta.arrow")
                   and p.rsplit("/", 1)[-1].split(".")[0] not in committed]
    checkpoints = [p for p in fs.find(f"{root}/checkpoints") if p.rsplit("/", 1)[-1].startswith("checkpoint-")]
    candidates = snapshots or uncommitted or (checkpoints if len(checkpoints) >= 2 else [])
    if not candidates:
        return None
    newest = max(candidates, key=lambda p: p.rsplit("/", 1)[-1])
    data = bytearray(fs.cat_file(newest))
    at = rng.randrange(len(data) // 4, 3 * len(data) // 4)
    data[at:at + 4] = bytes(b ^ 0xFF for b in data[at:at + 4])
    fs.pipe_file(newest, bytes(data))
    return newest


def run_soak_chaos(cluster: Any, s3_options: dict, work: Path, settings: SoakSettings) -> SoakRecord:
    rng = random.Random(settings.seed)
    target = urlparse(s3_options["client_kwargs"]["endpoint_url"])
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 80).start()
    options = {**s3_options, "client_kwargs": {**s3_options["client_kwargs"],
                                               "endpoint_url": f"http://127.0.0.1:{proxy.port}"}}
    run = uuid.uuid4().hex[:8]
    checkpoint, out = f"s3://batchline-test/soak-{run}/checkpoint", f"s3://batchline-sink/soak-{run}/out"
    incoming, log = work / "incoming", work / "drivers.log"
    record = SoakRecord(settings.duration_s)
    feeder = _Feeder(incoming, settings.file_every_s, rng)
    for _ in range(4):
        feeder.write_one()
    drivers: list[_Driver] = []

    def start_driver() -> _Driver:
        driver = _Driver(cluster.url, incoming, checkpoint, out, options, log, kill_delay_s=rng.uniform(1, 8))
        drivers.append(driver)
        return driver

    def tail() -> str:
        return "\n".join(log.read_text(errors="replace").splitlines()[-60:])

    def uniform(bounds: tuple[float, float]) -> float:
        return rng.uniform(*bounds)

    started = time.monotonic()
    end = started + settings.duration_s
    driver = start_driver()
    feeder.start()
    damage_at = started + settings.duration_s * rng.uniform(0.3, 0.6)
    next_kill = time.monotonic() + uniform(settings.driver_life_s)
    next_executor = started + uniform(settings.executor_every_s)
    next_outage = started + uniform(settings.outage_every_s)
    try:
        while time.monotonic() < end:
            now = time.monotonic()
            if not driver.alive():
                raise AssertionError(f"a driver ended by itself (exit {driver.process.returncode}):\n{tail()}")
            if now >= next_kill and driver.killable_at is not None and now >= driver.killable_at:
                driver.kill()
                record.driver_kills += 1
                if record.files_damaged == 0 and now >= damage_at:
                    damaged = _damage_a_file(checkpoint, s3_options, rng)
                    if damaged is not None:
                        record.files_damaged += 1
                        record.damaged = damaged.rsplit("/checkpoint/", 1)[-1]
                driver = start_driver()
                record.restarts += 1
                next_kill = time.monotonic() + uniform(settings.driver_life_s)
            elif now >= next_executor:
                pids = cluster.executor_pids()
                if pids:
                    os.kill(rng.choice(sorted(pids.values())), signal.SIGKILL)
                    record.executor_kills += 1
                next_executor = now + uniform(settings.executor_every_s)
            elif now >= next_outage:
                length = min(uniform(settings.outage_s), max(0.0, end - now))
                proxy.down()
                time.sleep(length)
                proxy.up()
                record.s3_outages += 1
                record.s3_outage_seconds += length
                next_outage = time.monotonic() + uniform(settings.outage_every_s)
            time.sleep(0.2)
        feeder.stop()
        record.files, record.events = feeder.files, len(feeder.events)
        expected = expected_rows(feeder.events)
        # The last driver works off what is left, without faults, until three batches in a row
        # found nothing new.
        catch_up = time.monotonic()
        seen = len(driver.records)

        def worked_off() -> bool:
            if len(driver.records) >= seen + 3 and not any(driver.records[-3:]):
                return True
            if not driver.alive():
                raise AssertionError(f"the last driver ended by itself:\n{tail()}")
            return False

        if not poll_until(worked_off, timeout_s=600, step_s=0.5):
            raise AssertionError(f"the last driver did not work off the input in 600 s:\n{tail()}")
        record.final_catch_up_s = round(time.monotonic() - catch_up, 1)
        driver.process.send_signal(signal.SIGTERM)
        driver.process.wait(120)
    finally:
        for each in drivers:
            if each.alive():
                each.kill()
        feeder.stop()
        proxy.stop()
    got = numbered_output(out, s3_options)
    repeated = sorted(row for row, n in got.items() if n > 1)
    assert not repeated, f"rows written twice: {repeated[:5]}"
    assert set(got) == set(expected), (f"missing {sorted(set(expected) - set(got))[:5]}, "
                                       f"unexpected {sorted(set(got) - set(expected))[:5]}\n{tail()}")
    # Every restart made progress: each killed driver had committed a batch (kills wait for it).
    record.batches_committed = sum(len(d.records) for d in drivers)
    record.batch_retries = sum(d.retries for d in drivers)
    record.seconds_to_first_commit = [round(d.first_commit_s, 1) for d in drivers if d.first_commit_s is not None]
    assert len(record.seconds_to_first_commit) == len(drivers), "a driver never committed a batch"
    return record
