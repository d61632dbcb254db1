"""Disk faults under the local log: a page-cache model behind the ``FileIO`` seam (S1, S2, S4, S5).

``FaultyFileIO`` performs every call on the real file system (so a running ``LocalLog`` reads
what it wrote, as it would from the page cache) and mirrors it in an ``FsModel``
(``fsmodel.py``: durable images plus pending changes), which knows what a power cut would
leave. Rules, besides the model's:

1. ``power_cut`` rewrites the files under ``root`` to one crash state and makes every later
   call raise EIO (the process is dead) except ``close``, which releases the descriptor. Open a
   new ``FaultyFileIO`` on the same root for the next life.
2. An fsync that fails with EIO drops the file's pending writes without making them durable,
   and a later fsync that succeeds does not bring them back: what Linux does (fsyncgate). The
   process still reads them from the cache until the power cut.
3. ENOSPC: with ``space_left`` set, writes consume it; a write that does not fit writes what
   fits and returns a short count, and the next one raises ``ENOSPC``.
4. ``on_op(what, path)`` runs before every change (under the lock, in the caller's thread): a
   nemesis may call ``power_cut`` from there to cut at an exact operation.

``record=True`` keeps the sequence of operations (``ops``) and the initial image, for the crash
state enumeration (``fsmodel.replay``).
"""

from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.streams.log.fileio import OS_IO, Buffer, FileIO
from conveyor_devtools.chaos.fsmodel import (
    DIR,
    DirOp,
    FileOp,
    FsModel,
    Tear,
    keep_nothing,
    random_tears,
)


@dataclass
class _Fd:
    inode: int
    position: int
    append: bool


