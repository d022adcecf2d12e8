"""Shared test helpers."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import importlib.util
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from batchline.clock import ManualClock

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
"""The repository's root."""
DRIVERS = ROOT / "tests" / "drivers"
"""The driver scripts that kill tests start in processes of their own."""
CHECKPOINT_FIXTURES = ROOT / "tests" / "fixtures" / "checkpoints"
"""Checkpoint locations older code wrote, each with the pipeline code that wrote it."""


def fixture_pipeline(name: str) -> ModuleType:
    """The pipeline code a checkpoint fixture was written by (its ``pipeline.py``), loaded as
    a restarted script would build the pipeline again."""
    spec = importlib.util.spec_from_file_location(name, CHECKPOINT_FIXTURES / name / "pipeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LogWatcher(logging.Handler):
    """Captures formatted log messages of a logger tree and lets a test wait for one."""

    def __init__(self, logger_name: str = "batchline") -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._changed = threading.Condition()
        self._logger = logging.getLogger(logger_name)

    def __enter__(self) -> LogWatcher:
        self._logger.addHandler(self)
        self._old_level = self._logger.level
        self._logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._old_level)

    def emit(self, record: logging.LogRecord) -> None:
        with self._changed:
            self.records.append(record)
            self._changed.notify_all()

    def messages(self, logger: str | None = None, level: int = logging.INFO) -> list[str]:
        with self._changed:
            return [r.getMessage() for r in self.records
                    if r.levelno >= level and (logger is None or r.name == logger)]

    def wait_for(self, fragment: str, timeout: float = 30) -> None:
        with self._changed:
            ok = self._changed.wait_for(lambda: any(fragment in r.getMessage() for r in self.records), timeout)
        if not ok:
            raise TimeoutError(f"no log line containing {fragment!r} within {timeout} s")


def drive_until_done(clock: ManualClock, thread: threading.Thread, step_ms: int = 100, limit: int = 2000) -> None:
    """Advance a manual clock step by step until ``thread`` (e.g. a stop()) has finished."""
    for _ in range(limit):
        if not thread.is_alive():
            return
        clock.advance(step_ms)
        thread.join(0.01)
    raise TimeoutError("the thread did not finish while the clock was driven")


