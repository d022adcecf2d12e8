"""Bytewax 0.21, the second peer of ``benchmarks.sessionization``: ``update_session``'s logic
(batchline/examples/sessionization.py) in a Bytewax dataflow on one worker, over the same
parquet files, one file per Bytewax batch.

The dataflow: a ``FixedPartitionedSource`` with one partition that reads a file per
``next_batch`` with pyarrow (its position, the next file, is its recovery state), then
``stateful_batch`` keyed by user, then a sink that counts the closed sessions. Like batchline's
side, the whole path from parquet to Python objects is timed; process start-up and building
the dataflow are not.

Why ``stateful_batch`` and not ``stateful``: in 0.21 ``stateful`` is a shim over it that adds a
Python call per item, and ``on_batch`` gets each key's events of the batch together, so the
logic sorts them by ``ts`` as ``update_session`` does. It has the same ``on_notify``,
``on_eof``, ``notify_at`` and ``snapshot`` hooks as ``StatefulLogic``.

Timeouts. Bytewax compares ``notify_at`` with the system clock (``Utc::now()`` in Rust, read
at the start of each activation of the operator; 0.21 has no way to substitute a clock), while
the batchline side runs on a manual clock that moves one minute per file. A wall-clock timeout
of one minute would never fire in a run of a few seconds, and Bytewax would do less work than
batchline. So processing time is counted in files here too, with batchline's rule: a session
last fed in file ``j`` times out in file ``j + 1`` (its deadline, batch ``j``'s time plus one
minute, is batch ``j + 1``'s time, and a processing-time timer fires in the batch at its
deadline) unless an event comes in ``j + 1``. Each file reaches the operator as one activation
(one ``next_batch``, one batch downstream), and a timer fires in the first activation that
starts after its time.

Exactly batchline's timing cannot be had: a timer that fires in file ``j + 1``'s activation
fires after that activation's new events too (Bytewax re-reads ``notify_at`` only after running
the timers), so every session fed in ``j`` and again in ``j + 1`` would cost an ``on_notify``
call that batchline does not make: it skips keys with data. A timer must fire later, once any
new event has replaced it, and the outputs stay exact whenever it fires: a session that gets an
event after its due file is closed as timed out in ``on_batch`` before the event is added, one
still open at the end of input in ``on_eof`` (batchline closed those due by the last file), and
a timer that fires before its session is due only re-arms. So ``notify_at`` aims at about the
start of the activation of the file after the due one (``j + 2``), from the files' reading
times and median period, erring late: it fires there or one file later. The sessions, their
contents and "timeout" labels are the same as batchline's; the timed-out ones come out one or
two files later. ``on_notify_calls`` against the number of timeouts shows what the timers
cost, ``timeouts_files_late`` how many files after the due one the timeouts closed. (Until
2026-11-25 batchline fired strictly after the deadline, in ``j + 2``; the figures in
BENCHMARKS.md from before then were measured with that rule on both sides.)

Checked against batchline's ``StateFunctionTester`` at small scale: the same sessions close,
the same way.

Bytewax work that batchline has no counterpart for: its operator scans every key's timer in
each activation; it calls ``snapshot`` for the keys changed in each epoch even without recovery
(copying the events list, as its contract requires; with recovery the copies are pickled into
SQLite every 2 s); and at the end of input ``on_eof`` and ``notify_at`` run for every open
session, in the last file's time.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from itertools import repeat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from bytewax import operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.operators import StatefulBatchLogic
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import run_main

Event = tuple[datetime, bool, str, int]
"""ts, is_last, data, and the index of the file (batch) it came in."""
Closed = tuple[datetime, datetime, int, str]
"""started, ended, events, closed_by: ClosedSession without the user, who is the key."""
Snapshot = tuple[datetime, datetime, list[str], int]

RECOVERY_EPOCH = timedelta(seconds=2)
FILES_TO_TIMEOUT = 1
"""Batchline's: deadline = batch time + 1 minute, due at a batch's time, batches 1 minute apart."""


class _FileClock:
    """Processing time counted in files, and its translation to the wall clock for ``notify_at``.
    Module state: the source and the stateful operator run in one thread of one worker."""

    def __init__(self) -> None:
        self.read_started: list[float] = []
        """Wall time (time.time()) at which the source began reading each file."""
        self.processing_started: list[float] = []
        """Wall time of the first on_batch call of each file: reading and routing are done."""
        self.current = -1
        """The newest file whose events reached the stateful operator."""
        self.on_notify_calls = 0
        self.timeouts_files_late: dict[int, int] = {}
        self._armed_for = -2
        self._soonest = 0.0
        self._aims: dict[int, datetime] = {}

    def reached(self, file: int) -> None:
        self.current = file
        self.processing_started.append(time.time())

    def timed_out(self, last_file: int) -> None:
        late = self.current - last_file - FILES_TO_TIMEOUT
        self.timeouts_files_late[late] = self.timeouts_files_late.get(late, 0) + 1

    def notify_time(self, due_file: int) -> datetime | None:
        if self.current < 0:
            return None  # a session resumed from a snapshot before any file: armed by its next event
        now = time.time()
        if self._armed_for != self.current or now > self._soonest:
            # The first call after this file's on_batch/on_notify calls, as the next file is about
            # to be read, or a later activation without events (a timer's, the end of input's),
            # where an old aim could lie in the past and fire the timers again and again. The
            # next activation starts after this file's reading time, each later one a period
            # later: the median so far, so that one slow file (a GC pause, a snapshot) does not
            # move the aims.
            starts = self.read_started[: self.current + 1]
            period = statistics.median([b - a for a, b in zip(starts, [*starts[1:], now], strict=True)])
            reading = self.processing_started[self.current] - self.read_started[self.current]
            self._aims = {ahead: datetime.fromtimestamp(now + reading + (ahead - 1) * period, UTC)
                          for ahead in (2, 3)}
            self._soonest = self._aims[2].timestamp()
            self._armed_for = self.current
        # About the start of the activation of the file after the due one (see the module docstring).
        return self._aims[min(max(due_file + 1 - self.current, 2), 3)]


_CLOCK = _FileClock()


class SessionLogic(StatefulBatchLogic[Event, Closed, Snapshot]):
    """One user's open session; discarded (Bytewax drops the key) when none is open."""

    def __init__(self, resume: Snapshot | None) -> None:
        if resume is None:
            self.events: list[str] = []
            self.last_file = -1
        else:
            self.started, self.last_seen, events, self.last_file = resume
            self.events = list(events)

    def _close(self, by: str) -> Closed:
        closed = (self.started, self.last_seen, len(self.events), by)
        self.events = []
        return closed

    def _timed_out(self) -> Closed:
        _CLOCK.timed_out(self.last_file)
        return self._close("timeout")

    def on_batch(self, values: list[Event]) -> tuple[Iterable[Closed], bool]:
        out: list[Closed] = []
        events = sorted(values, key=_by_ts)
        if events[-1][3] > _CLOCK.current:
            _CLOCK.reached(events[-1][3])
        for ts, is_last, data, file in events:
            if self.events and file - self.last_file > FILES_TO_TIMEOUT:
                out.append(self._timed_out())  # batchline timed it out before this file; its timer is late
            if not self.events:
                self.started = self.last_seen = ts
            self.events.append(data)
            self.last_seen = max(self.last_seen, ts)
            self.last_file = file
            if is_last:
                out.append(self._close("last event"))
        return out, not self.events

    def on_notify(self) -> tuple[Iterable[Closed], bool]:
        _CLOCK.on_notify_calls += 1
        if _CLOCK.current - self.last_file >= FILES_TO_TIMEOUT:
            return (self._timed_out(),), StatefulBatchLogic.DISCARD
        return (), StatefulBatchLogic.RETAIN  # fired early, or after this activation's events

    def on_eof(self) -> tuple[Iterable[Closed], bool]:
        # Due by the last file (batchline closed it by then) but its timer aims past the end.
        if _CLOCK.current - self.last_file >= FILES_TO_TIMEOUT:
            return (self._timed_out(),), StatefulBatchLogic.DISCARD
        return (), StatefulBatchLogic.RETAIN

    def notify_at(self) -> datetime | None:
        return _CLOCK.notify_time(self.last_file + FILES_TO_TIMEOUT)

    def snapshot(self) -> Snapshot:
        # on_batch appends to the list after this returns: Bytewax needs an immutable copy.
        return (self.started, self.last_seen, list(self.events), self.last_file)


