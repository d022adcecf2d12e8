"""Checkpoint storage by URL through fsspec (SPEC E1).

Commits never depend on rename or on listing after write: data goes into immutable,
uniquely named files, and the one small file that names them (a manifest, a lease) is
replaced in one step: ``os.replace`` after an fsync on local disks, a single PUT on object
stores, where a PUT is atomic.

Files written once (batch log entries, commit markers, output commit records) are created
exclusively, so a second writer of the same name gets ``FileExistsError``: ``open(..., "xb")``
on local disks, a conditional PUT (``If-None-Match: *``) on S3. On a store with no known
conditional create the write is a plain one, and a WARNING says so once per location.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import has_magic

from batchline.errors import BatchlineError, CarriedError, error_chain

__all__ = ["CheckpointStorage", "CorruptFileError", "ExclusiveCreate", "RawJson", "StorageFullError",
           "StorageUnreachableError", "TornFileError", "fsync_path", "is_unreachable", "seal", "unseal"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_S3_ONE_REQUEST_COPY_BYTES = 5 * 2**30
"""S3's CopyObject copies up to 5 GiB; a larger object takes a multipart copy."""


class CorruptFileError(BatchlineError):
    """A stored file is torn or does not match its checksum."""

    retryable = False
    """A damaged file stays damaged: running the batch again reads the same bytes."""


class TornFileError(CorruptFileError):
    """A stored file ends early: what a crash in the middle of writing it leaves (a flipped
    byte is a plain ``CorruptFileError``)."""


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class StorageFullError(CarriedError, OSError):
    """A store batchline writes to has no space left (ENOSPC, or a quota: EDQUOT). An OSError
    still, so that what retries or tolerates failed writes (the checkpoint writer, the progress
    records) goes on doing so; carried from a Spark task, so that the driver names the location.
    Retryable: space may come back before the batch's next attempt."""

    attributes = ("location", "path")

    def __init__(self, location: str, path: str, carry: bool = True) -> None:
        self.location = location
        self.path = path
        super().__init__(
            f"no space left at {location} (writing {path}). Free space there, or give it more (or move the "
            "checkpoint to a larger location, copying it whole), then start the pipeline again: the batch was not "
            "committed, nothing half-written is kept, and it runs again", carry)
        self.errno = errno.ENOSPC  # without a strerror, so that str() stays the message above


def _in_spark_task() -> bool:
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None


_MAGIC = b"BATCHLINE1"
_LONGEST_HEADER = len(_MAGIC) + 1 + 64 + 1 + 20
"""Magic, space, SHA-256 in hex, space, a length of up to 20 digits: a file longer than this
without its header's newline was altered, not cut short."""