def sleeps_on_a_fake_clock(monkeypatch, module: ModuleType) -> list[float]:
    """Make ``module``'s ``_sleep`` move a fake clock that its ``_monotonic`` reads, instead of
    waiting: the clock's reading is the returned list's one item, in seconds."""
    now = [0.0]
    monkeypatch.setattr(module, "_monotonic", lambda: now[0])
    monkeypatch.setattr(module, "_sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
    return now


def poll_until(predicate: Callable[[], T], timeout_s: float = 10, step_s: float = 0.005,
               stop: Callable[[], object] | None = None) -> T | None:
    """``predicate()``'s first true value within ``timeout_s`` of real time (None if it never
    came, or ``stop()`` became true first): for a state another thread or process reaches
    without notifying anyone (a clock would not make it come sooner). The one polling loop of
    the tests."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline or (stop is not None and stop()):
            return None
        time.sleep(step_s)


def in_background(function: Callable[..., T], *args: object, **kwargs: object) -> Callable[[float | None], T]:
    """``function(*args, **kwargs)`` in a thread of its own (e.g. an uninterrupted run beside
    a kill test's kills); returns a callable that waits for its result, raising its error."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(function, *args, **kwargs)
    pool.shutdown(wait=False)
    return future.result


def wait_for(predicate: Callable[[], T], what: str, timeout_s: float = 10, step_s: float = 0.005,
             stop: Callable[[], object] | None = None) -> T:
    """``poll_until``, failing with ``TimeoutError`` naming ``what`` when it never came."""
    value = poll_until(predicate, timeout_s, step_s, stop)
    if not value:
        raise TimeoutError(f"no {what} within {timeout_s:.0f} s")
    return value


@dataclass
class Count:
    """A key's state in the state tests: how many rows, and their values' total."""

    count: int
    total: int


def running_count(key, rows, state):
    count = state.get() if state.exists else Count(0, 0)
    for row in rows:
        count = Count(count.count + 1, count.total + row.value)
    state.update(count)
    yield {"key": key, "count": count.count}


def session_fn(key, rows, state):
    """Collects a count; on timeout emits it and drops the key."""
    if state.has_timed_out:
        count = state.get()
        state.remove()
        yield {"key": key, "count": count.count}
        return
    count = state.get_option() or Count(0, 0)
    state.update(Count(count.count + sum(1 for _ in rows), 0))
    state.set_timeout_duration("2 seconds")


def event_time_count(key, rows, state):
    """Counts a batch's rows; times out five seconds of event time after the newest."""
    if state.has_timed_out:
        state.remove()
        yield {"key": key, "count": -1}
        return
    times = [r.ts for r in rows]
    state.update(Count(len(times), 0))
    state.set_timeout_timestamp(max(times), "5 seconds")
    yield {"key": key, "count": len(times)}


def at(seconds: float) -> dt.datetime:
    """An event time ``seconds`` after the event-time tests' origin (2026-01-01, UTC)."""
    return dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds)


def naive(seconds: float) -> dt.datetime:
    """``at(seconds)`` as a top-level timestamp column comes back from Spark: naive, in UTC."""
    return at(seconds).replace(tzinfo=None)


class Collect:
    """A ``foreach_batch`` function that keeps every batch's rows (dicts, nested rows too) by batch
    time, and fails the batch on its ``fail_on_call``-th call (after reading it): a crash."""

    def __init__(self, fail_on_call: int | None = None) -> None:
        self.batches: dict[int, list[dict]] = {}
        self.calls = 0
        self.fail_on_call = fail_on_call

    def __call__(self, df, batch_time) -> None:
        self.calls += 1
        self.batches[int(batch_time)] = [row.asDict(recursive=True) for row in df.collect()]
        if self.calls == self.fail_on_call:
            raise RuntimeError("crash after reading")

    def rows(self) -> list[dict]:
        return [row for t in sorted(self.batches) for row in self.batches[t]]


def run_until_finished(ssc, timeout: float | None = None) -> int:
    """A driver script's run: start, say ``started``, then ``finished`` (exit code 0) or ``not
    finished`` (1) when the pipeline ends or ``timeout`` passes."""
    ssc.start()
    print("started", flush=True)
    if not ssc.run_until_finished(timeout):
        print("not finished", flush=True)
        return 1
    print("finished", flush=True)
    return 0


def exit_with(main: Callable[[], int]) -> None:
    """Run a driver script's ``main`` and exit with its code, or with 1 on any error."""
    try:
        code = main()
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # non-daemon threads (Spark's, the pipeline's) must not keep a failed driver alive
    sys.exit(code)


class LineServer:
    """A TCP server on loopback that sends lines to whoever connects."""

    def __init__(self):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._conn = None
        self._connected = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self._conn, _ = self._listener.accept()
        self._connected.set()

    def send(self, lines):
        assert self._connected.wait(30), "the receiver never connected"
        self._conn.sendall("".join(f"{line}\n" for line in lines).encode())

    def close(self):
        if self._conn:
            self._conn.close()
        self._listener.close()


class DriverProcess:
    """A driver script of ``tests/drivers/`` in a process of its own, as kill tests start them:
    its stdout line ``started`` sets ``started``, and each ``completed <batch time> ...`` line
    adds the batch time to ``completed``.

    ``warm=True`` starts it with ``--wait-for-go``: the script starts Spark, prints ``ready``
    (which sets ``ready``) and waits for ``go()`` before it builds and starts its pipeline. A
    kill test starts the next driver warm while it lets the current one run, so that the next
    JVM's start-up overlaps the current run; the kill points it draws after ``started`` are
    the same. (A kill meant for the JVM's start-up needs a driver started cold.)"""

    def __init__(self, script: Path, *args: object, warm: bool = False) -> None:
        self.process = subprocess.Popen([sys.executable, str(script), *(str(a) for a in args),
                                         *(["--wait-for-go"] if warm else [])],
                                        stdin=subprocess.PIPE if warm else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.completed: list[int] = []
        self.ready = threading.Event()
        self.started = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("ready"):
                self.ready.set()
            elif line.startswith("started"):
                self.started.set()
            elif line.startswith("completed "):
                self.completed.append(int(line.split()[1]))

    def go(self, timeout_s: float = 60) -> None:
        """Let a driver started warm build and start its pipeline, once its Spark is up."""
        assert self.process.stdin is not None, "go() is for a driver started warm"
        assert self.ready.wait(timeout_s), "the warm driver did not start Spark"
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone."""
        self.process.kill()
        self.process.wait()
        if self.process.stdin is not None:
            self.process.stdin.close()

    def wait_exit(self, timeout_s: float) -> int:
        return self.process.wait(timeout_s)


def wait_for_go() -> None:
    """In a driver script started warm (``--wait-for-go``), after Spark started: say
    ``ready`` and wait for the test's ``go``; a test that went away ends the driver."""
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        os._exit(1)  # Spark's non-daemon threads must not keep it alive
