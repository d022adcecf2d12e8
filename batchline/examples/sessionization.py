"""Sessionization (seed 003's example, in Python): per user, collect events into a session
that closes on a "last" event or after one minute without events, even if no more data
ever arrives for the user.

    python examples/sessionization.py [checkpoint-dir]

Stop it with Ctrl-C and start it again: open sessions, their timeouts and the generator's
position resume from the checkpoint.
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
    checkpoint = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="batchline-sessions-")
    spark = local_spark_session(app_name="sessionization")
    ssc = StreamingContext(spark, "2 seconds", checkpoint=checkpoint)
    sessions = build_sessionization(ssc, rate=500, users=200)
    sessions.console(num_rows=10, truncate=False, name="closed-sessions")
    print(f"Checkpoint: {checkpoint}", flush=True)
    ssc.start()
    try:
        ssc.await_termination()
    except KeyboardInterrupt:
        ssc.stop(graceful=True)


if __name__ == "__main__":
    main()
