"""Every conversion of checkpoint data written in an older format, in one place, a section per
kind of file: the checkpoint files, the positions and batch log records of sources, the
commit records of sinks.

A reader asks what it reads for its version first and converts an older one here, so the
sources and sinks carry no knowledge of an older layout. A version this release does not know
(a newer release wrote it) is refused, not guessed at: a restart from it could run batches
again that a newer driver already committed. (The state store's own files, which carry their
layouts in typed headers and metadata, are read by ``batchline.state``.)

Conversions that need to look at live data (a directory listing) take it as an argument, so
this module depends on nothing above ``checkpoint`` and sources, sinks and state can all use it.

Sections:

- Checkpoint files (``checkpoints/checkpoint-*.json``): ``upgrade``, by ``format_version``.
- File source positions (``inputs[<name>]`` of a checkpoint) and the batches such a source
  logged: ``upgrade_file_source_position``, ``file_source_batch_mtimes``.
- File sink commit records, of which the sink's first layout kept under the output:
  ``file_sink_record`` and the names of that layout.
- Older layouts read without a conversion (nothing to convert: what they lack cannot be
  made up, and the reader does without it): listed at the end, with where they are read.

Each conversion has a test that reads data in the older layout (``tests/unit/test_migrations.py``,
with inputs under ``tests/fixtures/``; whole checkpoints in ``tests/spark/test_checkpoint_migrations.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from batchline.checkpoint.model import FORMAT_VERSION
from batchline.checkpoint.storage import CorruptFileError
from batchline.errors import CheckpointFormatError

__all__ = [
    "upgrade", "MIGRATIONS",
    "FILE_SOURCE_POSITION_VERSION", "file_source_position_version", "upgrade_file_source_position",
    "file_source_batch_mtimes",
    "FILE_SINK_COMMITS_V1", "FILE_SINK_STAGING_V1", "file_sink_record_name_v1", "file_sink_staging_v1",
    "file_sink_record",
]

logger = logging.getLogger(__name__)


# ==================================================================== checkpoint files
# ``checkpoints/checkpoint-*.json`` carry ``format_version``; ``upgrade`` runs a file through
# one function per version, each turning version ``n`` into ``n + 1``, until it has the shape
# ``Checkpoint.from_json`` reads.
#
# Version 1: the operators' progress, the report of what had finished and the final record
#            were keys of one untyped dict, ``extra`` (``operators``, ``finished``, ``final``).
# Version 2: each is a field of its own (``Checkpoint.operators``, ``finished``, ``final``).
#
# Each has a test that restarts a pipeline from a checkpoint location the older code wrote
# (``tests/fixtures/checkpoints/v<n>/``).


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
"""The conversion from each older version of a checkpoint file to the next one."""


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


# ==================================================================== file source positions
# A file source's position is a dict inside the checkpoint (``inputs[<name>]``), and its
# batches are logged as dicts in the job event log; neither is a file of its own, so each
# carries its own version.
#
# Version 1 (before ``max_file_age``): ``{"seen": [every file name ever read]}``; a bounded
#     source's also ``"listing"`` (the files present at its first start) once it was made, and
#     no count: the names read are always the first of the listing. A logged batch is
#     ``{"files": [...]}``.
# Version 2 (``max_file_age`` on): an unbounded source's ``{"seen_files": {"watermark_ms",
#     "horizon_ms", "files": {name: modification time in ms}}}`` (``sources.seen_files.SeenFiles``);
#     a bounded one's ``{"listing": [...], "taken": n}``, or, before its listing was made,
#     ``{"seen_files": <nothing remembered>}``. A logged batch of an unbounded source adds
#     ``"mtimes"``, its files' modification times.
#
# Positions are written with ``"v"`` from this release on. Version 2 was first written
# without it: such a record is told apart from version 1 by its keys (``seen_files`` or
# ``taken``), here and nowhere else, and must keep restarting exactly as it did. A logged
# batch carries no version: it is read by the position it follows, and an unbounded
# source's batch without ``mtimes`` is of version 1.
#
# Fixtures, written by the code of each layout: ``tests/fixtures/file_source/``
# (``make_file_source_fixtures.py``).

FILE_SOURCE_POSITION_VERSION = 2
"""The version of a file source's position that this release writes (as ``"v"``)."""