class RawJson:
    """JSON a source has already encoded (and keeps up to date as it grows), spliced into a
    checkpoint as it is: the writer's cost for it is a copy and a hash, not an encoding."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def seal(payload: dict[str, Any]) -> bytes:
    """A header line with the body's SHA-256 and length, then the JSON body, so that a torn
    or altered file is recognised."""
    token = uuid.uuid4().hex
    raw: list[bytes] = []

    def placeholder(value: object) -> object:
        if isinstance(value, RawJson):
            raw.append(value.data)
            return f"{token}-{len(raw) - 1}"
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    body = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=placeholder).encode()
    for index, data in enumerate(raw):
        body = body.replace(f'"{token}-{index}"'.encode(), data, 1)
    return b"%s %s %d\n" % (_MAGIC, hashlib.sha256(body).hexdigest().encode(), len(body)) + body


def unseal(data: bytes, what: str) -> dict[str, Any]:
    if not data:
        raise TornFileError(f"{what} is empty (0 bytes)")
    header, newline, body = data.partition(b"\n")
    parts = header.split(b" ")
    if len(parts) != 3 or parts[0] != _MAGIC or not newline:
        if not newline and len(data) <= _LONGEST_HEADER and (_MAGIC.startswith(header)
                                                              or header.startswith(_MAGIC + b" ")):
            raise TornFileError(f"{what} is torn (it ends inside its header)")
        raise CorruptFileError(f"{what} is not a batchline file, or its header was altered")
    if not parts[2].isdigit() or len(body) > int(parts[2]):
        declared = parts[2].decode(errors="replace")
        raise CorruptFileError(f"{what} was altered: {len(body)} bytes where its header says {declared}")
    if len(body) < int(parts[2]):
        raise TornFileError(f"{what} is torn: {len(body)} of {parts[2].decode()} bytes")
    if hashlib.sha256(body).hexdigest().encode() != parts[1]:
        raise CorruptFileError(f"{what} does not match its checksum")
    try:
        return json.loads(body)
    except ValueError as error:
        raise CorruptFileError(f"{what} is not valid JSON ({error})") from error


# How often a conditional PUT that S3 answered with 409 ConditionalRequestConflict (another
# write of the same name in flight) is tried again before the conflict is raised.
_CONFLICT_ATTEMPTS = 5
_warned_locations: set[str] = set()
_warned_lock = threading.Lock()


class ExclusiveCreate(enum.Enum):
    """How a file system creates a file only if it does not exist yet."""

    LOCAL = "local"
    """``open(..., "xb")`` and fsync."""
    S3 = "s3"
    """put_object / complete_multipart_upload with IfNoneMatch="*"."""
    MEMORY = "memory"
    """One process's dictionary: ``pipe_file(..., mode="create")``."""


class StorageUnreachableError(CarriedError, OSError):
    """A store that could not be reached (refused or dropped connections, timeouts, 5xx answers)
    for longer than its outage tolerance. An OSError still: what retries or tolerates failed
    writes goes on doing so; retryable, and carried from a Spark task, as StorageFullError."""

    attributes = ("location", "what", "seconds", "reason")

    def __init__(self, location: str, what: str, seconds: float, reason: str, carry: bool = True) -> None:
        self.location = location
        self.what = what
        self.seconds = seconds
        self.reason = reason
        super().__init__(
            f"could not reach {location} {what} for {seconds:.0f} s ({reason}). Check that the store is up and "
            "reachable from the driver and every executor; the batch is tried again by its retry policy, and a "
            "start once it is back resumes exactly", carry)


OUTAGE_TOLERANCE_S = 60.0
"""How long a storage operation keeps trying a store it cannot reach before it fails: an
object store restarted, or a network blip, costs a wait, not a failed batch."""

_UNREACHABLE_NAMES = frozenset({
    "ConnectionError", "TimeoutError", "HTTPClientError", "ClientConnectionError", "ClientPayloadError",
    "ServerDisconnectedError", "IncompleteRead", "ReadTimeoutError", "ConnectTimeoutError",
    "EndpointConnectionError", "ConnectionClosedError",
})
"""Names of the exceptions (builtins, botocore's, aiohttp's, urllib3's) that say the store could
not be reached, by name: the core does not import the clients of every store."""
_UNREACHABLE_CODES = frozenset({"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout",
                                "500", "502", "503", "504"})


def is_unreachable(error: BaseException) -> bool:
    """Whether ``error``, or an error it carries, says the store could not be reached (as opposed
    to an answer: a missing or existing file, no permission, no space), and was not waited for
    already."""
    for cause in error_chain(error):
        if isinstance(cause, (FileNotFoundError, FileExistsError, PermissionError, StorageFullError,
                              StorageUnreachableError)):  # the last: waited for already
            return False
        if any(cls.__name__ in _UNREACHABLE_NAMES for cls in type(cause).__mro__):
            return True
    return _s3_error_code(error) in _UNREACHABLE_CODES


