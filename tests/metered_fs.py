"""A local directory that runs out of space: an fsspec file system (a ``LocalFileSystem``
subclass, protocol ``meteredfile://``) whose writes fail with ENOSPC once the files under its
root would exceed ``limit_bytes``, for where a small tmpfs cannot be mounted (CI without root).

A write that does not fit writes what fits and then raises ``OSError(ENOSPC)``, as a full
disk does. The limit holds for every process: usage is what is stored under the root, counted
at each write, so the driver and Spark's Python workers see the same disk. ``Meter.refuse``
makes one chosen file's writes fail the same way, for a test of one write in particular.

Spark's workers must know the protocol too: they open the checkpoint's storage from its URL
and options, and the options carry a ``Meter`` (defined here), so unpickling them imports this
module, which registers the protocol.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

PROTOCOL = "meteredfile"


@dataclass(frozen=True)
class Meter:
    root: str
    limit_bytes: int

    @property
    def _refusals(self) -> str:
        # Beside the root, not in it: the checkpoint never sees (or counts) the markers.
        return f"{self.root.rstrip('/')}.refusals"

    def _marker(self, path: str) -> str:
        return os.path.join(self._refusals, os.path.relpath(path, self.root).replace(os.sep, "%"))

    def refuse(self, relative: str) -> None:
        """Fail every write of ``relative`` (under the root) with ENOSPC, in every process, until
        ``allow``: for a test that needs one chosen write to find the store full."""
        os.makedirs(self._refusals, exist_ok=True)
        open(self._marker(os.path.join(self.root, relative)), "wb").close()

    def allow(self, relative: str) -> None:
        os.unlink(self._marker(os.path.join(self.root, relative)))

    def refuses(self, path: str) -> bool:
        return os.path.exists(self._marker(path))

    def used(self) -> int:
        total = 0
        for directory, _, names in os.walk(self.root):
            for name in names:
                try:
                    total += os.path.getsize(os.path.join(directory, name))
                except FileNotFoundError:
                    pass  # replaced or deleted meanwhile
        return total


class _MeteredFile(LocalFileOpener):
    def __init__(self, path: str, mode: str, meter: Meter, **kwargs: Any) -> None:
        self._meter = meter
        super().__init__(path, mode, **kwargs)

    def write(self, data: Any) -> int:
        self.flush()  # what this handle wrote so far counts as stored
        room = 0 if self._meter.refuses(self.path) else self._meter.limit_bytes - self._meter.used()
        if len(data) > room:
            if room > 0:
                super().write(data[:room])
                self.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
        return int(super().write(data))


class MeteredFileSystem(LocalFileSystem):
    protocol = PROTOCOL

    def __init__(self, meter: Meter, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.meter = meter

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        if "r" in mode and "+" not in mode:
            return super()._open(path, mode, block_size, **kwargs)
        return _MeteredFile(self._strip_protocol(path), mode, self.meter, fs=self,
                            autocommit=kwargs.get("autocommit", True))

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        with self._open(path, "xb" if mode == "create" else "wb") as handle:
            handle.write(value)


fsspec.register_implementation(PROTOCOL, MeteredFileSystem, clobber=True)


def metered_location(root: str, limit_bytes: int) -> tuple[str, dict[str, Any]]:
    """The URL and storage options of a location at ``root`` (a local directory) that holds at
    most ``limit_bytes``."""
    os.makedirs(root, exist_ok=True)
    return f"{PROTOCOL}://{root}", {"meter": Meter(root, limit_bytes)}
