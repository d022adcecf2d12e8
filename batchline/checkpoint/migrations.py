"""Every conversion of a checkpoint file from an older format, in one place.

A reader asks a file for its ``format_version`` first and never sniffs for keys: ``upgrade``
runs the file through one function per version, each turning version ``n`` into ``n + 1``,
until it has the shape ``Checkpoint.from_json`` reads. A file of a version this release does
not know (a newer release wrote it) is refused, not guessed at:
a restart from an older checkpoint would run batches that a newer driver already committed.

Version 1: the operators' progress, the report of what had finished and the final record
           were keys of one untyped dict, ``extra`` (``operators``, ``finished``, ``final``).
Version 2: each is a field of its own (``Checkpoint.operators``, ``finished``, ``final``).

Each migration has a test that restarts a pipeline from a checkpoint location the older
code wrote (``tests/fixtures/checkpoints/v<n>/``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from batchline.checkpoint.model import FORMAT_VERSION
from batchline.checkpoint.storage import CorruptFileError
from batchline.errors import CheckpointFormatError

__all__ = ["upgrade", "MIGRATIONS"]

logger = logging.getLogger(__name__)


def _from_1(payload: dict[str, Any]) -> dict[str, Any]:
    """``extra`` becomes three fields; a key version 1 did not write becomes an empty field."""
    upgraded = {key: value for key, value in payload.items() if key != "extra"}
    extra = dict(payload.get("extra") or {})
    upgraded["operators"] = dict(extra.get("operators") or {})
    upgraded["finished"] = extra.get("finished") or None
    upgraded["final"] = extra.get("final")
    upgraded["format_version"] = 2
    return upgraded


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _from_1}
"""The conversion from each older version to the next one."""


def upgrade(payload: dict[str, Any], what: str) -> dict[str, Any]:
    """``payload`` (a checkpoint file's content, named ``what`` in errors) in the current format."""
    version = payload.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise CorruptFileError(
            f"{what} has no valid format version ({version!r}); it was not written by batchline: move it "
            "out of the checkpoints folder")
    if version > FORMAT_VERSION:
        raise CheckpointFormatError(
            f"{what} has format version {version}, newer than the {FORMAT_VERSION} this release reads; run the "
            "release that wrote it, or a later one")
    if version < FORMAT_VERSION:
        logger.info("Reading %s, written in checkpoint format %d, as format %d", what, version, FORMAT_VERSION)
    while version < FORMAT_VERSION:
        payload = MIGRATIONS[version](payload)
        version += 1
    return payload