def _by_ts(event: Event) -> datetime:
    return event[0]


class _FilesPartition(StatefulSourcePartition[tuple[str, Event], int]):
    def __init__(self, paths: list[Path], next_file: int) -> None:
        self.paths = paths
        self.next_file = next_file

    def next_batch(self) -> list[tuple[str, Event]]:
        if self.next_file >= len(self.paths):
            raise StopIteration
        file = self.next_file
        _CLOCK.read_started.append(time.time())
        # Spark writes timestamps as INT96: read them as microseconds so they come out as datetimes.
        table = pq.read_table(self.paths[file], columns=["id", "data", "is_last", "ts"],
                              coerce_int96_timestamp_unit="us")
        users = pc.cast(table["id"], pa.string()).to_pylist()  # Bytewax keys are strings
        events = zip(table["ts"].to_pylist(), table["is_last"].to_pylist(), table["data"].to_pylist(),
                     repeat(file), strict=False)
        self.next_file += 1
        return list(zip(users, events, strict=True))

    def snapshot(self) -> int:
        return self.next_file


class FilesSource(FixedPartitionedSource[tuple[str, Event], int]):
    """The benchmark's parquet files in order, one per batch."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def list_parts(self) -> list[str]:
        return ["files"]

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _FilesPartition:
        return _FilesPartition(self.paths, resume_state or 0)


class _CountingPartition(StatelessSinkPartition[tuple[str, Closed]]):
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def write_batch(self, items: list[tuple[str, Closed]]) -> None:
        for _user, closed in items:
            self.counts[closed[3]] += 1


class CountingSink(DynamicSink[tuple[str, Closed]]):
    """Counts closed sessions by how they closed (batchline's side counts its output rows)."""

    def __init__(self) -> None:
        self.counts = {"last event": 0, "timeout": 0}

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _CountingPartition:
        return _CountingPartition(self.counts)


def run(paths: list[Path], recovery: bool) -> dict[str, Any]:
    """Sessionize ``paths`` in one Bytewax worker in this process; wall seconds per file (from
    the start of reading it to the start of reading the next, the last one to the end of the run)."""
    global _CLOCK
    _CLOCK = _FileClock()
    sink = CountingSink()
    flow = Dataflow("sessions")
    events = op.input("files", flow, FilesSource(paths))
    op.output("count", op.stateful_batch("sessions", events, SessionLogic), sink)
    with tempfile.TemporaryDirectory(prefix="bytewax-recovery-") as tmp:
        db_dir = Path(tmp)
        if recovery:
            init_db_dir(db_dir, 1)  # what `python -m bytewax.recovery DIR 1` does
            run_main(flow, epoch_interval=RECOVERY_EPOCH, recovery_config=RecoveryConfig(db_dir))
        else:
            run_main(flow)  # epochs of 10 s, the default; nothing is persisted
        ended = time.time()
        db_bytes = sum(f.stat().st_size for f in db_dir.iterdir())
    starts = _CLOCK.read_started
    return {
        "batch_seconds": [b - a for a, b in zip(starts, [*starts[1:], ended], strict=True)],
        "closed_sessions": dict(sink.counts),
        "on_notify_calls": _CLOCK.on_notify_calls,
        "timeouts_files_late": dict(sorted(_CLOCK.timeouts_files_late.items())),
        "recovery_db_bytes": db_bytes if recovery else None,
    }
