"""A receiver of text lines over TCP (SPEC B2) and the stream its blocks feed."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import StringType, StructField, StructType

from batchline.checkpoint.received_blocks import Block, ReceivedBlockLog
from batchline.errors import SourceError
from batchline.sources.receiver import BlockGenerator, Receiver
from batchline.streams import InputNode, InputRuntime, RuntimeEnv, StreamRuntime

__all__ = ["SocketReceiver", "ReceiverSource", "ReceiverReader", "TEXT_SCHEMA"]

logger = logging.getLogger(__name__)

TEXT_SCHEMA = StructType([StructField("value", StringType(), True)])


class SocketReceiver(Receiver):
    """Connects to ``host:port`` and stores every line (UTF-8, without its line ending).

    A dropped or refused connection is retried every ``reconnect_interval_s``. On a graceful
    stop it keeps reading until the socket has been quiet for ``drain_quiet_s`` (at most
    ``max_drain_s``), so every line the peer sent before the stop is stored; an immediate
    stop stops reading at once.
    """

    def __init__(
        self,
        host: str,
        port: int,
        reconnect_interval_s: float = 1.0,
        drain_quiet_s: float = 0.1,
        max_drain_s: float = 5.0,
    ) -> None:
        super().__init__()
        self.host = host
        self.port = port
        self._reconnect_interval_s = reconnect_interval_s
        self._drain_quiet_s = drain_quiet_s
        self._max_drain_s = max_drain_s
        self._thread: threading.Thread | None = None

    def on_start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"SocketReceiver-{self.host}:{self.port}", daemon=True)
        self._thread.start()

    def on_stop(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self.is_stopped:
            try:
                with socket.create_connection((self.host, self.port), timeout=self._reconnect_interval_s) as conn:
                    logger.info("Connected to %s:%d", self.host, self.port)
                    self._read(conn)
                    if not self.is_stopped:
                        logger.warning("Connection to %s:%d closed by peer; reconnecting", self.host, self.port)
            except OSError as error:
                if self.is_stopped:
                    return
                logger.warning(
                    "Cannot receive from %s:%d (%s); retrying in %.1f s",
                    self.host, self.port, error, self._reconnect_interval_s,
                )
            self._stopped.wait(self._reconnect_interval_s)

    def _read(self, conn: socket.socket) -> None:
        conn.settimeout(self._drain_quiet_s)
        pending = b""
        drain_until: float | None = None
        while True:
            if self.is_stopped:
                if not self.stopping_gracefully:
                    break
                drain_until = drain_until or time.monotonic() + self._max_drain_s
                if time.monotonic() > drain_until:
                    logger.warning("Still receiving from %s:%d %.0f s after a graceful stop; stopping",
                                   self.host, self.port, self._max_drain_s)
                    break
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                if self.is_stopped:
                    break  # quiet for drain_quiet_s after the stop: everything sent is in
                continue
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._store_line(line)
        if pending:
            self._store_line(pending)

    def _store_line(self, raw: bytes) -> None:
        self.store(raw.rstrip(b"\r").decode("utf-8", errors="replace"))


class ReceiverSource(InputNode):
    """Rows ``value: string`` from the blocks a receiver stored, as allocated to each batch.

    With checkpointing, every block is written ahead to the checkpoint location before it
    counts as received; a restart gives pending batches their blocks back and queues the
    blocks no batch had taken yet.
    """

    replayable = True

    def __init__(self, batch_interval_ms: int, receiver: Receiver, block_interval_ms: int, name: str) -> None:
        super().__init__(name, batch_interval_ms)
        self.receiver = receiver
        self.block_interval_ms = block_interval_ms

    def create_runtime(self, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> ReceiverReader:
        return ReceiverReader(self, env, parents)


class ReceiverReader(InputRuntime):
    node: ReceiverSource

    def __init__(self, node: ReceiverSource, env: RuntimeEnv, parents: Sequence[StreamRuntime]) -> None:
        super().__init__(node, env, parents)
        self._tracker = env.receiver_tracker
        self.block_log = (ReceivedBlockLog(env.checkpoint.storage, node.name, node.input_id)
                          if env.checkpoint is not None else None)
        self._batch_blocks: dict[int, list[int]] = {}
        self._missing: dict[int, list[int]] = {}
        self._allocated_through = -1
        self.next_block_id = 0

    def start(self) -> None:
        """Start the receiver, once a restart has recovered its written-ahead blocks."""
        self.node.receiver.start_receiving(BlockGenerator(self.input_id, self.env.clock, self.node.block_interval_ms,
                                                          self.store_block, self.next_block_id))

    def stop(self, graceful: bool) -> None:
        self.node.receiver.stop_receiving(graceful)

    def _records(self, batch_time: int) -> list[str]:
        return [r for block in self._tracker.get_blocks_of_batch(batch_time, self.input_id) for r in block.records]

    def store_block(self, block: Block) -> None:
        """Write the block ahead (with checkpointing), then hand it to the tracker."""
        if self.block_log is not None:
            self.block_log.write(block)
        self._tracker.add_block(block)

    def allocate(self, batch_time: int) -> None:
        ids = [b.block_id for b in self._tracker.get_blocks_of_batch(batch_time, self.input_id)]
        self._note_allocation(batch_time, ids)
        self.report(batch_time, len(self._records(batch_time)))

    def _note_allocation(self, batch_time: int, ids: list[int]) -> None:
        self._batch_blocks[batch_time] = ids
        self._allocated_through = max([self._allocated_through, *ids])

    def allocation(self, batch_time: int) -> dict[str, Any]:
        return {"blocks": self._batch_blocks.get(batch_time, [])}

    def restore_allocation(self, batch_time: int, allocation: dict[str, Any], advance: bool) -> None:
        if self.block_log is None:
            super().restore_allocation(batch_time, allocation, advance)
            return
        ids = [int(i) for i in allocation["blocks"]]
        blocks = []
        for block_id in ids:
            try:
                blocks.append(self.block_log.read(block_id))
            except FileNotFoundError:
                # Fine for a batch that is only replayed to move on; fatal if it must re-run.
                self._missing.setdefault(batch_time, []).append(block_id)
        self._tracker.restore_batch(batch_time, self.input_id, blocks)
        self._note_allocation(batch_time, ids)
        self.report(batch_time, len(self._records(batch_time)))

    def snapshot(self) -> dict[str, Any]:
        return {"allocated_through": self._allocated_through}

    def restore(self, snapshot: dict[str, Any]) -> None:
        self._allocated_through = int(snapshot["allocated_through"])

    def recover_after_restart(self) -> None:
        """Queue the written-ahead blocks no batch took before the crash."""
        if self.block_log is None:
            return
        on_disk = self.block_log.block_ids()
        recovered = [i for i in on_disk if i > self._allocated_through]
        for block_id in recovered:
            self._tracker.add_block(self.block_log.read(block_id))
        if recovered:
            logger.info("Recovered %d received blocks of %s that no batch had taken", len(recovered), self.name)
        self.next_block_id = max([self._allocated_through, *on_disk]) + 1

    def forget_before(self, threshold_time: int) -> None:
        for batch_time in [t for t in self._batch_blocks if t <= threshold_time]:
            self._missing.pop(batch_time, None)
            for block_id in self._batch_blocks.pop(batch_time):
                if self.block_log is not None:
                    self.block_log.delete(block_id)

    def compute(self, batch_time: int) -> DataFrame:
        if batch_time in self._missing:
            raise SourceError(
                f"blocks {self._missing[batch_time]} of batch {batch_time} for {self.name} are missing from the "
                "write-ahead log at the checkpoint location; they were deleted or the location was changed"
            )
        records = self._records(batch_time)
        if not records:
            return self.env.empty_frame(TEXT_SCHEMA)
        return self.env.spark.createDataFrame([(r,) for r in records], TEXT_SCHEMA)
