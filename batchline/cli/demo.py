"""The demo pipeline: sessionization of generated user events on local Spark."""

from __future__ import annotations

from batchline.api.context import StreamingContext
from batchline.api.stream import Stream
from batchline.examples.sessionization import build_sessionization

__all__ = ["build_demo"]


def build_demo(ssc: StreamingContext, rate: float, users: int) -> Stream:
    """Sessions per user, printed as they close (a last event, or a minute without events)."""
    # The cap spreads the backlog of a resumed demo over batches instead of one giant batch.
    sessions = build_sessionization(ssc, rate=rate, users=users, max_records_per_batch=int(rate * 10) or None)
    sessions.console(num_rows=10, truncate=False, name="closed-sessions")
    return sessions
