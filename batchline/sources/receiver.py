"""The receiver input (SPEC B2): a user's ``Receiver`` stores records on the driver, a block
generator cuts them into blocks, and ``ReceiverSource`` is the ``Source`` whose batches are
those blocks."""

from __future__ import annotations

import itertools
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from batchline.checkpoint.received_blocks import Block, ReceivedBlockLog
from batchline.clock import Clock, SystemClock
from batchline.errors import SourceError
from batchline.scheduler.timer import RecurringTimer
from batchline.sources.source import BatchTimes, Position, Source, SourceBatch, SourceRun, Split

__all__ = ["Receiver", "BlockGenerator", "ReceiverSource", "TEXT_SCHEMA"]

logger = logging.getLogger(__name__)

TEXT_SCHEMA = StructType([StructField("value", StringType(), True)])


class BlockGenerator:
    """Buffers stored records and pushes them as one block every block interval (SPEC B2)."""

    def __init__(
        self,
        name: str,
        clock: Clock,
        block_interval_ms: int,
        push_block: Callable[[Block], None],
        first_block_id: int = 0,
    ) -> None:
        self._clock = clock
        self._push_block = push_block
        self._buffer: list[str] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(first_block_id)
        self._timer = RecurringTimer(clock, block_interval_ms, self._cut_block, f"BlockGenerator-{name}")

    def start(self) -> None:
        self._timer.start(self._timer.get_start_time())

    def add(self, record: str) -> None:
        with self._lock:
            self._buffer.append(record)

    def stop(self) -> None:
        """Stop cutting on the timer and push what is still buffered as a last block."""
        self._timer.stop(interrupt=True)
        self._cut_block(self._clock.now_ms())

    def _cut_block(self, time_ms: int) -> None:
        with self._lock:
            records, self._buffer = self._buffer, []
        if records:
            self._push_block(Block(next(self._ids), tuple(records), time_ms))


class Receiver(ABC):
    """Subclass and implement ``on_start``/``on_stop``; call ``store`` from your own threads.

    ``on_stop`` must return only once no more ``store`` calls will come: a graceful stop
    (``stopping_gracefully``) counts on every record received before it being stored.
    """

    def __init__(self) -> None:
        self._block_generator: BlockGenerator | None = None
        self._stopped = threading.Event()
        self.stopping_gracefully = False

    @abstractmethod
    def on_start(self) -> None:
        """Start the threads that receive data; return at once."""

    @abstractmethod
    def on_stop(self) -> None:
        """Stop receiving, flushing what was already received through ``store``."""

    def store(self, record: str) -> None:
        if self._block_generator is None:
            raise RuntimeError("store() called on a receiver that was not started by a streaming context")
        self._block_generator.add(record)

    @property
    def is_stopped(self) -> bool:
        return self._stopped.is_set()

    def start_receiving(self, block_generator: BlockGenerator) -> None:
        """Called by the pipeline once it runs: records stored from now on go into blocks."""
        self._block_generator = block_generator
        block_generator.start()
        self.on_start()

    def stop_receiving(self, graceful: bool) -> None:
        """Called by the pipeline when it stops (gracefully: flush what was received)."""
        self.stopping_gracefully = graceful
        self._stopped.set()
        try:
            self.on_stop()
        finally:
            if self._block_generator is not None:
                self._block_generator.stop()