def _conditional_create(fs: Any) -> ExclusiveCreate | None:
    """How ``fs`` creates a file exclusively; None when not known."""
    if isinstance(fs, LocalFileSystem):
        return ExclusiveCreate.LOCAL
    cls = type(fs)
    if cls.__module__.split(".", 1)[0] == "s3fs" and cls.__name__ == "S3FileSystem":
        return ExclusiveCreate.S3
    if cls.__module__ == "fsspec.implementations.memory":
        return ExclusiveCreate.MEMORY
    return None


def _s3_error_code(error: BaseException) -> str | None:
    """The S3 error code behind an error s3fs translated (it keeps the ClientError as cause)."""
    for cause in error_chain(error):
        response = getattr(cause, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            return str(code) if code is not None else None
    return None


class CheckpointStorage:
    """Files under one root URL; paths given to methods are relative to it.

    ``exclusive_creates`` says whether :meth:`write_new` refuses a name that exists (local
    disks, S3, fsspec's memory file system); elsewhere it overwrites, and fencing a stale
    driver then relies on the lease alone.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *, warn: bool = True,
                 outage_tolerance_s: float = OUTAGE_TOLERANCE_S) -> None:
        """``warn=False`` leaves out the WARNING about a store without exclusive creates (the
        copies shipped to executors, whose driver has said it already). Every operation keeps
        trying a store it cannot reach for ``outage_tolerance_s`` (``is_unreachable``)."""
        self.outage_tolerance_s = outage_tolerance_s
        if "://" not in url:
            url = os.path.abspath(url)
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.root = self.root.rstrip("/")
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self._create_kind = _conditional_create(self.fs)
        self._one_get: dict[str, Any] = {"max_concurrency": 1} if self._create_kind is ExclusiveCreate.S3 else {}
        """What makes s3fs read a file in one GET, without asking for its size first."""
        self.exclusive_creates: bool = self._create_kind is not None
        self.creates_whole: bool = self._create_kind in (ExclusiveCreate.S3, ExclusiveCreate.MEMORY)
        """Whether a file created exclusively appears whole or not at all (S3's conditional PUT, a
        memory store's dictionary); a local one is created, then written and synced, so a crash
        may leave it torn."""
        if warn and not self.exclusive_creates:
            self._warn_no_exclusive_creates()

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0] if "://" in self.url else "file"

    def _warn_no_exclusive_creates(self) -> None:
        with _warned_lock:
            if self.url in _warned_locations:
                return
            _warned_locations.add(self.url)
        logger.warning(
            "Storage %s (protocol %r) has no known exclusive create: a file that must be written once (batch log "
            "entry, commit marker, output commit record) is overwritten by a second writer instead of refused, so "
            "fencing of a stale driver relies on the lease alone. Run exactly one driver per location, or use a "
            "local path or s3:// for exclusive creates", self.url, self.protocol)

    def __reduce__(self) -> tuple[Any, ...]:
        # Shipped to executors by URL and options; each process opens its own file system
        # (without repeating the driver's warning).
        return (functools.partial(CheckpointStorage, warn=False, outage_tolerance_s=self.outage_tolerance_s),
                (self.url, self.storage_options))

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def full_url(self, relative: str) -> str:
        return f"{self.url}/{relative}"

    def _reaching(self, what: str, call: Callable[[], _T]) -> _T:
        """``call()``, tried again with backoff while the store cannot be reached, for up to
        ``outage_tolerance_s``; then StorageUnreachableError."""
        deadline: float | None = None
        wait = 0.5
        while True:
            try:
                result = call()
            except Exception as error:
                if not is_unreachable(error):
                    raise
                now = _monotonic()
                if deadline is None:
                    deadline = now + self.outage_tolerance_s
                    logger.warning("Could not reach %s %s (%s); trying again for up to %.0f s", self.url, what,
                                   _short(error), self.outage_tolerance_s)
                if now >= deadline:
                    raise StorageUnreachableError(self.url, what, self.outage_tolerance_s, _short(error),
                                                  carry=_in_spark_task()) from error
                _sleep(min(wait, max(0.0, deadline - now)))
                wait = min(wait * 2, 8.0)
                continue
            if deadline is not None:
                logger.info("Reached %s again %s", self.url, what)
            return result

    def _reaching_again(self, what: str, call: Callable[[bool], _T]) -> _T:
        """As ``_reaching``, telling ``call`` whether it runs again: the answer to an earlier
        try may have been lost, so what that try did may be found done."""
        tries = itertools.count()
        return self._reaching(what, lambda: call(next(tries) > 0))

    def exists(self, relative: str) -> bool:
        """Whether a file or a folder is at ``relative``. On an object store a miss costs a HEAD
        and a listing: a file's own presence is ``has_file``, a file to read ``read_if_present``."""
        path = self.path(relative)

        def look() -> bool:
            self._forget_listings(path)
            return bool(self.fs.exists(path))
        return self._reaching(f"(looking for {relative})", look)

    def has_file(self, relative: str) -> bool:
        """Whether a file is at ``relative``: on S3 one HEAD (fsspec's ``exists`` lists the
        prefix too when there is no such object, to find a folder)."""
        path = self.path(relative)

        def look() -> bool:
            s3 = self._on_s3(path)
            if s3 is None:
                self._forget_listings(path)
                return bool(self.fs.isfile(path))
            try:
                self.fs.call_s3("head_object", Bucket=s3[0], Key=s3[1])
            except FileNotFoundError:
                return False
            return True
        return self._reaching(f"(looking for {relative})", look)

    def has_folder(self, relative: str) -> bool:
        """Whether anything is stored under the folder ``relative``: on S3 one listing of at
        most one key."""
        path = self.path(relative)

        def look() -> bool:
            s3 = self._on_s3(path)
            if s3 is None:
                self._forget_listings(path)
                return bool(self.fs.isdir(path))
            listed = self.fs.call_s3("list_objects_v2", Bucket=s3[0], Prefix=s3[1].rstrip("/") + "/", MaxKeys=1)
            return bool(listed.get("KeyCount") or listed.get("Contents") or listed.get("CommonPrefixes"))
        return self._reaching(f"(looking for {relative})", look)

    def _on_s3(self, path: str) -> tuple[str, str] | None:
        """``path``'s bucket and key on S3, where batchline sends the one request fsspec's call
        would precede with another; None on other stores."""
        if self._create_kind is not ExclusiveCreate.S3:
            return None
        bucket, key, _ = self.fs.split_path(path)
        return bucket, key

    def _forget_listings(self, path: str) -> None:
        # Object-store clients cache listings; a recovery decision must see the store itself.
        if not self.is_local:
            self.fs.invalidate_cache(path)

    def read(self, relative: str, *, large: bool = False) -> bytes:
        """A file's bytes, in one GET on S3 (a file object would look the object up first, and
        then refuse to read it, FileExpired, when it was replaced in between, as the lease is
        while it is renewed). ``large`` (a state snapshot, a kept input file): s3fs asks for the
        size with a HEAD first, and reads a file beyond its block size in concurrent ranges."""
        path = self.path(relative)
        options = self._one_get if not large else {}
        return self._reaching(f"(reading {relative})", lambda: bytes(self.fs.cat_file(path, **options)))

    def read_if_present(self, relative: str) -> bytes | None:
        """A file's bytes, or None when there is none: one GET on S3, where ``exists`` then
        ``read`` takes a HEAD (and a listing on a miss) before it."""
        path = self.path(relative)

        def get() -> bytes | None:
            try:
                return bytes(self.fs.cat_file(path, **self._one_get))
            except FileNotFoundError:
                return None
        return self._reaching(f"(reading {relative})", get)

    def read_sealed(self, relative: str) -> dict[str, Any]:
        return unseal(self.read(relative), self.full_url(relative))

    def read_sealed_if_present(self, relative: str) -> dict[str, Any] | None:
        data = self.read_if_present(relative)
        return None if data is None else unseal(data, self.full_url(relative))

    def write_new(self, relative: str, data: bytes) -> None:
        """Write a new, never rewritten file, created exclusively where the store can (see
        ``exclusive_creates``): a name that exists already raises FileExistsError and keeps its
        content. On a local disk the file is fsynced before returning; on S3 it is one
        conditional PUT (``If-None-Match: *``), whole or not at all. A write tried again after
        the store could not be reached that finds the name taken by these very bytes was this
        write's own: its answer was lost."""
        def write(again: bool) -> None:
            try:
                self._write_new(relative, data)
            except FileExistsError:
                if again and self.read(relative) == data:
                    return
                raise
        self._reaching_again(f"(writing {relative})", write)

    def _write_new(self, relative: str, data: bytes) -> None:
        path = self.path(relative)
        try:
            if self._create_kind is ExclusiveCreate.LOCAL:
                self._create_local(path, data)
            elif self._create_kind is ExclusiveCreate.S3:
                self._put_if_absent(relative, data)
            elif self._create_kind is ExclusiveCreate.MEMORY:
                self.fs.pipe_file(path, data, mode="create")
            else:
                self.fs.pipe_file(path, data)
        except OSError as error:
            full = self._full(relative, error)
            if full is error:
                raise
            raise full from error

    def _create_local(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Through the file system object (a plain open() for LocalFileSystem), so that a subclass
        # sees every byte written (the tests' one that runs out of space does).
        handle = self.fs.open(path, "xb")
        try:
            with handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            # Created by this call (exclusively), so it is this call's to remove: a file cut short
            # by a full disk must not stand for a write that never finished.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        fsync_path(os.path.dirname(path))

    def _full(self, relative: str, error: OSError) -> OSError:
        """``error`` as a StorageFullError naming the location when the store is out of space."""
        if error.errno in _NO_SPACE and not isinstance(error, StorageFullError):
            return StorageFullError(self.url, self.full_url(relative), carry=_in_spark_task())
        return error

    def _put_if_absent(self, relative: str, data: bytes) -> None:
        path = self.path(relative)
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            try:
                self.fs.pipe_file(path, data, mode="create")
                return
            except FileExistsError:
                raise
            except OSError as error:
                code = _s3_error_code(error)
                if code in ("PreconditionFailed", "412"):
                    # s3fs names this FileExistsError only when the answer names the condition.
                    raise FileExistsError(f"{self.full_url(relative)} exists already") from error
                if code not in ("ConditionalRequestConflict", "409") or attempt == _CONFLICT_ATTEMPTS:
                    raise
                logger.debug("Conditional PUT of %s conflicted with another write; trying again", path)
                time.sleep(0.05 * attempt)

    def replace(self, relative: str, data: bytes) -> None:
        """Replace a small file in one step: readers see the old or the new content, whole."""
        try:
            self._reaching(f"(writing {relative})", lambda: self._replace(relative, data))
        except OSError as error:
            full = self._full(relative, error)
            if full is error:
                raise
            raise full from error

    def _replace(self, relative: str, data: bytes) -> None:
        path = self.path(relative)
        if not self.is_local:
            self.fs.pipe_file(path, data)
            return
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
        os.close(fd)
        try:
            # Through the file system object, as in write_new.
            with self.fs.open(temp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise
        fsync_path(directory)

    def copy_in(self, source_path: str, relative: str, size: int | None = None) -> None:
        """Copy the file at ``source_path`` (a path on this file system, as ``path`` gives it) to
        ``relative``. On S3, with the file's ``size`` known and within what one request copies,
        one server-side copy: fsspec's copy first asks for the size with a HEAD."""
        target = self.path(relative)
        source, s3 = self._on_s3(source_path), self._on_s3(target)
        if source is None or s3 is None or size is None or size > _S3_ONE_REQUEST_COPY_BYTES:
            if self.is_local:
                os.makedirs(os.path.dirname(target), exist_ok=True)
            self.fs.cp_file(source_path, target)
            return
        self.fs.call_s3("copy_object", Bucket=s3[0], Key=s3[1], CopySource={"Bucket": source[0], "Key": source[1]})
        self.fs.invalidate_cache(target)

    def delete(self, relative: str, recursive: bool = False) -> bool:
        """Delete a file (or a folder, ``recursive``); False when the store says it was not there.
        The name is taken as it is: fsspec's ``rm`` takes it as a glob, so a location named
        ``runs[1]`` would delete under ``runs1`` and leave its own files."""
        path = self.path(relative)

        def delete(again: bool) -> bool:
            try:
                if not recursive:
                    self.fs.rm_file(path)
                elif self.is_local and os.path.isdir(path):
                    shutil.rmtree(path)
                elif self.is_local:
                    os.remove(path)
                elif self._on_s3(path) is None and not has_magic(path):
                    self.fs.rm(path, recursive=True)  # the store's own folder delete, for what it keeps of folders
                else:
                    self._forget_listings(path)
                    files = [str(found) for found in self.fs.find(path)]
                    if not files and not self.fs.isfile(path):
                        raise FileNotFoundError(path)
                    self._delete_paths(files or [path])
            except FileNotFoundError:
                return again  # tried again: the first try, whose answer was lost, deleted it
            return True
        return self._reaching_again(f"(deleting {relative})", delete)

    def delete_files(self, relatives: Sequence[str]) -> None:
        """Delete these files, those not there included: on an object store in one request per
        1,000 names (a folder's ``delete`` lists it first)."""
        paths = [self.path(relative) for relative in dict.fromkeys(relatives)]
        if paths:
            self._reaching(f"(deleting {len(paths)} files)", lambda: self._delete_paths(paths))

    def _delete_paths(self, paths: list[str]) -> None:
        on_s3 = [place for place in map(self._on_s3, paths) if place is not None]
        for start in range(0, len(on_s3), 1000):  # a key that is not there is no error to S3
            chunk = on_s3[start:start + 1000]
            answer = self.fs.call_s3("delete_objects", Bucket=chunk[0][0],
                                     Delete={"Objects": [{"Key": key} for _, key in chunk], "Quiet": True})
            # Quiet: S3 answers with the keys it could not delete only, each with its reason.
            failed = (answer or {}).get("Errors") or []
            if failed:
                first = failed[0]
                kind = PermissionError if first.get("Code") == "AccessDenied" else OSError
                raise kind(f"S3 did not delete {len(failed)} of {len(chunk)} files under s3://{chunk[0][0]}, e.g. "
                           f"{first.get('Key')}: {first.get('Code')} ({first.get('Message')}); check that the "
                           "credentials may delete there (s3:DeleteObject)")
        if on_s3:
            for path in paths:
                self._forget_listings(path)
            return
        for path in paths:  # one at a time elsewhere: fsspec's rm of a list takes names as globs
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)

    def find_files(self, relative_dir: str) -> list[str]:
        """The files under a folder, at any depth, relative to this location (one listing on an
        object store, per 1,000 files); for recovery only, like ``list_names``."""
        def listing() -> list[str]:
            folder = self.path(relative_dir)
            self._forget_listings(folder)
            try:
                found = self.fs.find(folder)
            except FileNotFoundError:
                return []
            return sorted(str(path).removeprefix(self.root + "/") for path in found)
        return self._reaching(f"(listing {relative_dir})", listing)

    def list_names(self, relative_dir: str) -> list[str]:
        """Names in a folder, for recovery only (never to find what this process just wrote)."""
        def listing() -> list[str]:
            self._forget_listings(self.path(relative_dir))
            try:
                entries = self.fs.ls(self.path(relative_dir), detail=False)
            except FileNotFoundError:
                return []
            return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)
        return self._reaching(f"(listing {relative_dir})", listing)


_sleep = time.sleep
_monotonic = time.monotonic


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


def fsync_path(path: str) -> None:
    """Flush a local file's data, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