def file_source_position_version(record: Mapping[str, Any], what: str) -> int:
    """The layout version of a file source's position ``record`` (``what`` names it in errors)."""
    version = record.get("v")
    if version is None:
        # Written before positions carried a version: version 2's keys, else version 1.
        return 2 if "seen_files" in record or "taken" in record else 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CorruptFileError(
            f"the position of {what} in the checkpoint has no valid version ({version!r}); restore the checkpoint "
            "from a backup, or delete the checkpoint location to start the pipeline afresh")
    if version > FILE_SOURCE_POSITION_VERSION:
        raise CheckpointFormatError(
            f"the position of {what} in the checkpoint has version {version}, newer than the "
            f"{FILE_SOURCE_POSITION_VERSION} this release reads; run the release that wrote it, or a later one")
    return version


def upgrade_file_source_position(
    record: Mapping[str, Any],
    *,
    bounded: bool,
    max_file_age_ms: int,
    listed: Callable[[], Iterable[tuple[str, int]]],
    key: Callable[[str], str],
    what: str,
) -> dict[str, Any]:
    """A file source's position ``record`` in the current layout (version 2, without ``"v"``).

    A version 1 record becomes what the reading source (``bounded`` or not) would have written:

    - bounded, with its listing: the listing and how many of it were read (the first names
      of the listing that the record names);
    - bounded, without one: nothing remembered (the listing is made at open);
    - unbounded: the files remembered by a watermark, without reading any file twice or
      skipping one that release would have read. ``listed()`` gives the files under the path
      now, as (name, modification time in ms); ``key`` turns a name into how it is remembered.
      The watermark is the newest time among the named files still present, and the horizon
      is ``watermark - max_file_age_ms``, or earlier when an unread file is older than that:
      the reader must keep that horizon until its first batch moves it on, not purge at once.
      Names no longer listed are dropped: they cannot be listed, so they are not read again.
    """
    version = file_source_position_version(record, what)
    if version == FILE_SOURCE_POSITION_VERSION:
        return {name: value for name, value in record.items() if name != "v"}
    seen = [str(name) for name in record.get("seen", ())]
    if bounded and "listing" in record:
        listing = sorted(record["listing"])
        read = set(seen)
        taken = next((index for index, name in enumerate(listing) if name not in read), len(listing))
        logger.info("Input %s: converted the checkpoint's %d names of files read to a count of %d files of its "
                    "listing", what, len(seen), taken)
        return {"listing": listing, "taken": taken}
    if bounded:
        return {"seen_files": {"watermark_ms": None, "horizon_ms": None, "files": {}}}
    return {"seen_files": _seen_files_from_names(seen, max_file_age_ms, listed, key, what)}


def _seen_files_from_names(seen: list[str], max_file_age_ms: int, listed: Callable[[], Iterable[tuple[str, int]]],
                           key: Callable[[str], str], what: str) -> dict[str, Any]:
    read = {key(name) for name in seen}
    files: dict[str, int] = {}
    unread_times: list[int] = []
    for name, modified in listed():
        remembered = key(name)
        if remembered in read:
            files[remembered] = max(modified, files.get(remembered, modified))
        else:
            unread_times.append(modified)
    watermark = max(files.values(), default=None)
    horizon = None
    if watermark is not None:
        horizon = min([watermark - max_file_age_ms, *unread_times])
        files = {name: modified for name, modified in files.items() if modified >= horizon}
    logger.info("Input %s: converted the checkpoint's %d names of files read to a watermark at %s with the %d "
                "files modified within max_file_age of it (names no longer listed are dropped: they cannot be "
                "listed, so they are not read again)", what, len(seen),
                "(none)" if watermark is None else datetime.fromtimestamp(watermark / 1000, UTC).isoformat(),
                len(files))
    return {"watermark_ms": watermark, "horizon_ms": horizon, "files": files}


