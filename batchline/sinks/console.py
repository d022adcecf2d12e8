"""Print each batch under a header naming its time."""

from __future__ import annotations

from pyspark.sql import DataFrame

from batchline.sinks.sink import BatchContext, Sink

__all__ = ["ConsoleSink"]


class ConsoleSink(Sink):
    reads_all_rows = False  # show() reads the first rows only
    needs_checkpoint = False  # printed, not kept: a rerun prints again and duplicates nothing

    def __init__(self, num_rows: int = 20, truncate: bool = True) -> None:
        self.num_rows = num_rows
        self.truncate = truncate

    def write(self, df: DataFrame, batch: BatchContext) -> None:
        rule = "-" * 43
        print(f"{rule}\nBatch: {batch.batch_time}\n{rule}", flush=True)
        df.show(self.num_rows, truncate=self.truncate)
