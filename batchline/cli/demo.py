"""The demo pipeline: generated user events, counted per batch on local Spark."""

from __future__ import annotations

from pyspark.sql import functions as F

from batchline.api.context import StreamingContext
from batchline.api.stream import Stream

__all__ = ["build_demo"]


def build_demo(ssc: StreamingContext, rate: float, users: int) -> Stream:
    """Per batch: the five busiest users, with their events and how many sessions ended."""
    # The cap spreads the backlog of a resumed demo over batches instead of one giant batch.
    events = ssc.generator_stream(rate=rate, users=users, seed=7, max_records_per_batch=int(rate * 10) or None)
    busiest = events.group_by_key("id").agg(
        F.count("*").alias("events"),
        F.sum(F.col("is_last").cast("int")).alias("sessions_ended"),
        F.max("ts").alias("last_seen"),
    ).transform(lambda df: df.orderBy(F.desc("events"), "id").limit(5))
    busiest.console(num_rows=5, truncate=False, name="busiest-users")
    return busiest
