"""The receivers' write-ahead log (SPEC B2): a block counts as received only once it is
stored at the checkpoint location, one immutable file per block."""

from __future__ import annotations

import re
from dataclasses import dataclass

from batchline.checkpoint.storage import CheckpointStorage, seal

__all__ = ["Block", "ReceivedBlockLog"]

RECEIVED = "received"


@dataclass(frozen=True)
class Block:
    """Records a receiver stored within one block interval, cut at ``received_time``."""

    block_id: int
    records: tuple[str, ...]
    received_time: int


class ReceivedBlockLog:
    """One input's blocks at the checkpoint location: ``received/<input name>/<block id>.json``."""

    def __init__(self, storage: CheckpointStorage, input_name: str) -> None:
        self._storage = storage
        self._folder = f"{RECEIVED}/{re.sub(r'[^A-Za-z0-9._-]+', '_', input_name)}"

    def _name(self, block_id: int) -> str:
        return f"{self._folder}/{block_id:012d}.json"

    def write(self, block: Block) -> None:
        payload = {"block_id": block.block_id, "received_time": block.received_time, "records": list(block.records)}
        self._storage.write_new(self._name(block.block_id), seal(payload))

    def read(self, block_id: int) -> Block:
        payload = self._storage.read_sealed(self._name(block_id))
        return Block(block_id, tuple(payload["records"]), int(payload["received_time"]))

    def delete(self, block_id: int) -> None:
        self._storage.delete(self._name(block_id))

    def block_ids(self) -> list[int]:
        """Blocks on disk, for recovery after a restart."""
        return sorted(int(n.split(".", 1)[0]) for n in self._storage.list_names(self._folder)
                      if n.split(".", 1)[0].isdigit())
