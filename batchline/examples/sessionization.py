"""Sessionization: per user, collect events into a session
that closes on a "last" event or after one minute without events, even if no more data
ever arrives for the user.

    python examples/sessionization.py [CHECKPOINT [SECONDS]]

Generates 500 events a second for 200 users and prints the sessions closed in every
two-second batch as a table (user, started, ended, events, closed_by: "last event" or
"timeout"), after a first line ``Checkpoint: <folder>``. The checkpoint is kept in CHECKPOINT
(default: a new folder in the system's temporary folder, named on that first line). It runs for
SECONDS, or until Ctrl-C, which stops it gracefully; start it again with the same CHECKPOINT:
open sessions, their timeouts and the generator's position resume from it.
"""

from __future__ import annotations

import datetime as dt
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from batchline import StreamingContext
from batchline.spark import local_spark_session
from batchline.state import GroupState, GroupStateTimeout

SESSION_TIMEOUT = "1 minute"


@dataclass
class UserSession:
    """Open session of one user: its events so far."""

    user: int
    started: dt.datetime
    last_seen: dt.datetime
    events: list[str] = field(default_factory=list)


@dataclass
class ClosedSession:
    user: int
    started: dt.datetime
    ended: dt.datetime
    events: int
    closed_by: str


def update_session(user: int, events: Iterator, state: GroupState[UserSession]) -> Iterator[ClosedSession]:
    if state.has_timed_out:
        closed = state.get()
        state.remove()
        yield ClosedSession(user, closed.started, closed.last_seen, len(closed.events), "timeout")
        return
    session: UserSession | None = state.get_option()
    for event in sorted(events, key=lambda e: e.ts):
        if session is None:
            session = UserSession(user, event.ts, event.ts)
        session.events.append(event.data)
        session.last_seen = max(session.last_seen, event.ts)
        if event.is_last:
            yield ClosedSession(user, session.started, session.last_seen, len(session.events), "last event")
            session = None
    if session is None:
        state.remove()
    else:
        state.update(session)
        state.set_timeout_duration(SESSION_TIMEOUT)


def build_sessionization(ssc: StreamingContext, rate: float, users: int, seed: int = 7,
                         max_records_per_batch: int | None = None, num_partitions: int | None = None):
    events = ssc.generator_stream(rate=rate, users=users, seed=seed, max_records_per_batch=max_records_per_batch)
    return events.group_by_key("id").flat_map_groups_with_state(
        update_session,
        state_schema=UserSession,
        output_schema=ClosedSession,
        timeout=GroupStateTimeout.PROCESSING_TIME,
        name="sessions",
        num_partitions=num_partitions,
    )


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--"]
    checkpoint = args[0] if args else tempfile.mkdtemp(prefix="batchline-sessions-")
    seconds = float(args[1]) if len(args) > 1 else None
    spark = local_spark_session(app_name="sessionization")
    ssc = StreamingContext(spark, "2 seconds", checkpoint=checkpoint)
    sessions = build_sessionization(ssc, rate=500, users=200)
    sessions.console(num_rows=10, truncate=False, name="closed-sessions")
    print(f"Checkpoint: {checkpoint}", flush=True)
    ssc.start()
    if not ssc.await_termination(seconds):  # SECONDS passed; Ctrl-C stops it gracefully before that
        ssc.stop(graceful=True)


if __name__ == "__main__":
    main()