def file_source_batch_mtimes(record: Mapping[str, Any], *, listed: Callable[[], Iterable[tuple[str, int]]],
                             fallback_ms: int | None) -> list[int]:
    """The modification times (ms) of a batch an unbounded file source logged, one per file.

    Version 2 logs them (``"mtimes"``). A batch of version 1 did not: its files' times are
    looked up in ``listed()`` (name, time in ms, names as logged); a file gone from the path
    gets ``fallback_ms`` (the newest time read so far; 0 without one), as it cannot be listed,
    so it is never read again anyway.
    """
    if record.get("mtimes") is not None:
        return [int(modified) for modified in record["mtimes"]]
    times = dict(listed())
    return [times.get(str(name), fallback_ms or 0) for name in record["files"]]


# ==================================================================== file sink commit records
# A file sink's commit record (``sinks.files``) names the staged files of one committed batch
# (``batch_time``, ``format``, ``staging``: their folder, ``files``). Its layout follows from
# where it lies; it carries no version.
#
# Layout 1 ("releases before 0.2" in the sink's documentation): under the output itself, the
#     record of batch ``t`` at ``<output>/_batchline/commits/<t, 15 digits>.json``, its
#     ``staging`` a folder under the output, and whatever a crashed attempt staged under
#     ``<output>/_staging/<t>``.
# Layout 2: in the sink's own directory beside the output (``sinks.files.own_location``):
#     ``<own>/commits/<t>.json``, ``staging`` relative to ``<own>``.
#
# A record of layout 1 is still honoured (its batch is not written again; what is missing
# is published from its staging there, which is then deleted), never written. Test:
# ``tests/unit/test_migrations.py``, with a record that layout's code wrote
# (``tests/fixtures/file_sink/v1/``).

FILE_SINK_COMMITS_V1 = "_batchline/commits"
"""Layout 1's records, relative to the output."""
FILE_SINK_STAGING_V1 = "_staging"
"""Layout 1's staged files, relative to the output."""


def file_sink_record_name_v1(time_ms: int) -> str:
    """Where layout 1 kept batch ``time_ms``'s commit record, relative to the output."""
    return f"{FILE_SINK_COMMITS_V1}/{time_ms:015d}.json"


def file_sink_staging_v1(time_ms: int) -> str:
    """Where layout 1 staged batch ``time_ms``'s files (every attempt's), relative to the output."""
    return f"{FILE_SINK_STAGING_V1}/{time_ms}"


def file_sink_record(record: Mapping[str, Any], *, under_output: bool) -> dict[str, Any]:
    """A commit record as the sink reads it: as written, with ``under_output`` saying whether it
    is of layout 1 (found under the output: its ``staging`` is relative to the output, not to
    the sink's own directory). The mark lives in memory only: a record is never written back."""
    return {**record, "under_output": under_output}


# ==================================================================== read without a conversion
# These older layouts lack a piece of information that cannot be computed from them; there is
# nothing to convert, and each reader does without it where it reads the file:
#
# - A partition's finish record in the job event log (``events/<t>/finished-*.json``,
#   ``checkpoint.events.PartitionFinished``) written before tasks reported what each
#   partition holds after a batch: its ``stats`` lack ``partitions_after``. A stateful
#   operator that keeps such a partition on a restart does not know every partition's facts
#   (timers, keys), so it runs its next batches whole until it has learnt them again
#   (``state.stateful``, ``_facts_after``); ``state.contract.Stats.from_json`` reads any
#   other field such a record lacks as nothing.
# - A job event log that its writer kept without ``events/_purged.json``: the first purge
#   lists the folder to find where to start (``checkpoint.events.JobEventStore.purge_before``),
#   as it does when that record is unreadable.
# - A lease file (``_lease.json``) written before it held ``acquired_at_ms`` and
#   ``renewed_at_ms``: they read as None, unknown (``checkpoint.lease.LeaseRecord``).
#
# Tests: ``tests/unit/test_migrations.py`` reads a finish record and a lease file the older code
# wrote (``tests/fixtures/records/``); ``tests/unit/test_event_compaction.py`` purges a log
# without its purge record.