class ReceiverSource(Source):
    """Rows ``value: string`` from the blocks a receiver stored, as allocated to each batch.

    The receiver runs on the driver from ``start_receiving`` to ``stop_receiving``; every
    block interval its block generator cuts what it stored into a block. With a checkpoint
    location, a block is written ahead there (``received/<input>/<block id>.json``) before
    it counts as received.
    A batch takes every block queued at its batch time; the batch log keeps their ids
    (``{"blocks": [...]}``) and the checkpoint the highest id a batch took
    (``{"allocated_through": n}``), so a restart gives a logged batch its blocks back from
    the write-ahead log and queues the blocks no batch had taken for the first batches after
    it. The blocks are held on the driver and handed to Spark as they are (``frame``); a
    block's file is deleted once no window needs its batch.
    """

    def __init__(self, receiver: Receiver, block_interval_ms: int) -> None:
        self.receiver = receiver
        self.block_interval_ms = block_interval_ms
        self.name = type(receiver).__name__
        self._clock: Clock = SystemClock()
        self._log: ReceivedBlockLog | None = None
        self._lock = threading.Lock()
        self._queued: list[Block] = []
        """Blocks received that no batch has taken yet, in the order they were cut."""
        self._taken: dict[int, Block] = {}
        """The blocks batches took, by id, until the engine forgets the batch."""
        self._next_block_id = 0

    def schema(self) -> StructType:
        return TEXT_SCHEMA

    def attach(self, run: SourceRun) -> None:
        self.name = run.name
        self._clock = run.clock
        self._log = ReceivedBlockLog(run.storage, run.name) if run.storage is not None else None

    # ---------------------------------------------------------------- receiving
    def recover_received(self, position: Position) -> None:
        """Queue the written-ahead blocks no batch took before the crash; new blocks are
        numbered after every block on disk."""
        if self._log is None:
            return
        through = int(position["allocated_through"])
        on_disk = self._log.block_ids()
        recovered = [self._log.read(block_id) for block_id in on_disk if block_id > through]
        with self._lock:
            self._queued.extend(recovered)
        if recovered:
            logger.info("Recovered %d received blocks of %s that no batch had taken", len(recovered), self.name)
        self._next_block_id = max([through, *on_disk]) + 1

    def start_receiving(self) -> None:
        """Start the receiver, once a restart has recovered its written-ahead blocks."""
        self.receiver.start_receiving(BlockGenerator(self.name, self._clock, self.block_interval_ms,
                                                     self._store_block, self._next_block_id))

    def stop_receiving(self, graceful: bool) -> None:
        self.receiver.stop_receiving(graceful)

    def has_unplanned(self) -> bool:
        with self._lock:
            return bool(self._queued)

    def _store_block(self, block: Block) -> None:
        """Write the block ahead (with checkpointing), then queue it for the next batch."""
        if self._log is not None:
            self._log.write(block)
        with self._lock:
            self._queued.append(block)

    # ---------------------------------------------------------------- batches
    def initial_position(self) -> Position:
        return {"allocated_through": -1}

    def plan_at(self, start: Position, end_of_input: Position | None, at: BatchTimes) -> SourceBatch:
        with self._lock:
            blocks, self._queued = self._queued, []
            for block in blocks:
                self._taken[block.block_id] = block
        return self._batch(start, [b.block_id for b in blocks], sum(len(b.records) for b in blocks), at, [])

    def _batch(self, start: Position, ids: list[int], records: int, at: BatchTimes,
               missing: list[int]) -> SourceBatch:
        end = {"allocated_through": max([int(start["allocated_through"]), *ids])}
        if not ids:
            return SourceBatch(start, end)
        split: dict[str, Any] = {"blocks": ids, "batch": at.batch_time_ms}
        if missing:
            split["missing"] = missing
        return SourceBatch(start, end, (split,), records=records)

    def frame(self, spark: SparkSession, batch: SourceBatch) -> DataFrame:
        [split] = batch.splits
        if split.get("missing"):
            raise SourceError(
                f"blocks {split['missing']} of batch {split['batch']} for {self.name} are missing from the "
                "write-ahead log at the checkpoint location; they were deleted or the location was changed"
            )
        with self._lock:
            records = [r for block_id in split["blocks"] for r in self._taken[block_id].records]
        return spark.createDataFrame([(r,) for r in records], TEXT_SCHEMA)

    def read(self, split: Split) -> Iterable[Any]:
        raise SourceError(f"the blocks of {self.name} are handed to Spark as they are (frame()), never read split "
                          "by split; this is a bug in batchline")

    def forget(self, batch: SourceBatch) -> None:
        for split in batch.splits:
            for block_id in split["blocks"]:
                with self._lock:
                    self._taken.pop(block_id, None)
                if self._log is not None:
                    self._log.delete(block_id)

    # ---------------------------------------------------------------- how it is written down
    def checkpoint_position(self, position: Position | None, end_of_input: Position | None) -> dict[str, Any]:
        return {"allocated_through": -1 if position is None else int(position["allocated_through"])}

    def restore_position(self, record: Mapping[str, Any]) -> tuple[Position | None, Position | None]:
        return {"allocated_through": int(record["allocated_through"])}, None

    def log_batch(self, batch: SourceBatch) -> dict[str, Any]:
        return {"blocks": list(batch.splits[0]["blocks"]) if batch.splits else []}

    def logged_batch(self, record: Mapping[str, Any], position: Position | None, at: BatchTimes) -> SourceBatch:
        """The logged blocks, read back from the write-ahead log; a block gone from it fails
        the batch only if the batch must run again (``frame``)."""
        ids = [int(block_id) for block_id in record["blocks"]]
        found: list[Block] = []
        missing: list[int] = []
        for block_id in ids:
            try:
                if self._log is None:
                    raise FileNotFoundError(block_id)
                found.append(self._log.read(block_id))
            except FileNotFoundError:
                missing.append(block_id)  # fine for a batch that is only replayed to move on
        with self._lock:
            for block in found:
                self._taken[block.block_id] = block
        start = position if position is not None else {"allocated_through": max(ids, default=-1)}
        return self._batch(start, ids, sum(len(b.records) for b in found), at, missing)