class FaultyFileIO:
    """A ``FileIO`` over the real files under ``root`` that can lose what was never synced."""

    def __init__(self, root: Path, *, real: FileIO = OS_IO, record: bool = False) -> None:
        self.root = Path(os.path.abspath(root))
        self.root.mkdir(parents=True, exist_ok=True)
        self.real = real
        self.model = FsModel.scan(self.root)
        self.initial = FsModel.scan(self.root) if record else None
        self.ops: list[tuple[str, Any]] | None = [] if record else None
        self.space_left: int | None = None  # bytes until ENOSPC; None: unlimited
        self.fail_fsync: Callable[[Path], bool] | None = None  # EIO for matching files, once
        self.on_op: Callable[[str, Path], None] | None = None  # called before each change
        self.dead = False
        self.eio_paths: list[Path] = []
        self.syncs_after_eio = 0
        self._fds: dict[int, _Fd] = {}
        self._paths: dict[int, Path] = {}
        self._lock = threading.RLock()

    # -- faults -----------------------------------------------------------------------------

    def power_cut(
        self,
        rng: random.Random | None = None,
        *,
        torn: bool = True,
        garbage: bool = False,
        choose: Callable[[str, Path | int], Tear] | None = None,
    ) -> None:
        """Lose what was not synced: rewrite the files under ``root`` to a crash state and fail
        every later call. With ``rng``: random prefixes of the pending changes survive; with
        ``choose``: the given ones; with neither: none. Safe to call from inside ``on_op`` (an
        I/O thread) or from outside."""
        with self._lock:
            if self.dead:
                return
            self.dead = True
            if choose is None:
                choose = (
                    keep_nothing
                    if rng is None
                    else random_tears(self.model, rng, torn=torn, garbage=garbage)
                )
            self.model.materialize(self.root, self.root, choose)

    def mark(self, kind: str, value: object) -> None:
        """Put a marker (e.g. an acknowledged append) into the recorded operation sequence."""
        with self._lock:
            if self.ops is not None:
                self.ops.append((kind, value))

    # -- FileIO -----------------------------------------------------------------------------

    def _check(self, what: str, path: Path) -> None:
        if self.dead:
            raise OSError(errno.EIO, f"power cut (during {what})", str(path))
        if self.on_op is not None:
            self.on_op(what, path)
            if self.dead:
                raise OSError(errno.EIO, f"power cut (during {what})", str(path))

    def _tracked(self, path: Path) -> Path | None:
        full = Path(os.path.abspath(path))
        return full if full.parent in self.model.dirs else None

    def _record(self, kind: str, value: Any) -> None:
        if self.ops is not None:
            self.ops.append((kind, value))

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        with self._lock:
            self._check("open", path)
            full = self._tracked(path)
            fd = self.real.open(path, flags, mode)
            if full is None:
                return fd
            entries = self.model.dirs[full.parent].current
            inode = entries.get(full.name)
            if inode is None:
                inode = self.model.new_file()
                self._dir_op(full.parent, ("link", full.name, inode))
            elif flags & os.O_TRUNC:
                self._file_op(inode, ("truncate", 0, b""))
            self._fds[fd] = _Fd(inode, 0, bool(flags & os.O_APPEND))
            self._paths[fd] = full
            return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._fds.pop(fd, None)
            self._paths.pop(fd, None)
            self.real.close(fd)

    def write(self, fd: int, data: Buffer) -> int:
        with self._lock:
            entry = self._fds.get(fd)
            if entry is None:
                self._check("write", Path("?"))
                return self.real.write(fd, data)
            at = len(self.model.files[entry.inode].current) if entry.append else entry.position
            written = self._pwrite(fd, entry, bytes(data), at, self.real.write)
            entry.position = at + written
            return written

    def pwrite(self, fd: int, data: Buffer, position: int) -> int:
        with self._lock:
            entry = self._fds.get(fd)
            if entry is None:
                self._check("pwrite", Path("?"))
                return self.real.pwrite(fd, data, position)

            def real(fd: int, chunk: Buffer) -> int:
                return self.real.pwrite(fd, chunk, position)

            return self._pwrite(fd, entry, bytes(data), position, real)

    def _pwrite(
        self, fd: int, entry: _Fd, data: bytes, at: int, real: Callable[[int, Buffer], int]
    ) -> int:
        self._check("write", self._paths[fd])
        if self.space_left is not None:
            if self.space_left <= 0 and data:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            data = data[: self.space_left]
            self.space_left -= len(data)
        written = real(fd, data)
        self._file_op(entry.inode, ("write", at, data[:written]))
        return written

    def fsync(self, fd: int) -> None:
        self._sync(fd, self.real.fsync)

    def fdatasync(self, fd: int) -> None:
        self._sync(fd, self.real.fdatasync)

    def _sync(self, fd: int, real: Callable[[int], None]) -> None:
        with self._lock:
            entry = self._fds.get(fd)
            path = self._paths.get(fd, Path("?"))
            self._check("fsync", path)
            if entry is None:
                real(fd)
                return
            if self.fail_fsync is not None and self.fail_fsync(path):
                self.fail_fsync = None
                self.model.sync_file(entry.inode, drop=True)
                self.eio_paths.append(path)
                self._record("sync_failed", entry.inode)
                raise OSError(errno.EIO, "Input/output error (injected fsync failure)", str(path))
            real(fd)
            if path in self.eio_paths:
                self.syncs_after_eio += 1
            self.model.sync_file(entry.inode)
            self._record("sync", entry.inode)

    def ftruncate(self, fd: int, length: int) -> None:
        with self._lock:
            entry = self._fds.get(fd)
            self._check("ftruncate", self._paths.get(fd, Path("?")))
            self.real.ftruncate(fd, length)
            if entry is not None:
                self._file_op(entry.inode, ("truncate", length, b""))

    def replace(self, src: Path, dst: Path) -> None:
        with self._lock:
            self._check("rename", dst)
            full_src, full_dst = self._tracked(src), self._tracked(dst)
            self.real.replace(src, dst)
            if full_src is not None and full_dst is not None:
                assert full_src.parent == full_dst.parent, "renames stay in one directory"
                self._dir_op(full_src.parent, ("rename", f"{full_src.name}\0{full_dst.name}", 0))

    def unlink(self, path: Path) -> None:
        with self._lock:
            self._check("unlink", path)
            full = self._tracked(path)
            self.real.unlink(path)
            if full is not None and full.name in self.model.dirs[full.parent].current:
                self._dir_op(full.parent, ("unlink", full.name, 0))

    def mkdir(self, path: Path) -> None:
        with self._lock:
            self._check("mkdir", path)
            full = self._tracked(path)
            self.real.mkdir(path)
            if full is not None:
                self._dir_op(full.parent, ("link", full.name, DIR))

    def fsync_dir(self, path: Path) -> None:
        with self._lock:
            self._check("fsync_dir", path)
            self.real.fsync_dir(path)
            full = Path(os.path.abspath(path))
            if full in self.model.dirs:
                self.model.sync_dir(full)
                self._record("sync_dir", full)

    def _file_op(self, inode: int, op: FileOp) -> None:
        self.model.change_file(inode, op)
        self._record("file", (inode, op))

    def _dir_op(self, path: Path, op: DirOp) -> None:
        if op[0] == "link" and op[2] != DIR:
            self._record("new_file", op[2])
        self.model.change_dir(path, op)
        self._record("dir", (path, op))
