"""FileIO: the seam through which ``LocalLog`` changes files, so tests can put faults under it.

Every call that changes what a crash would leave on disk goes through a ``FileIO``: creating,
writing, truncating, syncing, renaming and deleting files and directories. Reads (``mmap``,
``pread``, ``read_bytes``, directory listings) do not: they see what a running process sees,
the page cache, which is the real file system also under a fault layer. The ``LOCK`` file is
not data and is not routed either.

Rules an implementation MUST follow:

1. Same semantics as the ``os`` function of the same name (errors are ``OSError`` with the
   real ``errno``); ``write`` writes at the file's current position (the log only uses it on
   ``O_APPEND`` descriptors), ``pwrite`` at ``position`` and may write fewer bytes.
2. ``fsync_dir`` makes the directory's entries (creates, renames, deletes) durable. Until it
   returns, a crash may undo any of them.

``OS_IO`` is the real thing and the default. ``FaultyFileIO`` of the checkout's fault runs
(``conveyor_devtools.chaos.disk``, not part of this package) is the test double that loses
unsynced writes at a power cut and injects EIO and ENOSPC.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, TypeAlias

Buffer: TypeAlias = "bytes | bytearray | memoryview"


class FileIO(Protocol):
    def open(self, path: Path, flags: int, mode: int = 0o644) -> int: ...

    def close(self, fd: int) -> None: ...

    def write(self, fd: int, data: Buffer) -> int: ...

    def pwrite(self, fd: int, data: Buffer, position: int) -> int: ...

    def fsync(self, fd: int) -> None: ...

    def fdatasync(self, fd: int) -> None: ...

    def ftruncate(self, fd: int, length: int) -> None: ...

    def replace(self, src: Path, dst: Path) -> None: ...

    def unlink(self, path: Path) -> None:
        """Delete a file; a missing file is not an error (every caller wants that)."""
        ...

    def mkdir(self, path: Path) -> None: ...

    def fsync_dir(self, path: Path) -> None: ...


class OsFileIO:
    """The real file system."""

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def write(self, fd: int, data: Buffer) -> int:
        return os.write(fd, data)

    def pwrite(self, fd: int, data: Buffer, position: int) -> int:
        return os.pwrite(fd, data, position)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def unlink(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def mkdir(self, path: Path) -> None:
        path.mkdir()

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


OS_IO: FileIO = OsFileIO()
