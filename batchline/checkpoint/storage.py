"""Checkpoint storage by URL through fsspec (SPEC E1).

Commits never depend on rename or on listing after write: data goes into immutable,
uniquely named files, and the one small file that names them (a manifest, a lease) is
replaced in one step: ``os.replace`` after an fsync on local disks, a single PUT on object
stores, where a PUT is atomic.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import uuid
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from batchline.errors import BatchlineError

__all__ = ["CheckpointStorage", "CorruptFileError", "RawJson", "seal", "unseal"]

logger = logging.getLogger(__name__)


class CorruptFileError(BatchlineError):
    """A stored file is torn or does not match its checksum."""


_MAGIC = b"BATCHLINE1"


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
    header, _, body = data.partition(b"\n")
    parts = header.split(b" ")
    if len(parts) != 3 or parts[0] != _MAGIC:
        raise CorruptFileError(f"{what} is torn or not a batchline file (bad header)")
    if not parts[2].isdigit() or len(body) != int(parts[2]):
        raise CorruptFileError(f"{what} is torn: {len(body)} of {parts[2].decode(errors='replace')} bytes")
    if hashlib.sha256(body).hexdigest().encode() != parts[1]:
        raise CorruptFileError(f"{what} does not match its checksum")
    try:
        return json.loads(body)
    except ValueError as error:
        raise CorruptFileError(f"{what} is not valid JSON ({error})") from error


class CheckpointStorage:
    """Files under one root URL; paths given to methods are relative to it."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        if "://" not in url:
            url = os.path.abspath(url)
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.root = self.root.rstrip("/")
        self.is_local = isinstance(self.fs, LocalFileSystem)

    def __reduce__(self) -> tuple[Any, ...]:
        # Shipped to executors by URL and options; each process opens its own file system.
        return (CheckpointStorage, (self.url, self.storage_options))

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def full_url(self, relative: str) -> str:
        return f"{self.url}/{relative}"

    def exists(self, relative: str) -> bool:
        path = self.path(relative)
        self._forget_listings(path)
        return bool(self.fs.exists(path))

    def _forget_listings(self, path: str) -> None:
        # Object-store clients cache listings; a recovery decision must see the store itself.
        if not self.is_local:
            self.fs.invalidate_cache(path)

    def read(self, relative: str) -> bytes:
        with self.fs.open(self.path(relative), "rb") as handle:
            return handle.read()

    def read_sealed(self, relative: str) -> dict[str, Any]:
        return unseal(self.read(relative), self.full_url(relative))

    def write_new(self, relative: str, data: bytes) -> None:
        """Write a new, never rewritten file; on local disk it is created exclusively (a file
        that exists already raises FileExistsError) and fsynced before returning."""
        path = self.path(relative)
        if self.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "xb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            _fsync_dir(os.path.dirname(path))
        else:
            self.fs.pipe_file(path, data)

    def replace(self, relative: str, data: bytes) -> None:
        """Replace a small file in one step: readers see the old or the new content, whole."""
        path = self.path(relative)
        if not self.is_local:
            self.fs.pipe_file(path, data)
            return
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise
        _fsync_dir(directory)

    def delete(self, relative: str, recursive: bool = False) -> None:
        try:
            self.fs.rm(self.path(relative), recursive=recursive)
        except FileNotFoundError:
            pass

    def list_names(self, relative_dir: str) -> list[str]:
        """Names in a folder, for recovery only (never to find what this process just wrote)."""
        self._forget_listings(self.path(relative_dir))
        try:
            entries = self.fs.ls(self.path(relative_dir), detail=False)
        except FileNotFoundError:
            return []
        return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
